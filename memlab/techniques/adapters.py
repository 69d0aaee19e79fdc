"""LoRA and QLoRA adapters through peft: train small low-rank adapters on a frozen base, its linear weights in 4-bit
NF4 (bitsandbytes) for QLoRA. Attached for a plan and taken off again with nothing left behind.

The adapter levers are whole here: the technique (:data:`ADAPTERS`), the declarations of ``adapter``, ``lora_rank``,
``lora_targets``, ``lora_alpha`` and ``lora_dropout`` (:data:`DECLARATIONS`, in the registry's order), what a peft
model carries of them, and :func:`lora_settings`, the one place every ``LoraConfig``, measured or exported, is
made."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from memlab.errors import MemlabError, UnsupportedTechnique
from memlab.live.device import model_device
from memlab.live.structure import ModuleStructure
from memlab.techniques.core.fragments import (
    TARGETS,
    Accelerate,
    Code,
    Elsewhere,
    Export,
    Fragment,
    InLoraConfig,
    Keys,
    Lora,
)
from memlab.techniques.core.lever import Lever, PlanLike
from memlab.techniques.core.technique import PlanFields, StepParts, Technique, Undo
from memlab.techniques.targets import adapter_targets as adapter_targets  # re-exported: callers import them here
from memlab.techniques.targets import lora_layer_types as lora_layer_types
from memlab.techniques.targets import output_head as output_head
from memlab.techniques.targets import targets_as_planned, task_heads


def is_peft_model(model: nn.Module) -> bool:
    """True when the model already carries peft adapters (a ``PeftModel`` or layers peft injected).

    Example:
        >>> is_peft_model(nn.Linear(2, 2))
        False
    """
    if hasattr(model, "peft_config"):
        return True
    return any(type(module).__module__.startswith("peft.") for module in model.modules())


def carried_settings(model: nn.Module) -> str:
    """The LoRA settings a peft model carries, as plan keywords (``lora_rank=8, lora_alpha=16.0``); empty for a model
    without a ``peft_config``.

    Example:
        >>> carried_settings(nn.Linear(2, 2))
        ''
    """
    configs = getattr(model, "peft_config", None)
    config = next(iter(configs.values()), None) if isinstance(configs, dict) and configs else None
    if config is None:
        return ""
    values = peft_plan_values(model, config)
    return ", ".join(f"{name}={value!r}" for name, value in values.items() if value is not None)


def peft_plan_values(model: nn.Module, config: Any) -> dict[str, Any]:
    """The plan's LoRA settings a peft ``config`` on ``model`` says (each lever's ``from_peft``; None where the plan
    keeps its default), its targets named ``"all-linear"`` where they are every layer that adapts on this model:
    peft stores ``target_modules="all-linear"`` resolved into the layers' paths, which a plan's label would list
    one by one.

    Example:
        >>> from types import SimpleNamespace
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        >>> config = SimpleNamespace(r=4, lora_alpha=8, lora_dropout=0.0, target_modules={"0"})
        >>> peft_plan_values(model, config)["lora_targets"]
        'all-linear'
    """
    values = {lever.name: lever.from_peft(config) for lever in DECLARATIONS if lever.from_peft is not None}
    values["lora_targets"] = targets_as_planned(model, values.get("lora_targets"))
    return values


def lora_config_of(model: nn.Module) -> Any:
    """The ``LoraConfig`` a peft model trains with (its first adapter's), or None for a model without one.

    Example:
        >>> lora_config_of(nn.Linear(2, 2)) is None
        True
    """
    configs = getattr(model, "peft_config", None)
    config = next(iter(configs.values()), None) if isinstance(configs, dict) and configs else None
    return config if isinstance(getattr(config, "r", None), int) else None


def adapter_of(model: nn.Module) -> str | None:
    """The adapter a peft model trains: ``"qlora"`` on a 4-bit base, ``"lora"`` on any other; None without one.

    Example:
        >>> adapter_of(nn.Linear(2, 2)) is None
        True
    """
    if lora_config_of(model) is None:
        return None
    base = getattr(model, "base_model", None)
    quantized = getattr(model, "is_loaded_in_4bit", False) or getattr(base, "is_loaded_in_4bit", False)
    return "qlora" if quantized else "lora"


def carries_plan_adapters(model: nn.Module, plan: PlanFields) -> bool:
    """True when the model is a peft model whose ``LoraConfig`` is the plan's adapter settings (each lever's
    ``from_peft``): its adapters are then what the plan trains, and nothing is put on.

    Example:
        >>> from memlab.plan import Plan
        >>> carries_plan_adapters(nn.Linear(2, 2), Plan(adapter="lora"))
        False
    """
    configs = getattr(model, "peft_config", None)
    config = next(iter(configs.values()), None) if isinstance(configs, dict) and configs else None
    if plan.adapter == "none" or config is None or not isinstance(getattr(config, "r", None), int):
        return False
    for name, value in peft_plan_values(model, config).items():
        asked = getattr(plan, name)
        if value is not None and (targets_as_planned(model, asked) if name == "lora_targets" else asked) != value:
            return False
    return True


def quantized_targets(model: nn.Module, skip_modules: Sequence[str] | None = None) -> list[str]:
    """The layers a bitsandbytes 4-bit or 8-bit load holds quantized, as transformers' bitsandbytes integration
    chooses them (``replace_with_bnb_linear``): every ``nn.Linear`` (exact ones only under transformers 5:
    :func:`bitsandbytes_replaces`) and GPT-2-style ``Conv1D``, but the modules of
    its ``get_modules_to_not_convert`` (the output head, the tied and the last modules: ``get_keys_to_not_convert``;
    ``skip_modules``, the config's ``llm_int8_skip_modules``, which replace those when given; the model's
    ``_keep_in_fp32_modules``, such as T5's ``wo``), matched as transformers matches them. QLoRA holds these in 4-bit
    whatever ``lora_targets`` adapts, as 4-bit loading does. A model that is not a transformers model keeps its
    output head (``get_output_embeddings()``, else its last linear layer) and ``skip_modules`` out.

    Example:
        >>> from transformers import T5Config, T5ForConditionalGeneration
        >>> t5 = T5ForConditionalGeneration(T5Config(d_model=16, d_ff=32, d_kv=8, num_layers=1, num_heads=2,
        ...                                          vocab_size=32))
        >>> [name for name in quantized_targets(t5) if "DenseReluDense" in name]
        ['encoder.block.0.layer.1.DenseReluDense.wi', 'decoder.block.0.layer.2.DenseReluDense.wi']
        >>> quantized_targets(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1)))
        ['0']
    """
    layers = [name for name, m in model.named_modules() if name and bitsandbytes_replaces(m)]
    skip = None if skip_modules is None else list(skip_modules)
    keep = list(getattr(model, "_keep_in_fp32_modules", None) or ())
    try:  # transformers 5's own choice
        from transformers.quantizers.base import HfQuantizer
        from transformers.quantizers.quantizers_utils import should_convert_module

        not_converted = HfQuantizer.get_modules_to_not_convert(model, skip, keep)  # type: ignore[arg-type]
        return [name for name in layers if should_convert_module(name, not_converted)]
    except (ImportError, AttributeError, TypeError, IndexError):  # an older transformers, or not its model
        pass
    if skip is None:
        head = output_head(model)
        skip = [n for n in layers if model.get_submodule(n) is head] if head is not None else layers[-1:]
    not_converted = [*skip, *keep]
    return [name for name in layers
            if not any(name == key or name.endswith(f".{key}") or f".{key}." in f".{name}." for key in not_converted)]


def qlora_targets(model: nn.Module) -> list[str]:
    """The layers QLoRA holds in 4-bit: :func:`quantized_targets` less the task heads LoRA trains whole
    (:func:`memlab.techniques.targets.task_heads`, peft's ``modules_to_save``: BERT's ``classifier``), which a 4-bit
    layer cannot train (its weight is ``uint8``: peft's ``requires_grad_`` on it fails). A 4-bit load of a classifier
    does the same with ``llm_int8_skip_modules`` naming them beside transformers' own (:func:`qlora_skip_modules`).

    Example:
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> bert = BertForSequenceClassification(BertConfig(hidden_size=16, num_hidden_layers=1,
        ...                                                 num_attention_heads=2, intermediate_size=32))
        >>> "classifier" in quantized_targets(bert), "classifier" in qlora_targets(bert)
        (True, False)
    """
    return quantized_targets(model, qlora_skip_modules(model))


def qlora_skip_modules(model: nn.Module) -> list[str] | None:
    """The ``llm_int8_skip_modules`` a QLoRA load of ``model`` needs: None (transformers' own choice) where LoRA
    trains no task head whole; else the modules transformers keeps out by default and the heads.

    Example:
        >>> qlora_skip_modules(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))) is None
        True
    """
    heads = task_heads(model)
    if not heads:
        return None
    try:
        from transformers.quantizers.base import HfQuantizer

        default = list(HfQuantizer.get_modules_to_not_convert(model, None, None))  # type: ignore[arg-type]
    except (ImportError, AttributeError, TypeError, IndexError):  # an older transformers, or not its model
        head = output_head(model)
        default = [n for n, m in model.named_modules() if head is not None and m is head]
    return sorted({*default, *heads})


def bitsandbytes_replaces(module: nn.Module) -> bool:
    """Whether transformers' bitsandbytes load (``replace_with_bnb_linear``) would replace ``module`` were it not
    kept out by name: a GPT-2-style ``Conv1D``, and an ``nn.Linear`` as the installed transformers matches it:
    transformers 5 replaces exact ``nn.Linear`` layers only (``type(module) is nn.Linear``: Falcon's ``FalconLinear``
    stays in full precision, and the load warns that no linear modules were found), transformers 4 every
    ``isinstance(module, nn.Linear)``, subclasses included.

    Example:
        >>> bitsandbytes_replaces(nn.Linear(2, 2)), bitsandbytes_replaces(nn.Conv1d(2, 2, 1))
        (True, False)
    """
    from transformers.pytorch_utils import Conv1D

    if isinstance(module, Conv1D):
        return True
    return type(module) is nn.Linear if _exact_linear_only() else isinstance(module, nn.Linear)


@functools.cache
def _exact_linear_only() -> bool:
    """Whether the installed transformers' bitsandbytes integration replaces exact ``nn.Linear`` layers only (5 and
    later), not their subclasses (4)."""
    import transformers

    return int(transformers.__version__.split(".")[0]) >= 5


def attach_adapter(model: nn.Module, plan: PlanFields) -> Undo | None:
    """Put the plan's adapters on the live model; the returned function takes them off again exactly.

    LoRA: ``peft.inject_adapter_in_model`` with the plan's ``LoraConfig`` on this model
    (:func:`lora_settings` with the model: the layers of :func:`adapter_targets`,
    fused experts, a task head trained whole), the very keywords ``plan.to_peft_config(model)`` writes; peft
    freezes everything but what they train. QLoRA: first the weight of each of
    :func:`qlora_targets` (the whole base, as 4-bit loading does, not only the adapted layers; a task head LoRA
    trains whole stays in full precision) is quantized to
    NF4 in a ``bitsandbytes.nn.Linear4bit`` that takes its place, and on CUDA the full-precision originals wait
    in host memory (their size in host RAM, and a copy each way) so that the device holds only the
    4-bit base while the plan runs. peft's ``prepare_model_for_kbit_training`` also enables input gradients for
    reentrant checkpointing; memlab checkpoints with ``use_reentrant=False``, which needs none.

    Example:
        >>> from memlab.plan import Plan
        >>> model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
        >>> undo = attach_adapter(model, Plan(adapter="lora", lora_rank=2))
        >>> sorted(n for n, p in model.named_parameters() if p.requires_grad)
        ['0.lora_A.default.weight', '0.lora_B.default.weight']
        >>> undo(); type(model[0]).__name__
        'Linear'
    """
    if plan.adapter == "none" or carries_plan_adapters(model, plan):
        return None  # a user's peft model: its own adapters are what trains, measured as they are
    if is_peft_model(model):
        raise UnsupportedTechnique(
            "this model already carries peft adapters, and they are what trains; measure its own settings "
            f"({carried_settings(model)}), or build another rank or targets on the base model "
            "(peft_model.get_base_model() before get_peft_model) and measure that"
        )

    settings = lora_settings(plan, model)  # what the export writes too
    if not settings["target_modules"] and not settings.get("target_parameters"):
        raise UnsupportedTechnique(
            f"adapter={plan.adapter!r} puts LoRA on linear layers (nn.Linear, Conv1D), and "
            f"lora_targets={plan.lora_targets!r} finds none in this model besides its output; write other "
            "lora_targets, or adapter='none'"
        )
    # Imported here: peft and bitsandbytes are heavy, and `import memlab` must not pull them in.
    from peft import LoraConfig, inject_adapter_in_model

    structure = ModuleStructure.capture(model)
    parked: list[tuple[torch.Tensor, torch.device]] = []
    try:
        if plan.adapter == "qlora":
            parked = _quantize(model, qlora_targets(model), compute_dtype(plan))
        inject_adapter_in_model(LoraConfig(**settings), model)
        if plan.weights != "bf16":
            _adapters_in_fp32(model)
    except BaseException:
        _put_back(structure, parked)
        raise

    def undo() -> None:
        _put_back(structure, parked)
        parked.clear()

    return undo


def _adapters_in_fp32(model: nn.Module) -> None:
    """Hold half-precision adapter weights in fp32, as ``peft.get_peft_model`` does by default
    (``autocast_adapter_dtype=True``); the injection API leaves QLoRA's adapters in the base's compute dtype, and
    the H100 run showed QLoRA then keeping half the optimizer state of the same LoRA."""
    for parameter in model.parameters():
        if parameter.requires_grad and parameter.dtype in (torch.bfloat16, torch.float16):
            # Tensor.to, not .float(): a dry run follows adapters built for a GPU through it (dryrun/adapters.py).
            parameter.data = parameter.data.to(torch.float32)


def _put_back(structure: ModuleStructure, parked: list[tuple[torch.Tensor, torch.device]]) -> None:
    structure.restore()
    for weight, device in parked:
        weight.data = weight.data.to(device)


def compute_dtype(plan: PlanFields) -> torch.dtype:
    """The dtype a QLoRA base computes in: the plan's half precision (autocast or pure bf16), else fp32.

    Example:
        >>> from memlab.plan import Plan
        >>> compute_dtype(Plan(adapter="qlora", precision="bf16"))
        torch.bfloat16
    """
    if plan.precision == "bf16" or plan.weights == "bf16":
        return torch.bfloat16
    if plan.precision == "fp16":
        return torch.float16
    return torch.float32


def _quantize(
    model: nn.Module, targets: list[str], compute_dtype: torch.dtype
) -> list[tuple[torch.Tensor, torch.device]]:
    """Replace each target ``nn.Linear`` (or GPT-2-style ``Conv1D``, whose weight is the transpose) by an NF4
    ``Linear4bit`` holding the same weight, as transformers' 4-bit load does; on CUDA the originals' weights move to
    host memory. Returns ``(weight, its device)`` for each moved weight, to put back."""
    import bitsandbytes

    device = model_device(model)
    parked: list[tuple[torch.Tensor, torch.device]] = []
    for name in targets:
        original = model.get_submodule(name)
        held: Any = original.weight  # nn.Linear's or Conv1D's weight
        if held.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise MemlabError(f"{name} holds {held.dtype} weights; QLoRA quantizes float weights only")
        values = held.data.detach()
        if not isinstance(original, nn.Linear):  # Conv1D holds (in, out)
            values = values.t()
        quantized = bitsandbytes.nn.Linear4bit(
            values.shape[1], values.shape[0], bias=False, compute_dtype=compute_dtype, quant_type="nf4",
            device="meta",
        )
        weight: Any = bitsandbytes.nn.Params4bit(values.contiguous().clone(), requires_grad=False, quant_type="nf4")
        quantized.weight = weight.to(device)  # moving it quantizes it (bitsandbytes' Params4bit.to)
        quantized.support_avx512bf16_for_cpu = False  # CPU_REPACKING_OFF says why
        quantized.bias = original.bias  # type: ignore[assignment]  # the same frozen bias, shared
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, quantized)
        if device.type != "cpu":
            parked.append((held, held.device))
            held.data = held.data.to("cpu")
    return parked


def adapter_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """What an adapter plan trains on ``model``, by name, as it is now: the LoRA adapters (names with ``lora_``)
    and the trained copies of the task heads peft trains whole (``modules_to_save``).

    Example:
        >>> from memlab.plan import Plan
        >>> model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
        >>> undo = attach_adapter(model, Plan(adapter="lora", lora_rank=2))
        >>> sorted(adapter_parameters(model)), undo()
        (['0.lora_A.default.weight', '0.lora_B.default.weight'], None)
    """
    return {name: p for name, p in model.named_parameters() if "lora_" in name or ".modules_to_save." in name}


def adapter_deltas(model: nn.Module) -> dict[str, torch.Tensor]:
    """What each LoRA layer on ``model`` adds to its base weight (peft's ``get_delta_weight``: ``B @ A * scaling``,
    in the base weight's layout), by the name of the base parameter it adds to (``0.weight``; a fused expert's
    ``...experts.gate_up_proj``, under the names the model has without adapters).

    Example:
        >>> from memlab.plan import Plan
        >>> model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
        >>> undo = attach_adapter(model, Plan(adapter="lora", lora_rank=2))
        >>> {name: tuple(delta.shape) for name, delta in adapter_deltas(model).items()}, undo()
        ({'0.weight': (8, 8)}, None)
    """
    from peft.tuners.lora import LoraLayer

    deltas: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            layer: Any = module  # each LoRA layer class defines get_delta_weight
            owner = ".".join(part for part in name.split(".") if part != "base_layer")
            key = f"{owner}.{getattr(layer, 'parameter_name', 'weight')}".lstrip(".")
            with torch.no_grad():
                for adapter in layer.active_adapters:
                    delta = layer.get_delta_weight(adapter)
                    deltas[key] = delta if key not in deltas else deltas[key] + delta
    return deltas


def trained_heads(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trained values of the task heads peft trains whole (``modules_to_save``) on ``model``, by the name of
    the head's parameter on the model without adapters.

    Example:
        >>> trained_heads(nn.Linear(2, 2))
        {}
    """
    prefix = ".modules_to_save."
    heads: dict[str, torch.Tensor] = {}
    for name, parameter in model.named_parameters():
        if prefix in name:
            owner, _, rest = name.partition(prefix)
            heads[f"{owner}.{rest.partition('.')[2]}"] = parameter.detach().clone()
    return heads


