"""The live figure without a browser: what the FigureWidget holds after progress events, how often it redraws, and how
LiveOutput shows it in a cell and leaves a static record there."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pytest
from models import mlp_batch, mlp_loss, tiny_mlp
from plotly.basedatatypes import Undefined

import memlab
from memlab.events import MemorySample, StepFinished, TrialFinished, TrialStarted
from memlab.frontends.jupyter import live as live_module
from memlab.frontends.jupyter.live import LiveFigure, LiveOutput
from memlab.plan import Plan
from memlab.report import CATEGORIES, Report, Trial
from memlab.report.views.figure import BEST_COLOR, MARKS_NAME
from memlab.runner.trial import TrialRunner

MIB = 1024**2


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ok_trial(plan: Plan, peak_mib: float, speed: float, budget: int | None = None) -> Trial:
    peak = int(peak_mib * MIB)
    quarter = peak // 4
    breakdown = {"params": quarter, "grads": quarter, "optimizer": quarter, "activations": peak - 3 * quarter}
    return Trial(plan, "ok", peak, breakdown, 1 / speed, speed, None, "cpu", budget=budget)


def oom_trial(plan: Plan, reached_mib: float, budget: int | None) -> Trial:
    return Trial(plan, "oom", int(reached_mib * MIB), {}, None, None, None, "cpu", error="out of memory", budget=budget)


def error_trial(plan: Plan) -> Trial:
    return Trial(plan, "error", 0, {}, None, None, None, "cpu", error="RuntimeError: boom")


def traces_on(figure: LiveFigure, xaxis: str) -> dict[str, Any]:
    return {trace.name: trace for trace in figure.widget.data if trace.xaxis == xaxis}


def run_trial(
    figure: LiveFigure | LiveOutput, trial: Trial, index: int, total: int, samples: Sequence[int] = ()
) -> None:
    plan = trial.plan
    figure(TrialStarted(plan=plan, index=index, total=total))
    figure(StepFinished(plan, index, 0, "warmup", 0.5, 2.0, None, None))
    for number, live in enumerate(samples):
        figure(MemorySample(plan=plan, index=index, seconds=0.01 * (number + 1), live_bytes=live))
    if trial.status == "ok":
        figure(StepFinished(plan, index, 0, "tracked", 0.1, 2.0, samples[-1] if samples else None, trial.peak_bytes))
        figure(StepFinished(plan, index, 0, "timed", 0.2, 2.0, None, None))
    figure(TrialFinished(trial=trial, index=index, total=total))


def test_a_bar_per_setting_for_each_category_and_a_point_per_setting() -> None:
    budget = 10 * MIB
    figure = LiveFigure(budget=budget, clock=FakeClock())
    trials = [
        ok_trial(Plan(), 8.0, 20.0, budget),
        ok_trial(Plan(checkpointing=True), 4.0, 15.0, budget),
        ok_trial(Plan(precision="bf16"), 12.0, 30.0, budget),  # ran, but over the budget
        oom_trial(Plan(micro_batch=64), 3.0, budget),
        error_trial(Plan(optimizer="adamw8bit")),
    ]
    for index, trial in enumerate(trials):
        run_trial(figure, trial, index, len(trials), samples=[MIB, 2 * MIB])

    labels = tuple(trial.label for trial in trials)
    assert labels[:3] == ("plain", "ckpt", "bf16")
    bars = traces_on(figure, "x2")
    for name in CATEGORIES:
        assert bars[name].x == labels
        assert [y is not None for y in bars[name].y] == [True, True, True, False, False]
    assert bars["params"].y[0] == pytest.approx(2.0)
    assert sum(bars[name].y[1] for name in CATEGORIES) == pytest.approx(4.0)
    # The OOM setting is a "does not fit" bar as high as what is known of its peak, a lower bound: the 10 MiB budget
    # it broke (higher than the 3 MiB it reached), written as a bound; the failure an x.
    assert bars["out of memory"].y == (None, None, None, pytest.approx(10.0), None)
    assert bars["out of memory"].text[3] == "does not fit: \u2265 10 MiB"
    assert bars["error"].y == (None, None, None, None, 0.0)
    assert bars["error"].text[4] == "RuntimeError: boom"

    speed = traces_on(figure, "x")["samples/s"]  # the top left panel, as in Report.plot
    assert speed.x == labels and speed.y == (20.0, 15.0, 30.0, None, None)
    assert speed.marker.color[0] == BEST_COLOR  # plain is the fastest that fits
    # The words over the bars are the "marks" text trace, at the top of each bar (no error bar: timed once)
    marks = traces_on(figure, "x")[MARKS_NAME]
    assert (marks.type, marks.mode) == ("scatter", "text")
    assert marks.x == ("plain", "bf16") and marks.y == (20.0, 30.0)
    assert marks.text == ("best", "over<br>budget") and marks.textfont.color[0] == BEST_COLOR

    scatter = traces_on(figure, "x4")
    assert scatter["fits"].text == ("plain", "ckpt")
    assert scatter["fits"].x == (pytest.approx(8.0), pytest.approx(4.0))
    assert scatter["does not fit"].text == ("bf16", labels[3])
    assert scatter["does not fit"].y == (30.0, 0.0)
    assert len(scatter["fits"].x) + len(scatter["does not fit"].x) == 4  # every setting that reached a peak


def test_the_budget_line_is_a_dashed_shape_at_the_budget() -> None:
    figure = LiveFigure(budget="6MiB")
    shapes = {shape.name: shape for shape in figure.widget.layout.shapes}
    line = shapes["budget"]
    assert (line.type, line.yref, line.xref, line.y0, line.y1) == ("line", "y2", "x2 domain", 6.0, 6.0)
    assert line.line.dash == "dash"
    assert (shapes["budget (live)"].xref, shapes["budget (live)"].yref) == ("x3 domain", "y3")
    assert shapes["budget (scatter)"].x0 == 6.0 and shapes["budget (scatter)"].xref == "x4"
    assert any("budget 6.0 MiB" in note.text for note in figure.widget.layout.annotations)
    figure.budget = None
    assert figure.widget.layout.shapes == ()


def test_memory_of_the_running_trial_is_drawn_in_seconds_into_the_trial() -> None:
    clock = FakeClock()
    figure = LiveFigure(clock=clock)
    plan = Plan(checkpointing=True)
    figure(TrialStarted(plan=plan, index=0, total=2))
    titles = [note.text for note in figure.widget.layout.annotations]
    assert titles[2] == "Running: ckpt (setting 1 of 2)"  # the bottom left panel's title
    figure(StepFinished(plan, 0, 0, "warmup", 0.5, 2.0, None, None))
    figure(MemorySample(plan=plan, index=0, seconds=0.1, live_bytes=MIB))
    figure(MemorySample(plan=plan, index=0, seconds=0.2, live_bytes=3 * MIB))
    figure.flush()
    live = figure.widget.data[live_module.LIVE]
    assert live.x == (pytest.approx(0.6), pytest.approx(0.7)) and live.y == (1.0, 3.0)
    # A new trial starts a new line.
    figure(TrialStarted(plan=Plan(), index=1, total=2))
    assert figure.widget.data[live_module.LIVE].x == ()


def test_updates_are_batched_at_most_one_redraw_per_interval() -> None:
    clock = FakeClock()
    figure = LiveFigure(min_interval_s=0.25, clock=clock)
    sent: list[str | None] = []
    updates: list[dict[str, Any]] = []
    send_state = figure.widget.send_state

    def record(key: Any = None) -> None:
        sent.append(key)
        if key == "_py2js_update" and figure.widget._py2js_update is not None:
            updates.append(figure.widget._py2js_update)
        send_state(key)

    figure.widget.send_state = record  # type: ignore[method-assign]
    plan = Plan()
    figure(TrialStarted(plan=plan, index=0, total=1))  # always redraws
    redraws = figure.redraws
    for number in range(500):
        figure(MemorySample(plan=plan, index=0, seconds=number / 1000, live_bytes=number * 1024))
    assert figure.redraws == redraws  # no time passed: all waiting
    assert figure.widget.data[live_module.LIVE].x == ()
    clock.now += 0.3
    figure(MemorySample(plan=plan, index=0, seconds=0.6, live_bytes=MIB))
    assert figure.redraws == redraws + 1
    assert len(figure.widget.data[live_module.LIVE].x) == 501
    clock.now += 0.1
    figure(StepFinished(plan, 0, 0, "tracked", 0.7, 1.0, MIB, MIB))
    assert figure.redraws == redraws + 1  # too soon
    figure(TrialFinished(trial=ok_trial(plan, 1.0, 10.0), index=0, total=1))  # always redraws
    assert figure.redraws == redraws + 2
    assert figure.widget.data[1].x == ("plain",)
    # A redraw is one update of the traces (and one of the layout where titles or budget changed), never a stream
    # of restyles and relayouts; every trace gets an explicit value, none is left undefined.
    assert "_py2js_restyle" not in sent and "_py2js_relayout" not in sent
    assert 0 < len(updates) <= 2 * (figure.redraws - redraws + 1)
    for update in updates:
        if update["style_traces"]:
            assert update["style_traces"] == list(range(len(figure.widget.data)))
            for values in update["style_data"].values():
                assert len(values) == len(figure.widget.data) and Undefined not in values


def test_flush_draws_what_is_waiting_and_nothing_else() -> None:
    figure = LiveFigure(min_interval_s=3600, clock=FakeClock())
    redraws = figure.redraws
    figure.flush()
    assert figure.redraws == redraws
    figure(MemorySample(plan=Plan(), index=0, seconds=0.1, live_bytes=MIB))
    figure.flush()
    assert figure.redraws == redraws + 1


def test_show_report_draws_a_whole_report_with_its_budget() -> None:
    report = Report([ok_trial(Plan(), 2.0, 5.0), oom_trial(Plan(accumulation=2), 0.0, 1 * MIB)], budget=1 * MIB)
    figure = LiveFigure()
    figure.show_report(report)
    bars = traces_on(figure, "x2")
    assert bars["params"].x == ("plain", Plan(accumulation=2).label())
    # reached nothing, yet drawn to its budget line: it needed at least that
    assert bars["out of memory"].y == (None, pytest.approx(1.0))
    assert figure.widget.layout.shapes[0].y0 == pytest.approx(1.0)
    assert figure.report == report and figure.report is not report


def test_many_samples_are_thinned_but_the_peak_is_kept() -> None:
    xs = [float(i) for i in range(10_000)]
    ys = [float(i % 97) for i in range(10_000)]
    ys[4321] = 1e6
    thin_x, thin_y = live_module._thin(xs, ys, 2000)
    assert len(thin_x) <= 2002 and 1e6 in thin_y and thin_x[-1] == xs[-1]


def test_a_drawing_problem_warns_once_and_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    figure = LiveFigure()

    def broken(*args: Any) -> Any:
        raise RuntimeError("no plotly today")

    monkeypatch.setattr(live_module, "figure_data", broken)
    with pytest.warns(RuntimeWarning, match="no plotly today"):
        figure(TrialStarted(plan=Plan(), index=0, total=1))
    figure(TrialStarted(plan=Plan(), index=0, total=1))  # a second failure is quiet


def test_as_the_callback_of_compare_it_draws_every_trial() -> None:
    model = tiny_mlp(blocks=2, width=16)
    figure = LiveFigure(budget="64MiB", min_interval_s=0.0)
    plans = [Plan(), Plan(checkpointing=True)]
    report = memlab.compare(
        model, mlp_batch(rows=8, width=16), plans, loss_fn=mlp_loss, steps=1, noise=0, callback=figure,
        progress=False,
    )
    assert figure.report.trials == report.trials
    assert traces_on(figure, "x2")["params"].x == ("plain", "ckpt")
    assert len(figure.widget.data[live_module.LIVE].x) > 0  # samples of the tracked step were drawn
    assert max(figure.widget.data[live_module.LIVE].y) <= report.trials[-1].peak_bytes / MIB + 1e-9


@pytest.mark.slow
def test_a_close_race_timed_again_keeps_its_columns_and_ends_with_the_pooled_trials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The same plan twice is as close as a race gets: compare times both again in turn (A B A B); every re-run
    # redraws its plan's column, and the figure ends with what compare returns, not with extra columns.
    # A clock that ticks one second per reading makes every timed step last a second: the race is a tie and the
    # noise target is met at its fewest steps, however busy the machine (real timing could run to the time limit).
    ticks = itertools.count()
    real_init = TrialRunner.__init__

    def init(self: TrialRunner, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **{**kwargs, "clock": lambda: float(next(ticks))})

    monkeypatch.setattr(TrialRunner, "__init__", init)
    figure = LiveFigure(budget="64MiB", min_interval_s=0.0)
    report = memlab.compare(tiny_mlp(blocks=2, width=16), mlp_batch(rows=8, width=16), [Plan(), Plan()],
                            loss_fn=mlp_loss, steps=1, callback=figure, progress=False)
    assert all(trial.step_runs for trial in report.trials)  # timed again, pooled
    assert figure.report.trials == report.trials
    figure.start_run()  # a second run (the panel's next click) gets columns of its own
    again = memlab.compare(tiny_mlp(blocks=2, width=16), mlp_batch(rows=8, width=16), [Plan()], loss_fn=mlp_loss,
                           steps=1, callback=figure, progress=False)
    assert figure.report.trials == [*report.trials, *again.trials]


def test_sixty_settings_are_numbered_with_error_bars_and_hover() -> None:
    figure = LiveFigure(budget="64MiB", clock=FakeClock())
    plans = [Plan(micro_batch=size, accumulation=accumulation) for size in (1, 2, 4) for accumulation in range(1, 21)]
    for index, plan in enumerate(plans):
        trial = ok_trial(plan, 2.0 + index / 10, 10.0 + index % 5)
        trial.rows_per_step, trial.step_times = 8, (0.5, 0.55, 0.6, 0.52, 0.58, 0.54)
        run_trial(figure, trial, index, len(plans))
    layout = figure.widget.layout
    assert list(layout.xaxis.ticktext[:3]) == ["1", "5", "10"] and layout.xaxis.tickangle == 0
    assert layout.xaxis2.ticktext == layout.xaxis.ticktext and layout.autosize is True and layout.width is None
    speed = traces_on(figure, "x")["samples/s"]
    assert len(speed.error_y.array) == 60 and all(isinstance(value, float) for value in speed.error_y.array)
    assert speed.hovertext[11].startswith("#12 ") and plans[11].describe() in speed.hovertext[11]
    points = traces_on(figure, "x4")["fits"]
    # The scatter's points are numbered like the bars; where two names would touch, one is left out (its hover says).
    assert points.text[0] == "1" and all(text in ("", str(i + 1)) for i, text in enumerate(points.text))
    assert 10 <= sum(bool(text) for text in points.text) < 60


class FakeHandle:
    def __init__(self) -> None:
        self.updates: list[tuple[Any, dict[str, Any]]] = []

    def update(self, obj: Any, **kwargs: Any) -> None:
        self.updates.append((obj, kwargs))


@pytest.fixture
def displays(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, dict[str, Any], FakeHandle]]:
    import IPython.display

    shown: list[tuple[Any, dict[str, Any], FakeHandle]] = []

    def display(obj: Any, **kwargs: Any) -> FakeHandle:
        handle = FakeHandle()
        shown.append((obj, kwargs, handle))
        return handle

    monkeypatch.setattr(IPython.display, "display", display)
    return shown


def test_live_output_shows_the_figure_at_the_first_event_then_leaves_a_static_record(
    displays: list[tuple[Any, dict[str, Any], FakeHandle]],
) -> None:
    from memlab.report.views.static import record_bundle

    output = LiveOutput(budget="8MiB", min_interval_s=0.0)
    assert output.figure is None and displays == []
    trial = ok_trial(Plan(), 2.0, 5.0)
    run_trial(output, trial, 0, 1)
    assert output.figure is not None and len(displays) == 1
    widget, options, handle = displays[0]
    assert widget is output.figure.widget and options == {"display_id": True}
    report = Report([trial], budget=8 * MIB)
    output.finish(report)
    assert handle.updates == [(record_bundle(report, interactive=False), {"raw": True})]
    assert output.figure.widget.comm is None  # closed
    assert len(displays) == 1


def test_live_output_without_events_shows_the_record_only_when_asked(
    displays: list[tuple[Any, dict[str, Any], FakeHandle]],
) -> None:
    output = LiveOutput()
    output.finish(Report([]))
    assert displays == []
    report = Report([ok_trial(Plan(), 2.0, 5.0)])
    output.finish(report, show=True)
    (record, options, _), = displays
    assert options == {"raw": True, "display_id": True} and "<svg" in record["image/svg+xml"]
    assert output.figure is None and output.shown


def test_live_output_never_raises_when_the_record_fails(
    displays: list[tuple[Any, dict[str, Any], FakeHandle]], monkeypatch: pytest.MonkeyPatch
) -> None:
    output = LiveOutput()
    run_trial(output, ok_trial(Plan(), 2.0, 5.0), 0, 1)

    def broken(report: Report, **_: Any) -> dict[str, Any]:
        raise RuntimeError("no SVG today")

    monkeypatch.setattr(live_module, "record_bundle", broken)
    with pytest.warns(RuntimeWarning, match="no SVG today"):
        output.finish(output.report)


@pytest.mark.parametrize(
    "speeds",
    [[float("inf"), 8.0], [float("nan"), 8.0], [0.0, 0.0], [float("inf")], [float("inf")] * 200],
    ids=["infinite", "nan", "zero", "one-infinite", "200-infinite"],
)
@pytest.mark.slow
def test_the_live_figure_draws_infinite_nan_and_zero_speeds(speeds: list[float]) -> None:
    import math

    figure = LiveFigure(budget=10 * MIB, clock=FakeClock())
    trials = [
        Trial(Plan(micro_batch=k + 1), "ok", 2 * MIB, {"params": MIB, "activations": MIB}, 0.0, speed, None, "cpu",
              rows_per_step=8, step_times=(0.0, 0.0))
        for k, speed in enumerate(speeds)
    ]
    for index, trial in enumerate(trials):
        run_trial(figure, trial, index, len(trials), samples=[MIB])
    for trace in figure.widget.data:
        for value in trace.y or ():
            assert value is None or isinstance(value, str) or math.isfinite(value), (trace.name, trace.y)
    for axis in ("yaxis", "yaxis2", "yaxis3", "yaxis4"):
        shown = getattr(figure.widget.layout, axis).range
        assert shown is None or all(math.isfinite(v) for v in shown)


def test_the_budget_label_leaves_a_bar_just_past_the_budget_uncovered() -> None:
    """The live figure's budget label slides left of the last bar when that bar's top is just past the budget (the
    rule Report.plot()'s and the SVG figure's labels follow); with every bar below it, it stays at the right end."""
    budget = int(100 * MIB)
    figure = LiveFigure(budget=budget)
    plain, ckpt = Plan(), Plan(checkpointing=True)
    figure.show_report(Report([ok_trial(plain, 50, 10.0, budget), ok_trial(ckpt, 103, 8.0, budget)], budget=budget))
    (note,) = [note for note in figure.widget.layout.annotations if str(note.text).startswith("budget ")]
    gap = figure.widget.layout.bargap
    assert note.x <= (2 - 0.5 - (1 - gap) / 2) / 2, note  # left of the second bar's left edge
    figure.show_report(Report([ok_trial(plain, 50, 10.0, budget), ok_trial(ckpt, 60, 8.0, budget)], budget=budget))
    (note,) = [note for note in figure.widget.layout.annotations if str(note.text).startswith("budget ")]
    assert note.x == 1


def test_a_points_name_near_the_right_edge_ends_at_its_point() -> None:
    """Issue 84 item 9: the scatter's right-most point (the largest peak, at 95% of its axis) had its name centred
    above it, half of it past the plot's edge, where plotly cuts it ("accum2 ck" in a 1,000-px window). Names in the
    axis's right part are written to their point's left, ending at it; the others centred."""
    figure = LiveFigure(clock=FakeClock())
    trials = [ok_trial(Plan(), 2.0, 20.0), ok_trial(Plan(accumulation=2, checkpointing=True), 8.0, 9.0)]
    for index, trial in enumerate(trials):
        run_trial(figure, trial, index, len(trials))
    figure.flush()
    scatter = traces_on(figure, "x4")["fits"]
    where = dict(zip(scatter.text, scatter.textposition, strict=True))
    assert where == {"plain": "top center", "accum2 ckpt": "top left"}
