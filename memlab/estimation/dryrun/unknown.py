"""What a dry run has no rule for, said in the estimate's notes instead of quietly taking the CPU's behaviour.

- **Attention implementations** other than ``"sdpa"`` (emulated for CUDA by
  :mod:`memlab.estimation.cuda.attention`) and ``"eager"`` (plain operators, counted as they run): flash-attention,
  flex attention, hub kernels, an implementation registered with transformers' ``AttentionInterface``. The CPU's
  kernels cannot run most of them (flash-attention needs its CUDA package; flex attention crashes on fake
  tensors), so on CPU kernels the fake model's config says ``"sdpa"`` instead (:func:`assume_sdpa`; the live model
  and the caller's config are never touched), and :func:`attention_implementation_note` says so.
- **Operators outside PyTorch's own** (a ``torch.library`` custom op, an extension's op; bitsandbytes' are known):
  the fake step runs them by their fake rules, which give their outputs but not what their kernels allocate
  inside; :func:`is_foreign` tells them apart (the fake mode collects them) and :func:`foreign_ops_note` names them.

This module imports neither transformers nor the rest of memlab's estimation.

Example:
    >>> print(foreign_ops_note({"mylib::scale"}))
    operators outside PyTorch's own ran by their fake rules (mylib::scale): their outputs are counted, what their
    kernels allocate inside is not
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

__all__ = [
    "KNOWN_ATTENTION",
    "KNOWN_NAMESPACES",
    "assume_sdpa",
    "attention_implementation_note",
    "foreign_ops_note",
    "is_foreign",
]

KNOWN_ATTENTION = frozenset({"sdpa", "eager"})
"""The attention implementations a dry run has rules for (``None``, transformers' default, is ``"sdpa"``)."""

KNOWN_NAMESPACES = frozenset({
    "aten", "prims", "prim", "_c10d_functional", "_c10d_functional_autograd", "c10d", "c10d_functional", "_dtensor",
    "fsdp", "profiler", "mkldnn", "quantized", "_quantized", "debugprims", "rngprims", "higher_order",
    # bitsandbytes' 8-bit optimizer updates work in place, and memlab counts its tensors from their known layout.
    "bitsandbytes",
})
"""Operator namespaces a dry run knows: PyTorch's own (ATen, its primitives, its distributed and FSDP2 operators)
and bitsandbytes'."""


def is_foreign(func: Any) -> bool:
    """Whether the operator ``func`` (an ``OpOverload`` the fake mode dispatches) lies outside PyTorch's own
    namespaces (and bitsandbytes'): a custom op or an extension's, whose fake rule gives its outputs and nothing of
    its kernel.

    Example:
        >>> import torch
        >>> is_foreign(torch.ops.aten.mm.default)
        False
    """
    namespace = getattr(func, "namespace", None)
    return isinstance(namespace, str) and namespace not in KNOWN_NAMESPACES


def foreign_ops_note(names: Iterable[str]) -> str | None:
    """The note on the operators outside PyTorch's own a fake step ran (by name), or None when it ran none.

    Example:
        >>> foreign_ops_note([]) is None
        True
    """
    listed = sorted(set(names))
    if not listed:
        return None
    shown = ", ".join(listed[:4]) + (f" and {len(listed) - 4} more" if len(listed) > 4 else "")
    return (f"operators outside PyTorch's own ran by their fake rules ({shown}): their outputs are counted, what "
            "their kernels allocate inside is not")


def _configs(root: Any) -> Iterator[Any]:
    """Every transformers config under ``root`` (a model: its modules' configs; or a config), sub-configs included,
    each once."""
    pending = [module.config for module in root.modules() if hasattr(module, "config")] if hasattr(
        root, "modules") else [root]
    seen: set[int] = set()
    while pending:
        config = pending.pop()
        if config is None or id(config) in seen or not hasattr(config, "sub_configs"):
            continue
        seen.add(id(config))
        yield config
        pending += [getattr(config, key, None) for key in config.sub_configs]


def _implementation(config: Any) -> Any:
    return getattr(config, "_attn_implementation_internal", getattr(config, "_attn_implementation", None))


def unknown_attention(root: Any) -> list[str]:
    """The attention implementations of ``root`` (a transformers model or config) that a dry run has no rule for.

    Example:
        >>> from transformers import LlamaConfig
        >>> unknown_attention(LlamaConfig(attn_implementation="eager")), unknown_attention(LlamaConfig())
        ([], [])
    """
    names = {_implementation(config) for config in _configs(root)}
    return sorted(name for name in names if isinstance(name, str) and name not in KNOWN_ATTENTION)


def assume_sdpa(root: Any) -> list[str]:
    """Make every config under ``root`` (a fake model, or a copy of a config) whose attention implementation has no
    rule say ``"sdpa"``; returns the implementations replaced. The models read it at each forward (transformers'
    ``AttentionInterface``), so a model already built switches too.

    Example:
        >>> from transformers import LlamaConfig
        >>> config = LlamaConfig(attn_implementation="flex_attention")
        >>> assume_sdpa(config), config._attn_implementation
        (['flex_attention'], 'sdpa')
    """
    replaced = []
    for config in _configs(root):
        name = _implementation(config)
        if isinstance(name, str) and name not in KNOWN_ATTENTION:
            config._attn_implementation_internal = "sdpa"  # this config only: its sub-configs are visited too
            replaced.append(name)
    return sorted(set(replaced))


def attention_implementation_note(names: Iterable[str], *, replaced: bool, cuda: bool) -> str | None:
    """The note on attention implementations without a rule: estimated as ``"sdpa"`` where ``replaced`` (CPU
    kernels; ``cuda``: the estimate is for CUDA, whose sdpa kernels are emulated), else run by their fake rules.

    Example:
        >>> print(attention_implementation_note(["flash_attention_2"], replaced=True, cuda=False))
        memlab has no rule for attn_implementation='flash_attention_2': its attention is estimated as 'sdpa'
        (the CPU's scaled_dot_product_attention)
    """
    listed = sorted(set(names))
    if not listed:
        return None
    shown = ", ".join(repr(name) for name in listed)
    if not replaced:
        return (f"memlab has no rule for attn_implementation={shown}: its kernels ran by their fake rules, whose "
                "workspaces are not counted")
    kernels = "CUDA's scaled_dot_product_attention kernels, emulated" if cuda else (
        "the CPU's scaled_dot_product_attention")
    return f"memlab has no rule for attn_implementation={shown}: its attention is estimated as 'sdpa' ({kernels})"
