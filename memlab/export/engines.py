"""Take a plan elsewhere: ``TrainingArguments`` keywords, a DeepSpeed config, a plain PyTorch loop.

``Plan.to_training_arguments()``, ``Plan.to_deepspeed()`` and ``Plan.to_code()`` call these functions.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from memlab.errors import MemlabError
from memlab.plan import PLAN_FIELDS, Plan
from memlab.techniques.levers_model import lora_settings, qlora_compute_dtype
from memlab.techniques.levers_step import CHUNKS, OPTIMIZER_FORMS
from memlab.techniques.registry import REGISTRY, refusals

__all__ = ["chunked_loss_code", "deepspeed_config", "lora_config_code", "optimizer_code", "peft_config",
           "pytorch_code", "refuse_unless_carried", "training_arguments"]

# Liger Kernel's fused linear cross-entropy (the head and the loss in chunks of tokens) and none of its other kernels.
_LIGER_CHUNKED_LOSS = {
    "fused_linear_cross_entropy": True,
    "cross_entropy": False,
    "rope": False,
    "swiglu": False,
    "rms_norm": False,
}



def refuse_unless_carried(plan: Plan, target: str, what: str) -> None:
    """Raise :class:`MemlabError` when the export ``target`` (see :data:`memlab.techniques.lever.TARGETS`) cannot
    carry a lever of ``plan``: one message naming ``what`` and, for each lever it cannot carry, what to do
    instead. An export never drops a lever silently.

    Example:
        >>> refuse_unless_carried(Plan(weights="bf16"), "trainer", "TrainingArguments")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: TrainingArguments cannot carry ... weights='bf16' (pure bf16, no fp32 master ...
    """
    problems = refusals(plan, target)
    if problems:
        raise MemlabError(f"{what} cannot carry {plan.label()!r}: " + "; ".join(problems))


@functools.lru_cache(maxsize=1)
def _installed_uses_activation_checkpointing() -> bool:
    """Whether the installed transformers names checkpointing ``activation_checkpointing`` (5.x) or only
    ``gradient_checkpointing`` (older releases, where the new name is rejected)."""
    from transformers import TrainingArguments

    return "activation_checkpointing" in {f.name for f in dataclasses.fields(TrainingArguments)}


def training_arguments(plan: Plan, *, legacy_names: bool | None = None) -> dict[str, Any]:
    """Keyword arguments for ``transformers.TrainingArguments`` that do what ``plan`` does.

    - ``per_device_train_batch_size``: ``plan.micro_batch`` (left out when it is None: keep your own).
    - ``gradient_accumulation_steps``: ``plan.accumulation``.
    - checkpointing: ``activation_checkpointing=True`` with
      ``activation_checkpointing_kwargs={"use_reentrant": False}`` where the installed transformers has those
      names (5.x, where ``gradient_checkpointing*`` are deprecated aliases that warn);
      ``gradient_checkpointing`` / ``gradient_checkpointing_kwargs`` with older releases, or when
      ``legacy_names=True``.
    - ``bf16`` / ``fp16``: from ``plan.precision`` (both False for fp32). On a machine without a bf16 GPU,
      transformers refuses ``bf16=True`` unless you also pass ``use_cpu=True``.
    - ``optim``: ``"adamw_torch_fused"`` (the Trainer's default from torch 2.8, which memlab's ``"adamw"`` is),
      ``"adamw_bnb_8bit"`` or ``"paged_adamw_8bit"`` (bitsandbytes), ``"adafactor"`` (transformers' Adafactor).
    - ``loss="chunked"``: ``use_liger_kernel=True`` with ``liger_kernel_config`` turning on only Liger Kernel's
      ``fused_linear_cross_entropy`` (the head and the cross-entropy over chunks of tokens, the logits never whole).
      That needs ``pip install liger-kernel`` (Triton kernels: CUDA) and a model type Liger supports (Llama,
      Mistral, Qwen2, Gemma, ...); elsewhere, compute the loss as :func:`pytorch_code` writes it.

    - optimizer offload: ``deepspeed=plan.to_deepspeed()`` (the Trainer offloads optimizer state only through
      DeepSpeed's ZeRO offload; see :func:`deepspeed_config`).
    - activation offload with checkpointing: transformers 5.x holds the checkpointed activations in pinned CPU
      memory (``activation_checkpointing_kwargs["offload"] = True``).

    The export is faithful: a lever the Trainer cannot carry raises :class:`MemlabError` saying what to do
    instead. Pure bf16 weights and adapters are not TrainingArguments (load the model in bf16; wrap it with
    ``peft.get_peft_model(model, plan.to_peft_config())``, and export the plan without them), nor is activation
    offload without checkpointing (the Trainer offloads only checkpointed activations); ``plan.to_code()``
    carries all of them.

    Args:
        plan: the plan to express.
        legacy_names: True for the ``gradient_checkpointing`` names, False for ``activation_checkpointing``,
            None (default) to follow the installed transformers.

    Example:
        >>> plan = Plan(micro_batch=4, accumulation=2, precision="bf16")
        >>> kwargs = training_arguments(plan, legacy_names=False)
        >>> kwargs["per_device_train_batch_size"], kwargs["gradient_accumulation_steps"], kwargs["bf16"]
        (4, 2, True)
        >>> kwargs["optim"], kwargs["activation_checkpointing"]
        ('adamw_torch_fused', False)
        >>> chunked = training_arguments(Plan(optimizer="adafactor", loss="chunked"))
        >>> chunked["optim"], chunked["use_liger_kernel"], chunked["liger_kernel_config"]["fused_linear_cross_entropy"]
        ('adafactor', True, True)
        >>> # then: transformers.TrainingArguments(output_dir="out", **kwargs)
    """
    refuse_unless_carried(plan, "trainer", "TrainingArguments")
    if legacy_names is None:
        legacy_names = not _installed_uses_activation_checkpointing()
    if legacy_names and plan.offloads_activations:
        raise MemlabError(
            f"offload={plan.offload!r}: transformers before 5 has no Trainer setting that offloads activations; "
            "upgrade transformers, or use plan.to_code() (save_on_cpu)"
        )
    kwargs: dict[str, Any] = {}
    if plan.micro_batch is not None:
        kwargs["per_device_train_batch_size"] = plan.micro_batch
    kwargs["gradient_accumulation_steps"] = plan.accumulation
    name = "gradient_checkpointing" if legacy_names else "activation_checkpointing"
    kwargs[name] = plan.checkpointing
    if plan.checkpointing:
        checkpoint_kwargs: dict[str, Any] = {"use_reentrant": False}
        if plan.offloads_activations and not legacy_names:
            checkpoint_kwargs["offload"] = True
        kwargs[f"{name}_kwargs"] = checkpoint_kwargs
    kwargs["bf16"] = plan.precision == "bf16"
    kwargs["fp16"] = plan.precision == "fp16"
    kwargs["optim"] = OPTIMIZER_FORMS[plan.optimizer].trainer
    if plan.loss == "chunked":
        kwargs["use_liger_kernel"] = True
        kwargs["liger_kernel_config"] = dict(_LIGER_CHUNKED_LOSS)
    if plan.offloads_optimizer:
        # The Trainer offloads optimizer state only through DeepSpeed.
        kwargs["deepspeed"] = deepspeed_config(plan)
    return kwargs


def deepspeed_config(plan: Plan) -> dict[str, Any]:
    """A DeepSpeed config (ZeRO stage 2) for ``plan``: for ``TrainingArguments(deepspeed=...)`` or a file.

    - ``train_micro_batch_size_per_gpu``: ``plan.micro_batch``, or ``"auto"`` (the Trainer fills it in) when
      None.
    - ``gradient_accumulation_steps``: ``plan.accumulation``.
    - ``zero_optimization``: stage 2; with ``"offload_optimizer": {"device": "cpu", "pin_memory": True}``
      where the plan offloads the optimizer.
    - ``bf16`` / ``fp16``: ``{"enabled": True}``; fp16 with ``"loss_scale": 0`` (dynamic loss scaling).
    - ``optimizer``: AdamW with ``"auto"`` parameters (the Trainer fills them in; with optimizer offload
      DeepSpeed runs its CPU Adam). 8-bit Adam (paged or not) and Adafactor are not DeepSpeed optimizers: the key
      is left out and ``"_comment"`` says to pass the optimizer yourself (for the Trainer:
      ``optimizers=(bnb.optim.AdamW8bit(...), None)``, or ``optim="adafactor"`` in TrainingArguments);
      ``"zero_allow_untested_optimizer": True`` lets ZeRO take it, and with optimizer offload
      ``"zero_force_ds_cpu_optimizer": False`` lets it run instead of DeepSpeed's CPU Adam.
    - the chunked loss is computed by the model's training code, not by DeepSpeed: ``"_comment"`` says where it
      comes from (see :func:`training_arguments` and :func:`pytorch_code`).
    - activation offload: ``"activation_checkpointing": {"cpu_checkpointing": True, ...}``. DeepSpeed offloads
      only checkpointed activations, so this acts together with checkpointing (and then only where the model
      checkpoints through ``deepspeed.checkpointing``); without checkpointing ``"_comment"`` says so.

    - adapters: ``"_comment"`` says to wrap the model with peft before DeepSpeed takes it.
    - pure bf16 weights: refused (:class:`MemlabError`): DeepSpeed's bf16 keeps fp32 master weights.

    Only what the plan decides is set: no learning rate, scheduler, clipping or ZeRO tuning.

    Example:
        >>> plan = Plan(micro_batch=2, accumulation=8, precision="fp16", offload="optimizer")
        >>> config = deepspeed_config(plan)
        >>> config["zero_optimization"]["offload_optimizer"]["device"], config["fp16"]
        ('cpu', {'enabled': True, 'loss_scale': 0})
        >>> config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
        (2, 8)
    """
    refuse_unless_carried(plan, "deepspeed", "a DeepSpeed config")
    comments: list[str] = []
    zero: dict[str, Any] = {"stage": 2}
    if plan.offloads_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": plan.micro_batch if plan.micro_batch is not None else "auto",
        "gradient_accumulation_steps": plan.accumulation,
        "zero_optimization": zero,
    }
    if plan.precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif plan.precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0}
    form = OPTIMIZER_FORMS[plan.optimizer]
    if form.deepspeed:
        config["optimizer"] = {
            "type": form.deepspeed,
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
        }
    else:
        keywords = f" ({form.keywords})" if form.keywords else ""
        comments.append(
            f"{form.title} is not a DeepSpeed optimizer: create {form.full_name}{keywords} yourself and pass it "
            f"(Trainer(optimizers=(optimizer, None)), or TrainingArguments(optim={form.trainer!r}), or "
            "deepspeed.initialize(optimizer=optimizer))"
        )
        config["zero_allow_untested_optimizer"] = True
        if plan.offloads_optimizer:
            config["zero_force_ds_cpu_optimizer"] = False
            comments.append(
                "optimizer offload with a client optimizer: DeepSpeed's own CPU Adam is not used, so the "
                "update runs wherever that optimizer runs it"
            )
    if plan.adapter != "none":
        comments.append(
            f"the {plan.adapter} adapters are the model's: wrap it with peft.get_peft_model(model, "
            "plan.to_peft_config()) before DeepSpeed takes it (QLoRA: load it in 4-bit NF4 first, as plan.to_code() "
            "shows)"
        )
    if plan.loss == "chunked":
        comments.append(
            "the chunked loss is not a DeepSpeed setting: with the Trainer pass plan.to_training_arguments() "
            "(use_liger_kernel), in your own loop compute the loss as plan.to_code() does"
        )
    if plan.offloads_activations:
        config["activation_checkpointing"] = {
            "partition_activations": False,
            "cpu_checkpointing": True,
            "contiguous_memory_optimization": False,
            "synchronize_checkpoint_boundary": False,
        }
        if not plan.checkpointing:
            comments.append(
                "DeepSpeed offloads only checkpointed activations: cpu_checkpointing acts only with "
                "activation checkpointing on"
            )
    if comments:
        config["_comment"] = "; ".join(comments)
    return config


def pytorch_code(plan: Plan) -> str:
    """A plain PyTorch training loop, as source text, that does what ``plan`` does.

    The snippet expects two names to exist: ``model`` (a ``torch.nn.Module`` already on its device, a Hugging
    Face model where checkpointing is on) and ``batches`` (an iterable of dicts of tensors, dimension 0 being
    rows; the loss is ``model(**micro_batch).loss``, in ``compute_loss``). With ``micro_batch`` set, each
    batch is one optimizer step, cut into micro-batches of that many rows; with ``micro_batch=None``, each
    batch is one micro-batch and every ``accumulation`` batches make a step. It uses ``torch.autocast`` (+
    ``GradScaler`` for fp16), ``activation_checkpointing_enable`` (``gradient_checkpointing_enable`` before
    transformers 5), fused ``torch.optim.AdamW`` (the Trainer's default), ``bitsandbytes.optim.AdamW8bit`` /
    ``PagedAdamW8bit``, transformers' ``Adafactor``, CPU copies of the weights for optimizer offload,
    ``torch.autograd.graph.save_on_cpu`` for activation offload, and for ``loss="chunked"`` a ``compute_loss``
    that runs the base model and then the LM head and cross-entropy over chunks of tokens under
    ``torch.utils.checkpoint`` (as memlab measured it).

    Example:
        >>> code = pytorch_code(Plan(micro_batch=2, accumulation=4, precision="fp16"))
        >>> "GradScaler" in code and "torch.autocast" in code
        True
        >>> _ = compile(code, "<plan>", "exec")
    """
    refuse_unless_carried(plan, "code", "the plain PyTorch code")
    fields = ", ".join(f"{name}={getattr(plan, name)!r}" for name in PLAN_FIELDS)
    lines: list[str] = [f"# memlab plan {plan.label()!r}", f"#   {fields}"]
    lines.append("# Needs `model` (a torch.nn.Module on its device) and `batches` (an iterable of dicts of")
    if plan.micro_batch is not None:
        rows = plan.micro_batch * plan.accumulation
        lines.append(
            f"# tensors, dimension 0 = rows). Each batch is one optimizer step of {rows} rows "
            f"({plan.micro_batch} x {plan.accumulation} micro-batches)."
        )
    else:
        if plan.accumulation == 1:
            lines.append("# tensors, dimension 0 = rows). Each batch is one optimizer step.")
        else:
            lines.append(
                "# tensors, dimension 0 = rows). Each batch is one micro-batch; "
                f"{plan.accumulation} batches make one optimizer step."
            )
    lines.append("import torch")
    if OPTIMIZER_FORMS[plan.optimizer].imports:
        lines.append(OPTIMIZER_FORMS[plan.optimizer].imports)
    if plan.loss == "chunked":
        lines.append("from torch.utils.checkpoint import checkpoint")
    lines += [
        "",
        "lr = 1e-5",
        *([f"micro_batch = {plan.micro_batch}"] if plan.micro_batch is not None else []),
        f"accumulation = {plan.accumulation}",
        "device = next(model.parameters()).device",
        *(
            ['pin = device.type == "cuda"  # pinned CPU memory makes copies to and from the GPU faster']
            if plan.offload != "none"
            else []
        ),
        "model.train()",
        "",
        "",
        *(chunked_loss_code() if plan.loss == "chunked" else ["def compute_loss(model, micro):",
                                                              "    return model(**micro).loss"]),
        "",
        "",
    ]
    if plan.checkpointing:
        lines += [
            "# Activation checkpointing: keep only each block's input, recompute the rest in backward",
            'if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5',
            '    model.activation_checkpointing_enable({"use_reentrant": False})',
            "else:",
            '    model.gradient_checkpointing_enable({"use_reentrant": False})',
            "",
        ]
    lines += _model_changes_code(plan)
    if plan.optimizer == "adamw":
        lines.append("# Fused AdamW where torch has the kernel: the Trainer's default optim adamw_torch_fused")
    lines.append("params = [p for p in model.parameters() if p.requires_grad]")
    if plan.offloads_optimizer:
        lines += [
            "# Optimizer offload: optimizer state and update live on the CPU, on copies of the weights",
            "cpu_params = [",
            '    torch.empty(p.shape, dtype=p.dtype, device="cpu", pin_memory=pin).copy_(p.detach())',
            "    for p in params",
            "]",
            "for cpu_p in cpu_params:",
            "    cpu_p.requires_grad_()",
            f"optimizer = {optimizer_code(plan, 'cpu_params', 'cpu_params[0].device')}",
        ]
    else:
        lines.append(f"optimizer = {optimizer_code(plan, 'params', 'device')}")
    for lever in REGISTRY.values():  # levers that change how the optimizer steps say so here
        lines += lever.code(plan) if lever.code else []
    if plan.precision == "fp16":
        lines.append("scaler = torch.amp.GradScaler(device.type)  # dynamic loss scaling for fp16")

    contexts = []
    if plan.offloads_activations:
        contexts.append("torch.autograd.graph.save_on_cpu(pin_memory=pin)")
    if plan.precision != "fp32":
        dtype = "torch.bfloat16" if plan.precision == "bf16" else "torch.float16"
        contexts.append(f"torch.autocast(device.type, dtype={dtype})")

    def forward_backward(indent: str, micro: str, divisor: str) -> list[str]:
        body = [f"{indent}micro = {micro}"]
        call = f"loss = compute_loss(model, micro) / {divisor}"
        if contexts:
            if plan.offloads_activations:
                body.append(f"{indent}# save_on_cpu: tensors kept for backward wait in CPU memory")
            body.append(f"{indent}with {', '.join(contexts)}:")
            body.append(f"{indent}    {call}")
        else:
            body.append(f"{indent}{call}")
        backward = "scaler.scale(loss).backward()" if plan.precision == "fp16" else "loss.backward()"
        body.append(f"{indent}{backward}")
        return body

    def optimizer_step(indent: str) -> list[str]:
        body = []
        if plan.offloads_optimizer:
            body += [
                f"{indent}for p, cpu_p in zip(params, cpu_params):  # gradients to the CPU",
                f'{indent}    cpu_p.grad = None if p.grad is None else p.grad.to("cpu", dtype=cpu_p.dtype)',
                f"{indent}    p.grad = None",
            ]
        if plan.precision == "fp16":
            body += [f"{indent}scaler.step(optimizer)", f"{indent}scaler.update()"]
        else:
            body.append(f"{indent}optimizer.step()")
        body.append(f"{indent}optimizer.zero_grad(set_to_none=True)")
        if plan.offloads_optimizer:
            body += [
                f"{indent}with torch.no_grad():  # updated weights back to the device",
                f"{indent}    for p, cpu_p in zip(params, cpu_params):",
                f"{indent}        p.copy_(cpu_p, non_blocking=True)",
            ]
        return body

    lines += ["", ""]
    if plan.micro_batch is not None:
        lines += [
            "for batch in batches:",
            "    rows = len(next(iter(batch.values())))",
            "    starts = range(0, rows, micro_batch)",
            "    for start in starts:",
            *forward_backward(
                "        ",
                "{k: v[start : start + micro_batch].to(device) for k, v in batch.items()}",
                "len(starts)",
            ),
            *optimizer_step("    "),
        ]
    elif plan.accumulation == 1:
        lines += [
            "for batch in batches:",
            *forward_backward("    ", "{k: v.to(device) for k, v in batch.items()}", "accumulation"),
            *optimizer_step("    "),
        ]
    else:
        lines += [
            "for index, batch in enumerate(batches):",
            *forward_backward("    ", "{k: v.to(device) for k, v in batch.items()}", "accumulation"),
            "    if (index + 1) % accumulation == 0:",
            *optimizer_step("        "),
        ]
    return "\n".join(lines) + "\n"


def optimizer_code(plan: Plan, parameters: str, device: str) -> str:
    """The expression that builds the plan's optimizer over ``parameters`` (code text) with ``lr``, as memlab
    builds it (fused AdamW where ``device`` has the kernel; after the import line of
    :data:`memlab.techniques.levers_step.OPTIMIZER_FORMS`).

    Example:
        >>> optimizer_code(Plan(optimizer="adafactor"), "params", "device")
        'Adafactor(params, lr=lr, scale_parameter=False, relative_step=False)'
    """
    form = OPTIMIZER_FORMS[plan.optimizer]
    extra = f", {form.keywords}" if form.keywords else ""
    if plan.optimizer == "adamw":
        extra = f', fused={device}.type in ("cuda", "cpu")'
    return f"{form.make}({parameters}, lr=lr{extra})"


def chunked_loss_code() -> list[str]:
    """The lines of a ``compute_loss(model, micro)`` for ``loss="chunked"`` (what :mod:`memlab.techniques.loss`
    does), for the plain code and the accelerate script.

    Example:
        >>> chunked_loss_code()[-1]
        '    return total / (labels != -100).sum()'
    """
    return [
        "def chunk_loss(head, hidden, labels):",
        "    logits = head(hidden).float()",
        '    return torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")',
        "",
        "",
        "def compute_loss(model, micro):",
        f"    # Chunked cross-entropy: the LM head and the loss over {CHUNKS} chunks of tokens, each checkpointed,",
        "    # so that only one chunk's logits exist at a time (backward recomputes them); the same loss as",
        "    # model(**micro).loss.",
        '    inner = model.get_base_model() if hasattr(model, "peft_config") else model  # under peft adapters',
        '    inputs = {k: v for k, v in micro.items() if k != "labels"}',
        "    hidden = inner.base_model(**inputs).last_hidden_state",
        '    labels = torch.nn.functional.pad(micro["labels"], (0, 1), value=-100)[..., 1:]  # shifted by one',
        "    hidden, labels = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)",
        f"    size = -(-labels.shape[0] // {CHUNKS})",
        "    head = inner.get_output_embeddings()",
        "    total = sum(",
        "        checkpoint(chunk_loss, head, h, y, use_reentrant=False)",
        "        for h, y in zip(hidden.split(size), labels.split(size))",
        "    )",
        "    return total / (labels != -100).sum()",
    ]


def _model_changes_code(plan: Plan) -> list[str]:
    """The snippet's lines that change the model itself: pure bf16 weights and LoRA / QLoRA adapters."""
    lines: list[str] = []
    if plan.adapter == "qlora":
        compute = f"torch.{qlora_compute_dtype(plan)}"
        lines += [
            "# QLoRA: the base's linear weights in 4-bit NF4. Load the model with this quantization config, e.g.",
            "#   from transformers import AutoModelForCausalLM, BitsAndBytesConfig",
            "#   quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4',",
            f"#                                     bnb_4bit_compute_dtype={compute})",
            "#   model = AutoModelForCausalLM.from_pretrained(name, quantization_config=quantization)",
        ]
    if plan.weights == "bf16":
        lines += ["# Pure bf16: weights, gradients and optimizer state in bf16 (no fp32 master copy)",
                  "model = model.to(torch.bfloat16)"]
    if plan.adapter != "none":
        lines += [
            "# LoRA adapters on every linear layer but the output head; only the adapters train",
            "from peft import LoraConfig, get_peft_model",
            "",
            f"model = get_peft_model(model, {lora_config_code(plan)})",
        ]
    return [*lines, ""] if lines else []


def lora_config_code(plan: Plan, **extra: Any) -> str:
    """The ``LoraConfig(...)`` of an adapter plan as code (:func:`memlab.techniques.levers_model.lora_settings`,
    plus ``extra`` keywords).

    Example:
        >>> lora_config_code(Plan(adapter="lora", lora_rank=4))
        "LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules='all-linear')"
    """
    settings = {**lora_settings(plan), **extra}
    return "LoraConfig(" + ", ".join(f"{key}={value!r}" for key, value in settings.items()) + ")"


def peft_config(plan: Plan, model: Any = None) -> Any:
    """The ``peft.LoraConfig`` of an adapter plan: rank ``plan.lora_rank``, alpha twice the rank, no dropout, on
    the plan's ``lora_targets``.

    With ``model`` (the model the config is for), ``target_modules`` is the list of layers memlab adapts when it
    measures (:func:`memlab.techniques.adapters.adapter_targets`), resolved from the model: for ``"all-linear"``
    every ``nn.Linear`` and ``Conv1D`` but the output head, or, for a model without output embeddings, its last
    linear layer (a classifier head). Without a model it stays ``"all-linear"``, which peft resolves itself to
    every ``nn.Linear`` and ``Conv1D`` but a transformers model's output embeddings: on a model without them (a
    sequence classifier) peft also adapts the classifier head, which memlab did not measure; pass ``model=`` to
    export exactly what was measured.

    For QLoRA, load the base in 4-bit too: ``from_pretrained(name, quantization_config=BitsAndBytesConfig(
    load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16))`` (see
    :func:`pytorch_code`).

    Example:
        >>> config = peft_config(Plan(adapter="lora", lora_rank=8))
        >>> config.r, config.lora_alpha, config.target_modules
        (8, 16, 'all-linear')
        >>> from torch import nn
        >>> peft_config(Plan(adapter="lora"), model=nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))).target_modules
        {'0'}
    """
    if plan.adapter == "none":
        raise MemlabError(
            f"{plan.label()!r} trains every weight and has no adapters; a peft config needs adapter='lora' or 'qlora'"
        )
    refuse_unless_carried(plan, "peft", "a peft LoraConfig")
    from peft import LoraConfig

    settings = lora_settings(plan)
    if model is not None:
        from torch import nn  # imported here: a plan's exports stay light without a model

        if not isinstance(model, nn.Module):
            raise MemlabError(f"model must be the torch nn.Module the config is for, not {type(model).__name__}")
        from memlab.techniques.targets import adapter_targets  # imported here: it needs torch

        settings["target_modules"] = adapter_targets(model, plan.lora_targets)
    return LoraConfig(**settings)