def merge_deltas(
    model: nn.Module, deltas: dict[str, torch.Tensor], heads: dict[str, torch.Tensor] | None = None
) -> None:
    """Add :func:`adapter_deltas` into ``model``'s parameters of the same names (a model the adapters were taken
    off; a GPT-2 ``Conv1D`` holds its weight transposed), and copy :func:`trained_heads` into its heads.

    Example:
        >>> model = nn.Linear(2, 2, bias=False)
        >>> with torch.no_grad():
        ...     _ = model.weight.zero_()
        >>> merge_deltas(model, {"weight": torch.ones(2, 2)}); model.weight.sum().item()
        4.0
    """
    with torch.no_grad():
        for name, delta in deltas.items():
            weight = model.get_parameter(name)
            if delta.shape != weight.shape:
                delta = delta.transpose(-2, -1)
            weight.add_(delta.to(weight.device, weight.dtype))
        for name, value in (heads or {}).items():
            model.get_parameter(name).copy_(value)


def reattach_adapters(model: nn.Module, plan: PlanFields, trained: dict[str, torch.Tensor]) -> None:
    """Put LoRA adapters of ``plan`` on ``model`` (peft's injection: only what the plan trains is trainable)
    holding the ``trained`` values of :func:`adapter_parameters`; a QLoRA plan's adapters go on the full-precision
    base.

    Example:
        >>> from memlab.plan import Plan
        >>> model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
        >>> undo = attach_adapter(model, Plan(adapter="lora", lora_rank=2))
        >>> trained = {name: p.detach().clone() for name, p in adapter_parameters(model).items()}
        >>> undo(); reattach_adapters(model, Plan(adapter="lora", lora_rank=2), trained)
        >>> sorted(adapter_parameters(model)) == sorted(trained)
        True
    """
    from peft import LoraConfig, inject_adapter_in_model


    inject_adapter_in_model(LoraConfig(**lora_settings(plan, model)), model)
    with torch.no_grad():
        for name, parameter in adapter_parameters(model).items():
            parameter.data = trained[name].detach().to(parameter.device).clone()


