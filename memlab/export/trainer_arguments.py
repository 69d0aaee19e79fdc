"""A Plan written as a TRL config's keywords, and a trainer's ``TrainingArguments`` (TRL's configs included) read
back as a memlab :class:`~memlab.plan.Plan`, and what memlab cannot measure.

:func:`plan_from_training_arguments` inverts :func:`memlab.export.engines.training_arguments`: for every plan the
Trainer can express, ``plan_from_training_arguments(TrainingArguments(output_dir=..., **training_arguments(plan)))``
is that plan. transformers is never imported here: the arguments are read by attribute name, so this module costs
nothing to import.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from memlab.errors import MemlabError
from memlab.export.engines import training_arguments
from memlab.live.trainer_kinds import is_trainer, kind_for_config, kind_of
from memlab.plan import OPTIMIZERS, Plan
from memlab.techniques.core.registry import REGISTRY
from memlab.techniques.optimizer import OPTIMIZER_FORMS
from memlab.techniques.precompute_ref import DPO_ONLY, dpo_config_keywords, precompute_from_arguments
from memlab.techniques.vllm import GRPO_ONLY, grpo_config_keywords, sets_vllm, vllm_from_arguments, without_vllm

__all__ = [
    "TRAINER_OPTIMIZERS",
    "check_single_process",
    "offloads_activations",
    "plan_from_trainer",
    "plan_training_arguments",
    "plan_from_training_arguments",
    "trainer_model",
    "trl_training_arguments",
]

# The Trainer's names for memlab's optimizers, as the export writes them (OPTIMIZER_FORMS, the registry's one record of
# each optimizer's forms), and the aliases transformers also takes.
# "adamw_torch" is torch's AdamW with its defaults (foreach on CUDA): memlab's "adamw_foreach", not the fused "adamw".
TRAINER_OPTIMIZERS = {
    **{OPTIMIZER_FORMS[name].trainer: name for name in OPTIMIZERS},
    "adamw_8bit": "adamw8bit",
}
"""The Trainer's ``optim`` names that are memlab optimizers (``TrainingArguments.optim`` -> ``Plan.optimizer``)."""


def _text(value: Any) -> str:
    """An enum's value (``OptimizerNames.ADAFACTOR`` -> ``"adafactor"``) or the text itself."""
    return str(getattr(value, "value", value))


def check_single_process(args: Any) -> None:
    """Refuse arguments that train over several processes: memlab measures one process on one device.

    Example:
        >>> from types import SimpleNamespace
        >>> check_single_process(SimpleNamespace(deepspeed=None, fsdp=[]))
        >>> check_single_process(SimpleNamespace(deepspeed="ds.json", fsdp=[]))
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: this trainer is set up for DeepSpeed (deepspeed='ds.json'), and memlab measures one
        process on one device; estimate the per-GPU peak with memlab.estimate(..., gpus=N, strategy=...) ...
    """
    deepspeed = getattr(args, "deepspeed", None)
    fsdp = getattr(args, "fsdp", None)
    if deepspeed:
        engine, setting, strategy = "DeepSpeed", f"deepspeed={deepspeed!r}", '"zero2" or "zero3"'
    elif fsdp:
        engine, setting, strategy = "FSDP", f"fsdp={_text(fsdp) if not isinstance(fsdp, list) else fsdp!r}", '"fsdp2"'
    else:
        return
    raise MemlabError(
        f"this trainer is set up for {engine} ({setting}), and memlab measures one process on one device; "
        f"estimate the per-GPU peak with memlab.estimate(model, batch, plan, gpus=N, strategy={strategy}) "
        "and launch with plan.to_accelerate_config(gpus=N, strategy=...)"
    )


def _checkpointing(args: Any) -> tuple[bool, dict[str, Any]]:
    """Whether the arguments checkpoint activations, and the keywords that go with it (5.x names first)."""
    for name in ("activation_checkpointing", "gradient_checkpointing"):
        if getattr(args, name, False):
            return True, dict(getattr(args, f"{name}_kwargs", None) or {})
    return False, {}


