"""Take a plan elsewhere: ``TrainingArguments`` keywords, a DeepSpeed config, a plain PyTorch loop, a peft config.

``Plan.to_training_arguments()``, ``Plan.to_deepspeed()``, ``Plan.to_code()`` and ``Plan.to_peft_config()`` call
these functions. Each assembles the fragments the levers declare (:mod:`memlab.techniques.core.fragments`, in
:data:`memlab.techniques.core.registry.REGISTRY`'s order) and names no lever: a lever's export is its declaration.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

from memlab.errors import MemlabError, warn_the_caller
from memlab.live.quiet import quiet
from memlab.plan import PLAN_FIELDS, Plan
from memlab.techniques.core.fragments import (
    THE_DEEPSPEED_CONFIG,
    Accelerate,
    Code,
    Elsewhere,
    InLoraConfig,
    Keys,
    Lora,
    merge_keys,
)
from memlab.techniques.core.registry import REGISTRY, refusals

__all__ = ["assembled_code", "assembled_keys", "deepspeed_config", "elsewhere_notes", "peft_config", "pytorch_code",
           "refuse_unless_carried", "training_arguments"]


def assembled_keys(
    plan: Plan, target: str, into: Mapping[str, Any] | None = None, *, legacy: bool = False
) -> dict[str, Any]:
    """The dict export ``target`` makes of ``plan``: ``into`` with every lever's :class:`Keys` merged in (their
    ``legacy`` keys with ``legacy=True``: transformers before 5).

    Example:
        >>> assembled_keys(Plan(accumulation=4), "deepspeed")["gradient_accumulation_steps"]
        4
    """
    made = dict(into or {})
    for lever in REGISTRY.values():
        fragment = lever.fragment(plan, target)
        if isinstance(fragment, Keys):
            keys = fragment.legacy if legacy and fragment.legacy is not None else fragment.keys
            if isinstance(keys, str):
                raise MemlabError(f"{plan.label()!r}: {keys}")
            made = merge_keys(made, keys)
    return made


def elsewhere_notes(plan: Plan, target: str) -> list[str]:
    """Where the levers that ``target`` is not the place for go instead (each lever's :class:`Elsewhere` note).

    Example:
        >>> elsewhere_notes(Plan(loss="chunked"), "deepspeed")[0][:32]
        'the chunked loss is not a DeepSp'
    """
    notes = []
    for lever in REGISTRY.values():
        fragment = lever.fragment(plan, target)
        if isinstance(fragment, Elsewhere) and fragment.note and fragment.note not in notes:
            notes.append(fragment.note)
    return notes


def assembled_code(plan: Plan, target: str, strategy: str = "") -> Code:
    """Every lever's script lines for ``target`` (``"code"``, or ``"accelerate"`` with its ``strategy``), slot by
    slot in the registry's order.

    Example:
        >>> assembled_code(Plan(accumulation=4), "code").settings
        ('accumulation = 4',)
    """
    code = Code()
    for lever in REGISTRY.values():
        fragment = lever.fragment(plan, target)
        if isinstance(fragment, Accelerate):
            code += fragment.lines(strategy)
        elif isinstance(fragment, Code):
            code += fragment
    return code


def refuse_unless_carried(plan: Plan, target: str, what: str) -> None:
    """Raise :class:`MemlabError` when the export ``target`` (see :data:`memlab.techniques.core.lever.TARGETS`) cannot
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

    - where a lever goes elsewhere (the allocator's expandable segments: the environment before CUDA starts; the
      attention implementation: ``from_pretrained``), a :class:`~memlab.errors.MemlabWarning` says where, with the
      line to write.

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
    kwargs = assembled_keys(plan, "trainer", legacy=legacy_names)
    for note in elsewhere_notes(plan, "trainer"):
        warn_the_caller(f"{plan.label()!r}: {note}")
    for name, value in kwargs.items():
        if value == THE_DEEPSPEED_CONFIG:
            kwargs[name] = deepspeed_config(plan)
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
    config = assembled_keys(plan, "deepspeed", {"zero_optimization": {"stage": 2}})
    notes = [*([config.pop("_comment")] if "_comment" in config else []), *elsewhere_notes(plan, "deepspeed")]
    if notes:
        config["_comment"] = "; ".join(notes)
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
    code = assembled_code(plan, "code")
    fields = ", ".join(f"{name}={getattr(plan, name)!r}" for name in PLAN_FIELDS)
    lines: list[str] = [
        f"# memlab plan {plan.label()!r}",
        f"#   {fields}",
        "# Needs `model` (a torch.nn.Module on its device) and `batches` (an iterable of dicts of tensors,",
        "# dimension 0 = rows).",
        *code.environment,
        "import torch",
        *code.imports,
        "",
        "lr = 1e-5",
        "device = next(model.parameters()).device",
        *code.settings,
        "model.train()",
        *loss_and_optimizer(code, [*code.model, ""] if code.model else []),
        "",
        "",
    ]
    for line in code.loop:
        indent = line[: len(line) - len(line.lstrip())]
        word, _, divisor = line.strip().partition(" ")
        if word == "FORWARD":
            lines += forward_backward(code, indent, f"compute_loss(model, micro) / {divisor}", "loss.backward()")
        elif word == "STEP":
            lines += optimizer_step(code, indent, "optimizer.zero_grad(set_to_none=True)")
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


DEFAULT_LOSS = ("def compute_loss(model, micro):", "    return model(**micro).loss")
"""The ``compute_loss`` of a script whose levers write none: the model's own loss."""


def optimizer_of(code: Code) -> str:
    """The optimizer expression of assembled ``code``, over its ``params`` on ``device`` (or what a lever builds it
    over instead).

    Example:
        >>> optimizer_of(Code(optimizer="torch.optim.SGD({params}, lr=lr)"))
        'torch.optim.SGD(params, lr=lr)'
    """
    params, device = code.optimizer_over
    return code.optimizer.format(params=params or "params", device=device or "device")


def loss_and_optimizer(code: Code, model: Sequence[str] = ()) -> list[str]:
    """A script's loss function (the levers', or the model's own) and its optimizer over the trained parameters,
    with ``model``'s lines between them: the middle of the plain PyTorch code and of the accelerate script.

    Example:
        >>> loss_and_optimizer(Code(optimizer="torch.optim.SGD({params}, lr=lr)"))[2:4]
        ['def compute_loss(model, micro):', '    return model(**micro).loss']
        >>> loss_and_optimizer(Code(optimizer="torch.optim.SGD({params}, lr=lr)"))[-1]
        'optimizer = torch.optim.SGD(params, lr=lr)'
    """
    return [
        "",
        "",
        *(code.loss or DEFAULT_LOSS),
        "",
        "",
        *model,
        "params = [p for p in model.parameters() if p.requires_grad]",
        *code.before_optimizer,
        f"optimizer = {optimizer_of(code)}",
        *code.after_optimizer,
    ]


def forward_backward(code: Code, indent: str, loss: str, backward: str) -> list[str]:
    """The forward (in ``code``'s contexts) and backward of one micro-batch, at ``indent``.

    Example:
        >>> forward_backward(Code(contexts=("torch.no_grad()",)), "", "f()", "loss.backward()")
        ['with torch.no_grad():', '    loss = f()', 'loss.backward()']
    """
    body = []
    if code.contexts:
        body += [f"{indent}with {', '.join(code.contexts)}:", f"{indent}    loss = {loss}"]
    else:
        body.append(f"{indent}loss = {loss}")
    body.append(indent + (code.backward or backward))
    return body


def optimizer_step(code: Code, indent: str, zero_grad: str) -> list[str]:
    """The optimizer step of ``code``, at ``indent``: its lines before, the step, ``zero_grad``, its lines after.

    Example:
        >>> optimizer_step(Code(), "    ", "optimizer.zero_grad()")
        ['    optimizer.step()', '    optimizer.zero_grad()']
    """
    body = [*code.before_step, *(code.step or ("optimizer.step()",)), zero_grad, *code.after_step]
    return [indent + line if line else line for line in body]


def peft_config(plan: Plan, model: Any = None) -> Any:
    """The ``peft.LoraConfig`` of an adapter plan (:func:`memlab.techniques.adapters.lora_settings`): rank
    ``plan.lora_rank``, alpha ``plan.lora_alpha`` (None: twice the rank), dropout ``plan.lora_dropout``, on the
    plan's ``lora_targets``.

    Without a model the config means, under peft's own rules, what memlab measured on a transformers model:
    ``"all-linear"`` (every ``nn.Linear`` and ``Conv1D`` but the output embeddings) and ``modules_to_save``
    naming a task model's new head (``classifier``, ``score``, ``qa_outputs``), which peft then trains whole
    instead of adapting it. With ``model`` (the model the config is for), ``target_modules`` is the list of
    layers memlab adapts on it (:func:`memlab.techniques.targets.lora_targets_on`) and ``modules_to_save`` its
    head, if any: the same layers, written out. A model with neither head (a base model, a plain ``nn.Module``,
    whose last linear layer memlab leaves out) and DistilBERT (whose ``pre_classifier`` peft's name matching takes
    for the head too) need ``model=``.

    For QLoRA, load the base in 4-bit too: ``from_pretrained(name, quantization_config=BitsAndBytesConfig(
    load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16))`` (see
    :func:`pytorch_code`).

    Example:
        >>> config = peft_config(Plan(adapter="lora", lora_rank=8))
        >>> config.r, config.lora_alpha, config.target_modules
        (8, 16, 'all-linear')
        >>> from torch import nn
        >>> mlp = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
        >>> sorted(peft_config(Plan(adapter="lora"), model=mlp).target_modules)
        ['0']
    """
    refuse_unless_carried(plan, "peft", "a peft LoraConfig")
    settings: dict[str, Any] = {}
    written: list[str] = []
    for lever in REGISTRY.values():
        fragment = lever.fragment(plan, "peft")
        if isinstance(fragment, Lora):
            settings.update(fragment.settings(model))
        elif isinstance(fragment, InLoraConfig):
            written.append(fragment.keyword)
    if not settings:  # no lever writes a LoraConfig: where the plan's levers go instead says why
        raise MemlabError("; ".join(elsewhere_notes(plan, "peft")) or f"{plan.label()!r} has no adapters")
    missing = [keyword for keyword in written if keyword not in settings]
    assert not missing, f"levers declared inside the LoraConfig that no adapter writes: {missing}"
    with quiet():  # memlab's import of peft (and of bitsandbytes with it) says nothing in the cell: no result changes
        from peft import LoraConfig

    return LoraConfig(**settings)