def carried_space(model: nn.Module, plan: PlanFields) -> dict[str, list[Any]]:
    """Where ``model`` is a peft model that carries ``plan``'s adapters: each adapter lever pinned to the plan's value
    (a search over a trainer keeps the adapters its model already has, and its plans say so); else empty.

    Example:
        >>> from memlab.plan import Plan
        >>> carried_space(nn.Linear(2, 2), Plan(adapter="lora"))
        {}
    """
    if plan.adapter == "none" or not carries_plan_adapters(model, plan):
        return {}
    return {lever.name: [getattr(plan, lever.name)] for lever in DECLARATIONS}


class Adapters(Technique):
    """``adapter`` (and the settings of its ``LoraConfig``: ``lora_rank``, ``lora_targets``, ...): LoRA / QLoRA
    adapters on the model, first of the model changes, since they decide which weights train.

    Example:
        >>> from torch import nn
        >>> from memlab.plan import Plan
        >>> from memlab.techniques.core.technique import StepParts
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        >>> undo = ADAPTERS.put_on(StepParts(model, Plan(adapter="lora", lora_rank=2), torch.device("cpu")))
        >>> sorted(adapter_parameters(model))[0]
        '0.lora_A.default.weight'
        >>> undo()
    """

    def put_on(self, parts: StepParts) -> Undo | None:
        return attach_adapter(parts.model, parts.plan)

    def trains_model_weights(self, model: nn.Module, plan: PlanFields) -> bool:
        # Adapters put on train only their own new weights; a peft model's own adapters are the model's.
        return bool(plan.adapter == "none" or carries_plan_adapters(model, plan))