def offloads_activations(args: Any) -> bool:
    """Whether ``args`` hold the step's saved activations in CPU memory: transformers' checkpointing with
    ``activation_checkpointing_kwargs={"offload": True}`` (``gradient_checkpointing_kwargs`` before 5.x's names), or
    TRL's ``activation_offloading=True``.

    Example:
        >>> from types import SimpleNamespace
        >>> legacy = SimpleNamespace(gradient_checkpointing=True, gradient_checkpointing_kwargs={"offload": True})
        >>> offloads_activations(legacy)
        True
        >>> offloads_activations(SimpleNamespace(activation_offloading=True)), offloads_activations(SimpleNamespace())
        (True, False)
    """
    checkpointing, checkpoint_kwargs = _checkpointing(args)
    trl_offloads = bool(getattr(args, "activation_offloading", False))
    return trl_offloads or (checkpointing and bool(checkpoint_kwargs.get("offload")))


# What remains of each offload once TRL's activation_offloading carries the activations.
_OFFLOAD_WITHOUT_ACTIVATIONS = {"activations": "none", "all": "optimizer"}


def trl_training_arguments(plan: Plan, *, legacy_names: bool | None = None, config: Any = None) -> dict[str, Any]:
    """Keyword arguments for a TRL trainer's config (``SFTConfig``, ``DPOConfig``, ``KTOConfig``, ``RewardConfig``)
    that do what ``plan`` does (:meth:`memlab.Plan.to_training_arguments` with ``trl=True``): the Trainer's
    (:func:`memlab.export.engines.training_arguments`), with activation offload as TRL's own
    ``activation_offloading``, with or without checkpointing. TRL holds the step's saved activations in (pinned) CPU
    memory around each training step (``trl.models.activation_offloading``), so the checkpointing keywords carry no
    ``offload`` of their own; a plan without activation offload writes ``activation_offloading=False``, so that a
    config that had it on is switched off. :func:`plan_from_training_arguments` reads it back.

    ``config``: the config class the keywords are for (``trl.GRPOConfig``, or its name ``"GRPOConfig"``;
    ``plan.to_training_arguments(trl=trl.GRPOConfig)``; or a trainer, whose kind names its config class:
    ``plan.to_training_arguments(trl=trainer)``): every keyword is one it accepts, or the plan is refused
    saying which lever it has no keyword for. A config without ``activation_offloading`` (TRL 1.16's
    ``GRPOConfig``) gets transformers' own keywords (activations offloaded only with checkpointing); a GRPOConfig
    refuses the chunked loss (its trainer refuses Liger's fused linear cross-entropy). A GRPOConfig built from them
    generates one optimizer step's generations at once (its default ``steps_per_generation`` is the accumulation),
    and ``micro_batch x accumulation`` must be a multiple of its ``num_generations``.

    Example:
        >>> kwargs = trl_training_arguments(Plan(micro_batch=2, offload="activations"), legacy_names=False)
        >>> kwargs["activation_offloading"], kwargs["activation_checkpointing"]
        (True, False)
        >>> trl_training_arguments(Plan(micro_batch=2))["activation_offloading"]
        False
        >>> # then: trl.SFTConfig(output_dir="out", **kwargs)
    """
    asked, engine, plan = plan, grpo_config_keywords(plan), without_vllm(plan)  # a GRPOConfig's keywords, added below
    engine.update(dpo_config_keywords(plan))  # a DPOConfig's (precompute_ref_log_probs), likewise
    plan = plan.replace(precompute_ref=None) if plan.precompute_ref is not None else plan
    if config is None:
        if engine:
            raise MemlabError(f"{GRPO_ONLY if sets_vllm(asked) else DPO_ONLY}; trl=True names no config class")
        rest = plan.replace(offload=_OFFLOAD_WITHOUT_ACTIVATIONS.get(plan.offload, plan.offload))
        return {**training_arguments(rest, legacy_names=legacy_names),
                "activation_offloading": plan.offloads_activations}
    cls = _config_class(config)
    fields = {field.name for field in dataclasses.fields(cls)}
    if legacy_names is None and "activation_checkpointing" not in fields:
        legacy_names = True
    name = cls.__name__
    kind = kind_for_config(cls)
    refusal = kind.export_refusal(plan) if kind is not None and kind.export_refusal is not None else ""
    if refusal:  # what the config's trainer kind refuses (a GRPOConfig: the chunked loss)
        raise MemlabError(refusal)
    if "activation_offloading" in fields:
        kwargs = trl_training_arguments(plan, legacy_names=legacy_names)
    else:
        try:
            kwargs = training_arguments(plan, legacy_names=legacy_names)
        except MemlabError as error:
            raise MemlabError(f"{name} has no activation_offloading (TRL's own); {error}") from None
    kwargs.update(engine)
    unknown = sorted(key for key in kwargs if key not in fields)
    if unknown:
        raise MemlabError(
            f"{name} takes no {', '.join(unknown)}, which plan {asked.label()!r} needs; build it with a plan without "
            "that lever, or pass the config class the trainer uses: plan.to_training_arguments(trl=trl.SFTConfig)"
        )
    return kwargs


