"""What a trainer question (``memlab estimate MODEL --trainer ...``) knows before any dry run: the weights as
loaded, which no lever of the step lowers. Where they and the CUDA context are over the budget, the answer is
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

__all__ = ["QUANTIZED_BASE", "floor_verdict", "trainer_weight_bytes"]

QUANTIZED_BASE = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True}
"""The load options of the 4-bit base the trainer question suggests (QLoRA as TRL's notebooks load it; the compute
dtype is the GPU's half precision)."""


def trainer_weight_bytes(trainer: Any) -> int:
    """Bytes of the weights ``trainer`` holds on its device as loaded (its model's, adapters included, and a reference
    model it holds apart), whatever the step does: :func:`memlab.estimation.dryrun.adapters.loaded_weight_bytes`.

    Example (``tests/frontends/test_trainer_cli.py`` asks a 4-bit and a bf16 base)::

        trainer_weight_bytes(memlab.trainer_on_meta(trl.SFTTrainer, model=policy, args=...))
    """
    from memlab.estimation.dryrun.adapters import loaded_weight_bytes

    models = [trainer.model, getattr(trainer, "ref_model", None)]
    return sum(loaded_weight_bytes(model) for model in models if model is not None)


def floor_verdict(weights: int, context: int, budget: int, dtype: str) -> str:
    """The verdict of a question whose weights (in ``dtype``, as loaded) and CUDA ``context`` are over ``budget``,
    wrapped to the command's width."""
    from memlab.frontends.estimate.text import WIDTH
    from memlab.plan import format_bytes

    with_context = f", with the CUDA context {format_bytes(weights + context)}," if context else ""
    text = (f"Verdict: does not fit: the weights alone, as loaded ({dtype}), are {format_bytes(weights)}"
            f"{with_context} over the budget, {format_bytes(budget)}; no lever of the step changes the weights, so "
            "none was searched.")
    return "\n".join(textwrap.wrap(text, WIDTH, subsequent_indent="  "))
