"""``memlab.limits``' table and answer as text: every column as wide as its widest cell (the "<-" marks in one column
whatever each row's status), the host budget in the answer where the sizes were judged on it, and, under a header
that says the budgets (``memlab estimate --max-tokens``), no budget said again."""

from __future__ import annotations

from memlab.plan import Plan, format_bytes
from memlab.report import Trial
from memlab.search.limits import Limits

BUDGET = 1000
HOST = 2**20


def _trial(peak: int, host: int) -> Trial:
    return Trial(Plan(offload="optimizer"), "ok", peak, {"params": 100, "activations": peak - 100}, None, None, None,
                 "cpu", budget=BUDGET, host_bytes=host, host_budget=HOST)


def _found() -> Limits:
    tried = [(64, _trial(500, 10)), (128, _trial(900, 10)), (256, _trial(1500, 10)), (512, _trial(900, 2 * HOST)),
             (1024, _trial(2000, 2 * HOST))]
    return Limits("tokens", 128, tried[1][1], 256, tried[2][1], BUDGET, tried)


def test_every_row_lines_up_whatever_its_status() -> None:
    lines = _found().to_text().splitlines()
    rows = lines[1:6]
    statuses = {row.split()[3] if row.split()[2] == "no" else row.split()[2] for row in rows}
    assert any("(host)" in row for row in rows) and any("(over budget and host)" in row for row in rows), lines
    assert len(statuses) > 1, lines
    marks = {row.index("<-") for row in rows if "<-" in row}
    assert len(marks) == 1 and len([row for row in rows if "<-" in row]) == 2, lines
    fits_column = lines[0].index("fits")
    assert all(row[fits_column - 1] == " " and row[fits_column] in "yn" for row in rows), lines


def test_the_answer_names_the_host_budget_it_was_judged_on() -> None:
    found = _found()
    assert found.answer() == (f"at most 128 tokens per row fit in {format_bytes(BUDGET)} and the host budget of "
                              f"{format_bytes(HOST)}; 256 do not")


def test_under_a_header_that_says_the_budgets_the_text_says_neither_again() -> None:
    text = _found().to_text(budget_said=True)
    assert format_bytes(BUDGET) not in text and format_bytes(HOST) not in text, text
    assert "at most 128 tokens per row fit in the budget and the host budget; 256 do not" in text, text
    assert format_bytes(BUDGET) in _found().to_text()  # said where no header says it
