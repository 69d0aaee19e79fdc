"""The figure from 1 plan to 60, in plotly (Report.plot) and as the static SVG a notebook keeps.

Readable: ticks that never touch (labels, turned labels, or numbers with a key), a legend in groups, the budget
labelled at its line, every plan spelled out in hover and key, the speed's 95% interval as error bars. Lasting: the
SVG is well-formed XML that renders without plotly.js, and the record of 60 plans stays small.
"""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ElementTree
from typing import Any

import pytest
from reports import MIB, plans, report_of

from memlab.plan import Plan, format_bytes
from memlab.report import Report, Trial
from memlab.report.noise import speed_interval
from memlab.report.views.figure import BUDGET_COLOR, INTERVAL_COLOR, MARKS_NAME, figure_data, report_figure
from memlab.report.views.plan_axis import FULL_LABELS_UP_TO, PLOTLY_PANEL_PX, plan_axis, text_width
from memlab.report.views.static import INTERACTIVE_LIMIT, PLOTLY_MIME, WIDTH, record_bundle, record_text, report_svg

SVG = "{http://www.w3.org/2000/svg}"


def svg_root(report: Report) -> ElementTree.Element:
    return ElementTree.fromstring(report_svg(report))


def all_text(root: ElementTree.Element) -> str:
    return " ".join(" ".join(root.itertext()).split())


# --- the plan axis -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("width", [PLOTLY_PANEL_PX, 369.0, 866.0])
@pytest.mark.parametrize("count", [1, 2, 3, 5, 8, 12, 13, 20, 30, 45, 60, 90])
def test_ticks_never_touch(count: int, width: float) -> None:
    labels = [plan.label() or "plain" for plan in plans(count)]
    labels = [f"{label} ({index})" for index, label in enumerate(labels)]  # longer, and all different
    axis = plan_axis(labels, width)
    slot = width / count
    assert axis.numbered == (count > FULL_LABELS_UP_TO)
    assert axis.text == ([str(index + 1) for index in range(count)] if axis.numbered else labels)
    line = axis.font_size * 1.25
    if axis.angle == 0:
        widths = [text_width(text, axis.font_size) for text in axis.text]
        for left, right in zip(axis.shown, axis.shown[1:], strict=False):
            assert (right - left) * slot >= (widths[left] + widths[right]) / 2
    elif axis.angle == -45:
        assert slot * math.sin(math.radians(45)) >= line
    else:
        assert axis.angle == -90 and slot >= line * 0.8  # only on axes narrower than any notebook cell
    if axis.numbered:  # numbers are level and never too few to find a bar by
        assert axis.angle == 0 and len(axis.shown) >= min(count, 10)


def test_sixty_plans_are_numbered_level_and_every_plan_is_spelled_out_in_its_hover() -> None:
    report = report_of(60)
    figure = report_figure(report)
    for name in ("xaxis", "xaxis2"):
        axis = figure.layout[name]
        assert axis.tickmode == "array" and axis.tickangle == 0 and axis.tickfont.size <= 10
        assert list(axis.ticktext[:4]) == ["1", "5", "10", "15"]
        assert list(axis.tickvals[:2]) == [report.trials[0].label, report.trials[4].label]
        assert "number" in axis.title.text
    speed = next(trace for trace in figure.data if trace.name == "samples/s")
    assert speed.hovertext[36].startswith("#37 ") and report.trials[36].plan.describe() in speed.hovertext[36]
    assert figure.layout.width is None and figure.layout.autosize is True  # follows the cell


def test_a_few_long_labels_are_turned_and_the_figure_grows_to_hold_them() -> None:
    short = report_figure(report_of(2))
    long = report_figure(report_of(8))
    assert short.layout.xaxis.tickangle == 0 and list(short.layout.xaxis.ticktext) == ["plain", "adamw8bit"]
    assert long.layout.xaxis.tickangle == -45
    assert long.layout.height > short.layout.height >= 400


