"""The command-line options several TRL kinds take (``memlab estimate --trainer ...``), declared once: each kind's
CLI facet (:class:`~memlab.live.trainer_kinds.TrainerCli`) lists them beside its own, and the length a kind's
examples take from ``--max-length`` (:func:`max_length_settings`: SFT's and DPO's).

Example:
    >>> BETA.name, MAX_LENGTH.before
    ('beta', 'prompt_length')
"""

from __future__ import annotations

from typing import Any

from memlab.errors import MemlabError
from memlab.live.trainer_kinds import CliOption

__all__ = ["BETA", "MAX_LENGTH", "max_length_settings"]

BETA = CliOption("beta", "DPO, GRPO: the KL coefficient: above 0 keeps a reference model (TRL's default: 0.0 for "
                 "GRPO, 0.1 for DPO)", metavar="BETA", value="float", before="lora")
"""``--beta``: DPOConfig's and GRPOConfig's KL coefficient."""

MAX_LENGTH = CliOption("max_length", "SFT: the longest (or packed) sequence; DPO: the longest prompt and answer "
                       "together; in tokens (TRL's default: 1024)", metavar="TOKENS", example="1024",
                       before="prompt_length")
"""``--max-length``: SFTConfig's and DPOConfig's longest sequence."""


def max_length_settings(args: Any, positions: int | None, prompt: int | None) -> dict[str, Any]:
    """``--max-length`` (TRL's default 1024) checked against ``prompt`` (the prompt's tokens, None: plain text) and
    the model's ``positions``: ``{"max_length": ..., "prompt_length": prompt}``.

    Example:
        >>> from types import SimpleNamespace
        >>> max_length_settings(SimpleNamespace(max_length=None), 2048, 512)
        {'max_length': 1024, 'prompt_length': 512}
    """
    length = args.max_length or 1024
    if prompt is not None and prompt >= length:
        raise MemlabError(f"--prompt-length {prompt} leaves no answer within --max-length {length}; write "
                          f"--prompt-length {max(1, length // 2)}")
    if positions is not None and length > positions:
        raise MemlabError(f"--max-length {length} is more than the model's {positions} positions; write "
                          f"--max-length {positions} or less")
    return {"max_length": length, "prompt_length": prompt}
