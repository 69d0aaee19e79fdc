"""Tables of a Report: plain text for terminals and HTML for notebooks, both rendered by pandas.

The cells are formatted here (sizes in KiB/MiB/GiB, one line per message); pandas lays them out. Per-row
highlighting of the HTML table (the best row, rows that do not fit) is added to pandas' ``to_html`` output by
:func:`_style_rows`, because the library way (``DataFrame.style``) needs jinja2, which memlab does not depend on.
"""

from __future__ import annotations

import html
from collections import Counter

from memlab.measure.tracker import CATEGORIES
from memlab.plan import format_bytes
from memlab.report.data import Report, Trial
from memlab.report.format import format_rate, format_seconds, one_line

__all__ = ["footer_lines", "html_table", "status_text", "table_rows", "text_table"]

_HEADERS = {
    "best": "",
    "plan": "plan",
    "status": "status",
    "peak": "peak",
    **{name: name for name in CATEGORIES},
    "step": "time/step",
    "samples": "samples/s",
    "tokens": "tokens/s",
    "notes": "notes",
}
_LEFT = ("best", "plan", "status", "notes")


def table_rows(report: Report) -> list[dict[str, str]]:
    """Each trial as formatted cells: best mark, plan, status, peak, categories, time/step, rates, notes."""
    best = report.best
    shared = shared_notes(report)
    rows = []
    for trial in report.trials:
        status = status_text(trial, report.fits(trial))
        notes = [note for note in trial.notes if note not in shared]
        if trial.error:
            notes.insert(0, one_line(trial.error))
        peak = format_bytes(trial.peak_bytes) if trial.status != "error" else "-"
        if trial.status == "oom" and trial.peak_bytes:
            peak = ">= " + peak
        row = {
            "best": "*" if trial is best else "",
            "plan": trial.label,
            "status": status,
            "peak": peak,
        }
        for name in CATEGORIES:
            row[name] = format_bytes(trial.breakdown[name]) if trial.status == "ok" else "-"
        row.update(
            step=format_seconds(trial.step_time_s),
            samples=format_rate(trial.samples_per_s),
            tokens=format_rate(trial.tokens_per_s),
            notes="; ".join(notes),
        )
        rows.append(row)
    return rows

def shared_notes(report: Report) -> list[str]:
    """The notes every trial of a report (of two or more) carries: said once under the table, not on each row.

    Example:
        >>> from memlab.plan import Plan
        >>> a = Trial(Plan(), "ok", 1, {}, None, None, None, "cuda", notes=("estimated", "a"))
        >>> shared_notes(Report([a, Trial(Plan(checkpointing=True), "ok", 1, {}, None, None, None, "cuda",
        ...                                 notes=("estimated",))]))
        ['estimated']
    """
    if len(report.trials) < 2:
        return []
    first, *others = report.trials
    return [note for note in first.notes if all(note in trial.notes for trial in others)]


def footer_lines(report: Report) -> list[str]:
    """The summary under a table: the best plan, the budget, memory held before, devices, skipped plans."""
    lines = []
    best = report.best
    if best is not None:
        speed = "" if best.samples_per_s is None else f", {format_rate(best.samples_per_s)} samples/s"
        lines.append(f"Best: {best.label} (peak {format_bytes(best.peak_bytes)}{speed})")
        ties = report.ties
        if ties:
            lines.append("As fast within measurement noise: " + ", ".join(trial.label for trial in ties))
    elif report.trials:
        lines.append("Best: none of these fits")
        if report.suggestions:
            named = ", ".join(f"{t.label} (estimated {format_bytes(t.peak_bytes)})" for t in report.suggestions)
            lines.append(f"Estimated to fit, outside the searched space: {named}")
    if report.budget is not None:
        lines.append(f"Budget: {format_bytes(report.budget)}")
    held = max((trial.preexisting_bytes for trial in report.trials), default=0)
    if held > 0:
        lines.append(
            f"Held before the trials: {format_bytes(held)} (counted under 'other'; "
            "free what you no longer need, such as an old optimizer, to make room)"
        )
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


