"""The budget's label on the plotly figure covers no bar: where a bar's top is just past the budget line at the
right end, the label slides left to where no bar reaches it (the SVG figure's rule, shared:
``memlab.report.views.budget_mark.label_place``); where none reaches it, it stays at the line's right end."""

from __future__ import annotations

from memlab.plan import Plan
from memlab.report import Report, Trial
from memlab.report.views.budget_mark import label_place
from memlab.report.views.figure import report_figure

MIB = 2**20


def _report(peaks_mib: list[float], budget_mib: float) -> Report:
    trials = [Trial(Plan(micro_batch=index + 1), "ok", int(peak * MIB), {"params": int(peak * MIB)}, 0.5, 8.0, None,
                    "cpu") for index, peak in enumerate(peaks_mib)]
    return Report(trials, budget=int(budget_mib * MIB))


def _note(report: Report):  # type: ignore[no-untyped-def]
    (note,) = [note for note in report_figure(report).layout.annotations if str(note.text).startswith("budget ")]
    return note


def test_the_label_leaves_a_bar_just_past_the_budget_uncovered() -> None:
    report = _report([50, 60, 103], 100)
    note = _note(report)
    count, gap = 3, report_figure(report).layout.bargap
    last_left = (count - 0.5 - (1 - gap) / 2) / count  # the last bar's left edge on the panel (0 to 1)
    assert note.x <= last_left and note.yanchor == "bottom", note


def test_the_label_stays_at_the_right_end_where_no_bar_reaches_it() -> None:
    assert _note(_report([50, 60, 70], 100)).x == 1


def test_the_rule_takes_the_place_below_the_line_where_there_is_no_room_above() -> None:
    from memlab.report.views.budget_mark import LabelBox

    box = LabelBox(width=1.5, height=1, above=0.1, below=0.1, step=0.5)
    # no room above the line at the panel's top: below it, slid left of the bar that crosses it
    assert label_place([5, 5, 10], [0.5, 1.5, 2.5], 0.4, 8, box, left=0, right=4, ceiling=8.5) == (2.0, False)
    assert label_place([5, 5, 10], [0.5, 1.5, 2.5], 0.4, 8, box, left=0, right=4, ceiling=20) == (2.0, True)