def test_the_legend_separates_memory_from_status() -> None:
    figure = report_figure(report_of(3))
    groups = {trace.name: (trace.legendgroup, trace.legendgrouptitle.text) for trace in figure.data}
    assert groups["params"] == ("memory", "memory") and groups["grads"][0] == "memory"
    assert groups["out of memory"] == ("status", "status") and groups["error"][0] == "status"
    assert figure.layout.legend.groupclick == "toggleitem"


def test_the_budget_is_labelled_at_its_line_above_the_bars() -> None:
    figure = report_figure(report_of(3, budget_mib=1024))
    line = next(shape for shape in figure.layout.shapes if shape.name == "budget")
    note = next(note for note in figure.layout.annotations if note.text.startswith("budget"))
    assert line.layer == "above" and line.y0 == pytest.approx(1024)
    assert note.y == pytest.approx(1024) and note.yref == "y2" and note.x == 1 and note.xanchor == "right"
    assert note.bgcolor is not None and "255,255,255" in note.bgcolor  # readable over the bars behind it


def test_hover_spells_every_plan_out() -> None:
    report = report_of(5)
    figure = report_figure(report)
    by_name = {trace.name: trace for trace in figure.data}
    for index, trial in enumerate(report.trials):
        if trial.status == "ok":
            assert trial.plan.describe() in by_name["params"].hovertext[index]
            assert trial.plan.describe() in by_name["samples/s"].hovertext[index]
        else:
            assert trial.plan.describe() in by_name["out of memory"].hovertext[index]
            assert by_name["params"].hovertext[index] == ""  # no bar, no hover text (small figures)
    assert all("%{hovertext}" in trace.hovertemplate for trace in figure.data if trace.name != MARKS_NAME)


def test_speed_intervals_are_asymmetric_error_bars() -> None:
    report = report_of(4)
    report.trials[0] = Trial(Plan(), "ok", MIB, {}, 0.5, 16.0, None, "cpu", rows_per_step=8, step_times=(0.5,))
    speed = next(trace for trace in report_figure(report).data if trace.name == "samples/s")
    assert speed.error_y.type == "data" and speed.error_y.symmetric is False
    assert speed.error_y.array[0] == "NaN" and speed.error_y.arrayminus[0] == "NaN"  # timed once: no bar
    for index in (1, 2, 3):
        trial = report.trials[index]
        interval = speed_interval(trial.step_times, trial.rows_per_step)
        if trial.status != "ok":
            continue
        assert interval is not None and trial.samples_per_s is not None
        low, high = interval
        assert speed.error_y.array[index] == pytest.approx(high - trial.samples_per_s)
        assert speed.error_y.arrayminus[index] == pytest.approx(trial.samples_per_s - low)
        assert "95% interval" in speed.customdata[index]
    data = figure_data(report)
    assert data["speed_low"][0] is None and data["speed_low"][1] is not None


# --- the static SVG ------------------------------------------------------------------------------------------------


def _height(root: Any) -> int:
    """The drawing's height in the SVG's own pixels (its viewBox's)."""
    return int(root.get("viewBox", "0 0 0 0").split()[3])


@pytest.mark.parametrize("count", [0, 1, 3, 12, 13, 60])
def test_the_svg_is_well_formed_and_follows_the_cell(count: int) -> None:
    root = svg_root(report_of(count, error_at=2))
    assert root.tag == f"{SVG}svg"
    # as wide as its cell (no size of its own in pixels: an <img> of it would keep that size; issue 71 item 7), drawn
    # at most WIDTH px wide where it is inline
    assert root.get("width") == "100%" and root.get("height") is None
    assert root.get("viewBox", "").startswith(f"0 0 {WIDTH} ")
    assert f"max-width:{WIDTH}px" in (root.get("style") or "")
    height = _height(root)
    assert (150 if count == 0 else 300) <= height <= 2000
    assert root.find(f"{SVG}title") is not None


