"""The attention lever's switch: transformers' ``attn_implementation`` on a live model, and back exactly.

:func:`switch_attention` sets an implementation with transformers' own
``PreTrainedModel.set_attn_implementation`` and returns what puts back every config it may change (the model's,
each sub-config's, each nested model's); :func:`unavailable` says, before any switch, why an implementation cannot
run here (the model class does not support it, or its kernel is not installed) and what to do instead. The lever's
declaration, and where each export writes it, are here too.

Example:
    >>> from tests.models import tiny_llama
    >>> model = tiny_llama()
    >>> undo = switch_attention(model, "eager"); model.config._attn_implementation
    'eager'
    >>> undo(); model.config._attn_implementation
    'sdpa'
"""

from __future__ import annotations

import importlib.util
from typing import Any

from torch import nn

from memlab.errors import MemlabError, UnsupportedTechnique
from memlab.techniques.core.fragments import Accelerate, Code, Elsewhere, Export, Fragment, Keys, per_target
from memlab.techniques.core.lever import Lever, PlanLike
from memlab.techniques.core.technique import StepParts, Technique, Undo

IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flex_attention")
"""The implementations the lever offers, as transformers spells them."""

FUSED_ATTENTION = "sdpa"
"""The implementation fit searches beside a model's eager attention (:func:`fused_attention_instead`)."""

_SUPPORT_FLAG = {"sdpa": "_supports_sdpa", "flash_attention_2": "_supports_flash_attn",
                 "flex_attention": "_supports_flex_attn"}


def _configs(model: nn.Module) -> list[Any]:
    """Every config object the switch may write: each PreTrainedModel's config and its sub-configs, at any depth."""
    seen: dict[int, Any] = {}
    pending = [module.config for module in model.modules() if hasattr(module, "config")]
    while pending:
        config = pending.pop()
        if id(config) in seen or not hasattr(config, "_attn_implementation_internal"):
            continue
        seen[id(config)] = config
        for key in getattr(config, "sub_configs", {}) or {}:
            if (sub := getattr(config, key, None)) is not None:
                pending.append(sub)
    return list(seen.values())


def _device_type(model: nn.Module) -> str:
    parameter = next(model.parameters(), None)
    return "cpu" if parameter is None else parameter.device.type


def unavailable(model: nn.Module, implementation: str) -> str:
    """Why ``implementation`` cannot run on ``model`` here, saying what to do instead; empty when it can.

    Example:
        >>> from tests.models import tiny_llama
        >>> unavailable(tiny_llama(), "sdpa")
        ''
        >>> "pip install flash-attn" in unavailable(tiny_llama(), "flash_attention_2")
        True
    """
    if implementation not in IMPLEMENTATIONS:
        return f"attention={implementation!r} is not known; write one of {', '.join(IMPLEMENTATIONS)}"
    if not hasattr(model, "set_attn_implementation"):
        return "attention applies to a transformers model only; leave attention unset (None)"
    flag = _SUPPORT_FLAG.get(implementation)
    if flag and not getattr(type(model), flag, False):
        return (f"{type(model).__name__} does not support attention={implementation!r} (transformers says so); "
                "write attention='eager' or leave it unset")
    on_cuda = _device_type(model) == "cuda"
    if implementation == "flash_attention_2" and (importlib.util.find_spec("flash_attn") is None or not on_cuda):
        return ("attention='flash_attention_2' needs the model on CUDA and the flash-attn package: pip install "
                "flash-attn --no-build-isolation on a CUDA machine; or write attention='sdpa'")
    if implementation == "flex_attention":
        if importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
            return "attention='flex_attention' needs torch 2.5 or newer: pip install -U torch; or write 'sdpa'"
        if not on_cuda:
            return ("attention='flex_attention' has no backward off CUDA (torch's FlexAttention trains on CUDA "
                    "only): move the model to a CUDA device, or write attention='sdpa'")
    return ""


def switch_attention(model: nn.Module, implementation: str) -> Undo:
    """Set ``implementation`` on the live ``model`` and return what puts every config's implementation back.

    Raises:
        MemlabError: when :func:`unavailable` gives a reason, the model untouched.

    Example:
        >>> from tests.models import tiny_llama
        >>> model = tiny_llama()
        >>> undo = switch_attention(model, "eager"); undo(); model.config._attn_implementation
        'sdpa'
    """
    reason = unavailable(model, implementation)
    if reason:
        raise MemlabError(reason)
    saved = [(config, config.__dict__.get("_attn_implementation_internal")) for config in _configs(model)]
    try:
        model.set_attn_implementation(implementation)  # type: ignore[operator]
    except Exception:
        _put_back(saved)
        raise

    def undo() -> None:
        _put_back(saved)

    return undo


def _put_back(saved: list[tuple[Any, Any]]) -> None:
    # The internal attribute, as transformers itself writes it, so that no check or recursion runs on the way back.
    for config, value in saved:
        config._attn_implementation_internal = value


_FAKE_AS_SDPA = ("flash_attention_2", "flex_attention")