ADAPTERS = Adapters()


# --- the adapter levers: their declarations, and the LoraConfig every one of them is a keyword of ------------

ADAPTER_KINDS = ("none", "lora", "qlora")
"""Every ``adapter`` value (its choices), which other modules ask instead of spelling them (:func:`with_adapter`
asks whether a plan trains any)."""

LORA_RANK_DEFAULT = 16
"""The adapters' rank when none is given (and the rank of every plan without an adapter)."""


def lora_settings(plan: PlanLike, model: Any = None) -> dict[str, Any]:
    """The ``peft.LoraConfig`` keywords memlab measures an adapter plan with: rank ``plan.lora_rank``, alpha
    ``plan.lora_alpha`` (None: twice the rank), dropout ``plan.lora_dropout`` on the adapters' input, on the plan's
    ``lora_targets``: every linear layer but the output head (``target_modules="all-linear"``), peft's default layers
    for the model's type (``None``: q and v projections for Llama-style models), or the names given (a list);
    ``modules_to_save`` names the new heads of task models (``classifier``, ``score``, ``qa_outputs``), so that on
    a sequence classifier peft trains the head whole and adapts it not, as memlab measures it (peft matches
    the ends of module names: on a model without such a head they match nothing). peft resolves this config on a
    transformers model with an output head or a task head to what
    :func:`memlab.techniques.targets.lora_targets_on` measures; a model with neither (a base model, a plain
    ``nn.Module``, where memlab leaves the last linear layer out as the head) and DistilBERT (whose
    ``pre_classifier`` peft's name matching takes for the head) need ``model=``.

    With ``model``, the targets are what LoRA trains on it, computed once
    (:func:`memlab.techniques.targets.lora_targets_on`): ``target_modules`` the list of layers, and where the model
    has them, ``target_parameters`` (fused MoE experts, with peft's ``rank_pattern``/``alpha_pattern``) and
    ``modules_to_save`` (a task model's new head, trained whole). The adapter's technique injects exactly these
    keywords, and every export writes an adapter's ``LoraConfig`` from here (a lever of the LoraConfig extends this
    function and declares :func:`in_lora_config`).

    Example:
        >>> from memlab.plan import Plan
        >>> lora_settings(Plan(adapter="lora", lora_rank=8))  # doctest: +NORMALIZE_WHITESPACE
        {'r': 8, 'lora_alpha': 16, 'lora_dropout': 0.0, 'target_modules': 'all-linear',
         'modules_to_save': ['classifier', 'score', 'qa_outputs']}
        >>> lora_settings(Plan(adapter="lora", lora_targets=("q_proj", "k_proj"), lora_dropout=0.05))["lora_dropout"]
        0.05
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> bert = BertForSequenceClassification(BertConfig(hidden_size=16, num_hidden_layers=1,
        ...                                                 num_attention_heads=2, intermediate_size=32))
        >>> lora_settings(Plan(adapter="lora"), bert)["modules_to_save"]
        ['classifier']
    """
    targets = plan.lora_targets
    alpha = plan.lora_alpha if plan.lora_alpha is not None else 2 * plan.lora_rank
    settings: dict[str, Any] = {"r": plan.lora_rank, "lora_alpha": alpha, "lora_dropout": plan.lora_dropout}
    if model is None:
        from memlab.techniques.targets import HEAD_NAMES, split_targets

        if isinstance(targets, str):
            settings["target_modules"] = targets if targets == "all-linear" else None
        else:
            modules, parameters = split_targets(targets)
            settings["target_modules"] = modules
            if parameters:
                settings["target_parameters"] = parameters
        # peft then trains a task model's new head whole and adapts it not, as memlab measured; on a model without
        # such a head the names match nothing (peft matches the ends of module names)
        settings["modules_to_save"] = list(HEAD_NAMES)
        return settings
    from torch import nn  # imported here: the declarations stay free of torch

    if not isinstance(model, nn.Module):
        raise MemlabError(f"model must be the torch nn.Module the config is for, not {type(model).__name__}")
    from memlab.techniques.targets import lora_targets_on

    return {**settings, **lora_targets_on(model, targets).settings(plan.lora_rank, alpha)}