def test_the_svg_grows_sensibly_with_the_plans() -> None:
    heights = [_height(svg_root(report_of(count))) for count in (1, 3, 12, 13, 30, 60)]
    assert heights == sorted(heights)
    assert heights[-1] < 2000


def test_the_svg_escapes_what_plans_and_errors_say() -> None:
    root = svg_root(report_of(3, error_at=1))
    assert "RuntimeError: <lambda> & 'x'" in " ".join(root.itertext())


@pytest.mark.parametrize("count", [3, 60])
def test_the_svg_legend_groups_and_key(count: int) -> None:
    report = report_of(count)
    text = all_text(svg_root(report))
    for word in ("memory", "params", "activations", "speed", "samples/s", "95% interval"):
        assert word in text
    # the legend names only what is drawn: "does not fit" where a plan does not fit
    drawn = any(not report.fits(trial) for trial in report.trials)
    assert ("does not fit" in text) == drawn
    for index, trial in enumerate(report.trials):  # the key: every label, spelled out
        words = trial.plan.describe().removeprefix("plain: ")
        assert f"{trial.label}: {words}" in text
        if count > FULL_LABELS_UP_TO:
            assert f"{index + 1} {trial.label}: " in text


def test_the_svg_draws_an_error_bar_per_interval_and_the_budget_at_its_line() -> None:
    report = report_of(6, budget_mib=1500)
    svg = report_svg(report)
    intervals = [trial for trial in report.trials if speed_interval(trial.step_times, trial.rows_per_step)]
    error_bars = re.findall(rf'<path d="[^"]*" stroke="{INTERVAL_COLOR}"', svg)
    assert len(error_bars) == len(intervals) + 1  # and the legend's
    root = ElementTree.fromstring(svg)
    lines = [line for line in root.iter(f"{SVG}line") if line.get("stroke") == BUDGET_COLOR]
    budget_line = max(lines, key=lambda line: float(line.get("x2") or 0) - float(line.get("x1") or 0))
    budget = f"budget {format_bytes(1500 * MIB)}"
    label = next(text for text in root.iter(f"{SVG}text") if (text.text or "") == budget)
    assert abs(float(label.get("y") or 0) - float(budget_line.get("y1") or 0)) < 20  # at the line


def test_a_budget_far_above_the_bars_is_written_not_drawn() -> None:
    text = all_text(svg_root(report_of(3, budget_mib=80 * 1024)))
    assert f"budget {format_bytes(80 * 1024 * MIB)}: far above these bars" in text


