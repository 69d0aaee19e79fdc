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
from memlab.plan import Plan
from memlab.techniques.adapters import lora_config_of, peft_plan_values
from memlab.techniques.core.registry import REGISTRY
from memlab.techniques.offload import trl_offload_keywords
from memlab.techniques.precompute_ref import DPO_ONLY, dpo_config_keywords, without_precompute
from memlab.techniques.vllm import GRPO_ONLY, grpo_config_keywords, sets_vllm, without_vllm

__all__ = [
    "check_single_process",
    "plan_from_trainer",
    "plan_training_arguments",
    "plan_from_training_arguments",
    "trainer_model",
    "trl_training_arguments",
]

def _text(value: Any) -> str:
    """An enum's value (``OptimizerNames.ADAFACTOR`` -> ``"adafactor"``) or the text itself."""
    return str(getattr(value, "value", value))


def check_single_process(args: Any) -> None:
    """Refuse arguments that train over several processes where memlab runs the trainer's step in this one process
    (``measure``, ``compare``, ``fit``, ``apply``); ``memlab.estimate(trainer)`` answers them per GPU.

    Example:
        >>> from types import SimpleNamespace
        >>> check_single_process(SimpleNamespace(deepspeed=None, fsdp=[]))
        >>> check_single_process(SimpleNamespace(deepspeed="ds.json", fsdp=[]))
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: this trainer is set up for DeepSpeed (deepspeed='ds.json'), and memlab measures one
        process on one device; memlab.estimate(trainer, gpus=N) answers it per GPU ...
    """
    deepspeed = getattr(args, "deepspeed", None)
    fsdp = getattr(args, "fsdp", None)
    if deepspeed:
        engine, setting = "DeepSpeed", f"deepspeed={deepspeed!r}"
    elif fsdp:
        engine, setting = "FSDP", f"fsdp={_text(fsdp) if not isinstance(fsdp, list) else fsdp!r}"
    else:
        return
    raise MemlabError(
        f"this trainer is set up for {engine} ({setting}), and memlab measures one process on one device; "
        "memlab.estimate(trainer, gpus=N) answers it per GPU (N the processes it will run in), "
        "memlab.limits(trainer, budget=..., vary='rows', gpus=N) the most examples per GPU that fit, and "
        "plan.to_accelerate_config(gpus=N, strategy=...) writes the launch"
    )


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
    plan = without_precompute(plan)
    if config is None:
        if engine:
            raise MemlabError(f"{GRPO_ONLY if sets_vllm(asked) else DPO_ONLY}; trl=True names no config class")
        rest, trl_offload = trl_offload_keywords(plan)
        return {**training_arguments(rest, legacy_names=legacy_names), **trl_offload}
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


def plan_from_training_arguments(args: Any) -> Plan:
    """The memlab plan that ``args`` (a ``transformers.TrainingArguments``, TRL's configs included) trains with.

    - ``per_device_train_batch_size`` -> ``micro_batch``; ``gradient_accumulation_steps`` -> ``accumulation``.
    - ``activation_checkpointing`` (or ``gradient_checkpointing``) -> ``checkpointing``; with
      ``activation_checkpointing_kwargs["offload"]`` -> ``offload="activations"``.
    - TRL's ``activation_offloading=True`` (``SFTConfig``, ``DPOConfig``...) -> ``offload="activations"``, with or
      without checkpointing: TRL holds every saved activation of the step in CPU memory, not only the checkpointed
      ones.
    - ``bf16`` / ``fp16`` -> ``precision``; ``optim`` -> ``optimizer``
      (:data:`memlab.techniques.optimizer.TRAINER_OPTIMIZERS`).
    - ``use_liger_kernel`` with Liger's fused linear cross-entropy -> ``loss="chunked"``.
    - ``torch_compile`` -> ``compile``.
    - a ``GRPOConfig``'s colocated vLLM engine (``use_vllm=True, vllm_mode="colocate"``): its
      ``vllm_gpu_memory_utilization`` -> ``vllm_memory``, ``vllm_enable_sleep_mode`` -> ``vllm_sleep``.
    - a ``DPOConfig``'s ``precompute_ref_log_probs=True`` -> ``precompute_ref=True`` (False: None, the trainer's own).

    What lives on the model rather than in the arguments (pure bf16 weights, adapters) is left at the defaults:
    :meth:`memlab.trainer.source.TrainerSource.plan` reads those from the trainer's model. The plan is one process's
    step: ``deepspeed`` / ``fsdp`` are the engine's, which :func:`memlab.trainer.sharding.trainer_sharding` reads.

    Raises:
        MemlabError: for a setting memlab cannot measure (an ``optim`` it has no optimizer for), naming it.

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
    return Plan(**{name: lever.from_arguments(args) for name, lever in REGISTRY.items() if lever.from_arguments})


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
    said = {name: lever.from_model(model) for name, lever in REGISTRY.items() if lever.from_model is not None}
    config = lora_config_of(model)
    if config is not None:  # every LoRA setting its LoraConfig says
        said.update(peft_plan_values(model, config))
    changes = {name: value for name, value in said.items() if value is not None}
    return plan.replace(**changes) if changes else plan