def plan_training_arguments(plan: Plan, *, trl: Any = False) -> dict[str, Any]:
    """What :meth:`memlab.Plan.to_training_arguments` returns: the Trainer's keywords
    (:func:`memlab.export.engines.training_arguments`), or with ``trl`` a TRL config's (:func:`trl_training_arguments`;
    ``trl=True`` for any TRL config, or the config class, its name or a trainer for exactly that class's).

    Example:
        >>> plan_training_arguments(Plan(micro_batch=2))["per_device_train_batch_size"]
        2
        >>> plan_training_arguments(Plan(micro_batch=2), trl=True)["activation_offloading"]
        False
    """
    if trl is not False:
        return trl_training_arguments(plan, config=None if trl is True else trl)
    return training_arguments(plan)


def _config_class(config: Any) -> type:
    """The config class ``config`` names (a dataclass, a class name importable from ``trl``, or a trainer: its
    kind's config class, :attr:`memlab.live.trainer_kinds.TrainerKind.config`)."""
    if is_trainer(config):
        return kind_of(config).config_class()
    if isinstance(config, str):
        try:
            import trl
        except ImportError:
            raise MemlabError(f"config {config!r} names a TRL config, and TRL is not installed; pip install trl, or "
                              "pass the class itself") from None
        found = getattr(trl, config, None)
        if found is None:
            raise MemlabError(f"trl has no {config!r}; write a TRL config's name, e.g. 'GRPOConfig' or 'DPOConfig', "
                              "or pass the class itself")
        config = found
    if not (isinstance(config, type) and dataclasses.is_dataclass(config)):
        raise MemlabError(f"{config!r} is not a config class; write trl=True, or a TRL config class such as "
                          "trl.GRPOConfig (or its name, 'GRPOConfig')")
    return config


def _loss(args: Any) -> str:
    if not getattr(args, "use_liger_kernel", False):
        return "full"
    config = getattr(args, "liger_kernel_config", None) or {}
    # Liger applies its fused linear cross-entropy unless the config turns it off; its other kernels (RoPE, SwiGLU,
    # RMSNorm) are not memlab levers and are left out of the plan.
    return "chunked" if config.get("fused_linear_cross_entropy", True) else "full"


