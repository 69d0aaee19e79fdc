"""Sizes as text: a budget read from ``"8GiB"`` / ``"500MB"`` / bytes, and bytes written for tables and messages.

Example:
    >>> format_bytes(parse_budget("1.5GiB"))
    '1.50 GiB'
"""

from __future__ import annotations

import math
import re

from memlab.errors import MemlabError

__all__ = ["format_bytes", "parse_budget"]

_UNITS = {
    "B": 1,
    "K": 1024,
    "KB": 1000,
    "KIB": 1024,
    "M": 1024**2,
    "MB": 1000**2,
    "MIB": 1024**2,
    "G": 1024**3,
    "GB": 1000**3,
    "GIB": 1024**3,
    "T": 1024**4,
    "TB": 1000**4,
    "TIB": 1024**4,
}
_BUDGET_PATTERN = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def _likely_size(text: str) -> str:
    """What to write for a bare number: large numbers are bytes, those in nvidia-smi's range MiB, small ones GiB."""
    number = float(text)
    if number >= 2**20:
        gib = number / 1024**3
        size = f"{gib:.3g}GiB" if gib >= 1 else f"{number / 1024**2:.3g}MiB"
        return f"the unit: {size}, or {text}B for bytes"
    if number >= 1024:
        return f"the unit, such as {text}MiB (= {number / 1024:.3g}GiB), or {text}B for bytes"
    return f"the unit, such as {text}GiB or {text}MB"


def parse_budget(budget: int | float | str | None) -> int | None:
    """Bytes from an int or a string such as ``"8GiB"``, ``"500MB"``, ``"1.5G"`` (G, M, K alone are binary).

    Example:
        >>> parse_budget("1.5G")
        1610612736
        >>> parse_budget("500MB")
        500000000
        >>> parse_budget("lots")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: budget 'lots' is not understood; write ... such as 8GiB, 500MB, 1.5G
        >>> parse_budget("24")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: budget '24' has no unit; write the unit, such as 24GiB or 24MB
        >>> parse_budget("25769803776")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: budget '25769803776' has no unit; write the unit: 24GiB, or 25769803776B for bytes
    """
    if budget is None:
        return None
    if isinstance(budget, bool):
        raise MemlabError("budget must be bytes or a size string; write for example budget='8GiB'")
    if isinstance(budget, int):
        if budget <= 0:
            raise MemlabError(f"budget {budget} is not positive; write a size such as 8GiB")
        return budget
    if isinstance(budget, float):
        if not math.isfinite(budget) or budget < 1:
            raise MemlabError(f"budget {budget} is not positive (a whole number of bytes); write a size such as 8GiB")
        return int(budget)
    match = _BUDGET_PATTERN.match(str(budget))
    unit = match.group(2).upper() if match else ""
    if match is not None and not unit:
        raise MemlabError(
            f"budget {budget!r} has no unit; write {_likely_size(match.group(1))}"
        )
    if match is None or unit not in _UNITS:
        raise MemlabError(
            f"budget {budget!r} is not understood; write bytes as a number or a size such as 8GiB, 500MB, 1.5G"
        )
    value = int(float(match.group(1)) * _UNITS[unit])
    if value < 1:
        raise MemlabError(f"budget {budget!r} is not positive; write a size such as 8GiB")
    return value


def format_bytes(num_bytes: float | None) -> str:
    """``1536`` -> ``'1.5 KiB'``; used in tables and messages.

    Example:
        >>> format_bytes(3 * 1024**3)
        '3.00 GiB'
    """
    if num_bytes is None:
        return "-"
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(round(value, 2 if unit == "GiB" else 1)) < 1024:
            return f"{value:.0f} B" if unit == "B" else f"{value:.{2 if unit == 'GiB' else 1}f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"
