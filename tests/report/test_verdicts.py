"""Every figure marks each plan's verdict as the table does (fits, over budget, out of memory, error), names in its
legend only what it draws, and marks the best plan and its ties on the bars with the reason (issue 48)."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from memlab.plan import Plan
from memlab.report import Report, Trial
from memlab.report.views.figure import (
    BEST_COLOR,
    DOES_NOT_FIT_COLOR,
    HATCH,
    MARK_FONT_PX,
    MARKS_NAME,
    MIN_TEXT_PX,
    OUT_OF_MEMORY_NAME,
    OVER_BUDGET_NAME,
    TIE_COLOR,
    report_figure,
)
from memlab.report.views.svg.layout import report_svg
from memlab.report.views.tables import status_text
from memlab.report.views.verdicts import (
    ERROR,
    FITS,
    NARROW_MARKS,
    OUT_OF_MEMORY,
    OVER_BUDGET,
    best_caption,
    verdicts,
)

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
        # its memory bars hatched too, over their own colours: the hatch is a bar as high as its peak drawn over them
        hatch = traces[OVER_BUDGET_NAME]
        hatched = dict(zip(hatch.x, hatch.y, strict=True))
        label = report.trials[index].label
        assert hatched[label] == pytest.approx(report.trials[index].peak_bytes / MIB) if over else label not in hatched
    hatch = traces[OVER_BUDGET_NAME]
    assert hatch.base == 0 and hatch.marker.pattern.shape == HATCH and hatch.hoverinfo == "skip"
    marks = traces[MARKS_NAME]
    assert list(marks.text[:3]) == ["over<br>budget", "best", "tie"] and not speed.text
    # each word above its bar's error bar (its whisker reaches up to the word, never through it)
    for index, (label, height) in enumerate(zip(marks.x, marks.y, strict=True)):
        bar = list(speed.x).index(label)
        reach = speed.error_y.array[bar]
        assert height == pytest.approx(speed.y[bar] + (reach if isinstance(reach, float) else 0.0)), index
    assert any(isinstance(speed.error_y.array[list(speed.x).index(label)], float) for label in marks.x)
    assert fig.layout.yaxis.range[1] >= 1.15 * max(marks.y)  # room above the highest for its word
    assert speed.marker.color[1] == BEST_COLOR and speed.marker.color[2] == TIE_COLOR
    caption = best_caption(report)
    assert caption == "best: ckpt, as fast as bf16 within noise and a lower peak"
    assert caption in fig.layout.title.text and caption in speed.hovertext[1]
    assert "does not fit (over budget)" in speed.hovertext[0]
    # the legend: each verdict's mark, all three drawn here
    assert all(traces[name].showlegend is True for name in (OUT_OF_MEMORY_NAME, OVER_BUDGET_NAME, "error"))


def test_the_legend_names_only_what_is_drawn() -> None:
    report = Report([timed(Plan(), 300, 10.0)], budget=512 * MIB)
    traces = {trace.name: trace for trace in report_figure(report).data}
    assert not any(traces[name].showlegend for name in (OUT_OF_MEMORY_NAME, OVER_BUDGET_NAME, "error"))
    over = Report([timed(Plan(), 900, 10.0)], budget=512 * MIB)  # over the budget only: its hatch is drawn
    traces = {trace.name: trace for trace in report_figure(over).data}
    assert traces[OVER_BUDGET_NAME].showlegend is True and traces[OUT_OF_MEMORY_NAME].showlegend is False


def _first_drawn_pattern(trace: Any) -> str:
    """The pattern plotly.js gives a trace's legend swatch: its first point's (``getPatternAttr(shape, 0, "")``)."""
    shape = trace.marker.pattern.shape if trace.type == "bar" else None
    return (shape[0] if shape else "") if isinstance(shape, (list, tuple)) else (shape or "")


@pytest.mark.parametrize("first_over", [True, False])
def test_the_legend_swatches_show_each_mark_as_drawn(first_over: bool) -> None:
    """The memory categories' swatches are their plain colours even when the first plan is over the budget (plotly
    draws a bar trace's swatch with its first bar's pattern: they were hatched); the hatch has its own entries."""
    plans = [timed(Plan(micro_batch=8), 900, 30.0), timed(Plan(checkpointing=True), 300, 10.0)]
    report = Report(plans if first_over else plans[::-1], budget=512 * MIB)
    fig = report_figure(report)
    shown = [trace for trace in fig.data if trace.showlegend is not False]
    swatches = {trace.name: _first_drawn_pattern(trace) for trace in shown}
    assert swatches == {"params": "", "grads": "", "optimizer": "", "activations": "", "other": "",
                        OVER_BUDGET_NAME: HATCH}
    assert {trace.legendgrouptitle.text for trace in shown if trace.legendgroup == "status"} == {"status"}


def test_marks_on_the_bars_are_never_shrunk_to_a_narrow_bar() -> None:
    """plotly shrinks a bar's text to the bar's width: the marks are drawn outside at MARK_FONT_PX, unshrunk, as
    words where the bar's share of the axis holds them, else as signs; text inside a bar is never under
    MIN_TEXT_PX (plotly hides it; the hover says it)."""
    few = json.loads(report_figure(mixed_report()).to_json())
    speeds = [timed(Plan(micro_batch=2 ** (i % 4), accumulation=1 + i // 4), 300 + 60 * i, 10.0 + i % 5)
              for i in range(12)]
    speeds[0] = timed(Plan(micro_batch=64), 900, 30.0)
    many = json.loads(report_figure(Report(speeds, budget=800 * MIB)).to_json())
    for figure in (few, many):
        marks = next(trace for trace in figure["data"] if trace["name"] == MARKS_NAME)
        assert marks["mode"] == "text" and marks["textposition"] == "top center"
        assert marks["textfont"]["size"] == MARK_FONT_PX >= 12
        assert figure["layout"]["uniformtext"] == {"minsize": MIN_TEXT_PX, "mode": "hide"} and MIN_TEXT_PX >= 10
    texts = next(trace for trace in few["data"] if trace["name"] == MARKS_NAME)["text"]
    assert texts[:3] == ["over<br>budget", "best", "tie"]
    texts = next(trace for trace in many["data"] if trace["name"] == MARKS_NAME)["text"]
    assert texts[0] == NARROW_MARKS[OVER_BUDGET] and NARROW_MARKS["best"] in texts  # 12 bars: 20 px each


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
    assert "over budget" in text and "out of memory" in text and best_caption(report) in text  # the legend's too
    assert re.search(r"\btie\b", text)


def test_the_svg_legend_leaves_out_what_is_not_drawn() -> None:
    text = " ".join(ET.fromstring(report_svg(Report([timed(Plan(), 300, 10.0)], budget=512 * MIB))).itertext())
    assert not any(word in text for word in ("does not fit", "over budget", "out of memory", "error", "tie"))


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
    hatch = next(trace for trace in live.widget.data if trace.name == OVER_BUDGET_NAME)
    marks = next(trace for trace in live.widget.data if trace.name == MARKS_NAME)
    assert list(marks.text[:3]) == ["over<br>budget", "best", "tie"]
    assert speed.marker.pattern.shape[0] == HATCH and list(hatch.x) == ["mb8x1"] and not params.marker.pattern.shape
    assert marks.textfont.color[1] == BEST_COLOR
    assert speed.marker.pattern.shape[1] == "" and speed.marker.color[0] == DOES_NOT_FIT_COLOR
    notes = [note.text for note in live.widget.layout.annotations]
    assert best_caption(report) in notes


def test_a_setting_run_twice_reads_as_two_runs_everywhere() -> None:
    """The panel runs a setting twice: two rows named alike read as a duplicated row, and "plain is named best for
    its lower peak" among ties at the same peak was not true. The table, its footer, the caption and the figure
    name the second run "plain (2)"."""
    first = timed(Plan(), 300, 10.0)
    again = timed(Plan(), 300, 10.05)
    report = Report([first, again], budget=512 * MIB)
    text = report.to_text()
    rows = [line for line in text.splitlines() if " ok " in line]
    assert [row.split()[1] for row in rows] == ["plain", "plain"] and "plain (2)" in rows[1]
    assert "As fast within measurement noise: plain (2) (plain is named best: no lower peak among them" in text
    assert ">plain (2)" in report._repr_html_()
    assert best_caption(report) == "best: plain, as fast as plain (2) within noise and a lower peak"
    speed = next(trace for trace in report_figure(report).data if trace.name == "samples/s")
    assert list(speed.x) == ["plain", "plain (2)"]


def _boxes(root: ET.Element, select: Any) -> list[tuple[float, float, float, float]]:
    """The (left, top, right, bottom) of each ``<rect>`` of the SVG that ``select`` keeps."""
    return [(float(r.get("x") or 0), float(r.get("y") or 0), float(r.get("x") or 0) + float(r.get("width") or 0),
             float(r.get("y") or 0) + float(r.get("height") or 0)) for r in root.iter(f"{SVG}rect") if select(r)]


@pytest.mark.parametrize("reached_mib", [100, 530])
def test_a_plan_out_of_memory_is_drawn_to_what_is_known_of_it_marked_as_a_bound(reached_mib: int) -> None:
    """Issue 71 item 10 (after issue 61 item 6): a plan the budget stopped needed at least the budget, and at least
    what it reached. Its bar reaches that lower bound, no less and no more (it reached a tenth past the line, whatever
    was known), and says it is a bound (an arrow up and "≥ N" in the SVG, "does not fit: ≥ N MiB" in plotly)."""
    from memlab.report.views.figure import figure_columns, figure_data

    oom = Trial(Plan(micro_batch=16), "oom", reached_mib * MIB, {}, None, None, None, "cpu", error="out of memory")
    report = Report([timed(Plan(), 300, 10.0), oom], budget=512 * MIB)
    bound = max(512, reached_mib)
    data = figure_data(report)
    heights = figure_columns(report, data)[len(data["categories"])]["y"]
    assert heights == [None, pytest.approx(bound)]
    traces = {trace.name: trace for trace in report_figure(report).data}
    assert traces[OUT_OF_MEMORY_NAME].y[1] == pytest.approx(bound)
    assert traces[OUT_OF_MEMORY_NAME].text[1] == f"does not fit: \u2265 {bound} MiB"
    root = ET.fromstring(report_svg(report))
    assert f"\u2265 {bound}" in [text.text for text in root.iter(f"{SVG}text") if text.get("class") == "bound"]
    assert [path for path in root.iter(f"{SVG}path") if path.get("class") == "bound"]


def test_the_budget_label_covers_no_bar() -> None:
    """Issue 71 item 10: the demo's report drew its out-of-memory plan, last and just past the budget, under the
    budget's label (a white box at the line's right end), so that its bar seemed to stop at the line, below the
    ">= 22.3" its table said. The label goes where it covers no bar."""
    plans = [Plan(), Plan(checkpointing=True), Plan(micro_batch=4, accumulation=2), Plan(micro_batch=2, accumulation=4)]
    trials = [timed(plan, peak, 100.0) for plan, peak in zip(plans[:3], (35, 19, 18), strict=False)]
    oom = Trial(plans[3], "oom", int(22.3 * MIB), {}, None, None, None, "cpu", error="out of memory",
                budget=int(21.1 * MIB))
    root = ET.fromstring(report_svg(Report([*trials, oom], budget=int(21.1 * MIB))))
    labels = _boxes(root, lambda rect: rect.get("fill") == "#FFFFFF" and rect.get("rx") == "2")
    bars = _boxes(root, lambda rect: rect.get("class") == "bar")
    assert len(labels) == 1 and bars
    left, top, right, bottom = labels[0]
    covered = [bar for bar in bars if bar[0] < right and left < bar[2] and bar[1] < bottom and top < bar[3]]
    assert covered == [], (labels, covered)