def _targets_from_peft(config: Any) -> Any:
    """A LoraConfig's ``target_modules`` as the plan's ``lora_targets``: ``"all-linear"``, ``"attention"`` for
    peft's defaults (None), or the layers' names (a tuple); None (the plan's default) for a regular expression.

    Example:
        >>> from types import SimpleNamespace
        >>> _targets_from_peft(SimpleNamespace(target_modules={"model.layers.0.q_proj", "model.layers.1.q_proj"}))
        ('q_proj',)
    """
    from memlab.techniques.targets import unfused_targets

    modules = config.target_modules
    # a config get_peft_model converted for fused MoE experts: the layer names it fused, so the plan's conversion
    # builds them fused at the rank peft gave them (rank_pattern), not at the plain rank of a named parameter
    unfused, fused = unfused_targets(config)
    if unfused and not isinstance(modules, str):
        modules = {*(modules or ()), *unfused}
    # target_parameters (fused MoE experts) as the config names them: peft matches the end of a parameter's name
    parameters = tuple(sorted(str(name) for name in getattr(config, "target_parameters", None) or ()
                              if str(name) not in fused))
    if modules is None:
        return ("attention", *parameters) if parameters else "attention"
    if isinstance(modules, str):
        if modules.lower() != "all-linear":
            return None
        return ("all-linear", *parameters) if parameters else "all-linear"
    # peft stores "all-linear" resolved into full paths; by peft's matching a leaf name adapts that layer in every
    # block, which is what such a list means
    return tuple(sorted({str(name).rpartition(".")[2] for name in modules})) + parameters or None


