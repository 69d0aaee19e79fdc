"""What LoRA trains on a model (:func:`lora_targets_on`): the layers it adapts, the fused expert parameters peft
adapts in their place, and the new task heads trained whole (peft's ``modules_to_save``). It is the one computation
that measurement (:mod:`memlab.techniques.adapters`) and the peft export (:func:`memlab.export.peft_config` with a
model, through :func:`memlab.techniques.adapters.lora_settings`) both read, so the export trains what the trial
trained. It imports neither :mod:`memlab.plan` nor peft at import time, so the exports can use it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from memlab.errors import UnsupportedTechnique

__all__ = ["HEAD_NAMES", "LoraTargets", "adapter_targets", "lora_layer_types", "lora_targets_on", "output_head",
           "parameter_targets", "split_targets", "targets_as_planned", "task_heads", "unfused_targets"]

HEAD_NAMES = ("classifier", "score", "qa_outputs")
"""The attribute names of a transformers task head that a task model creates new (sequence and token
classification: peft's ``SEQ_CLS_HEAD_NAMES``; question answering: ``qa_outputs``), which peft trains whole for such
a task (``modules_to_save``)."""


@dataclass(frozen=True)
class LoraTargets:
    """What LoRA trains on one model: ``modules`` (``LoraConfig.target_modules``, full names), ``parameters``
    (``target_parameters``: fused MoE expert weights, which peft adapts where transformers fused the experts'
    linear layers into one 3-D parameter), ``fused`` (how many former projections each fused parameter holds:
    peft multiplies the rank and alpha by it) and ``saved`` (``modules_to_save``: new task heads trained whole).

    Example:
        >>> LoraTargets(["0"]).settings(8, 16)
        {'target_modules': ['0']}
    """

    modules: list[str]
    parameters: list[str] = field(default_factory=list)
    fused: dict[str, int] = field(default_factory=dict)
    saved: list[str] = field(default_factory=list)

    def settings(self, rank: int, alpha: int) -> dict[str, object]:
        """The ``LoraConfig`` keywords these targets add, for adapters of ``rank`` and ``alpha``."""
        settings: dict[str, object] = {"target_modules": list(self.modules)}
        if self.parameters:
            settings["target_parameters"] = list(self.parameters)
        if self.fused:
            settings["rank_pattern"] = {rf".*\.{name}": rank * count for name, count in self.fused.items()}
            settings["alpha_pattern"] = {rf".*\.{name}": alpha * count for name, count in self.fused.items()}
        if self.saved:
            settings["modules_to_save"] = list(self.saved)
        return settings


def lora_targets_on(model: nn.Module, targets: str | tuple[str, ...] = "all-linear") -> LoraTargets:
    """What LoRA with the plan's ``lora_targets`` trains on ``model`` (:class:`LoraTargets`): the layers of
    :func:`adapter_targets`; on a transformers model whose experts are fused (Mixtral, OLMoE in transformers 5),
    the expert and router parameters peft's own conversion targets for the same ``target_modules``; and on a task
    model (a sequence classifier, ...) its new head (:func:`task_heads`), trained whole as peft's task types do.

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        >>> lora_targets_on(model)
        LoraTargets(modules=['0'], parameters=[], fused={}, saved=[])
    """
    modules = adapter_targets(model, targets)
    explicit = parameter_targets(model, targets)
    keyword = targets if isinstance(targets, str) else "all-linear" if "all-linear" in targets else \
        tuple(name for name in targets if name != "attention" and name not in explicit)
    parameters, fused = _fused_experts(model, keyword) if keyword else ([], {})
    # peft unions the target_parameters a config names with those its conversion adds; the fused rank applies only
    # to the converted ones, as peft's rank_pattern names them
    return LoraTargets(modules, sorted({*parameters, *explicit}), fused, task_heads(model))


def parameter_targets(model: nn.Module, targets: str | tuple[str, ...]) -> list[str]:
    """The entries of a tuple ``lora_targets`` that name a parameter of ``model`` outside its linear layers (a fused
    MoE expert weight such as Qwen3-MoE's ``mlp.experts.gate_up_proj``): what peft adapts through
    ``target_parameters``, where a parameter matches when ``module_name.param_name`` equals the entry or ends with
    ``"." + entry``. A keyword (``"all-linear"``, ``"attention"``) names none.

    Example:
        >>> import torch
        >>> class Experts(nn.Module):
        ...     def __init__(self) -> None:
        ...         super().__init__()
        ...         self.gate_up_proj = nn.Parameter(torch.zeros(2, 4, 8))
        >>> model = nn.ModuleDict({"experts": Experts(), "q_proj": nn.Linear(4, 4)})
        >>> parameter_targets(model, ("q_proj", "experts.gate_up_proj")), parameter_targets(model, "all-linear")
        (['experts.gate_up_proj'], [])
    """
    if isinstance(targets, str):
        return []
    names = [name for name in targets if name not in ("all-linear", "attention")]
    found: set[str] = set()
    for module_name, module in model.named_modules():
        if isinstance(module, lora_layer_types()):
            continue  # a linear layer's weight is adapted through the layer (target_modules)
        for param_name, _ in module.named_parameters(recurse=False):
            key = f"{module_name}.{param_name}" if module_name else param_name
            found.update(name for name in names if key == name or key.endswith("." + name))
    return sorted(found)


def task_heads(model: nn.Module) -> list[str]:
    """The new task head of a transformers model without output embeddings (BERT's ``classifier``, Llama's
    ``score``, ``qa_outputs``): what peft's task types train whole (``modules_to_save``); none elsewhere.

    Example:
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> bert = BertForSequenceClassification(BertConfig(hidden_size=16, num_hidden_layers=1,
        ...                                                 num_attention_heads=2, intermediate_size=32))
        >>> task_heads(bert), task_heads(nn.Linear(2, 2))
        (['classifier'], [])
    """
    if not hasattr(getattr(model, "config", None), "model_type") or output_head(model) is not None:
        return []
    children = dict(model.named_children())
    return [name for name in HEAD_NAMES if isinstance(children.get(name), nn.Module)
            and any(isinstance(m, lora_layer_types()) for m in children[name].modules())]


def _fused_experts(model: nn.Module, targets: str | tuple[str, ...]) -> tuple[list[str], dict[str, int]]:
    """The fused expert parameters peft targets for ``targets`` on ``model`` (its transformers 5 conversion of the
    former expert and router layers), and how many former projections each holds; none where peft has no
    conversion for the model or the installed peft predates it."""
    if targets == "attention" or not hasattr(getattr(model, "config", None), "model_type"):
        return [], {}
    try:
        from peft import LoraConfig
        from peft.utils.transformers_weight_conversion import (
            convert_peft_config_for_transformers,
            get_model_conversion_mapping,
        )
    except ImportError:  # a peft without fused-expert support adapts only linear layers
        return [], {}
    config = LoraConfig(r=1, lora_alpha=1, target_modules=targets if isinstance(targets, str) else list(targets))
    model_: Any = model  # a transformers model (it has a config with a model_type)
    convert_peft_config_for_transformers(config, model_, get_model_conversion_mapping(model_))
    parameters = sorted(config.target_parameters or ())
    fused = {key.rpartition("\\.")[2]: int(value) for key, value in (config.rank_pattern or {}).items()}
    return parameters, fused


def unfused_targets(config: Any) -> tuple[set[str], set[str]]:
    """peft's conversion of a ``LoraConfig`` for transformers 5's fused MoE experts, undone: the layer names it
    renamed into expert and router parameters, and the parameters it added. ``get_peft_model`` rewrites the config
    in place (``"all-linear"`` becomes the attention layers' names; ``gate_proj`` and ``up_proj``, or Mixtral's
    ``w1`` and ``w3``, become the parameter ``gate_up_proj`` at twice the rank through ``rank_pattern``); read back
    as it stands, a plan would build that parameter at the plain rank. A fused parameter counts as converted where
    the config's ``rank_pattern`` gives it the rank times the number of layers fused into it, as peft writes it.
    The config does not say the model's family, so every family's names that fuse so are given back: on the model,
    peft's conversion turns its own names into the fused parameter again and the others match nothing.

    Example:
        >>> from types import SimpleNamespace
        >>> config = SimpleNamespace(r=4, rank_pattern={r".*\\.gate_up_proj": 8},
        ...                          target_parameters={"gate_up_proj", "gate.weight"})
        >>> names, converted = unfused_targets(config)
        >>> sorted(names), sorted(converted)
        (['gate', 'gate_proj', 'up_proj', 'w1', 'w3'], ['gate.weight', 'gate_up_proj'])
    """
    parameters = {str(name) for name in getattr(config, "target_parameters", None) or ()}
    pattern, rank = getattr(config, "rank_pattern", None) or {}, getattr(config, "r", None)
    if not parameters or not pattern or not isinstance(rank, int):
        return set(), set()
    try:
        from peft.utils import transformers_weight_conversion as conversion
    except ImportError:  # a peft without fused-expert support converted nothing
        return set(), set()
    import re

    names: set[str] = set()
    converted: set[str] = set()
    renames = getattr(conversion, "_MOE_TARGET_MODULE_MAPPING", {})
    for family, fusions in getattr(conversion, "_MOE_FUSED_TARGETS", {}).items():
        if any(new in parameters and pattern.get(rf".*\.{re.escape(new)}") == rank * len(old)
               for new, old in fusions.items()):
            # this family's conversion ran: each parameter it adds (the router's gate.weight, down_proj too) goes
            # back to its layer name, which peft's conversion without the model maps again
            for old_name, new_name in renames.get(family, {}).items():
                if new_name in parameters:
                    names.add(old_name)
                    converted.add(new_name)
    return names, converted


def split_targets(targets: tuple[str, ...]) -> tuple[Any, list[str]]:
    """A tuple ``lora_targets`` as ``target_modules`` and ``target_parameters`` without a model: names with an
    ``experts`` part (``"mlp.experts.gate_up_proj"``, as peft's documentation writes them) are fused expert
    parameters; a keyword among the names stands for the list. With the model,
    :func:`memlab.techniques.targets.lora_targets_on` finds parameters by what they are (``"gate_up_proj"`` too).

    Example:
        >>> split_targets(("q_proj", "v_proj", "mlp.experts.gate_up_proj"))
        (['q_proj', 'v_proj'], ['mlp.experts.gate_up_proj'])
        >>> split_targets(("all-linear", "experts.down_proj"))
        ('all-linear', ['experts.down_proj'])
    """
    parameters = [name for name in targets if "experts" in name.split(".")[:-1]]
    names = [name for name in targets if name not in parameters]
    if "all-linear" in names:
        return "all-linear", parameters
    if "attention" in names:
        return None, parameters
    return names, parameters  # [] with parameters only: None would add peft's default layers for the model type


def adapter_targets(model: nn.Module, targets: str | tuple[str, ...] = "all-linear") -> list[str]:
    """Names of the linear layers that get adapters, for the plan's ``lora_targets`` (the one list both
    measurement and :func:`memlab.export.peft_config` with a model read):

    - ``"all-linear"``: every linear layer (``nn.Linear`` and transformers' ``Conv1D``, as peft's ``"all-linear"``)
      except the output head: the model's output embeddings, or else its last linear layer (a classifier head,
      such as BERT's ``classifier``, which peft's ``"all-linear"`` would adapt);
    - ``"attention"``: the layers peft adapts by default for the model's type
      (``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``: ``q_proj`` and ``v_proj`` for Llama-style models);
    - a tuple of names: the linear layers whose name is one of them or ends with ``"." + name`` (peft's matching);
      a keyword among them adds its layers (``("all-linear", "mlp.experts.gate_up_proj")``), and names of other
      parameters (fused experts) are :func:`parameter_targets`, not layers.

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.Linear(8, 1))
        >>> adapter_targets(model), adapter_targets(model, ("2",))
        (['0', '2'], ['2'])
    """
    names = [name for name, module in model.named_modules() if isinstance(module, lora_layer_types()) and name]
    if targets == "all-linear":
        head = output_head(model)
        if head is not None:
            return [name for name in names if model.get_submodule(name) is not head]
        heads = task_heads(model)
        if heads:  # a task head is trained whole (modules_to_save), not adapted; peft matches it by the end of a
            # module's name, so DistilBERT's pre_classifier is trained whole too
            return [name for name in names if not any(
                ".".join(name.split(".")[:k]).endswith(h) for h in heads for k in range(1, name.count(".") + 2))]
        return names[:-1] if len(names) > 1 else names
    if targets == "attention":
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

        model_type = getattr(getattr(model, "config", None), "model_type", None)
        if model_type not in DEFAULTS:
            raise UnsupportedTechnique(
                f"lora_targets='attention' means peft's default layers for the model's type, and peft has none for "
                f"{model_type or type(model).__name__}; write lora_targets='all-linear' or a list of module names"
            )
        targets = tuple(DEFAULTS[model_type])
    keywords = [t for t in targets if t in ("all-linear", "attention")]
    if keywords:  # a keyword beside names (the names of fused expert parameters, say): its layers and theirs
        chosen = {name for keyword in keywords for name in adapter_targets(model, keyword)}
        chosen.update(adapter_targets(model, tuple(t for t in targets if t not in keywords)))
        return [name for name in names if name in chosen]
    return [name for name in names if any(name == t or name.endswith("." + t) for t in targets)]


_PEFT_PARTS = ("base_layer", "lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_dropout",
               "lora_magnitude_vector")


def targets_as_planned(model: nn.Module, targets: Any) -> Any:
    """``lora_targets`` as a plan names them on ``model`` (a peft model's base layers): ``"all-linear"`` where a tuple
    of layer names is every layer ``"all-linear"`` adapts there (peft stores ``target_modules="all-linear"`` resolved
    into the layers' paths, which a plan's label would list one by one); anything else as it is.

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        >>> targets_as_planned(model, ("0",)), targets_as_planned(model, ("1",))
        ('all-linear', ('1',))
    """
    if not isinstance(targets, tuple) or not targets:
        return targets
    wrapped: Any = model
    base: Any = wrapped.get_base_model() if hasattr(wrapped, "get_base_model") else model
    leaves = set()
    for name in adapter_targets(base, "all-linear"):
        parts = name.split(".")
        host = parts[:next((i for i, part in enumerate(parts) if part in _PEFT_PARTS), len(parts))]
        if host:  # a layer peft wrapped is named by its host, whose base layer and adapters are linear layers too
            leaves.add(host[-1])
    return "all-linear" if set(targets) == leaves else targets


def lora_layer_types() -> tuple[type[nn.Module], ...]:
    """The linear layer types LoRA adapts: ``nn.Linear`` and transformers' ``Conv1D`` (GPT-2's), which peft's
    LoRA dispatches to its ``Linear`` layer (``fan_in_fan_out``) and its ``"all-linear"`` targets.

    Example:
        >>> [t.__name__ for t in lora_layer_types()]
        ['Linear', 'Conv1D']
    """
    from transformers.pytorch_utils import Conv1D

    return (nn.Linear, Conv1D)


def output_head(model: nn.Module) -> nn.Module | None:
    """The model's output layer (``get_output_embeddings()``, e.g. an LM head), which quantization leaves as it is;
    None for a model without one.

    Example:
        >>> output_head(nn.Linear(2, 2)) is None
        True
    """
    get_head = getattr(model, "get_output_embeddings", None)
    if not callable(get_head):
        return None
    try:
        head = get_head()
    except (NotImplementedError, AttributeError):
        return None
    return head if isinstance(head, nn.Module) else None
