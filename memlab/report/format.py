"""Small text forms shared by tables, the live figure and the panel: one-line messages, seconds, rates."""

from __future__ import annotations

from typing import Any

from memlab.errors import MemlabError

__all__ = ["FIGURE_WORDS", "budget_words", "format_rate", "format_seconds", "one_line", "over_words", "verdict_text"]

FIGURE_WORDS = {"card": "card figure", "allocated": "allocated peak", "host": "host memory"}
"""How text names each :attr:`memlab.report.Trial.verdict_figure` (``"card"``: the card figure, ...)."""


def over_words(trial: Any) -> str:
    """Which budget a :class:`~memlab.report.Trial` that does not fit is over, as its status says it: ``over
    budget`` (the device's), ``host`` (the host budget alone) or ``over budget and host`` (both).

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.report import Trial
        >>> both = Trial(Plan(offload="all"), "ok", 9, {}, None, None, None, "cuda", budget=8, host_bytes=9,
        ...              host_budget=8)
        >>> import dataclasses
        >>> over_words(both), over_words(dataclasses.replace(both, budget=10)), over_words(both.__class__(
        ...     Plan(), "ok", 9, {}, None, None, None, "cuda", budget=8))
        ('over budget and host', 'host', 'over budget')
    """
    if trial.host_fits:
        return "over budget"
    return "host" if trial.device_fits else "over budget and host"


def verdict_text(trial: Any, fits: bool) -> str:
    """``fits`` or ``does not fit``, and on CUDA the figure the verdict judged (:attr:`Trial.verdict_figure`):
    ``fits by the card figure``, ``does not fit by the allocated peak``; over the host budget, which budgets refused
    it (:func:`~memlab.report.format.over_words`): ``does not fit (host)``, ``does not fit by the card figure and
    host memory``.

    Example:
        >>> import dataclasses
        >>> from memlab.plan import Plan
        >>> from memlab.report import Trial
        >>> trial = Trial(Plan(), "ok", 1, {}, None, None, None, "cuda:0", budget=0)
        >>> verdict_text(trial, False)
        'does not fit by the allocated peak'
        >>> verdict_text(dataclasses.replace(trial, host_bytes=2, host_budget=1), False)
        'does not fit by the allocated peak and host memory'
    """
    words = "fits" if fits else "does not fit"
    if not fits and over_words(trial) == "host":
        return "does not fit (host)"
    device = "allocated" if trial.card_bytes is None else "card"  # the device's figure, whatever refused it
    figure = f"by the {FIGURE_WORDS[device]}" + ("" if fits or trial.host_fits else " and host memory")
    return f"{words} {figure}" if str(trial.device).startswith("cuda") or not trial.host_fits else words


def one_line(message: BaseException | str, limit: int | None = 120) -> str:
    """The first non-empty line of a message, for a table cell or a status line; at most ``limit`` characters.

    An exception other than a :class:`~memlab.errors.MemlabError` (whose messages are written for the user) is
    prefixed with its type name, and one without a message is its type name alone.

    Example:
        >>> one_line("CUDA out of memory.\\n  Tried to allocate 2.00 GiB")
        'CUDA out of memory.'
        >>> one_line(ValueError("\\nbad value\\nmore")), one_line(MemlabError("write budget='8GiB'"))
        ('ValueError: bad value', "write budget='8GiB'")
        >>> one_line("x" * 200, limit=10), one_line(KeyboardInterrupt())
        ('xxxxxxx...', 'KeyboardInterrupt')
    """
    text = next((line.strip() for line in str(message).splitlines() if line.strip()), "")
    if isinstance(message, BaseException) and not isinstance(message, MemlabError):
        text = f"{type(message).__name__}: {text}" if text else type(message).__name__
    elif isinstance(message, BaseException) and not text:
        text = type(message).__name__
    if limit is None or len(text) <= limit:
        return text
    return text[: limit - 3] + "..."


def format_seconds(seconds: float | None) -> str:
    """``0.25`` -> ``'250 ms'``, ``2.5`` -> ``'2.50 s'``, None -> ``'-'``.

    Example:
        >>> format_seconds(0.25), format_seconds(2.5), format_seconds(None)
        ('250 ms', '2.50 s', '-')
    """
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.2f} s"


def format_rate(rate: float | None) -> str:
    """A rate with three significant figures or so: ``1234.5`` -> ``'1,234'``, ``12.34`` -> ``'12.3'``.

    Example:
        >>> format_rate(1234.5), format_rate(12.34), format_rate(1.234), format_rate(None)
        ('1,234', '12.3', '1.23', '-')
    """
    if rate is None:
        return "-"
    if rate >= 100:
        return f"{rate:,.0f}"
    if rate >= 10:
        return f"{rate:.1f}"
    return f"{rate:.2f}"


def budget_words(text: str) -> str:
    """What a budget string means, unit spelled out, so that ``24GB`` (10^9 bytes) and ``24GiB`` (2^30) are never
    confused: the bytes in GiB, and which kind of unit was read.

    Example:
        >>> budget_words("24gb")
        '24gb = 22.35 GiB (GB = 10^9 bytes; write 24GiB for 2^30)'
        >>> budget_words("24G"), budget_words("24GiB")
        ('24G = 24.00 GiB (G read as GiB, 2^30 bytes)', '24GiB = 24.00 GiB')
    """
    import re

    from memlab.plan import format_bytes, parse_budget

    value = parse_budget(text) or 0
    match = re.match(r"^\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*$", text)
    unit = match.group(2) if match else ""
    size = format_bytes(value)
    upper = unit.upper()
    if upper in ("KB", "MB", "GB", "TB"):
        number = match.group(1) if match else ""
        power = "KMGT".index(upper[0]) + 1
        return f"{text} = {size} ({upper} = 10^{3 * power} bytes; write {number}{upper[0]}iB for 2^{10 * power})"
    if upper in ("K", "M", "G", "T"):
        return f"{text} = {size} ({upper} read as {upper}iB, 2^{10 * ('KMGT'.index(upper) + 1)} bytes)"
    return f"{text} = {size}"
