"""Tables of a Report: plain text for terminals and HTML for notebooks.

The cells are formatted here (sizes in KiB/MiB/GiB, one line per message), and laid out here too: the text table's
columns padded as pandas' ``to_string`` would pad them, the HTML table written cell by cell (:func:`html_table`: the
best row highlighted, rows that do not fit greyed, each cell's wrapping and padding its own, which pandas' ``to_html``
cannot say and its ``DataFrame.style`` would need jinja2 for).
"""

from __future__ import annotations

import html
import math
import re
import textwrap
from collections import Counter

from memlab.plan import format_bytes
from memlab.report.data import ALL_CATEGORIES, Report, Trial, speed_range
from memlab.report.format import format_rate, one_line, over_words, verdict_text
from memlab.report.host import host_lines, host_reason
from memlab.report.noise import relative_half_width
from memlab.report.views import register_views
from memlab.report.views.plan_axis import FULL_LABELS_UP_TO, run_labels

__all__ = [
    "BEST_MARK", "TIE_MARK", "card_line", "card_text", "footer_lines", "headers", "held_line", "html_table", "in_unit",
    "judged_text", "nothing_fits_reason", "short_error", "UNRELIABLE", "SPEEDS", "shown_columns", "spread_text",
    "status_text", "table_rows", "table_units", "text_lines", "text_table", "verdict_text",
]

