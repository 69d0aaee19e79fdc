"""Every figure marks each plan's verdict as the table does (fits, over budget, out of memory, error), names in its
legend only what it draws, and marks the best plan and its ties on the bars with the reason (issue 48)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from memlab.plan import Plan
from memlab.report import Report, Trial
from memlab.report.figure import BEST_COLOR, DOES_NOT_FIT_COLOR, HATCH, TIE_COLOR, report_figure
from memlab.report.svg_layout import report_svg
from memlab.report.tables import status_text
from memlab.report.verdicts import ERROR, FITS, OUT_OF_MEMORY, OVER_BUDGET, best_caption, verdicts

MIB = 2**20
SVG = "{http://www.w3.org/2000/svg}"


def timed(plan: Plan, peak_mib: int, speed: float, spread: float = 0.02) -> Trial:
    step = 8 / speed
    times = (step * (1 - spread), step, step * (1 + spread))
    parts = {"params": peak_mib * MIB // 2, "activations": peak_mib * MIB - peak_mib * MIB // 2}
    return Trial(plan, "ok", peak_mib * MIB, parts, step, speed, None, "cpu", rows_per_step=8, step_times=times)


def mixed_report() -> Report:
    """A tall fast plan over the budget, a best, its tie, an out-of-memory plan and a failed one."""
    over = timed(Plan(micro_batch=8), 900, 30.0)  # the fastest bar: it must not look like one that fits
    best = timed(Plan(checkpointing=True), 300, 10.0)
    tie = timed(Plan(precision="bf16"), 400, 10.1)
    oom = Trial(Plan(micro_batch=16), "oom", 1000 * MIB, {}, None, None, None, "cpu", error="out of memory")
    failed = Trial(Plan(optimizer="adafactor"), "error", 0, {}, None, None, None, "cpu", error="RuntimeError: x")
    return Report([over, best, tie, oom, failed], budget=512 * MIB)


def table_verdicts(report: Report) -> list[str]:
    words = {"ok": FITS, "does not fit (over budget)": OVER_BUDGET, "does not fit (OOM)": OUT_OF_MEMORY,
             "error": ERROR}
    return [words[status_text(trial, report.fits(trial))] for trial in report.trials]


def test_verdicts_are_the_tables() -> None:
    report = mixed_report()
    assert verdicts(report) == table_verdicts(report) == [OVER_BUDGET, FITS, FITS, OUT_OF_MEMORY, ERROR]


def test_the_plotly_figure_marks_each_verdict_and_the_best_on_the_bars() -> None:
    report = mixed_report()
    fig = report_figure(report)
    traces = {trace.name: trace for trace in fig.data}
    speed = traces["samples/s"]
    table = table_verdicts(report)
    for index, verdict in enumerate(table):
        if report.trials[index].status != "ok":
            assert speed.y[index] is None
            continue
        over = verdict == OVER_BUDGET
        assert (speed.marker.pattern.shape[index] == HATCH) == over
        assert (speed.marker.color[index] == DOES_NOT_FIT_COLOR) == over
        for name in ("params", "activations"):  # its memory bars hatched too, in their own colours
            assert (traces[name].marker.pattern.shape[index] == HATCH) == over
    assert list(speed.text[:3]) == ["over budget", "best", "tie"]
    assert speed.marker.color[1] == BEST_COLOR and speed.marker.color[2] == TIE_COLOR
    caption = best_caption(report)
    assert caption == "best: ckpt, fastest within noise, lowest peak among ties (bf16)"
    assert caption in fig.layout.title.text and caption in speed.hovertext[1]
    assert "does not fit (over budget)" in speed.hovertext[0]
    # the legend: "does not fit" (the hatch) and "error", both drawn here
    assert traces["does not fit"].showlegend is True and traces["error"].showlegend is True


def test_the_legend_names_only_what_is_drawn() -> None:
    report = Report([timed(Plan(), 300, 10.0)], budget=512 * MIB)
    traces = {trace.name: trace for trace in report_figure(report).data}
    assert traces["does not fit"].showlegend is False and traces["error"].showlegend is False
    over = Report([timed(Plan(), 900, 10.0)], budget=512 * MIB)  # over the budget only: the hatch is drawn
    assert {trace.name: trace for trace in report_figure(over).data}["does not fit"].showlegend is True


def test_the_svg_marks_each_verdict_as_the_table_does() -> None:
    report = mixed_report()
    svg = report_svg(report)
    root = ET.fromstring(svg)
    groups = [g for g in root.iter(f"{SVG}g") if g.get("class") == "plan"]
    # per plan: its memory bar (or cross) carries its verdict; timed plans a speed bar too, with the best marks
    memory = {}
    for group in groups:
        title = group.find(f"{SVG}title")
        assert title is not None and title.text
        label = title.text.splitlines()[0]
        memory.setdefault(label, set()).add(group.get("data-verdict"))
    for trial, verdict in zip(report.trials, table_verdicts(report), strict=True):
        assert memory[trial.label] == {verdict}
    marks = {g.find(f"{SVG}title").text.splitlines()[0]: g.get("data-mark")  # type: ignore[union-attr]
             for g in groups if g.get("data-mark") is not None}
    assert marks == {"mb8x1": "", "ckpt": "best", "bf16": "tie"}
    over_group = next(g for g in groups if g.get("data-verdict") == OVER_BUDGET and g.get("data-mark") is not None)
    assert any("-over)" in (rect.get("fill") or "") or "hatch" in (rect.get("fill") or "")
               for rect in over_group.iter(f"{SVG}rect"))
    text = " ".join(root.itertext())
    assert "over budget" in text and best_caption(report) in text
    assert re.search(r"\btie\b", text)


def test_the_svg_legend_leaves_out_what_is_not_drawn() -> None:
    text = " ".join(ET.fromstring(report_svg(Report([timed(Plan(), 300, 10.0)], budget=512 * MIB))).itertext())
    assert "does not fit" not in text and "error" not in text and "tie" not in text


def test_the_estimates_best_says_what_it_means() -> None:
    estimate = Trial(Plan(), "ok", 300 * MIB, {"params": 300 * MIB}, None, None, None, "cuda", estimated=True)
    report = Report([estimate], budget=512 * MIB)
    assert "lowest peak among the plans that fit, nothing was timed" in report.to_text()
    assert best_caption(report) == "best: plain, lowest peak among plans that fit (nothing was timed)"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_live_figure_marks_the_same_verdicts() -> None:
    from memlab.frontends.jupyter.live import LiveFigure

    report = mixed_report()
    live = LiveFigure(budget=report.budget)
    live.show_report(report)
    speed = next(trace for trace in live.widget.data if trace.name == "samples/s")
    params = next(trace for trace in live.widget.data if trace.name == "params")
    assert list(speed.text[:3]) == ["over budget", "best", "tie"]
    assert speed.marker.pattern.shape[0] == HATCH and params.marker.pattern.shape[0] == HATCH
    assert speed.marker.pattern.shape[1] == "" and speed.marker.color[0] == DOES_NOT_FIT_COLOR
    notes = [note.text for note in live.widget.layout.annotations]
    assert best_caption(report) in notes