class Attention(Technique):
    """``attention``: the plan's implementation switched on the live model for the trial, and switched back.

    An implementation that cannot run here (:func:`unavailable`) raises :class:`UnsupportedTechnique` from
    ``put_on``: the trial is an error trial that says what to install or write instead. A dry run on fake tensors
    runs flash-attention-2 and flex-attention as sdpa (their kernels need CUDA): on CUDA sdpa picks its flash
    backend for half precision, which keeps what flash-attention keeps (the output and the logsumexp, no
    probabilities).

    Example:
        >>> import torch
        >>> from memlab.plan import Plan
        >>> from memlab.techniques.core.technique import StepParts
        >>> from tests.models import tiny_llama
        >>> model = tiny_llama()
        >>> undo = ATTENTION.put_on(StepParts(model, Plan(attention="eager"), torch.device("cpu")))
        >>> model.config._attn_implementation
        'eager'
        >>> undo(); model.config._attn_implementation
        'sdpa'
    """

    def put_on(self, parts: StepParts) -> Undo | None:
        wanted = parts.plan.attention
        if wanted is None:
            return None
        if parts.fake and wanted in _FAKE_AS_SDPA and hasattr(parts.model, "set_attn_implementation"):
            wanted = "sdpa"
        reason = unavailable(parts.model, wanted)
        if reason:
            raise UnsupportedTechnique(reason)
        return switch_attention(parts.model, wanted)

    def notes(self, parts: StepParts) -> list[str]:
        wanted = parts.plan.attention
        if wanted is None:
            return []
        running = _implementation(parts.model)
        if parts.fake and wanted in _FAKE_AS_SDPA:
            return []  # dry_run says how it is estimated
        return [f"attention {running} ran (the plan's attention={wanted!r})"]

    def dry_run(self, parts: StepParts) -> list[str]:
        wanted = parts.plan.attention
        if wanted == "flash_attention_2":
            return ["attention flash_attention_2 estimated as sdpa: on CUDA in half precision sdpa's flash backend "
                    "keeps what flash-attention keeps (the output and its logsumexp, no probabilities)"]
        if wanted == "flex_attention":
            return ["attention flex_attention estimated as sdpa: FlexAttention keeps the output and its logsumexp, "
                    "as sdpa's fused backends do"]
        return []


def fused_attention_instead(model: nn.Module) -> bool:
    """Whether ``model`` runs eager attention and could run sdpa here: then ``fit`` searches ``attention`` too
    (sdpa keeps no attention probabilities for backward, so it can only lower the peak).

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> config = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        ...               vocab_size=64)
        >>> fused_attention_instead(LlamaForCausalLM(LlamaConfig(**config, attn_implementation="eager")))
        True
        >>> fused_attention_instead(LlamaForCausalLM(LlamaConfig(**config, attn_implementation="sdpa")))
        False
    """
    return _implementation(model) == "eager" and not unavailable(model, FUSED_ATTENTION)


def _implementation(model: nn.Module) -> str:
    """The implementation the model's config names now ("?" where it has none)."""
    config = getattr(model, "config", None)
    return str(getattr(config, "_attn_implementation", None) or "?")


ATTENTION = Attention()
"""The ``attention`` lever's technique."""


def _attention_export(target: str) -> Export:
    """Where each export writes ``attention``: the plain code switches the loaded model, the accelerate script loads
    it with ``attn_implementation=``; the Trainer, DeepSpeed and peft exports leave it to the loading code."""

    def export(plan: PlanLike) -> Fragment:
        if plan.attention is None:
            nothing: dict[str, Fragment] = {"code": Code(), "accelerate": Accelerate(), "trainer": Keys()}
            return nothing.get(target, Elsewhere())
        if target == "code":
            return Code(model=(f"model.set_attn_implementation({plan.attention!r})  # or from_pretrained(..., "
                               f"attn_implementation={plan.attention!r})",))
        if target == "accelerate":
            return Accelerate(script=Code(load={"attn_implementation": repr(plan.attention)}))
        return Elsewhere(f"load the model with from_pretrained(..., attn_implementation={plan.attention!r})")

    return export


DECLARATIONS = (
    Lever(
        "attention",
        None,
        short="attn-{}",
        help="transformers' attention implementation (attn_implementation), switched for the trial: eager keeps "
        "each layer's attention probabilities (rows x heads x tokens^2) for backward, sdpa and flash_attention_2 keep "
        "none; None: as the model was loaded; fit searches the model's own and sdpa where the model runs eager and "
        "sdpa can run, other values when you put them in space=",
        choices=IMPLEMENTATIONS,
        technique=ATTENTION,
        # what attention keeps for backward is activations: a plan with another kernel has its own activation line,
        # never the measured kernel's (fit skipped sdpa as "predicted not to fit" from eager's peak)
        activation_key=lambda value: value,
        exports=per_target(_attention_export),
    ),
)
"""The ``attention`` lever (:data:`memlab.techniques.core.registry.REGISTRY` gathers it)."""