def text_table(report: Report) -> str:
    """A plain-text table for the terminal: a line per trial, ``*`` marks the best, then the summary.

    Example:
        >>> from memlab.plan import Plan
        >>> r = Report([Trial(Plan(), "ok", 2048, {"params": 2048}, 0.25, 16.0, None, "cpu")])
        >>> print(text_table(r))
          plan  status    peak  params grads optimizer activations other time/step samples/s tokens/s
        * plain ok     2.0 KiB 2.0 KiB   0 B       0 B         0 B   0 B    250 ms      16.0        -
        <BLANKLINE>
        Best: plain (peak 2.0 KiB, 16.0 samples/s)
        Device: cpu
    """
    import pandas

    if not report.trials:
        return "No trials yet."
    rows = table_rows(report)
    keys = [key for key in _HEADERS if key != "notes" or any(row["notes"] for row in rows)]
    widths = {key: max(len(_HEADERS[key]), *(len(row[key]) for row in rows)) for key in keys}

    def aligned(key: str, text: str) -> str:
        return text.ljust(widths[key]) if key in _LEFT else text.rjust(widths[key])

    # Every cell and header is padded here, so pandas only joins the columns: text left, numbers right.
    headers = [aligned(key, _HEADERS[key]) for key in keys]
    frame = pandas.DataFrame([[aligned(key, row[key]) for key in keys] for row in rows], columns=headers)
    table = frame.to_string(index=False, formatters={header: str for header in headers})
    lines = [line.rstrip() for line in table.splitlines()]
    return "\n".join([*lines, "", *footer_lines(report)])


def html_table(report: Report) -> str:
    """An HTML table: sizes in KiB/MiB/GiB, the best row highlighted and marked, rows that do not fit greyed.

    Example:
        >>> from memlab.plan import Plan
        >>> r = Report([Trial(Plan(), "ok", 2048, {"params": 2048}, 0.25, 16.0, None, "cpu")])
        >>> "plain \u2605 best" in html_table(r)
        True
    """
    import pandas

    if not report.trials:
        return "<div class='memlab-report'><p>No trials yet.</p></div>"
    best = report.best
    rows = table_rows(report)
    styles = []
    for trial, row in zip(report.trials, rows, strict=True):
        if trial is best:
            row["plan"] += " \u2605 best"
            styles.append("background:#e3f4e1;font-weight:bold")
        elif trial.status == "oom" or (trial.status == "ok" and not report.fits(trial)):
            styles.append("background:#f4f4f4;color:#777")
        elif trial.status == "error":
            styles.append("background:#fdecea")
        else:
            styles.append("")
    keys = [key for key in _HEADERS if key != "best" and (key != "notes" or any(row["notes"] for row in rows))]
    frame = pandas.DataFrame([[row[key] for key in keys] for row in rows], columns=[_HEADERS[k] for k in keys])
    table = frame.to_html(index=False, escape=True, border=0, justify="left")
    footer = "".join(f"<p style='margin:2px 0'>{html.escape(line)}</p>" for line in footer_lines(report))
    return f"<div class='memlab-report'>{_style_rows(table, styles)}{footer}</div>"


def _style_rows(table: str, styles: list[str]) -> str:
    """Add ``style`` to each body row of a ``DataFrame.to_html`` table, in order (see the module docstring)."""
    head, _, body = table.partition("<tbody>")
    parts = body.split("<tr>")
    styled = [parts[0]] + [
        (f"<tr style='{style}'>" if style else "<tr>") + part for style, part in zip(styles, parts[1:], strict=True)
    ]
    return head + "<tbody>" + "".join(styled)


def status_text(trial: Trial, fits: bool) -> str:
    """``ok``, ``ok (estimate)``, ``does not fit (OOM)``, ``does not fit (over budget)`` or ``error``."""
    if trial.status == "oom":
        return "does not fit (OOM)"
    if trial.status == "error":
        return "error"
    if not fits:
        return "does not fit (over budget)"
    return "ok (estimate)" if trial.estimated else "ok"
