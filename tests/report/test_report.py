"""Trial and Report: fits/best, breakdown rules, tables, HTML, JSON, the figure, events, and lazy imports."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from typing import Any

import pytest

from memlab.events import Callback, Event, MemorySample, StepFinished, TrialFinished, TrialStarted
from memlab.plan import PLAN_FIELDS, Plan
from memlab.report import CATEGORIES, Report, Trial
from memlab.report.data import speed_range
from memlab.report.views.figure import figure_data

MIB = 1024**2


def ok(plan: Plan, peak_mib: float, speed: float | None, **extra: Any) -> Trial:
    peak = int(peak_mib * MIB)
    breakdown = {"params": peak // 4, "grads": peak // 4, "optimizer": peak // 4, "activations": peak // 8}
    breakdown["other"] = peak - sum(breakdown.values())
    return Trial(
        plan,
        "ok",
        peak,
        breakdown,
        None if speed is None else 8 / speed,
        speed,
        None if speed is None else speed * 128,
        "cpu",
        **extra,
    )


def oom(plan: Plan, peak_mib: float) -> Trial:
    peak = int(peak_mib * MIB)
    return Trial(
        plan,
        "oom",
        peak,
        {"activations": peak},
        None,
        None,
        None,
        "cpu",
        error="OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n(more detail)",
    )


def error(plan: Plan) -> Trial:
    return Trial(
        plan, "error", 0, {}, None, None, None, "cpu", error="RuntimeError: shapes do not match\nTraceback line two"
    )


@pytest.fixture
def report() -> Report:
    return Report(
        [
            ok(Plan(), 900, 10.0),
            ok(Plan(checkpointing=True), 500, 6.0),
            ok(Plan(precision="bf16"), 700, 14.0),
            oom(Plan(micro_batch=64), 2000),
            error(Plan(optimizer="adamw8bit")),
            ok(Plan(micro_batch=2, accumulation=4, checkpointing=True), 400, 5.0, notes=("fp16 on CPU is slow",)),
        ],
        budget=800 * MIB,
    )


# --- Trial ---------------------------------------------------------------------------------------------------------


def test_breakdown_has_every_category_and_adds_up_to_the_peak() -> None:
    trial = Trial(Plan(), "ok", 100, {"params": 60}, 1.0, 2.0, None, "cpu")
    assert list(trial.breakdown) == list(CATEGORIES)
    assert trial.breakdown == {"params": 60, "grads": 0, "optimizer": 0, "activations": 0, "other": 40}
    assert sum(trial.breakdown.values()) == trial.peak_bytes


def test_empty_breakdown_puts_the_peak_under_other() -> None:
    trial = Trial(Plan(), "error", 12, {}, None, None, None, "cpu", error="boom")
    assert trial.breakdown["other"] == 12


@pytest.mark.parametrize(
    ("breakdown", "match"),
    [({"params": 200}, "more than peak_bytes"), ({"weights": 1}, "unknown categories"), ({"params": -1}, "negative")],
)
def test_bad_breakdown_raises(breakdown: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Trial(Plan(), "ok", 100, breakdown, 1.0, 2.0, None, "cpu")


def test_bad_status_raises() -> None:
    with pytest.raises(ValueError, match="status"):
        Trial(Plan(), "fine", 0, {}, None, None, None, "cpu")


def test_trial_fits_needs_ok_and_the_budget() -> None:
    assert ok(Plan(), 10, 1.0).fits
    assert ok(Plan(), 10, 1.0, budget=10 * MIB).fits
    assert not ok(Plan(), 10, 1.0, budget=10 * MIB - 1).fits
    assert not oom(Plan(), 1).fits
    assert not error(Plan()).fits


# --- best ----------------------------------------------------------------------------------------------------------


def test_best_is_the_fastest_trial_that_fits(report: Report) -> None:
    # bf16 is the fastest within 800 MiB; plain (900 MiB) is over the budget
    assert report.best is report.trials[2]
    assert Report(report.trials).best is report.trials[2]
    assert Report(report.trials, budget=600 * MIB).best is report.trials[1]


def test_an_oom_or_error_trial_is_never_best() -> None:
    fast_oom = oom(Plan(micro_batch=64), 1)
    fast_oom.samples_per_s = 1e9
    crashed = error(Plan())
    assert Report([fast_oom, crashed]).best is None
    slow = ok(Plan(checkpointing=True), 100, 0.5)
    assert Report([fast_oom, crashed, slow]).best is slow


def test_best_tie_goes_to_the_lower_peak() -> None:
    big, small = ok(Plan(), 300, 5.0), ok(Plan(checkpointing=True), 200, 5.0)
    assert Report([big, small]).best is small
    assert Report([small, big]).best is small


def test_best_respects_each_trials_own_budget() -> None:
    over = ok(Plan(), 300, 50.0, budget=100 * MIB)
    under = ok(Plan(checkpointing=True), 50, 1.0, budget=100 * MIB)
    assert Report([over, under]).best is under


def test_estimates_without_speed_rank_by_peak() -> None:
    a = ok(Plan(), 300, None, estimated=True)
    b = ok(Plan(checkpointing=True), 100, None, estimated=True)
    assert Report([a, b]).best is b
    assert Report([]).best is None


# --- container -----------------------------------------------------------------------------------------------------


def test_report_is_a_sequence_of_trials(report: Report) -> None:
    assert len(report) == 6
    assert list(report) == report.trials
    assert report[0] is report.trials[0]
    assert report[-1] is report.trials[-1]
    part = report[1:3]
    assert isinstance(part, Report) and part.trials == report.trials[1:3] and part.budget == report.budget


# --- dataframe -----------------------------------------------------------------------------------------------------


def test_to_dataframe_columns_and_values(report: Report) -> None:
    frame = report.to_dataframe()
    assert len(frame) == len(report)
    expected = [
        "label",
        "status",
        "fits",
        "peak_bytes",
        *(f"{name}_bytes" for name in CATEGORIES),
        "step_time_s",
        "samples_per_s",
        "tokens_per_s",
        "error",
        *PLAN_FIELDS,
    ]
    assert list(frame.columns[: len(expected)]) == expected
    for name in (
        "device",
        "rows_per_step",
        "budget",
        "reserved_bytes",
        "rss_bytes",
        "preexisting_bytes",
        "notes",
        "estimated",
        "step_times",
    ):
        assert name in frame.columns
    assert list(frame["label"]) == [t.label for t in report]
    assert list(frame["status"]) == ["ok", "ok", "ok", "oom", "error", "ok"]
    assert list(frame["fits"]) == [False, True, True, False, False, True]
    assert list(frame["peak_bytes"]) == [t.peak_bytes for t in report]
    assert frame.loc[2, "precision"] == "bf16"
    assert frame.loc[5, "notes"] == "fp16 on CPU is slow"
    assert frame.loc[3, "micro_batch"] == 64
    assert frame["samples_per_s"].dtype.kind == "f"


def test_empty_report_dataframe_has_the_columns() -> None:
    frame = Report([]).to_dataframe()
    assert len(frame) == 0 and "peak_bytes" in frame.columns and "precision" in frame.columns


# --- HTML and text -------------------------------------------------------------------------------------------------


def test_html_names_every_plan_and_marks_what_does_not_fit(report: Report) -> None:
    page = report._repr_html_()
    for trial in report:
        assert trial.label in page
    assert page.count("does not fit") == 2  # the OOM and the plan over the 800 MiB budget
    assert "\u2605 best" in page and "bf16 \u2605 best" in page
    assert "peak MiB" in page and ">900</td>" in page  # one unit per size column, said in the header
    assert "white-space:nowrap" in page  # no size or label wraps
    assert "RuntimeError: shapes do not match" in page and "Traceback line two" not in page  # errors: one line
    assert "fp16 on CPU is slow" in page
    assert "Budget: 800.0 MiB" in page
    assert "Held before" not in page


def test_html_names_memory_held_before_and_escapes() -> None:
    trial = ok(Plan(), 10, 1.0, preexisting_bytes=3 * MIB, notes=("<script>",))
    assert "Held before" not in Report([trial])._repr_html_()  # changes no verdict: not said
    page = Report([trial], budget=trial.peak_bytes - MIB)._repr_html_()
    assert "Held before the trials: 3.0 MiB" in page and page.index("Held before") < page.index("<table")
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "No trials" in Report([])._repr_html_()
    assert trial._repr_html_().count("<tr") == 2


def test_text_table(report: Report) -> None:
    text = str(report)
    assert text == report.to_text()
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["plan", "status", "peak", "MiB"]
    best_line = next(line for line in lines if line.startswith("\u2605"))
    assert "bf16" in best_line
    assert "does not fit (OOM)" in text and "does not fit (over budget)" in text
    assert "Best: bf16" in text and "Budget: 800.0 MiB" in text and "Device: cpu" in text
    assert Report([]).to_text() == "No trials yet."


# --- JSON ----------------------------------------------------------------------------------------------------------


def test_json_round_trip(report: Report) -> None:
    report.trials[0] = dataclasses.replace(
        report.trials[0],
        reserved_bytes=123,
        rss_bytes=456,
        preexisting_bytes=7,
        rows_per_step=8,
        budget=10**12,
        device="cuda:0",
    )
    text = report.to_json()
    data = json.loads(text)
    assert data["budget"] == report.budget and len(data["trials"]) == len(report)
    assert data["trials"][0]["label"] == "plain" and data["trials"][0]["fits"] is False
    again = Report.from_json(text)
    assert again == report
    assert Report.from_dict(report.to_dict()) == report
    assert again.best == report.best


def test_trial_to_dict_is_flat_and_json_friendly() -> None:
    trial = ok(Plan(micro_batch=2, precision="fp16"), 10, 3.0, notes=("a", "b"), estimated=True)
    data = trial.to_dict()
    assert all(not isinstance(value, (dict, tuple, Plan)) for value in data.values())
    assert data["micro_batch"] == 2 and data["precision"] == "fp16" and data["optimizer"] == "adamw"
    assert data["label"] == "mb2x1 fp16" and data["notes"] == ["a", "b"] and data["estimated"] is True
    assert Trial.from_dict(json.loads(json.dumps(data))) == trial


# --- figure --------------------------------------------------------------------------------------------------------


def test_figure_data_lists(report: Report) -> None:
    data = figure_data(report)
    assert data["labels"] == [t.label for t in report]
    assert data["best"] == "bf16"
    assert data["categories"]["params"][0] == pytest.approx(900 / 4)
    assert data["categories"]["params"][3] is None and data["does_not_fit"][3] == pytest.approx(2000)
    assert data["error"] == [None, None, None, None, 0.0, None]
    assert data["error_text"][4] == "RuntimeError: shapes do not match"
    assert data["samples_per_s"] == [10.0, 6.0, 14.0, None, None, 5.0]
    assert data["budget_mib"] == pytest.approx(800)
    assert data["fits"] == [False, True, True, False, False, True]
    json.dumps(data)  # plain data


def test_figure_data_makes_repeated_labels_unique() -> None:
    data = figure_data(Report([ok(Plan(), 1, 1.0), ok(Plan(), 1, 2.0), ok(Plan(), 1, 3.0)]))
    assert data["labels"] == ["plain", "plain (2)", "plain (3)"]
    assert data["best"] == "plain (3)"


def test_plot_has_a_trace_per_category_and_a_samples_trace(report: Report) -> None:
    import plotly.graph_objects as go

    figure = report.plot()
    assert isinstance(figure, go.Figure)
    names = [trace.name for trace in figure.data]
    assert names == [*CATEGORIES, "out of memory", "over budget", "error", "samples/s", "marks"]
    by_name = {trace.name: trace for trace in figure.data}
    assert list(by_name["params"].x) == [t.label for t in report]
    assert by_name["out of memory"].marker.pattern.shape == "/" and by_name["over budget"].marker.pattern.shape == "/"
    # The live figure's top row: samples/s on the left (x, y), peak memory by category on the right (x2, y2).
    assert by_name["samples/s"].xaxis == "x" and {by_name[name].xaxis for name in CATEGORIES} == {"x2"}
    assert [note.text for note in figure.layout.annotations][:2] == ["Throughput", "Peak memory by category"]
    assert figure.layout.barmode == "stack"
    assert "MiB" in figure.layout.yaxis2.title.text and figure.layout.yaxis.title.text == "samples/s"
    assert figure.layout.title.text and "bf16" in figure.layout.title.text
    budget_lines = [shape for shape in figure.layout.shapes if shape.y0 == shape.y1]
    assert budget_lines and budget_lines[0].y0 == pytest.approx(800) and budget_lines[0].yref == "y2"


def test_plot_and_the_live_figure_share_traces_colours_and_layout(report: Report) -> None:
    from memlab.frontends.jupyter.live import LiveFigure

    static = report.plot()
    live = LiveFigure()
    live.show_report(report)
    shared = live.widget.data[: len(static.data)]
    for drawn, alive in zip(static.data, shared, strict=True):
        assert (drawn.name, drawn.type, drawn.xaxis, drawn.yaxis) == (alive.name, alive.type, alive.xaxis, alive.yaxis)
        assert drawn.hovertemplate == alive.hovertemplate and drawn.legendgroup == alive.legendgroup
        assert drawn.marker.color == alive.marker.color and drawn.x == alive.x and drawn.y == alive.y
    for axis in ("xaxis", "xaxis2"):  # the same columns (the live figure adds a row, so its heights differ)
        assert static.layout[axis].domain == live.widget.layout[axis].domain
    for axis in ("xaxis", "xaxis2", "yaxis", "yaxis2"):
        assert static.layout[axis].title.text == live.widget.layout[axis].title.text


def test_plot_without_budget_or_trials() -> None:
    figure = Report([ok(Plan(), 1, 1.0)]).plot()
    assert not figure.layout.shapes
    assert len(Report([]).plot().data) == len(CATEGORIES) + 5


# --- events --------------------------------------------------------------------------------------------------------


def test_events_are_frozen_dataclasses_for_a_callback() -> None:
    plan = Plan()
    trial = ok(plan, 1, 1.0)
    events: list[Event] = [
        TrialStarted(plan=plan, index=0, total=1),
        StepFinished(plan=plan, index=0, step=0, kind="timed", seconds=0.1, loss=1.0, live_bytes=1, peak_bytes=2),
        MemorySample(plan=plan, index=0, seconds=0.05, live_bytes=10),
        TrialFinished(trial=trial, index=0, total=1),
    ]
    for event in events:
        assert dataclasses.is_dataclass(event)
        with pytest.raises(dataclasses.FrozenInstanceError):
            event.index = 3  # type: ignore[misc]
    seen: list[Event] = []
    callback: Callback = seen.append
    for event in events:
        callback(event)
    assert seen == events
    assert isinstance(events[3], TrialFinished) and events[3].trial is trial


# --- lazy imports --------------------------------------------------------------------------------------------------


def test_importing_report_events_and_export_does_not_import_plotly_or_pandas() -> None:
    code = (
        "import sys, memlab.report, memlab.events, memlab.export; "
        "bad = [m for m in ('plotly', 'pandas', 'IPython', 'ipywidgets', 'bitsandbytes') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- speed with its noise ------------------------------------------------------------------------------------------


def timed(plan: Plan, peak_mib: float, seconds: tuple[float, ...], rows: int = 8) -> Trial:
    median = sorted(seconds)[len(seconds) // 2]
    return Trial(plan, "ok", int(peak_mib * MIB), {}, median, rows / median, None, "cpu", rows_per_step=rows,
                 step_times=seconds)


def test_speeds_within_noise_tie_and_the_lower_peak_is_best() -> None:
    fast_but_big = timed(Plan(), 900, (0.40, 0.50, 0.62))
    a_bit_slower_small = timed(Plan(checkpointing=True), 500, (0.45, 0.52, 0.60))
    report = Report([fast_but_big, a_bit_slower_small])
    assert report.best is a_bit_slower_small and report.ties == [fast_but_big]
    assert "As fast within measurement noise: plain" in report.to_text()


def test_a_plan_truly_30_percent_slower_is_ranked_slower() -> None:
    fast = timed(Plan(), 900, (0.48, 0.50, 0.52))
    slow = timed(Plan(checkpointing=True), 500, (0.63, 0.65, 0.67))
    report = Report([fast, slow])
    assert report.best is fast and report.ties == []


def test_step_times_survive_json_and_untimed_trials_have_no_range() -> None:
    trial = timed(Plan(), 100, (0.1, 0.2, 0.3))
    assert Report.from_json(Report([trial]).to_json())[0].step_times == (0.1, 0.2, 0.3)
    once = Trial(Plan(), "ok", 10, {}, 0.5, 16.0, None, "cpu", rows_per_step=8, step_times=(0.5,))
    twice_as_fast = Trial(Plan(precision="bf16"), "ok", 20, {}, 0.25, 32.0, None, "cpu", rows_per_step=8,
                          step_times=(0.25,))
    assert Report([once, twice_as_fast]).ties == []


# --- noise: ties, spread, and why nothing fits -----------------------------------------------------------------------


def timed_trial(plan: Plan, peak_mib: float, step_times: tuple[float, ...]) -> Trial:
    median = sorted(step_times)[len(step_times) // 2]
    return dataclasses.replace(ok(plan, peak_mib, 8 / median), rows_per_step=8, step_times=step_times,
                               step_time_s=median)


def test_a_speed_inside_the_noise_is_a_tie_and_the_tables_say_so() -> None:
    fast = timed_trial(Plan(), 900, (0.50, 0.52, 0.60, 0.49, 0.51, 0.55))
    close = timed_trial(Plan(checkpointing=True), 500, (0.53, 0.54, 0.56, 0.52, 0.55, 0.58))
    slow = timed_trial(Plan(accumulation=2), 400, (1.0, 1.01, 0.99, 1.02, 1.0, 1.01))
    report = Report([fast, close, slow])
    assert report.best is close and report.ties == [fast]  # tied within noise: the lower peak is named best
    text = report.to_text()
    assert "\u2605 ckpt" in text and "\u2248 plain" in text and "\u2248 accum2" not in text
    assert "noise" in text.splitlines()[0] and "\u00b1" in text
    assert "As fast within measurement noise: plain" in text
    page = report._repr_html_()
    assert "ckpt \u2605 best" in page and "plain \u2248 as fast" in page


def test_many_timed_steps_separate_speeds_that_a_few_could_not() -> None:
    # Two steps each: the ranges overlap, a tie. Forty steps each with the same spread: the intervals of the
    # medians are narrow, and the faster plan wins outright.
    a_few = Report([timed_trial(Plan(), 900, (0.50, 0.60)), timed_trial(Plan(checkpointing=True), 500, (0.55, 0.65))])
    assert a_few.ties
    fast = tuple(0.50 + 0.10 * ((i * 7) % 40) / 40 for i in range(40))
    slow = tuple(seconds + 0.05 for seconds in fast)
    many = Report([timed_trial(Plan(), 900, fast), timed_trial(Plan(checkpointing=True), 500, slow)])
    assert many.best is many.trials[0] and many.ties == []


def test_when_nothing_fits_the_footer_says_why_in_one_line() -> None:
    state_too_big = Report([ok(Plan(), 900, 10.0)], budget=600 * MIB)  # params+grads+optimizer: 675 MiB
    text = state_too_big.to_text()
    assert "Why: weights, gradients and optimizer state alone take 675.0 MiB in plain" in text
    close = Report([ok(Plan(), 900, 10.0), oom(Plan(micro_batch=64), 2000)], budget=800 * MIB)
    assert "Why: the smallest peak, 900.0 MiB (plain), is 100.0 MiB over the budget of 800.0 MiB" in close.to_text()


def test_out_of_memory_notes_are_short() -> None:
    message = (
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has a total capacity of 79.19 GiB "
        "of which 2.1 GiB is free. Including non-PyTorch memory, this process has 77.0 GiB memory in use."
    )
    trial = dataclasses.replace(oom(Plan(), 2000), error=message, device="cuda:0")
    text = Report([trial]).to_text()
    assert "CUDA out of memory allocating 3.50 GiB" in text and "total capacity" not in text


def _runs(*medians: float, steps: int = 8) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """Step times of runs with these median seconds, each a little noisy (+-1%)."""
    times = tuple(median * (1 + 0.01 * ((i % 3) - 1)) for median in medians for i in range(steps))
    return times, (steps,) * len(medians)


def _pooled_trial(plan: Plan, medians: tuple[float, ...]) -> Trial:
    times, runs = _runs(*medians, steps=30)
    step = sorted(times)[len(times) // 2]
    return Trial(plan, "ok", 100, {}, step, 8 / step, None, "cpu", rows_per_step=8, step_times=times, step_runs=runs)


def test_a_plan_timed_in_turn_with_itself_on_a_drifting_machine_is_a_tie() -> None:
    # A B A B A B while the machine slows down 5% a run: each run's own interval is narrow, so pooled step times
    # alone would crown A; the span of the runs' medians sees the drift both met.
    first = _pooled_trial(Plan(), (1.00, 1.10, 1.20))
    second = _pooled_trial(Plan(), (1.05, 1.15, 1.25))
    assert Report([first, second]).ties == [second] or Report([first, second]).ties == [first]
    flat = [Trial(t.plan, "ok", 100, {}, t.step_time_s, t.samples_per_s, None, "cpu", rows_per_step=8,
                  step_times=t.step_times) for t in (first, second)]  # fmt: skip
    assert Report(flat).ties == []  # what the pooled times alone would claim


def test_a_plan_truly_thirty_percent_slower_stays_slower_through_drift() -> None:
    fast = _pooled_trial(Plan(), (1.00, 1.05, 1.10))
    slow = _pooled_trial(Plan(checkpointing=True), (1.32, 1.38, 1.44))
    report = Report([fast, slow])
    assert report.best is fast and report.ties == []


def test_one_run_disturbed_by_a_burst_does_not_hide_a_real_difference() -> None:
    # benchmarks/results/ties-cpu.json once had a plan 40% slower reported as a tie: one short re-run of it met a
    # burst on the shared machine, and six steps with a spike give an interval as wide as the spike. The spike
    # moves that run's median little; the typical run's noise, not the noisiest's, widens the span.
    calm = (0.50, 0.51, 0.50, 0.51, 0.50, 0.51)
    fast_times = calm * 2 + (0.50, 0.51, 0.50, 0.51, 0.50, 1.9)  # the last run met a burst
    slow_times = tuple(1.4 * t for t in calm * 3)
    fast = Trial(Plan(), "ok", 100, {}, 0.505, 8 / 0.505, None, "cpu", rows_per_step=8,
                 step_times=fast_times, step_runs=(6, 6, 6))  # fmt: skip
    slow = Trial(Plan(checkpointing=True), "ok", 90, {}, 0.707, 8 / 0.707, None, "cpu", rows_per_step=8,
                 step_times=slow_times, step_runs=(6, 6, 6))  # fmt: skip
    report = Report([fast, slow])
    assert report.best is fast and report.ties == []
    low, high = speed_range(fast)
    assert low > 8 / 0.51 * 0.95 and high < 8 / 0.50 * 1.05  # widened by the typical run's noise, not the spike's


def test_step_runs_must_add_up_to_the_step_times() -> None:
    with pytest.raises(ValueError, match="does not add up"):
        Trial(Plan(), "ok", 1, {}, 0.5, 16.0, None, "cpu", rows_per_step=8, step_times=(0.5, 0.5), step_runs=(3,))
    trial = _pooled_trial(Plan(), (1.0, 1.1))
    assert Trial.from_dict(trial.to_dict()) == trial


@pytest.mark.parametrize(
    ("step_times", "shown"),
    [
        ((0.01, 0.01, 5.0, 9.0), "unreliable (machine busy)"),  # a spread over 100% is no number
        ((0.0, 0.0), "unreliable (machine busy)"),  # a step timed at 0 s: no interval
        ((0.25,), "timed once"),  # one timed step: no interval, and the cell says why
        ((0.24, 0.25, 0.26), "\u00b14%"),
    ],
    ids=["over-100%", "zero-time", "timed-once", "ordinary"],
)
def test_the_noise_column_never_shows_over_100_percent_nor_a_bare_dash_for_a_measured_trial(
    step_times: tuple[float, ...], shown: str
) -> None:
    from memlab.report.views.tables import table_rows

    trial = Trial(Plan(), "ok", 2**20, {"params": 2**20}, 0.25, 32.0, None, "cpu", rows_per_step=8,
                  step_times=step_times)
    other = Trial(Plan(checkpointing=True), "ok", 2**20, {"params": 2**20}, 0.25, 32.0, None, "cpu",
                  rows_per_step=8, step_times=(0.24, 0.25, 0.26))
    report = Report([trial, other])
    assert table_rows(report)[0]["spread"] == shown
    assert shown in report.to_text() and shown.replace("\u00b1", "") in report._repr_html_()


def test_the_table_numbers_its_rows_as_the_figures_number_their_bars_when_there_are_many() -> None:
    import re

    from memlab.report.views.plan_axis import FULL_LABELS_UP_TO, plan_axis, plan_axis_layout
    from memlab.report.views.tables import html_table, table_rows, text_table

    many = Report([Trial(Plan(micro_batch=rows), "ok", 100 + rows, {}, 0.1, 10.0 + rows, None, "cpu")
                   for rows in range(1, FULL_LABELS_UP_TO + 3)])
    data = figure_data(many)
    rows = table_rows(many)
    # The bar numbered n in the figure (its hover starts "#n <b>label</b>") is row n of the table, "#" column n.
    for number, (hover, row) in enumerate(zip(data["hover"], rows, strict=True), start=1):
        assert row["number"] == str(number)
        assert hover.startswith(f"#{number} <b>{row['plan']}</b>")
    assert text_table(many).splitlines()[0].split()[:2] == ["#", "plan"]
    assert ">#</th>" in html_table(many)
    axis = plan_axis_layout(plan_axis(data["labels"]), data["labels"])
    assert axis["title"]["text"] == "plan number (the table's # column)"
    few = Report(many.trials[:FULL_LABELS_UP_TO])
    assert all(row["number"] == "" for row in table_rows(few))
    assert not re.search(r"^\s*#", text_table(few).splitlines()[0])


def test_suggestions_under_a_table_name_the_figure_their_verdict_judged() -> None:
    """Where the estimate models the card, a suggestion is judged on it (as every row of the table is), and the
    line under the table says that figure, with its allocated peak beside it; the commands after it say the same."""
    gib = 2**30
    over = Trial(Plan(), "ok", 30 * gib, {}, None, None, None, "cuda", budget=24 * gib, estimated=True)
    lora = Trial(Plan(adapter="lora", precision="bf16"), "ok", 15 * gib, {}, None, None, None, "cuda",
                 budget=24 * gib, reserved_bytes=16 * gib, context_bytes=gib // 2, estimated=True)
    plain_cpu = Trial(Plan(adapter="qlora", precision="bf16"), "ok", 7 * gib, {}, None, None, None, "cpu",
                      budget=24 * gib, estimated=True)
    text = Report([over], budget=24 * gib, suggestions=[lora, plain_cpu]).to_text()
    line = next(line for line in text.splitlines() if line.startswith("Estimated to fit, outside the searched space"))
    assert line.endswith("bf16 lora, card 16.50 GiB (peak 15.00 GiB); bf16 qlora, peak 7.00 GiB"), line