def _alpha_from_peft(config: Any) -> int | None:
    """A LoraConfig's alpha as the plan holds it: None where it is twice the rank (the plan's own default)."""
    alpha = config.lora_alpha
    if not isinstance(alpha, (int, float)) or alpha == 2 * config.r:
        return None
    return int(alpha) if float(alpha).is_integer() else None


def lora_config_code(plan: PlanLike, **extra: Any) -> str:
    """The ``LoraConfig(...)`` of an adapter plan as code (:func:`lora_settings`, plus ``extra`` keywords).

    Example:
        >>> from memlab.plan import Plan
        >>> lora_config_code(Plan(adapter="lora", lora_rank=4))[:75]
        "LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules='all-linear'"
    """
    settings = {**lora_settings(plan), **extra}
    return "LoraConfig(" + ", ".join(f"{key}={value!r}" for key, value in settings.items()) + ")"


def in_lora_config(keyword: str) -> dict[str, Export]:
    """The ``exports`` of a lever that is a setting of the adapter's ``LoraConfig`` (``keyword``, as
    :func:`lora_settings` writes it): every export carries it inside the adapter's config, or refuses it with the
    adapter (the Trainer), or sends it where the adapter goes (DeepSpeed).

    Example:
        >>> in_lora_config("r")["peft"](None)
        InLoraConfig(keyword='r')
    """
    return dict.fromkeys(TARGETS, lambda plan: InLoraConfig(keyword))


def qlora_compute_dtype(plan: PlanLike) -> str:
    """The dtype a QLoRA base computes in, as torch's name: the plan's half precision (autocast or pure bf16),
    else float32.

    Example:
        >>> from memlab.plan import Plan
        >>> qlora_compute_dtype(Plan(adapter="qlora", precision="bf16"))
        'bfloat16'
    """
    if plan.precision == "bf16" or plan.weights == "bf16":
        return "bfloat16"
    return "float16" if plan.precision == "fp16" else "float32"


def _qlora_compute_conflict(plan: PlanLike) -> str:
    """Why a QLoRA plan's 4-bit base cannot compute in its dtype: with pure bf16 weights it computes in bf16, and
    fp16 autocast cannot mix its bf16 outputs with fp16 (the step fails, measured and exported alike)."""
    if plan.adapter == "qlora" and plan.weights == "bf16" and plan.precision == "fp16":
        return ("adapter='qlora' with weights='bf16' computes its 4-bit base in bf16, which fp16 autocast cannot mix "
                "with fp16; write precision='bf16' (or 'fp32') with weights='bf16', or weights='fp32' with fp16")
    return ""


def with_adapter(plan: PlanLike) -> bool:
    """Whether ``plan`` trains adapters (the LoRA settings mean something only then).

    Example:
        >>> from memlab.plan import Plan
        >>> with_adapter(Plan(adapter="qlora")), with_adapter(Plan())
        (True, False)
    """
    return bool(plan.adapter != "none")


def _adapters_for_the_trainer(plan: PlanLike) -> Fragment:
    if plan.adapter == "none":
        return Keys()
    return (
        f"adapter={plan.adapter!r} is not a TrainingArguments setting: wrap the model with "
        "peft.get_peft_model(model, plan.to_peft_config())"
        + (" after loading it in 4-bit NF4 (plan.to_code() shows how)" if plan.adapter == "qlora" else "")
        + " and export plan.replace(adapter='none').to_training_arguments(), or use plan.to_code()"
    )