def plan_from_training_arguments(args: Any) -> Plan:
    """The memlab plan that ``args`` (a ``transformers.TrainingArguments``, TRL's configs included) trains with.

    - ``per_device_train_batch_size`` -> ``micro_batch``; ``gradient_accumulation_steps`` -> ``accumulation``.
    - ``activation_checkpointing`` (or ``gradient_checkpointing``) -> ``checkpointing``; with
      ``activation_checkpointing_kwargs["offload"]`` -> ``offload="activations"``.
    - TRL's ``activation_offloading=True`` (``SFTConfig``, ``DPOConfig``...) -> ``offload="activations"``, with or
      without checkpointing: TRL holds every saved activation of the step in CPU memory, not only the checkpointed
      ones.
    - ``bf16`` / ``fp16`` -> ``precision``; ``optim`` -> ``optimizer`` (see :data:`TRAINER_OPTIMIZERS`).
    - ``use_liger_kernel`` with Liger's fused linear cross-entropy -> ``loss="chunked"``.
    - ``torch_compile`` -> ``compile``.
    - a ``GRPOConfig``'s colocated vLLM engine (``use_vllm=True, vllm_mode="colocate"``): its
      ``vllm_gpu_memory_utilization`` -> ``vllm_memory``, ``vllm_enable_sleep_mode`` -> ``vllm_sleep``.
    - a ``DPOConfig``'s ``precompute_ref_log_probs=True`` -> ``precompute_ref=True`` (False: None, the trainer's own).

    What lives on the model rather than in the arguments (pure bf16 weights, adapters) is left at the defaults:
    :meth:`memlab.trainer.source.TrainerSource.plan` reads those from the trainer's model.

    Raises:
        MemlabError: for a setting memlab cannot measure (an ``optim`` it has no optimizer for, DeepSpeed, FSDP),
            naming it.

    Example:
        >>> from types import SimpleNamespace
        >>> args = SimpleNamespace(per_device_train_batch_size=4, gradient_accumulation_steps=2, bf16=True,
        ...                        fp16=False, optim="adamw_torch_fused", gradient_checkpointing=True)
        >>> plan_from_training_arguments(args).label()
        'mb4x2 ckpt bf16'
        >>> plan_from_training_arguments(SimpleNamespace(optim="sgd"))
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: optim='sgd' is not an optimizer memlab measures; write optim= one of ...
    """
    check_single_process(args)
    optim = _text(getattr(args, "optim", "adamw_torch_fused"))
    if optim not in TRAINER_OPTIMIZERS:
        raise MemlabError(
            f"optim={optim!r} is not an optimizer memlab measures; write optim= one of {', '.join(TRAINER_OPTIMIZERS)}"
        )
    bf16, fp16 = bool(getattr(args, "bf16", False)), bool(getattr(args, "fp16", False))
    if bf16 and fp16:
        raise MemlabError("bf16=True and fp16=True together are not one precision; keep one of them")
    checkpointing, _ = _checkpointing(args)
    micro_batch = getattr(args, "per_device_train_batch_size", None)
    return Plan(
        micro_batch=micro_batch,
        accumulation=getattr(args, "gradient_accumulation_steps", 1),
        checkpointing=checkpointing,
        precision="bf16" if bf16 else "fp16" if fp16 else "fp32",
        optimizer=TRAINER_OPTIMIZERS[optim],
        offload="activations" if offloads_activations(args) else "none",
        loss=_loss(args),
        compile=bool(getattr(args, "torch_compile", False)),
        **vllm_from_arguments(args),
        **precompute_from_arguments(args),
    )


def trainer_model(trainer: Any) -> Any:
    """The model the trainer trains, out of any ``DataParallel``/DDP wrapper (a peft model stays what it is)."""
    model = trainer.model
    while type(model).__name__ in ("DataParallel", "DistributedDataParallel") and hasattr(model, "module"):
        model = model.module
    return model


def plan_from_trainer(trainer: Any) -> Plan:
    """The trainer's settings as a plan (:meth:`memlab.Plan.from_trainer`): :func:`plan_from_training_arguments` of
    its arguments, plus what the model says: ``weights="bf16"`` when its trained parameters are bf16,
    ``adapter="lora"`` (with its rank) when it is a peft model, with every LoRA setting its ``LoraConfig`` says (each
    lever's ``from_peft``).

    Raises:
        MemlabError: not a trainer (or settings memlab cannot express).

    Example:
        >>> plan_from_trainer(object())
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: a object is not a transformers Trainer; pass a Trainer (TRL's too), or read a plan \
from arguments with memlab.Plan.from_training_arguments(args)
    """
    if not is_trainer(trainer):
        raise MemlabError(f"a {type(trainer).__name__} is not a transformers Trainer; pass a Trainer (TRL's "
                          "too), or read a plan from arguments with memlab.Plan.from_training_arguments(args)")
    plan = plan_from_training_arguments(trainer.args)
    model = trainer_model(trainer)
    trained = [p for p in model.parameters() if p.requires_grad]
    changes: dict[str, Any] = {}
    if trained and all(str(p.dtype) == "torch.bfloat16" for p in trained):
        changes["weights"] = "bf16"
    peft_config = getattr(model, "peft_config", None)
    if isinstance(peft_config, dict) and peft_config:
        config = next(iter(peft_config.values()))
        if isinstance(getattr(config, "r", None), int):
            quantized = getattr(model, "is_loaded_in_4bit", False) or getattr(
                getattr(model, "base_model", None), "is_loaded_in_4bit", False
            )
            changes["adapter"] = "qlora" if quantized else "lora"
            for name, lever in REGISTRY.items():
                value = lever.from_peft(config) if lever.from_peft is not None else None
                if value is not None:
                    changes[name] = value
    return plan.replace(**changes) if changes else plan
