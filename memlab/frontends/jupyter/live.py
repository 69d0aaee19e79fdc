"""The live figure: a plotly FigureWidget that memlab's progress events redraw while trials run, and
:class:`LiveOutput`, which shows it in a cell and leaves a static record there when the run ends.

Four panels, always the same traces in the same order (so every redraw updates them in place). The top row is
:meth:`memlab.Report.plot`'s figure, built by the same :func:`memlab.report.views.figure.comparison_figure` (the same
traces, colours and layout); the bottom row is the live figure's own:

* top left, **samples/s** per setting (the best one green), each with its 95% interval as an error bar;
* top right, **peak memory by category** per setting, stacked (params, grads, optimizer, activations, other),
  a grey hatched "does not fit" bar for a setting that ran out of memory, a red ``x`` for one that failed, and
  a dashed budget line;
* bottom left, **memory of the running trial**: live bytes over the seconds of the trial, from the samples taken
  during its tracked step (warm-up and timed steps are not tracked, so they only move the clock on);
* bottom right, **memory vs throughput**: a point per setting that reached a peak (an out-of-memory one at 0
  samples/s), green where it fits the budget, grey where it does not.

With many settings the bars are numbered (:func:`memlab.report.views.plan_axis.plan_axis`); every hover names the
setting and spells its levers out.

Redraws are batched: a step or a memory sample redraws at most once per ``min_interval_s``, while the start and the
end of a trial always redraw. A redraw is one ``plotly_update`` message for all the traces (every trace given every
value explicitly), plus one batched layout message when the titles, the budget line or the plan axis changed. That
keeps the kernel free for the training it measures, and the browser in step with Python.
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import plotly.graph_objects as go

from memlab.events import Event, MemorySample, StepFinished, TrialFinished, TrialSettled, TrialStarted
from memlab.frontends.jupyter.live_layout import (
    MARGIN_PX,
    SCATTER_HEADROOM,
    row_domains,
    spaced_labels,
)
from memlab.plan import Plan, parse_budget
from memlab.report import CATEGORIES, Report
from memlab.report.views.budget_mark import memory_tops
from memlab.report.views.figure import (
    BEST_COLOR,
    DOES_NOT_FIT_COLOR,
    FIGURE_TITLES,
    THROUGHPUT_COLUMN,
    budget_line,
    budget_note,
    comparison_figure,
    empty_trace,
    figure_columns,
    figure_data,
    speed_range,
)
from memlab.report.views.plan_axis import figure_height, plan_axis, plan_axis_layout
from memlab.report.views.static import record_bundle

__all__ = ["LiveFigure", "LiveOutput", "responsive_widget"]

_MIB = 1024**2
_MAX_LIVE_POINTS = 2000
_LIVE_COLOR = "#4C78A8"

# Trace order (indices into ``widget.data``): Report.plot's ten traces (the categories', then the marks'), then the
# live figure's own three.
DOES_NOT_FIT = len(CATEGORIES)
OVER_BUDGET = DOES_NOT_FIT + 1
ERROR = OVER_BUDGET + 1
SPEED = ERROR + 1
MARKS = SPEED + 1
LIVE = MARKS + 1
SCATTER_FITS = LIVE + 1
SCATTER_MISSES = SCATTER_FITS + 1

_TRACE_KEYS = (
    "x", "y", "text", "textposition", "customdata", "hovertext", "marker.color", "textfont.color", "showlegend",
    "error_y.array", "error_y.arrayminus", "error_y.width",
)
_LIVE_TITLES = ("Memory of the running trial", "Memory vs throughput")
_TITLES = (*FIGURE_TITLES, *_LIVE_TITLES)
_THROUGHPUT_TITLE = THROUGHPUT_COLUMN - 1  # indices into _TITLES
_RUNNING_TITLE = len(FIGURE_TITLES)
_HEIGHT = 640


class LiveFigure:
    """The live plotly FigureWidget: memory over steps of the running trial, peak by category per setting with the
    budget line, samples/s per setting, memory-vs-throughput scatter. Fed by memlab's progress events.

    Pass it as the ``callback`` of ``memlab.compare`` / ``measure`` / ``fit`` and display ``.widget``; it keeps
    every trial it has seen in ``.report``, so several calls add up in one figure.

    Args:
        budget: the memory budget (bytes, or a string such as ``"8GiB"``) drawn as a line; None for no line.
        min_interval_s: the least time between two redraws while a trial runs.
        clock: the clock used to space redraws (for tests).
        categories: the stacked memory categories: a training run's (default), or
            :data:`memlab.report.INFERENCE_CATEGORIES` for inference plans (the traces after them move along).

    Example:
        >>> import torch, memlab
        >>> live = LiveFigure(budget="1GiB")
        >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        >>> report = memlab.compare(model, torch.randn(4, 8), [memlab.Plan()], loss_fn=lambda m, b: m(b).mean(),
        ...                         steps=1, callback=live, progress=False)
        >>> live.report.trials[0].label, live.widget.data[0].x
        ('plain', ('plain',))
    """

    def __init__(
        self,
        budget: int | str | None = None,
        *,
        min_interval_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
        categories: tuple[str, ...] = CATEGORIES,
    ) -> None:
        self.min_interval_s = min_interval_s
        self.categories = tuple(categories)
        shift = len(self.categories) - len(CATEGORIES)
        self._does_not_fit, self._live = DOES_NOT_FIT + shift, LIVE + shift
        self._scatter_fits, self._scatter_misses = SCATTER_FITS + shift, SCATTER_MISSES + shift
        self.report = Report([], budget=parse_budget(budget))
        self.widget: go.FigureWidget = _build_widget(self.categories)
        self._title_notes = [note.to_plotly_json() for note in self.widget.layout.annotations]
        self._defaults = [_trace_defaults(trace) for trace in self.widget.data]
        self._layout: dict[str, Any] | None = None
        self.redraws = 0
        self._clock = clock
        self._last_draw = -math.inf
        self._pending = False
        self._running: Plan | None = None
        self._running_text = ""
        self._live_seconds: list[float] = []
        self._live_mib: list[float] = []
        self._offset_s = 0.0
        self._warned = False
        self._columns_of_run: dict[int, int] = {}
        self._draw()

    def start_run(self) -> None:
        """A new run begins, whose trial indexes count from 0 again (a panel runs one compare per click): its
        trials get new columns, while a plan timed again within one run keeps its column.

        Example:
            >>> from memlab.events import TrialFinished
            >>> from memlab.report import Trial
            >>> live, trial = LiveFigure(), Trial(Plan(), "ok", 2**20, {"params": 2**20}, 0.5, 8.0, None, "cpu")
            >>> live(TrialFinished(trial, 0, 1)); live(TrialFinished(trial, 0, 1)); len(live.report)
            1
            >>> live.start_run(); live(TrialFinished(trial, 0, 1)); len(live.report)
            2
        """
        self._columns_of_run = {}

    @property
    def budget(self) -> int | None:
        """The budget in bytes drawn as a line (None: no line); setting it redraws.

        Example:
            >>> live = LiveFigure()
            >>> live.budget = "2MiB"
            >>> live.budget, [shape.name for shape in live.widget.layout.shapes][0]
            (2097152, 'budget')
        """
        return self.report.budget

    @budget.setter
    def budget(self, budget: int | str | None) -> None:
        self.report.budget = parse_budget(budget)
        self._draw()

    def __call__(self, event: Event) -> None:
        """Take one progress event; redraw now or later (see the module docstring). Never raises.

        Example:
            >>> from memlab.events import TrialStarted, MemorySample
            >>> live = LiveFigure(min_interval_s=60)
            >>> live(TrialStarted(plan=Plan(), index=0, total=1))
            >>> live(MemorySample(plan=Plan(), index=0, seconds=0.1, live_bytes=2**20))
            >>> live.widget.data[LIVE].y, live.flush(), live.widget.data[LIVE].y
            ((), None, (1.0,))
        """
        try:
            self._take(event)
        except Exception as error:  # noqa: BLE001 - a drawing problem must never stop a trial
            if not self._warned:
                warnings.warn(f"memlab's live figure could not draw: {error}", RuntimeWarning, stacklevel=2)
                self._warned = True

    def show_report(self, report: Report) -> None:
        """Draw a whole Report at once (its trials and its budget replace what the figure showed).

        Example:
            >>> from memlab.report import Trial
            >>> live = LiveFigure()
            >>> live.show_report(Report([Trial(Plan(), "ok", 2**20, {"params": 2**20}, 0.5, 8.0, None, "cpu")]))
            >>> live.widget.data[0].y
            (1.0,)
        """
        self.report = Report(list(report.trials), budget=report.budget)
        self._draw()
        self.keep_state()

    def flush(self) -> None:
        """Redraw now if events arrived since the last redraw (the panel calls it when a run ends).

        Example:
            >>> live = LiveFigure(min_interval_s=60)
            >>> live(MemorySample(plan=Plan(), index=0, seconds=0.1, live_bytes=2**20))
            >>> before = live.redraws
            >>> live.flush(); live.flush()
            >>> live.redraws - before
            1
        """
        if self._pending:
            self._draw()
        self.keep_state()

    def keep_state(self) -> None:
        """Store the figure as it is now in the widget's model, so that a view made later (the page reloaded while
        the kernel runs) draws it: plotly's FigureWidget sends its updates as messages that only the views open
        at the time apply, and keeps its first state for new views, empty axes here.

        The two traits are plotly's own (``BaseFigureWidget._repr_mimebundle_`` sets them the same way before a
        figure is shown); plotly has no public call that does this.

        Example:
            >>> from memlab.report import Trial
            >>> live = LiveFigure()
            >>> live.show_report(Report([Trial(Plan(), "ok", 2**20, {"params": 2**20}, 0.5, 8.0, None, "cpu")]))
            >>> list(live.widget._widget_data[0]["y"])  # what a view made now draws
            [1.0]
        """
        self.widget._widget_layout = copy.deepcopy(self.widget._layout_obj._props)
        self.widget._widget_data = copy.deepcopy(self.widget._data)

    def _take(self, event: Event) -> None:
        if isinstance(event, TrialStarted):
            self._running = event.plan
            self._running_text = f"{event.plan.label()} (setting {event.index + 1} of {event.total})"
            self._live_seconds, self._live_mib = [], []
            self._offset_s = 0.0
            self._draw()
        elif isinstance(event, MemorySample):
            self._add_point(self._offset_s + event.seconds, event.live_bytes)
            self._maybe_draw()
        elif isinstance(event, StepFinished):
            if event.live_bytes is not None:
                self._add_point(self._offset_s + event.seconds, event.live_bytes)
            self._offset_s += event.seconds
            self._running_text = f"{event.plan.label()}: {event.kind} step {event.step + 1} done"
            self._maybe_draw()
        elif isinstance(event, (TrialFinished, TrialSettled)):
            # A plan timed again in this run (a close race settled A B A B) keeps its column: index says which.
            column = self._columns_of_run.get(event.index)
            if column is not None and self.report.trials[column].plan == event.trial.plan:
                self.report.trials[column] = event.trial
            else:
                self._columns_of_run[event.index] = len(self.report.trials)
                self.report.trials.append(event.trial)
            self._running = None
            self._running_text = f"{event.trial.label}: {_status_word(event.trial.status)}"
            self._draw()

    def _add_point(self, seconds: float, live_bytes: int) -> None:
        self._live_seconds.append(seconds)
        self._live_mib.append(live_bytes / _MIB)
        self._pending = True

    def _maybe_draw(self) -> None:
        self._pending = True
        if self._clock() - self._last_draw >= self.min_interval_s:
            self._draw()

    def _draw(self) -> None:
        data = figure_data(self.report, self.categories)
        axis = plan_axis(data["labels"])
        height = figure_height(axis, _HEIGHT)
        top, bottom, low_titles = row_domains(axis, height)
        columns = self._columns(data, (bottom[1] - bottom[0]) * (height - 2 * MARGIN_PX))
        traces = range(len(self.widget.data))
        # One explicit value per trace for every key, in one ``plotly_update``: plotly's ``batch_update`` leaves the
        # values of traces it did not touch undefined, and a FigureWidget shown inside an ipywidgets box (the panel)
        # then loses their marker colours in the browser.
        restyle = {key: [{**self._defaults[index], **columns[index]}[key] for index in traces] for key in _TRACE_KEYS}
        self.widget.plotly_update(restyle_data=restyle, trace_indexes=list(traces))
        # The hatch of the plans that do not fit, on the bars only (a scatter has no pattern).
        bars = [index for index in traces if self.widget.data[index].type == "bar"]
        patterns = [columns[index].get("marker.pattern.shape", self._defaults[index]["pattern"]) for index in bars]
        self.widget.plotly_update(restyle_data={"marker.pattern.shape": patterns}, trace_indexes=bars)
        layout = {
            "shapes": _budget_shapes(data["budget_mib"]),
            "annotations": self._annotations(data, low_titles),
            "xaxis": plan_axis_layout(axis, data["labels"]),
            "height": height,
            "domains": (top, bottom),
            "rates": speed_range(data),  # the throughput axis: room above the highest error bar for its word
            "speeds": [0, SCATTER_HEADROOM * max((speed or 0.0 for speed in data["samples_per_s"]), default=0.0) or 1],
        }
        if layout != self._layout:  # layout objects are set through the figure, so Python's view stays current
            with self.widget.batch_update():
                self.widget.layout.shapes = layout["shapes"]
                self.widget.layout.annotations = layout["annotations"]
                self.widget.layout.xaxis.update(layout["xaxis"])
                self.widget.layout.xaxis2.update(layout["xaxis"])
                self.widget.layout.height = layout["height"]
                # The rows apart by what the plan axis's ticks and title need, so they never reach the row below.
                self.widget.layout.update({f"yaxis{n}": {"domain": top} for n in ("", "2")})
                self.widget.layout.update({f"yaxis{n}": {"domain": bottom} for n in ("3", "4")})
                self.widget.layout.yaxis.range = layout["rates"]
                self.widget.layout.yaxis4.range = layout["speeds"]  # room above the top point for its name
            self._layout = layout
        self.redraws += 1
        self._pending = False
        self._last_draw = self._clock()

    def _columns(self, data: dict[str, Any], scatter_px: float) -> dict[int, dict[str, Any]]:
        """What each trace shows, by trace index: ``{index: {"x": [...], "y": [...], ...}}``."""
        labels = data["labels"]
        columns: dict[int, dict[str, Any]] = dict(enumerate(figure_columns(self.report, data)))
        seconds, mib = _thin(self._live_seconds, self._live_mib, _MAX_LIVE_POINTS)
        columns[self._live] = {"x": seconds, "y": mib}
        does_not_fit = columns[self._does_not_fit]["y"]
        peaks = [dnf if dnf is not None else peak for dnf, peak in zip(does_not_fit, data["peak_mib"], strict=True)]
        speeds = [speed or 0.0 for speed in data["samples_per_s"]]
        # Where the bars are numbered, the points are too; the fastest that fit are named first, and a point whose
        # name would touch another's above it goes below it, else is left unnamed (its hover names it).
        drawn = [i for i, peak in enumerate(peaks) if peak is not None]
        drawn.sort(key=lambda i: (not data["fits"][i], -speeds[i]))
        text = plan_axis(labels).text
        shown = spaced_labels([text[i] for i in drawn], [peaks[i] for i in drawn], [speeds[i] for i in drawn],
                              height_px=scatter_px)
        names = {i: name for i, (name, _) in zip(drawn, shown, strict=True)}
        where = {i: position for i, (_, position) in zip(drawn, shown, strict=True)}
        for index, fits in ((self._scatter_fits, True), (self._scatter_misses, False)):
            points = [i for i in range(len(labels)) if i in names and data["fits"][i] == fits]
            columns[index] = {
                "x": [peaks[i] for i in points],
                "y": [speeds[i] for i in points],
                "text": [names[i] for i in points],
                "textposition": [where[i] for i in points],
                "hovertext": [data["hover"][i] for i in points],
            }
        # "fits" in the legend only where there is a budget to fit (the hover of a plan that does not fit says so)
        columns[self._scatter_fits]["showlegend"] = data["budget_mib"] is not None
        return columns

    def _annotations(self, data: dict[str, Any], low_titles: float) -> list[dict[str, Any]]:
        titles = list(_TITLES)
        if self._running_text:
            titles[_RUNNING_TITLE] = f"{'Running' if self._running is not None else 'Last'}: {self._running_text}"
        notes = [dict(note) for note in self._title_notes]
        for index, (note, title) in enumerate(zip(notes, titles, strict=True)):
            note["text"] = title
            if index >= len(FIGURE_TITLES):  # the bottom row's titles, above its plots
                note["y"] = low_titles
        if self.report.budget is not None:  # its label where it covers no bar, as in Report.plot()'s figure
            tops = memory_tops(figure_columns(self.report, data), data)
            notes.append(budget_note(self.report.budget, tops, self.widget.layout.bargap or 0))
        if data["caption"] is not None:  # why the best is best, above the plots (the bars say which)
            notes.append({"text": data["caption"], "name": "best caption", "xref": "paper", "yref": "paper", "x": 0,
                          "y": 1, "yshift": 24, "xanchor": "left", "yanchor": "bottom", "showarrow": False,
                          "font": {"color": BEST_COLOR, "size": 12}})
        return notes

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)


class LiveOutput:
    """The live figure as a cell's output: shown at the first progress event, and replaced by a static record when
    the run ends (:meth:`finish`), so that the notebook keeps a figure that renders without a kernel.

    A FigureWidget in a saved notebook is a widget view that nothing draws after a reload, nbconvert or GitHub
    (they show its empty repr), and its state weighs megabytes. So the figure is displayed with a display id,
    and :meth:`finish` updates that output in place to :func:`memlab.report.views.static.record_bundle` (an SVG and a
    line of text) and closes the widget, leaving no widget view or comm behind. Nothing is created
    or displayed before the first event: a run refused before it starts shows nothing.

    Pass it as the ``callback`` of ``memlab.compare`` / ``fit``; call :meth:`finish` when the run returns or raises
    (a Ctrl-C included), with the Report to keep.

    Args:
        budget: the memory budget (bytes, or a string such as ``"8GiB"``) the live figure draws.
        min_interval_s: the least time between two redraws of the live figure.
        categories: the memory categories the live figure stacks (see :class:`LiveFigure`).

    Example:
        >>> output = LiveOutput(budget="1GiB")
        >>> output.figure is None, output.shown, output.report.budget  # nothing shown before the first event
        (True, False, 1073741824)
        >>> output.finish(Report([]))  # nothing was shown, so there is nothing to replace
        >>> output.shown
        False
    """

    def __init__(
        self, budget: int | str | None = None, *, min_interval_s: float = 0.25, categories: tuple[str, ...] = CATEGORIES
    ) -> None:
        self.budget = parse_budget(budget)
        self.min_interval_s = min_interval_s
        self.categories = tuple(categories)
        self.figure: LiveFigure | None = None
        self.handle: Any = None  # the IPython DisplayHandle of the shown output
        self._warned = False

    @property
    def shown(self) -> bool:
        """Whether an output has been displayed (the live figure, or the record that replaced it)."""
        return self.handle is not None

    @property
    def report(self) -> Report:
        """The trials the live figure has drawn so far (an empty Report before the first event)."""
        return self.figure.report if self.figure is not None else Report([], budget=self.budget)

    def __call__(self, event: Event) -> None:
        """Show the live figure (at the first event) and hand it the event."""
        if self.figure is None:
            from IPython.display import display

            self.figure = LiveFigure(self.budget, min_interval_s=self.min_interval_s, categories=self.categories)
            self.handle = display(self.figure.widget, display_id=True)
        self.figure(event)

    def finish(self, report: Report, *, show: bool = False) -> None:
        """Replace the shown live figure by ``report``'s static record and close the widget; with ``show``, display
        the record even where no live figure was shown (a dry run sends no events). Never raises: a run's result
        matters more than its figure.
        """
        try:
            self._finish(report, show)
        except Exception as error:  # noqa: BLE001 - the run has ended; its Report is returned whatever happens here
            if not self._warned:
                warnings.warn(f"memlab could not keep the figure: {error}", RuntimeWarning, stacklevel=2)
                self._warned = True

    def _finish(self, report: Report, show: bool) -> None:
        if self.handle is None and not show:
            return
        from IPython.display import display

        # The SVG alone: JupyterLab's plotly renderer would store a PNG of a plotly JSON in the notebook too (60 to
        # 100 kB a figure), and the SVG names every plan without a hover.
        record = record_bundle(report, interactive=False)
        if self.handle is not None:
            self.handle.update(record, raw=True)  # the same output, now a static record
        else:
            self.handle = display(record, raw=True, display_id=True)
        if self.figure is not None:
            # Front ends that store widget state keep even a closed widget's last state (nbclient and papermill
            # do, by default), and plotly's FigureWidget carries plotly.js, 5 MB, as its anywidget module. The
            # figure lives on as the record above, so its state is emptied before it is closed.
            self.figure.widget._esm = ""
            self.figure.widget.close()  # no comm stays behind


def _build_widget(categories: tuple[str, ...] = CATEGORIES) -> go.FigureWidget:
    """Report.plot's figure (empty) with a second row: the running trial's memory, and memory vs throughput."""
    fig = comparison_figure(more_titles=_LIVE_TITLES, categories=categories)
    fig.add_trace(
        empty_trace(
            "Scatter",
            "live memory",
            mode="lines",
            line={"color": _LIVE_COLOR},
            showlegend=False,
            hovertemplate="%{x:.3f} s<br>%{y:.2f} MiB<extra></extra>",
        ),
        row=2,
        col=1,
    )
    for name, color, symbol, legend in (
        ("fits", BEST_COLOR, "circle", True),
        ("does not fit", DOES_NOT_FIT_COLOR, "x", False),
    ):
        fig.add_trace(
            empty_trace(
                "Scatter",
                name,
                mode="markers+text",
                textposition="top center",
                marker={"color": color, "symbol": symbol, "size": 11},
                legendgroup="status",
                showlegend=legend,
                hovertemplate="%{hovertext}<br>%{x:.2f} MiB, %{y:.3r} samples/s<extra></extra>",
            ),
            row=2,
            col=2,
        )
    fig.update_layout(height=_HEIGHT, margin={"t": MARGIN_PX, "b": MARGIN_PX, "l": 60, "r": 20})
    fig.update_xaxes(title_text="seconds into the trial", row=2, col=1)
    fig.update_yaxes(title_text="live memory (MiB)", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text="peak memory (MiB)", rangemode="tozero", row=2, col=2)
    fig.update_yaxes(title_text="samples/s", rangemode="tozero", row=2, col=2)
    return responsive_widget(fig)


def responsive_widget(figure: go.Figure) -> go.FigureWidget:
    """``figure`` as a FigureWidget that follows its cell's width: plotly.js lays it out again when the window is
    resized (its ``responsive`` setting, which FigureWidget leaves off: a narrower window cut the panel's figure at
    the width it was first drawn at; issue 71).

    Example:
        >>> responsive_widget(go.Figure())._config["responsive"]
        True
    """
    widget = go.FigureWidget(figure)
    widget._config = {**widget._config, "responsive": True}
    return widget


def _trace_defaults(trace: Any) -> dict[str, Any]:
    """The values a trace keeps where a redraw does not set them: no text, customdata or hover text, its own marker
    colour, no error bars."""
    marker = getattr(trace, "marker", None)
    return {
        "text": [],
        "customdata": [],
        "hovertext": [],
        "marker.color": None if marker is None else marker.color,
        "textfont.color": None,
        "textposition": getattr(trace, "textposition", None),
        "pattern": getattr(getattr(marker, "pattern", None), "shape", None),
        "showlegend": trace.showlegend,
        "error_y.array": None,
        "error_y.arrayminus": None,
        "error_y.width": None,
    }


def _budget_shapes(budget_mib: float | None) -> list[dict[str, Any]]:
    """Dashed budget lines: across the peak-by-category panel (as in Report.plot) and the live-memory panel, and
    up the scatter."""
    if budget_mib is None:
        return []
    across = budget_line(budget_mib)
    live = {**across, "xref": "x3 domain", "yref": "y3", "name": "budget (live)"}
    scatter = {
        **across,
        "xref": "x4",
        "x0": budget_mib,
        "x1": budget_mib,
        "yref": "y4 domain",
        "y0": 0,
        "y1": 1,
        "name": "budget (scatter)",
    }
    return [across, live, scatter]


def _thin(xs: list[float], ys: list[float], limit: int) -> tuple[list[float], list[float]]:
    """At most about ``limit`` points, evenly spaced, always keeping the highest one (the peak)."""
    if len(xs) <= limit:
        return list(xs), list(ys)
    stride = math.ceil(len(xs) / limit)
    keep = set(range(0, len(xs), stride))
    keep.add(max(range(len(ys)), key=ys.__getitem__))
    keep.add(len(xs) - 1)
    order = sorted(keep)
    return [xs[i] for i in order], [ys[i] for i in order]


def _status_word(status: str) -> str:
    return {"ok": "done", "oom": "does not fit (out of memory)", "error": "failed"}.get(status, status)