def test_the_svg_numbers_sixty_bars_without_collisions() -> None:
    root = svg_root(report_of(60))
    numbers = [
        text for text in root.iter(f"{SVG}text") if (text.text or "").isdigit() and text.get("text-anchor") == "middle"
    ]
    assert len(numbers) >= 2 * 20  # both panels, at least every other bar
    for panel in (numbers[: len(numbers) // 2], numbers[len(numbers) // 2 :]):
        xs = [float(text.get("x") or 0) for text in panel]
        assert xs == sorted(xs)
        for left, right in zip(panel, panel[1:], strict=False):
            size = float(left.get("font-size") or 10)
            gap = float(right.get("x") or 0) - float(left.get("x") or 0)
            assert gap >= (text_width(left.text or "", size) + text_width(right.text or "", size)) / 2


# --- the record ----------------------------------------------------------------------------------------------------


def test_the_record_of_sixty_plans_is_small_and_complete() -> None:
    bundle = record_bundle(report_of(60))
    assert set(bundle) == {"text/plain", "image/svg+xml", PLOTLY_MIME}
    assert len(json.dumps(bundle)) < 150_000
    figure: dict[str, Any] = bundle[PLOTLY_MIME]
    assert set(figure) == {"data", "layout"} and "data" not in figure["layout"].get("template", {})
    assert "plotly.js" not in json.dumps(figure) and len(figure["data"]) == 10


def test_a_record_too_large_to_be_interactive_keeps_only_its_svg() -> None:
    bundle = record_bundle(report_of(150))
    assert PLOTLY_MIME not in bundle and bundle["image/svg+xml"].startswith("<svg")
    assert len(json.dumps(bundle)) < 250_000
    assert len(json.dumps(record_bundle(report_of(150), interactive=True).get(PLOTLY_MIME, {}))) <= INTERACTIVE_LIMIT


def test_the_record_text_is_one_short_line() -> None:
    text = record_text(report_of(60))
    assert text.startswith("memlab: 60 plans; best ") and "budget 2.00 GiB" in text and "\n" not in text
    assert record_text(report_of(1, budget_mib=1)) == f"memlab: 1 plan; no plan fits; budget {format_bytes(MIB)}"


@pytest.mark.parametrize(("peak", "unit"), [(300 * 1024, "KiB"), (300 * MIB, "MiB"), (40 * 1024 * MIB, "GiB")])
def test_the_svg_counts_memory_in_a_unit_that_suits_it(peak: int, unit: str) -> None:
    trial = Trial(Plan(), "ok", peak, {"params": peak}, 0.5, 16.0, None, "cpu")
    text = all_text(svg_root(Report([trial])))
    assert f"peak memory ({unit})" in text


# --- whatever a run produced: infinite, NaN, missing or zero speeds, all errors, one plan, 200 plans --------------


def _odd_speed(plan: Plan, speed: float | None, step: float | None) -> Trial:
    return Trial(plan, "ok", 3 * MIB, {"params": MIB, "activations": 2 * MIB}, step, speed, None, "cpu",
                 rows_per_step=8, step_times=() if step is None else (step, step))


ODD_RUNS = {
    "infinite-speed": [_odd_speed(Plan(), math.inf, 0.0), _odd_speed(Plan(checkpointing=True), 8.0, 1.0)],
    "nan-speed": [_odd_speed(Plan(), math.nan, math.nan), _odd_speed(Plan(checkpointing=True), 8.0, 1.0)],
    "missing-speed": [_odd_speed(Plan(), None, None), _odd_speed(Plan(checkpointing=True), 8.0, 1.0)],
    "zero-speed": [_odd_speed(Plan(), 0.0, math.inf), _odd_speed(Plan(checkpointing=True), 0.0, 1.0)],
    "all-infinite": [_odd_speed(Plan(), math.inf, 0.0), _odd_speed(Plan(checkpointing=True), math.inf, 0.0)],
    "all-errors": [Trial(Plan(), "error", 0, {}, None, None, None, "cpu", error="RuntimeError: boom"),
                   Trial(Plan(checkpointing=True), "error", 0, {}, None, None, None, "cpu", error="x")],
    "one-plan": [_odd_speed(Plan(), math.inf, 0.0)],
    "200-plans": [_odd_speed(Plan(micro_batch=k + 1), [math.inf, math.nan, None, 0.0, 8.0 / (k + 1)][k % 5], 0.1)
                  for k in range(200)],
}


@pytest.mark.parametrize("name", list(ODD_RUNS))
def test_the_figures_draw_whatever_a_run_produced(name: str) -> None:
    report = Report(list(ODD_RUNS[name]), budget=4 * MIB)
    data = figure_data(report)
    for key in ("samples_per_s", "speed_low", "speed_high", "peak_mib"):
        assert all(value is None or math.isfinite(value) for value in data[key]), (key, data[key])
    svg = record_bundle(report)["image/svg+xml"]
    assert "inf" not in re.sub(r"<[^>]*>", " ", svg).lower().replace("info", "")  # no number drawn as "inf"/"nan"
    assert "nan" not in re.findall(r">([^<]*)<", svg)
    ElementTree.fromstring(svg)
    figure = report_figure(report)
    for axis in ("yaxis", "yaxis2"):
        shown = figure.layout[axis].range
        assert shown is None or all(math.isfinite(v) for v in shown)
    json.dumps(figure.to_plotly_json(), allow_nan=False, default=str)