_HEADERS = {
    "best": "",
    "number": "#",
    "plan": "plan",
    "status": "status",
    "peak": "peak",
    "card": "card",
    "host": "host",
    **{name: name for name in ALL_CATEGORIES},
    "step": "time/step",
    "samples": "samples/s",
    "spread": "noise",
    "tokens": "tokens/s",
    "prefill": "prefill tokens/s",
    "decode": "decode tokens/s",
    "notes": "notes",
}
_LEFT = ("best", "plan", "status", "notes")
SPEEDS = ("step", "samples", "tokens", "prefill", "decode")
"""The speed columns' keys (what an estimate, timing nothing, leaves out)."""
_LONG_NOTE = 40
"""A note longer than this (characters) is written under the HTML table, numbered, and its row says its number."""
_SIZES = ("peak", "card", "host", *ALL_CATEGORIES)
_BYTE_UNITS = (("B", 1), ("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30), ("TiB", 2**40))
BEST_MARK, TIE_MARK = "\u2605", "\u2248"
"""How tables mark the best trial, and the trials as fast as it within noise (:attr:`Report.ties`)."""


def _spread(trial: Trial) -> float:
    """Half the width of the trial's speed interval as a fraction of its speed (inf where there is none)."""
    if trial.status != "ok":
        return math.inf
    if trial.step_runs and trial.samples_per_s:  # pooled from runs timed in turn: the span of their medians
        low, high = speed_range(trial)
        return (high - low) / 2 / trial.samples_per_s
    return relative_half_width(trial.step_times)


UNRELIABLE = "unreliable (machine busy)"
"""The noise cell of a trial whose step times spread over more than its speed (or timed at 0 s)."""


def spread_text(trial: Trial) -> str:
    """The noise cell: ``±4%``; ``timed once`` or :data:`UNRELIABLE` where a measured trial has no number worth
    showing (never over 100%); ``-`` for a trial that was not timed (estimated, failed, out of memory, or read
    back without its step times).

    Example:
        >>> from memlab.plan import Plan
        >>> timed = Trial(Plan(), "ok", 1, {}, 0.25, 32.0, None, "cpu", rows_per_step=8, step_times=(0.1, 0.1, 9.0))
        >>> spread_text(timed)
        'unreliable (machine busy)'
    """
    if trial.status != "ok" or trial.estimated or not (trial.step_times or trial.step_runs):
        return "-"
    if len(trial.step_times) < 2 and not trial.step_runs:
        return "timed once"
    spread = _spread(trial)
    return f"\u00b1{spread:.0%}" if math.isfinite(spread) and spread <= 1 else UNRELIABLE


def table_rows(report: Report) -> list[dict[str, str]]:
    """Each trial as formatted cells: mark, number (1, 2, ... in trial order, as the figures number their bars, where
    there are more than :data:`~memlab.report.views.plan_axis.FULL_LABELS_UP_TO` trials), plan, status, sizes (one unit
    for them all: :func:`table_units`; the card figure beside the allocated peak, ``-`` where it is unknown),
    time/step, samples/s and its noise, tokens/s, notes.

    Example:
        >>> from memlab.plan import Plan
        >>> row = table_rows(Report([Trial(Plan(), "ok", 3 * 2**20, {"params": 2**20}, 0.25, 32.0, None, "cpu",
        ...                                rows_per_step=8, step_times=(0.24, 0.25, 0.26))]))[0]
        >>> row["peak"], row["params"], row["step"], row["samples"], row["spread"]
        ('3.0', '1.0', '250', '32.0', '\u00b14%')
    """
    best, ties = report.best, report.ties
    shared = shared_notes(report)
    size_unit, time_unit = table_units(report)
    rows = []
    numbered = len(report.trials) > FULL_LABELS_UP_TO  # the figures number their bars: the table says which is which
    names = run_labels([trial.label for trial in report.trials])  # a setting run twice: "plain", "plain (2)"
    for number, (name, trial) in enumerate(zip(names, report.trials, strict=True), start=1):
        status = status_text(trial, report.fits(trial))
        notes = [note for note in trial.notes if note not in shared]
        if trial.error:
            notes.insert(0, short_error(trial))
        peak = in_unit(trial.peak_bytes, size_unit) if trial.status != "error" else "-"
        if trial.status == "oom" and trial.peak_bytes:
            peak = ">= " + peak
        mark = BEST_MARK if trial is best else TIE_MARK if any(trial is tie for tie in ties) else ""
        card = trial.card_bytes if trial.status == "ok" else None
        row = {"best": mark, "number": str(number) if numbered else "", "plan": name, "status": status,
               "peak": peak,
               "card": "-" if card is None else in_unit(card, size_unit),
               "host": in_unit(trial.host_bytes, size_unit) if trial.host_bytes and trial.status != "error" else "-"}
        for name in report.categories:
            row[name] = in_unit(trial.breakdown.get(name, 0), size_unit) if trial.status == "ok" else "-"
        row.update(
            step="-" if trial.step_time_s is None else in_unit(trial.step_time_s, time_unit),
            samples=format_rate(trial.samples_per_s),
            spread=spread_text(trial),
            tokens=format_rate(trial.tokens_per_s),
            prefill=format_rate(getattr(trial, "prefill_tokens_per_s", None)),
            decode=format_rate(getattr(trial, "decode_tokens_per_s", None)),
            notes="; ".join(notes),
        )
        rows.append(row)
    return rows


def table_units(report: Report) -> tuple[tuple[str, float], tuple[str, float]]:
    """The unit of the size columns (from the largest peak of the trials that ran: KiB, MiB, GiB...) and of
    time/step (ms or s), each as ``(name, size of one unit)``: one unit per column, said in the header.

    Example:
        >>> from memlab.plan import Plan
        >>> table_units(Report([Trial(Plan(), "ok", 3 * 2**30, {}, 2.5, 1.0, None, "cpu")]))
        (('GiB', 1073741824), ('s', 1))
    """
    # The sizes of the trials that ran decide: an out-of-memory peak many times larger would shrink them to 0.01s.
    ran = [trial.peak_bytes for trial in report.trials if trial.status == "ok"]
    largest = max(ran or [trial.peak_bytes for trial in report.trials] or [0])
    size_unit = _BYTE_UNITS[0]
    for unit in _BYTE_UNITS:
        if largest >= unit[1]:
            size_unit = unit
    slowest = max((trial.step_time_s or 0.0 for trial in report.trials), default=0.0)
    time_unit: tuple[str, float] = ("s", 1) if slowest >= 1 else ("ms", 1e-3)
    return size_unit, time_unit


def headers(report: Report) -> dict[str, str]:
    """The column headers, units included (``peak MiB``, ``time/step ms``).

    Example:
        >>> from memlab.plan import Plan
        >>> h = headers(Report([Trial(Plan(), "ok", 3 * 2**20, {}, 0.5, 1.0, None, "cpu")]))
        >>> h["peak"], h["activations"], h["step"]
        ('peak MiB', 'activations MiB', 'time/step ms')
    """
    (size_name, _), (time_name, _) = table_units(report)
    named = dict(_HEADERS)
    for key in _SIZES:
        named[key] = f"{_HEADERS[key]} {size_name}"
    named["step"] = f"{_HEADERS['step']} {time_name}"
    return named


def short_error(trial: Trial) -> str:
    """The trial's error as a short note: out-of-memory messages (which run to several lines of allocator figures)
    say only what was being allocated, or that the budget was passed; other errors their first line.

    Example:
        >>> from memlab.plan import Plan
        >>> cuda = ("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
        ...         "of 79.19 GiB of which 1.2 GiB is free.")
        >>> short_error(Trial(Plan(), "oom", 5, {}, None, None, None, "cuda:0", error=cuda))
        'CUDA out of memory allocating 2.00 GiB'
        >>> budget = "OutOfMemoryError: memlab budget: out of memory: the step needs more than 700.0 KiB (716800 bytes)"
        >>> short_error(Trial(Plan(), "oom", 5, {}, None, None, None, "cpu", error=budget))
        'over the budget'
    """
    message = trial.error or ""
    if trial.status != "oom":
        return one_line(message)
    if "memlab budget" in message:
        return "over the budget"
    allocating = re.search(r"[Tt]ried to allocate ([\d.]+ ?[KMGT]?i?B)", message)
    where = "CUDA out of memory" if "CUDA" in message else "out of memory"
    return f"{where} allocating {allocating.group(1)}" if allocating else where


def in_unit(value: float, unit: tuple[str, float]) -> str:
    """``value`` in ``unit``, three significant figures or so, no unit written (the header has it); never in
    scientific notation: a size too small to show in the unit is ``< 0.01`` (in the column's unit: one unit per
    column).

    Example:
        >>> GIB, MIB = ("GiB", 2**30), ("MiB", 2**20)
        >>> in_unit(3 * 2**30, GIB), in_unit(2**29, GIB), in_unit(40 * 2**20, GIB), in_unit(5 * 2**20, GIB)
        ('3.0', '0.5', '0.04', '< 0.01')
        >>> in_unit(20_480, GIB), in_unit(4096, MIB), in_unit(0, GIB), in_unit(0.0053, ("ms", 1e-3))
        ('< 0.01', '< 0.01', '0', '5.3')
    """
    amount = value / unit[1]
    if amount == 0:
        return "0"
    if amount >= 100 or unit[0] == "B":
        return f"{amount:,.0f}"
    if amount >= 0.095:  # 0.097 shows as 0.1, as its neighbours at 0.1 do, not as 0.10
        return f"{amount:.1f}"
    if amount >= 0.01:
        return f"{amount:.2f}"
    return "< 0.01"


def shared_notes(report: Report) -> list[str]:
    """The notes every trial of a report carries: said once under the table, not on each row (a report of one
    trial has all its notes there, so that its row stays one line).

    Example:
        >>> from memlab.plan import Plan
        >>> a = Trial(Plan(), "ok", 1, {}, None, None, None, "cuda", notes=("estimated", "a"))
        >>> shared_notes(Report([a, Trial(Plan(checkpointing=True), "ok", 1, {}, None, None, None, "cuda",
        ...                                 notes=("estimated",))]))
        ['estimated']
    """
    if not report.trials:
        return []
    first, *others = report.trials
    return [note for note in first.notes if all(note in trial.notes for trial in others)]


def footer_lines(report: Report) -> list[str]:
    """The summary under a table: the best plan, the budget, memory held before, devices, skipped plans."""
    lines = []
    best = report.best
    names = {id(trial): name for trial, name in zip(report.trials, run_labels([t.label for t in report.trials]),
                                                    strict=True)}
    if best is not None:
        speed = "" if best.samples_per_s is None else f", {format_rate(best.samples_per_s)} samples/s"
        card = "" if best.card_bytes is None else f", card {format_bytes(best.card_bytes)}"
        # Untimed (estimates), "best" can only mean the lowest peak: said, so that it never reads as the fastest.
        why = "lowest peak among the plans that fit, nothing was timed: " if best.samples_per_s is None else ""
        best_name = names.get(id(best), best.label)
        lines.append(f"Best: {best_name} ({why}peak {format_bytes(best.peak_bytes)}{card}{speed})")
        ties = report.ties
        if ties:
            lines.append(
                f"{TIE_MARK} As fast within measurement noise: "
                + ", ".join(names.get(id(trial), trial.label) for trial in ties)
                # "lower" only where it is: a setting run twice ties with itself at the same peak
                + (f" ({best_name} is named best for its lower peak)"
                   if all(trial.peak_bytes > best.peak_bytes for trial in ties)
                   else f" ({best_name} is named best: no lower peak among them, and it comes first)")
            )
    elif report.trials:
        lines.append("Best: none of these fits")
        reason = nothing_fits_reason(report)
        if reason:
            lines.append(f"Why: {reason}")
        if report.suggestions:
            # the figure their verdict judged, as the table's own rows are judged (the card figure where known)
            allocator = [t for t in report.suggestions if t.notes and t.notes[0].startswith("with the CUDA allocator")]
            named = "; ".join(f"{t.label}{' with expandable segments' if t in allocator else ''}, {judged_text(t)}"
                              for t in report.suggestions)
            lines.append(f"Estimated to fit, outside the searched space: {named}")
            lines += [f"{t.label} fits {t.notes[0]}" for t in allocator[:1]]
        if report.shorter_sequences:
            lines.append(f"Or shorter: {report.shorter_sequences}")
    if report.budget is not None:
        lines.append(f"Budget: {format_bytes(report.budget)}")
    lines += host_lines(report)
    verdict = card_line(report)
    if verdict is not None:
        lines.append(verdict)
    devices = sorted({trial.device for trial in report.trials})
    if devices:
        lines.append("Device: " + ", ".join(devices))
    if any(trial.estimated for trial in report.trials):
        lines.append("Estimated: dry run on fake tensors, no step was timed")
    lines += [f"Note: {note}" for note in shared_notes(report)]
    if report.skipped:
        kinds = Counter(reason.split(":", 1)[0].strip() for _, reason in report.skipped)
        counted = ", ".join(f"{count} {kind}" for kind, count in kinds.most_common())
        lines.append(f"Not measured: {len(report.skipped)} plans ({counted})")
    return lines


def held_line(report: Report) -> str | None:
    """The line at the top of a table that names the memory the process held before the trials (counted in their
    peaks, under 'other'), only where it changes a verdict: a trial that does not fit would fit without it. None
    otherwise: memory held that changes nothing is no news.

    Example:
        >>> from memlab.plan import Plan
        >>> over = Trial(Plan(), "ok", 90 * 2**20, {"other": 20 * 2**20}, None, None, None, "cpu",
        ...              preexisting_bytes=16 * 2**20)
        >>> held_line(Report([over], budget=80 * 2**20))  # doctest: +NORMALIZE_WHITESPACE
        "Held before the trials: 16.0 MiB, counted in each peak (under 'other'): without it, plain would fit the
        budget. Free what you no longer need (an old optimizer, an earlier apply's), or undo it."
        >>> held_line(Report([over], budget=60 * 2**20)) is None  # over the budget either way
        True
    """
    budget = report.budget
    held = max((trial.preexisting_bytes for trial in report.trials), default=0)
    if held <= 0 or budget is None:
        return None
    changed = [
        trial for trial in report.trials
        if trial.status in ("ok", "oom") and not report.fits(trial) and 0 < trial.verdict_bytes - held <= budget
        and (trial.status == "ok" or trial.preexisting_bytes > 0)
    ]
    if not changed:
        return None
    named = ", ".join(trial.label for trial in changed[:3]) + (" and others" if len(changed) > 3 else "")
    return (
        f"Held before the trials: {format_bytes(held)}, counted in each peak (under 'other'): without it, {named} "
        "would fit the budget. Free what you no longer need (an old optimizer, an earlier apply's), or undo it."
    )


def card_text(trial: Trial) -> str | None:
    """What the card will show, in words, for a trial on CUDA: ``card 1.50 GiB``, or ``card figure unknown`` where
    the allocator's reserve or the CUDA context is not known; None for a trial that is not on CUDA.

    Example:
        >>> import dataclasses
        >>> from memlab.plan import Plan
        >>> trial = Trial(Plan(), "ok", 2**30, {}, None, None, None, "cuda:0", reserved_bytes=2**30)
        >>> card_text(trial), card_text(dataclasses.replace(trial, context_bytes=2**29))
        ('card figure unknown', 'card 1.50 GiB')
    """
    if not str(trial.device).startswith("cuda"):
        return None
    card = trial.card_bytes
    return "card figure unknown" if card is None else f"card {format_bytes(card)}"


def judged_text(trial: Trial) -> str:
    """The figure a budget verdict on ``trial`` judges, in words: ``card 1.50 GiB (peak 1.00 GiB)`` where the card
    figure is known, else ``peak 1.00 GiB``.

    Example:
        >>> from memlab.plan import Plan
        >>> judged_text(Trial(Plan(), "ok", 2**30, {}, None, None, None, "cuda:0", reserved_bytes=2**30,
        ...                   context_bytes=2**29))
        'card 1.50 GiB (peak 1.00 GiB)'
    """
    peak = f"peak {format_bytes(trial.peak_bytes)}"
    return peak if trial.card_bytes is None else f"card {format_bytes(trial.card_bytes)} ({peak})"


def card_line(report: Report) -> str | None:
    """The line under a table that says what the card column is and which figure the budget verdicts judged, for a
    report with trials on CUDA that ran (None otherwise).

    Example:
        >>> import dataclasses
        >>> from memlab.plan import Plan
        >>> trial = Trial(Plan(), "ok", 90, {}, None, None, None, "cuda:0", reserved_bytes=96, context_bytes=8)
        >>> card_line(Report([trial], budget=100))
        'Card: allocator reserve + CUDA context (what nvidia-smi shows); fits are judged on it'
        >>> card_line(Report([dataclasses.replace(trial, context_bytes=None)], budget=100))
        "Card figure unknown (the allocator's reserve or the CUDA context is not known); fits are judged on the \
allocated peak"
    """
    ran = [trial for trial in report.trials if trial.status == "ok" and str(trial.device).startswith("cuda")]
    if not ran:
        return None
    known = sum(trial.card_bytes is not None for trial in ran)
    judged = report.budget is not None or any(trial.budget is not None for trial in ran)
    if not known:
        line = "Card figure unknown (the allocator's reserve or the CUDA context is not known)"
        return line + ("; fits are judged on the allocated peak" if judged else "")
    line = "Card: allocator reserve + CUDA context (what nvidia-smi shows)"
    if known < len(ran):
        return line + ("; fits are judged on it where known, else on the allocated peak" if judged else "")
    return line + ("; fits are judged on it" if judged else "")


def nothing_fits_reason(report: Report) -> str | None:
    """Why no trial fits, in one line: what the trials' own breakdowns say about the budget (None if one fits).

    The weights, their gradients and the optimizer state do not shrink with the micro-batch: when they alone pass
    the budget, no split of the batch can help, and that is said. Otherwise the closest trial is named.

    Example:
        >>> from memlab.plan import Plan
        >>> full = Trial(Plan(), "ok", 900, {"params": 300, "grads": 300, "optimizer": 200, "activations": 100},
        ...              1.0, 1.0, None, "cpu")
        >>> nothing_fits_reason(Report([full], budget=700))
        'weights, gradients and optimizer state alone take 800 B in plain, more than the budget of 700 B'
        >>> nothing_fits_reason(Report([full], budget=850))
        'the smallest peak, 900 B (plain), is 50 B over the budget of 850 B'
    """
    if report.best is not None or not report.trials or report.budget is None or host_reason(report):
        return host_reason(report) if report.best is None else None
    budget = report.budget
    states = [
        (sum(trial.breakdown.get(name, 0) for name in ("params", "grads", "optimizer")), trial)
        for trial in report.trials
        if trial.status != "error"
    ]
    smallest_state = min(states, key=lambda item: item[0], default=None)
    if smallest_state is not None and smallest_state[0] > budget:
        state, trial = smallest_state
        return (
            f"weights, gradients and optimizer state alone take {format_bytes(state)} in {trial.label}, more than "
            f"the budget of {format_bytes(budget)}"
        )
    ran = [trial for trial in report.trials if trial.status != "error" and trial.peak_bytes > 0]
    if not ran:
        return "no plan ran; see the errors in the table"
    closest = min(ran, key=lambda trial: trial.verdict_bytes)
    at_least = "at least " if closest.status == "oom" else ""
    figure = "peak" if closest.card_bytes is None else "card figure"
    return (
        f"the smallest {figure}, {at_least}{format_bytes(closest.verdict_bytes)} ({closest.label}), is "
        f"{at_least}{format_bytes(closest.verdict_bytes - budget)} over the budget of {format_bytes(budget)}"
    )


def text_table(report: Report, width: int | None = None) -> str:
    """A plain-text table for the terminal: a line per trial, ★ marks the best (≈ its ties), then the summary.

    With ``width`` (a terminal's columns), a table that would be wider keeps its lines within it: the notes go under
    the table, numbered, and then, if that is not enough, the memory categories give way (the peak stays).

    Example:
        >>> from memlab.plan import Plan
        >>> r = Report([Trial(Plan(), "ok", 2048, {"params": 2048}, 0.25, 16.0, None, "cpu")])
        >>> print(text_table(r))  # doctest: +NORMALIZE_WHITESPACE
          plan  status peak KiB params KiB grads KiB optimizer KiB activations KiB other KiB
          time/step ms samples/s tokens/s
        ★ plain ok 2.0 2.0 0 0 0 0 250 16.0 -
        <BLANKLINE>
        Best: plain (peak 2.0 KiB, 16.0 samples/s)
        Device: cpu
        >>> print(text_table(r, width=60))
          plan  status peak KiB time/step ms samples/s tokens/s
        ★ plain ok          2.0          250      16.0        -
        <BLANKLINE>
        Memory by category (params, grads, optimizer, activations,
          other) left out to fit 60 columns.
        Best: plain (peak 2.0 KiB, 16.0 samples/s)
        Device: cpu
    """
    if not report.trials:
        return "No trials yet."
    rows = table_rows(report)
    names = headers(report)
    keys = shown_columns(rows, with_mark=True, categories=report.categories)
    lines = text_lines(rows, names, keys)
    under: list[str] = []
    if width is not None and max(map(len, lines), default=0) > width and "notes" in keys:
        notes = list(dict.fromkeys(row["notes"] for row in rows if row["notes"]))
        under = [f"[{number}] {note}" for number, note in enumerate(notes, start=1)]
        rows = [{**row, "notes": f"[{notes.index(row['notes']) + 1}]" if row["notes"] else ""} for row in rows]
        lines = text_lines(rows, names, keys)
    if width is not None and max(map(len, lines), default=0) > width:
        dropped = [key for key in keys if key in ALL_CATEGORIES]
        keys = [key for key in keys if key not in ALL_CATEGORIES]
        lines = text_lines(rows, names, keys)
        under.append(f"Memory by category ({', '.join(dropped)}) left out to fit {width} columns.")
    under += footer_lines(report)
    if width is not None:  # the lines under the table too: a 120-column terminal wraps none of them
        under = [part for line in under for part in textwrap.wrap(line, width, subsequent_indent="  ",
                                                                      break_long_words=False, break_on_hyphens=False)]
    held = held_line(report)
    return "\n".join([*([held, ""] if held else []), *lines, "", *under])


def text_lines(rows: list[dict[str, str]], names: dict[str, str], keys: list[str]) -> list[str]:
    widths = {key: max(len(names[key]), *(len(row[key]) for row in rows)) for key in keys}

    def aligned(key: str, text: str) -> str:
        return text.ljust(widths[key]) if key in _LEFT else text.rjust(widths[key])

    # Every cell and header is padded to its column's width (text left, numbers right), joined by one space: what
    # pandas' DataFrame.to_string(index=False) printed of them, without importing pandas (half a second).
    lines = [[aligned(key, names[key]) for key in keys], *([aligned(key, row[key]) for key in keys] for row in rows)]
    return [" ".join(cells).rstrip() for cells in lines]


def html_table(report: Report) -> str:
    """An HTML table: one unit per size column, the best row highlighted and marked, rows that do not fit greyed.

    Laid out to fit a notebook's output in a 1,000-px window with the file browser open (about 540 px beside the
    prompt; a search's table of 13 columns was 830 px there, its speeds out of sight): the number columns' headers
    turned to read upwards, so that each is as narrow as its numbers; the plan's name, the status, the noise and the
    notes wrap between words, the other cells never (``>= 1.2``); the cells' padding is 3 px above and below, 2 px at
    the sides, and the text 12 px. One
    still wider scrolls sideways in its own box rather than spilling out of the output.

    Example:
        >>> from memlab.plan import Plan
        >>> r = Report([Trial(Plan(), "ok", 2048, {"params": 2048}, 0.25, 16.0, None, "cpu")])
        >>> "plain ★ best" in html_table(r), "writing-mode:vertical-rl" in html_table(r)  # "peak KiB" turned
        (True, True)
    """
    if not report.trials:
        return "<div class='memlab-report'><p>No trials yet.</p></div>"
    best = report.best
    rows = table_rows(report)
    styles = []
    for trial, row in zip(report.trials, rows, strict=True):
        if trial is best:
            row["plan"] += f" {BEST_MARK} best"
            styles.append("background:#e3f4e1;font-weight:bold")
        elif row["best"] == TIE_MARK:
            row["plan"] += f" {TIE_MARK} as fast"
            styles.append("background:#f1f9ef")
        elif trial.status == "oom" or (trial.status == "ok" and not report.fits(trial)):
            styles.append("background:#f4f4f4;color:#777")
        elif trial.status == "error":
            styles.append("background:#fdecea")
        else:
            styles.append("")
    # Long notes go under the table, numbered (in a notebook's ~1000 px, a dozen columns left them ~150 px, and a
    # row of 7 to 9 lines); short ones stay in their row.
    long_notes = list(dict.fromkeys(row["notes"] for row in rows if len(row["notes"]) > _LONG_NOTE))
    for row in rows:
        if row["notes"] in long_notes:
            row["notes"] = f"[{long_notes.index(row['notes']) + 1}]"
    names = headers(report)
    keys = shown_columns(rows, with_mark=False, categories=report.categories)
    head = "".join(_header_cell(key, names[key]) for key in keys)
    body = "".join(
        (f"<tr style='{style}'>" if style else "<tr>") + "".join(_cell(key, row[key]) for key in keys) + "</tr>"
        for row, style in zip(rows, styles, strict=True)
    )
    table = (f"<table style='white-space:nowrap;font-size:12px'><thead><tr>{head}</tr></thead>"
             f"<tbody>{body}</tbody></table>")
    numbered = [f"[{number}] {note}" for number, note in enumerate(long_notes, start=1)]
    footer = "".join(f"<p style='margin:2px 0'>{html.escape(line)}</p>" for line in [*numbered, *footer_lines(report)])
    held = held_line(report)
    top = "" if held is None else f"<p style='margin:2px 0 6px;font-weight:bold'>{html.escape(held)}</p>"
    table = f"<div style='max-width:100%;overflow-x:auto'>{table}</div>"
    # As wide as its container, which it never widens (width 0, at least 100%): inside the panel's HTML widget (a
    # flex item as wide as its content) the table then scrolls in its own box instead of running past the panel.
    return f"<div class='memlab-report' style='white-space:normal;width:0;min-width:100%'>{top}{table}{footer}</div>"


# JupyterLab's cells have 6 px: 13 columns gave 78 px of a 630-px area to it. 2 px at the sides keeps a search's
# 14 columns inside 548 px with room for wider speeds (3 px left CI's run 3 px over).
_PADDING = "padding:3px 2px"
_WRAPPING = frozenset(("plan", "status", "spread", "notes"))  # words: a line may break between them


def _header_cell(key: str, name: str) -> str:
    """A column's header: a number column's turned to read upwards (its numbers are far narrower than
    ``activations KiB`` or ``samples/s``), the plan's, the status's and the notes' level, left-aligned."""
    text = html.escape(name)
    if key in _LEFT or key == "number":
        return f"<th style='{_PADDING};white-space:normal;vertical-align:bottom;text-align:left'>{text}</th>"
    return (f"<th style='{_PADDING};vertical-align:bottom;text-align:left'><span style='writing-mode:vertical-rl;"
            f"transform:rotate(180deg);white-space:nowrap'>{text}</span></th>")


def _cell(key: str, value: str) -> str:
    """A body cell: words in the wrapping columns may go onto several lines, the others' on one (``>= 1.2``); the
    plan's, the status's and the notes' left-aligned (numbers as the notebook aligns a cell: JupyterLab to the right).
    Every byte here is in a saved notebook once per row and column: nothing more is said."""
    wrapping = ";white-space:normal" if key in _WRAPPING else ""
    side = ";text-align:left" if key in _LEFT else ""
    # JupyterLab's cells wrap whatever the table says: a bound keeps its sign by a space that does not break
    text = html.escape(value) if key in _WRAPPING else html.escape(value).replace(" ", "&nbsp;")
    return f"<td style='{_PADDING}{side}{wrapping}'>{text}</td>"


def shown_columns(rows: list[dict[str, str]], *, with_mark: bool, categories: tuple[str, ...]) -> list[str]:
    """The columns worth a place: the report's memory categories; the plan numbers (where the figures number their
    bars), the card figure, the host bytes, the noise, the prefill and decode speeds and the notes only where some
    row has one."""
    optional = {"number", "card", "host", "spread", "notes", "prefill", "decode"}
    return [
        key
        for key in _HEADERS
        if (with_mark or key != "best")
        and (key not in ALL_CATEGORIES or key in categories)
        and (key not in optional or any(row[key] not in ("", "-") for row in rows))
    ]


def status_text(trial: Trial, fits: bool) -> str:
    """``ok``, ``ok (estimate)``, ``does not fit (OOM)``, ``does not fit (over budget)``, ``does not fit (host)``
    (the device's budget holds, the host's does not), ``does not fit (over budget and host)`` (both:
    :func:`~memlab.report.format.over_words`) or ``error``."""
    if trial.status == "oom":
        return "does not fit (OOM)"
    if trial.status == "error":
        return "error"
    if not fits:
        return f"does not fit ({over_words(trial)})"
    return "ok (estimate)" if trial.estimated else "ok"


register_views(text_table=text_table, html_table=html_table)
