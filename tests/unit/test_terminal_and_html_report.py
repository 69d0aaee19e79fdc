"""Issue 48's layout items off the browser: ``memlab demo``'s table within a 120-column terminal (the notes under
it, numbered, and the memory categories left out where they would not fit), and its HTML report small (the static
SVG figure inlined, not plotly.js) with the verdict marks its table prints. (The progress bar piped to a log is
``tests/unit/test_progress.py::test_no_bar_is_animated_into_a_log``.)"""

from __future__ import annotations

import re
from pathlib import Path

from reports import report_of

from memlab.frontends.cli import terminal_width, write_html_report
from memlab.plan import Plan
from memlab.report import Report, Trial
from memlab.report.views.tables import text_table

MIB = 2**20


def _noted_report() -> Report:
    notes = ("timed again in turn with ckpt, mb4x2 ckpt (3 rounds): close in speed when first measured",)
    trials = [
        Trial(Plan(), "ok", 35 * MIB, {"params": 4 * MIB, "activations": 31 * MIB}, 0.036, 223.0, None, "cpu",
              rows_per_step=8, step_times=(0.035, 0.036, 0.037)),
        Trial(Plan(micro_batch=2, accumulation=4, loss="chunked"), "ok", 20 * MIB, {"params": 20 * MIB}, 0.065,
              124.0, None, "cpu", rows_per_step=8, step_times=(0.064, 0.065, 0.066), notes=notes),
        Trial(Plan(checkpointing=True), "ok", 19 * MIB, {"params": 19 * MIB}, 0.047, 169.0, None, "cpu",
              rows_per_step=8, step_times=(0.046, 0.047, 0.048), notes=notes),
        Trial(Plan(checkpointing=2), "oom", 23 * MIB, {}, None, None, None, "cpu", error="out of memory",
              budget=21 * MIB),
    ]
    return Report(trials, budget=21 * MIB)


def test_the_table_keeps_within_the_terminals_columns() -> None:
    report = _noted_report()
    wide = text_table(report)
    assert max(len(line) for line in wide.splitlines()) > 120  # what a 120-column terminal wrapped
    narrow = text_table(report, width=120)
    lines = narrow.splitlines()
    assert max(len(line) for line in lines) <= 120, narrow
    # Every row is still one line, with its status; its notes are under the table, numbered once.
    rows = [line for line in lines if re.match(r"^[\u2605\u2248 ] \S", line)][1:]
    assert [row.split()[-1] for row in rows if "[" in row] == ["[1]", "[1]", "[2]"], rows
    assert "[1] timed again in turn" in narrow and narrow.count("timed again in turn") == 1
    assert "does not fit (over budget)" in narrow and "does not fit (OOM)" in narrow
    assert "Memory by category (params, grads, optimizer, activations, other) left out to fit 120 columns" in (
        " ".join(narrow.split())
    )
    assert text_table(report, width=400) == wide  # room enough: the table as it was


def test_the_lines_under_the_table_keep_within_the_terminal_too() -> None:
    """The summary under the table (ties, plans not measured) went past 120 columns in the demo."""
    report = _noted_report()
    report.skipped = [(Plan(micro_batch=1, accumulation=8, checkpointing=True, loss="chunked"),
                       "estimated (dry run on fake tensors) not to fit, a reason as long as the search can write "
                       "when it says why")] * 9
    wide = text_table(report)
    assert any(len(line) > 120 for line in wide.splitlines()[-6:])
    narrow = text_table(report, width=120)
    assert max(len(line) for line in narrow.splitlines()) <= 120, narrow
    assert " ".join(wide.split()).endswith(" ".join(narrow.split())[-40:])  # the same words, wrapped


def test_the_demo_reads_its_width_from_columns_or_the_terminal(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import io

    monkeypatch.setenv("COLUMNS", "120")
    assert terminal_width(io.StringIO()) == 120
    monkeypatch.delenv("COLUMNS")
    assert terminal_width(io.StringIO()) is None  # a log: no width to keep within


def test_the_html_report_is_small_and_marks_each_plans_verdict_as_its_table(tmp_path: Path) -> None:
    report = report_of(24, budget_mib=1000)
    page = Path(write_html_report(report, tmp_path / "report.html")).read_text()
    assert len(page.encode()) < 150_000  # plotly.js inlined made it 4.8 MB
    assert "<svg" in page and "plotly" not in page.lower()
    drawn = {label: verdict for verdict, label in re.findall(
        r'<g class="plan" data-verdict="([^"]+)"[^>]*><title>(?:#\d+ )?([^\n<]+)', page)}
    table = {
        trial.label: "out of memory" if trial.status == "oom" else "fits" if report.fits(trial) else "over budget"
        for trial in report.trials
    }
    assert drawn == table
    assert {"fits", "over budget", "out of memory"} <= set(table.values())


def test_a_long_note_goes_under_the_html_table_numbered() -> None:
    from memlab.report.views.tables import html_table

    table = html_table(_noted_report())
    note = "timed again in turn with ckpt, mb4x2 ckpt (3 rounds): close in speed when first measured"
    assert table.count(note) == 1 and f"[1] {note}" in table  # once, under the table
    assert table.count(">[1]</td>") == 2  # its rows say its number
    assert ">out of memory</td>" in table  # a short note stays in its row


def test_table_lines_are_what_pandas_printed_of_the_padded_cells() -> None:
    import pandas

    from memlab.report.views.tables import _LEFT, headers, shown_columns, table_rows, text_lines

    for report in (_noted_report(), Report(_noted_report().trials[:1])):
        rows, names = table_rows(report), headers(report)
        keys = shown_columns(rows, with_mark=True, categories=report.categories)
        lines = text_lines(rows, names, keys)
        # each column's cells padded as _text_lines pads them, joined by pandas as before
        cells = [[row[key] for key in keys] for row in rows]
        width = {key: max(len(names[key]), *(len(row[key]) for row in rows)) for key in keys}

        def pad(key: str, text: str, width: dict[str, int] = width) -> str:
            return text.ljust(width[key]) if key in _LEFT else text.rjust(width[key])

        header = [pad(key, names[key]) for key in keys]
        frame = pandas.DataFrame([[pad(key, cell) for key, cell in zip(keys, row, strict=True)] for row in cells],
                                 columns=header)
        printed = frame.to_string(index=False, formatters={name: str for name in header})
        assert lines == [line.rstrip() for line in printed.splitlines()]