CPU_REPACKING_OFF = (
    "# bitsandbytes repacks a 4-bit weight for AVX512-BF16 CPUs at its first forward in eval mode, which fails",
    "# for a layer not in tiles of 32 x 64 and leaves training after it without the input's gradient: off",
    "layer.support_avx512bf16_for_cpu = False",
)
"""What every 4-bit layer memlab builds (a trial's, the exported script's) sets, so that bitsandbytes 0.50's repacking
of an eval-mode layer's weight for AVX512-BF16 CPUs is never taken: it raised "shape '[32, 0]' is invalid for input
of size 16" on a 32 x 32 layer, and once repacked a layer gives its input no gradient (a custom operator without
autograd). On a GPU the flag means nothing."""


def quantize_code(plan: PlanLike) -> tuple[str, ...]:
    """The lines that hold the base's linear layers in 4-bit NF4 on the model the code receives, as memlab's
    QLoRA does (:func:`memlab.techniques.adapters.qlora_targets`, transformers' own choice: every ``nn.Linear``
    and GPT-2-style ``Conv1D`` but the output head, the tied and last modules and those the model keeps in fp32;
    and a task model's new head, which LoRA trains whole, kept in full precision),
    replaced by a ``bitsandbytes.nn.Linear4bit`` computing in the plan's dtype.

    Example:
        >>> from memlab.plan import Plan
        >>> quantize_code(Plan(adapter="qlora", precision="bf16"))[-1]
        'quantize_nf4(model, torch.bfloat16)'
    """
    from memlab.techniques.targets import HEAD_NAMES  # torch-free names; the module imports torch lazily

    compute = f"torch.{qlora_compute_dtype(plan)}"
    return (
        "# QLoRA: the base's linear layers (all but the output head) hold their weights in 4-bit NF4. Loading from",
        "# a checkpoint does the same with from_pretrained(name, quantization_config=BitsAndBytesConfig(",
        f"#     load_in_4bit=True, bnb_4bit_quant_type='nf4', bnb_4bit_compute_dtype={compute})); here the model",
        "# you have is quantized in place.",
        "def quantize_nf4(model, compute_dtype):",
        "    # The layers transformers' bitsandbytes load quantizes: nn.Linear and GPT-2's Conv1D, less the output",
        "    # head, the tied and last modules and those the model keeps in fp32 (a 4-bit layer stays as it is).",
        "    from transformers.pytorch_utils import Conv1D",
        "",
        "    layers = [(name, module) for name, module in model.named_modules()",
        "              if name and (type(module) is torch.nn.Linear or isinstance(module, Conv1D))]",
        "    try:",
        "        from transformers.quantizers.base import HfQuantizer",
        "        from transformers.quantizers.quantizers_utils import should_convert_module",
        "",
        '        keep = list(getattr(model, "_keep_in_fp32_modules", None) or ())',
        "        skip = HfQuantizer.get_modules_to_not_convert(model, None, keep)",
        "        # a task model's new head trains whole (modules_to_save below): it stays in full precision, as",
        "        # llm_int8_skip_modules=[*skip, *heads] keeps it when loading",
        "        if model.get_output_embeddings() is None:",
        f"            skip += [name for name in {HEAD_NAMES!r}",
        "                     if isinstance(getattr(model, name, None), torch.nn.Module)]",
        "        layers = [(name, module) for name, module in layers",
        "                  if should_convert_module(name, skip)]",
        "    except (ImportError, AttributeError, TypeError, IndexError):  # not a transformers model",
        '        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else layers[-1][1]',
        "        layers = [(name, module) for name, module in layers if module is not head]",
        "    if not layers and not any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules()):",
        '        raise ValueError("QLoRA holds in 4-bit the layers a bitsandbytes load quantizes (nn.Linear, "',
        '                         "Conv1D), and this model has none besides its head; train it with LoRA instead")',
        "    for name, linear in layers:",
        "        weight = linear.weight.data.detach()",
        "        weight = weight.t() if isinstance(linear, Conv1D) else weight  # Conv1D keeps (in, out)",
        "        layer = bnb.nn.Linear4bit(weight.shape[1], weight.shape[0], bias=False,",
        '                                  compute_dtype=compute_dtype, quant_type="nf4", device="meta")',
        "        layer.weight = bnb.nn.Params4bit(weight.contiguous().cpu(), requires_grad=False,",
        '                                         quant_type="nf4").to(weight.device)  # moving it quantizes it',
        *(f"        {line}" for line in CPU_REPACKING_OFF),
        "        layer.bias = linear.bias",
        '        parent, _, child = name.rpartition(".")',
        "        setattr(model.get_submodule(parent) if parent else model, child, layer)",
        "",
        "",
        f"quantize_nf4(model, {compute})",
    )


def _adapter_code(plan: PlanLike) -> Code:
    if plan.adapter == "none":
        return Code()
    quantized = Code(imports=("import bitsandbytes as bnb",), model=quantize_code(plan)) if plan.adapter == "qlora" \
        else Code()
    # peft makes a bf16 model's adapters fp32 (autocast_adapter_dtype); pure bf16 trains them in bf16, as measured
    bf16 = ("model = model.to(torch.bfloat16)  # the adapters in bf16 too",) if plan.weights == "bf16" else ()
    return quantized + Code(imports=("from peft import LoraConfig, get_peft_model",), model=(
        "# LoRA adapters on the plan's layers; only the adapters train",
        f"model = get_peft_model(model, {lora_config_code(plan)})",
        *bf16,
    ))


