"""Which layers LoRA adapts (:func:`adapter_targets`): the one list measurement (:mod:`memlab.techniques.adapters`)
and the peft export (:func:`memlab.export.peft_config` with a model) both read. It imports neither
:mod:`memlab.plan` nor peft at import time, so the exports can use it."""

from __future__ import annotations

from torch import nn

from memlab.errors import UnsupportedTechnique

__all__ = ["adapter_targets", "lora_layer_types", "output_head"]


def adapter_targets(model: nn.Module, targets: str | tuple[str, ...] = "all-linear") -> list[str]:
    """Names of the linear layers that get adapters, for the plan's ``lora_targets`` (the one list both
    measurement and :func:`memlab.export.peft_config` with a model read):

    - ``"all-linear"``: every linear layer (``nn.Linear`` and transformers' ``Conv1D``, as peft's ``"all-linear"``)
      except the output head: the model's output embeddings, or else its last linear layer (a classifier head,
      such as BERT's ``classifier``, which peft's ``"all-linear"`` would adapt);
    - ``"attention"``: the layers peft adapts by default for the model's type
      (``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``: ``q_proj`` and ``v_proj`` for Llama-style models);
    - a tuple of names: the linear layers whose name is one of them or ends with ``"." + name`` (peft's matching).

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
    return [name for name in names if any(name == t or name.endswith("." + t) for t in targets)]


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
