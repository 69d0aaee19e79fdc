"""What a trainer question (``memlab estimate MODEL --trainer ...``) knows before it builds the trainer or makes a
dry run: the weights as loaded (:func:`memlab.estimation.dryrun.adapters.loaded_weight_bytes` of the policy on the
meta device), which no lever of the step lowers. Where they and the CUDA context are over the budget, the answer is
foregone: the command says so at once, with what changes it (a 4-bit base, a GPU with more memory), instead of
searching levers that cannot help (a 7B question on a T4 searched for minutes to say so).

Example:
    >>> print(floor_verdict(15 * 2**30, 2**29, 14 * 2**30, "bf16"))  # doctest: +NORMALIZE_WHITESPACE
    Verdict: does not fit: the weights alone, as loaded (bf16), are 15.00 GiB, with the CUDA context 15.50 GiB, over
    the budget, 14.00 GiB; no lever of the step changes the weights, so none was searched.
"""

from __future__ import annotations

import textwrap
from typing import Any

__all__ = ["QUANTIZED_BASE", "floor_verdict", "four_bit_changes", "remedies"]

QUANTIZED_BASE = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True}
"""The load options of the 4-bit base the trainer question suggests (QLoRA as TRL's notebooks load it; the compute
dtype is the GPU's half precision)."""


def floor_verdict(weights: int, context: int, budget: int, dtype: str) -> str:
    """The verdict of a question whose weights (in ``dtype``, as loaded) and CUDA ``context`` are over ``budget``,
    wrapped to the command's width."""
    from memlab.frontends.cli.estimate.text import WIDTH
    from memlab.plan import format_bytes

    with_context = f", with the CUDA context {format_bytes(weights + context)}," if context else ""
    text = (f"Verdict: does not fit: the weights alone, as loaded ({dtype}), are {format_bytes(weights)}"
            f"{with_context} over the budget, {format_bytes(budget)}; no lever of the step changes the weights, so "
            "none was searched.")
    return "\n".join(textwrap.wrap(text, WIDTH, subsequent_indent="  "))


def four_bit_changes(args: Any) -> dict[str, Any]:
    """The trainer question's options that put its model on a 4-bit base (:data:`QUANTIZED_BASE`), computing in the
    GPU's half precision, with LoRA of rank 16 where none was asked (a 4-bit base trains adapters only).

    Example:
        >>> from types import SimpleNamespace
        >>> four_bit_changes(SimpleNamespace(device=None, gpu="T4-16GB", gpu_memory=None, gpu_capability=None,
        ...                                  lora=None))["bnb_4bit_compute_dtype"]
        'float16'
    """
    from memlab.estimation.cuda.gpus import kind_or_default
    from memlab.frontends.cli.gpu import cli_gpu

    half = "bfloat16" if getattr(args, "device", None) == "cpu" or kind_or_default(cli_gpu(args)).bf16 else "float16"
    return {**QUANTIZED_BASE, "bnb_4bit_compute_dtype": half, "lora": getattr(args, "lora", None) or 16}


def remedies(needed: int, budget: int, four_bit: int | None, context: int, command: str | None) -> list[str]:
    """The lines after a foregone verdict: a 4-bit base where its weights (``four_bit``, as laid out; None where the
    base is quantized already) leave room under the budget, with the ``command`` that asks it; and a GPU with more
    memory than ``needed`` (the weights and the context).

    Example:
        >>> gib = 2**30
        >>> print("\\n".join(remedies(16 * gib, 15 * gib, 5 * gib, gib, "memlab estimate x --load-in-4bit")))
        ... # doctest: +NORMALIZE_WHITESPACE
        Next: what changes that:
          a 4-bit base (QLoRA): its weights are 5.00 GiB, with the CUDA context 6.00 GiB, which leaves 9.00 GiB of the
          budget for the step; ask it (one dry run):
            memlab estimate x --load-in-4bit
          or a GPU with more than 16.00 GiB of memory.
    """
    from memlab.frontends.cli.estimate.text import WIDTH
    from memlab.plan import format_bytes

    lines = ["Next: what changes that:"]
    if four_bit is not None and four_bit + context < budget:
        said = (f"a 4-bit base (QLoRA): its weights are {format_bytes(four_bit)}, with the CUDA context "
                f"{format_bytes(four_bit + context)}, which leaves {format_bytes(budget - four_bit - context)} of the "
                "budget for the step; ask it (one dry run):")
        lines += textwrap.wrap(said, WIDTH, initial_indent="  ", subsequent_indent="  ")
        lines.append(f"    {command}")
    elif four_bit is not None:
        lines.append(f"  not a 4-bit base: its weights are {format_bytes(four_bit)}, over the budget too;")
    lines.append(f"  {'or ' if len(lines) > 1 else ''}a GPU with more than {format_bytes(needed)} of memory.")
    return lines