def _adapter_script(plan: PlanLike) -> Accelerate:
    if plan.adapter == "none":
        return Accelerate()
    script = Code(imports=("from peft import LoraConfig, get_peft_model",), model=(
        f"model = get_peft_model(model, {lora_config_code(plan, task_type='CAUSAL_LM')})",))
    if plan.adapter == "qlora":
        compute = f"torch.{qlora_compute_dtype(plan)}"
        script = Code(
            imports=("from transformers import BitsAndBytesConfig",),
            settings=(
                "# QLoRA: the base's linear weights in 4-bit NF4 (stored as the compute dtype, so FSDP can shard "
                "them)",
                f'quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", '
                f"bnb_4bit_compute_dtype={compute}, bnb_4bit_quant_storage={compute})",
            ),
            load={"quantization_config": "quantization"},
        ) + script
    return Accelerate(script=script)


def _adapter_for_peft(plan: PlanLike) -> Fragment:
    if plan.adapter == "none":  # not a refusal of the plan's other exports: peft has nothing to write
        return Elsewhere(
            f"{plan.label()!r} trains every weight and has no adapters; a peft config needs adapter='lora' or 'qlora'"
        )
    return Lora(lambda model: lora_settings(plan, model))


def _adapter_elsewhere(plan: PlanLike) -> Fragment:
    if plan.adapter == "none":
        return Elsewhere()
    return Elsewhere(
        f"the {plan.adapter} adapters are the model's: wrap it with peft.get_peft_model(model, "
        "plan.to_peft_config()) before DeepSpeed takes it (QLoRA: hold its base in 4-bit NF4 first, as plan.to_code() "
        "does)"
    )


DECLARATIONS: tuple[Lever, ...] = (
    Lever(
        "adapter",
        "none",
        short="{}",
        choices=ADAPTER_KINDS,
        help="train LoRA adapters (peft) on a frozen base instead of every weight: far fewer grads and optimizer "
        "state; qlora also holds the base's linear weights in 4-bit NF4 (bitsandbytes)",
        technique=ADAPTERS,
        conflicts=_qlora_compute_conflict,
        family=True,
        slower=(("qlora", "lora"),),
        activation_key=lambda value: value,
        least_params={"qlora": 0.125},
        least_trained={"lora": 0.0, "qlora": 0.0},
        speed={"lora": (1.3, 1.2), "qlora": (1.0, 0.8)},
        suggest=("lora", "qlora"),
        from_model=adapter_of,
        exports={
            "trainer": _adapters_for_the_trainer,
            "deepspeed": _adapter_elsewhere,
            "code": _adapter_code,
            "peft": _adapter_for_peft,
            "accelerate": _adapter_script,
        },
    ),
    Lever(
        "lora_rank",
        LORA_RANK_DEFAULT,
        short="r{}",
        help="rank of the LoRA adapters, used with adapter lora or qlora: a higher rank trains more weights",
        technique=ADAPTERS,
        applies=with_adapter,
        from_peft=lambda config: config.r if isinstance(config.r, int) else None,
        family=True,
        # Carried wherever the adapter is (and refused with it): the rank is part of the adapter's LoraConfig.
        exports=in_lora_config("r"),
    ),
    Lever(
        "lora_targets",
        "all-linear",
        short="{}",
        choices=("all-linear", "attention"),
        open_choices=True,
        help="the layers that get LoRA adapters (with adapter lora or qlora): all-linear (every linear layer but the "
        "head), attention (peft's default: q and v projections), or module names joined with +, fused MoE expert "
        "parameters among them (mlp.experts.gate_up_proj: peft's target_parameters); fewer layers, fewer adapter "
        "weights",
        technique=ADAPTERS,
        applies=with_adapter,
        from_peft=_targets_from_peft,
        family=True,
        # Carried wherever the adapter is (and refused with it): LoraConfig(target_modules=...).
        exports=in_lora_config("target_modules"),
    ),
    Lever(
        "lora_alpha",
        None,
        short="alpha{}",
        help="LoRA's alpha, with adapter lora or qlora: the adapters' output is scaled by alpha / rank; auto (None): "
        "twice the rank; no memory of its own",
        none_means="auto: twice the rank",
        technique=ADAPTERS,
        applies=with_adapter,
        from_peft=_alpha_from_peft,
        exports=in_lora_config("lora_alpha"),
    ),
    Lever(
        "lora_dropout",
        0.0,
        short="drop{}",
        help="dropout on the adapters' input, with adapter lora or qlora (peft's lora_dropout; recipes use 0.05): "
        "each adapted layer keeps its dropout mask and output for backward, a little more activation memory",
        technique=ADAPTERS,
        applies=with_adapter,
        conflicts=lambda plan: "" if plan.lora_dropout < 1 else (
            f"lora_dropout={plan.lora_dropout!r} drops every input; write a probability below 1, e.g. 0.05"),
        from_peft=lambda config: float(config.lora_dropout) if isinstance(config.lora_dropout, (int, float)) else None,
        needs_at_least=lambda mine, theirs: mine > 0 or theirs == 0,
        activation_key=lambda value: value > 0,
        exports=in_lora_config("lora_dropout"),
    ),
)
"""The adapter levers' declarations, in the registry's order (:data:`memlab.techniques.core.registry.REGISTRY` gathers
them).

Example:
    >>> [lever.name for lever in DECLARATIONS]
    ['adapter', 'lora_rank', 'lora_targets', 'lora_alpha', 'lora_dropout']
"""
