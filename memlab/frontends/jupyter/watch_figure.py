"""The live figure of ``memlab.watch``: while ``trainer.train()`` runs, samples/s and memory per optimizer step in the
cell that trains; when training ends, a static record in its place, so that a saved notebook shows it without a
kernel.

Two panels, laid out like :meth:`memlab.Report.plot`'s (throughput left, memory right, the same colours, the same
dashed budget line and its label, :func:`memlab.report.views.figure.budget_line`):

* **samples/s per step**: rows of the step over its wall time;
* **memory per step**: on CPU the step's peak stacked by category (params, grads, optimizer, activations, other:
  memlab's tracker knows what each tensor is); on CUDA the peak alone (the caching allocator's
  ``max_memory_allocated`` over the step has no categories), drawn as one "peak" area.

The figure redraws at most every ``trainer.args.logging_steps`` steps, and at the last step (``max_steps``), so its
cost is one small plotly update per logging step. It subscribes to the core through
:meth:`memlab.trainer.watch.Watch.on_step` and :meth:`~memlab.trainer.watch.Watch.on_end`; the core never imports
this module. Nothing is displayed before the first step. The record is
:func:`memlab.report.views.static.figure_bundle` of :func:`memlab.report.views.svg.steps.steps_svg` (an SVG and a text
line: one static form per figure, as the comparison figure's record, :class:`memlab.frontends.jupyter.live.LiveOutput`;
plotly's JSON would make JupyterLab save a PNG of it too, tripling a notebook's size). Below it, once training ends,
the timeline of the costliest step (``Watch.timeline``: memory over that step by category, its phases, its peak
named) as a second static record, :func:`memlab.report.views.static.timeline_bundle`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import plotly.graph_objects as go

from memlab.frontends.jupyter.live import responsive_widget
from memlab.report.views.figure import CATEGORY_COLORS, RATE_COLOR, budget_line, budget_note, empty_trace
from memlab.report.views.static import figure_bundle, timeline_bundle
from memlab.report.views.svg.steps import PEAK_COLOR, StepSeries, step_series, steps_svg, steps_text

__all__ = ["WatchFigure", "show_watch", "step_tick", "steps_figure"]

_MEMORY_NAMES = (*(name for name in CATEGORY_COLORS if name != "kv_cache"), "peak")
_TITLES = ("samples/s per step", "memory per step")
_HEIGHT = 360


def steps_figure(series: StepSeries) -> go.Figure:
    """The plotly figure of a watched training (see the module docstring); empty series give empty axes.

    Example:
        >>> from types import SimpleNamespace as R
        >>> from memlab.report.views.svg.steps import step_series
        >>> fig = steps_figure(step_series([R(step=1, peak_bytes=2**20, samples_per_s=4.0, categories={})], 2**21))
        >>> [trace.name for trace in fig.data if len(trace.x)], [shape.name for shape in fig.layout.shapes]
        (['samples/s', 'peak'], ['budget'])
    """
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=_TITLES)
    fig.add_trace(
        empty_trace("Scatter", "samples/s", mode="lines+markers", line={"color": RATE_COLOR}, marker={"size": 4},
                    hovertemplate="step %{x}<br>%{y:.3r} samples/s<extra></extra>"),
        row=1, col=1,
    )
    for name in _MEMORY_NAMES:
        colour = CATEGORY_COLORS.get(name, PEAK_COLOR)
        fig.add_trace(
            empty_trace("Scatter", name, mode="lines", stackgroup="memory", line={"color": colour, "width": 0.5},
                        fillcolor=colour, hovertemplate="step %{x}<br>%{y:.2f} MiB<extra>" + name + "</extra>"),
            row=1, col=2,
        )
    fig.update_layout(height=_HEIGHT, margin={"t": 50, "b": 40, "l": 60, "r": 20}, autosize=True,
                      title={"text": steps_text(series), "font": {"size": 13}, "x": 0.01})
    # Steps start at 1: an axis from 0 would put its "0" on the memory axis's "0" at the corner.
    fig.update_xaxes(title_text="optimizer step", rangemode="normal", tickformat="d")
    fig.update_yaxes(title_text="samples/s", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="memory (MiB)", rangemode="tozero", row=1, col=2)
    _fill(fig, series)
    return fig


def _fill(fig: Any, series: StepSeries) -> None:
    """Put ``series`` into the figure's traces, title and budget line (in place: a FigureWidget sends it)."""
    steps = series["steps"]
    fig.data[0].update(x=steps, y=series["samples_per_s"])
    for trace in fig.data[1:]:
        values = series["memory"].get(trace.name)
        trace.update(x=steps if values is not None else [], y=values if values is not None else [])
    fig.layout.title.text = steps_text(series)
    # Whole steps only: with plotly's own spacing, a few steps got ticks at halves, rounded by "d" to "1 2 2 3 3".
    fig.update_xaxes(dtick=step_tick(max(steps, default=1) - min(steps, default=1)))
    budget = series["budget_mib"]
    if budget is not None and not fig.layout.shapes:
        fig.add_shape(budget_line(budget))
        fig.add_annotation(budget_note(int(budget * 1024**2)))


def step_tick(span: float, most: int = 8) -> int:
    """The distance between two ticks of the step axis over ``span`` steps: 1, 2 or 5 times a power of ten, the
    least that writes at most about ``most`` ticks, each a whole step.

    Example:
        >>> step_tick(2), step_tick(30), step_tick(1000)
        (1, 5, 200)
    """
    power = 1
    while True:
        for factor in (1, 2, 5):
            if span / (factor * power) <= most:
                return factor * power
        power *= 10


class WatchFigure:
    """The figure of one :class:`memlab.trainer.watch.Watch`: shown in the training cell at the first step, redrawn
    every ``every`` steps (default ``trainer.args.logging_steps``) and at the last, replaced by its static record when
    ``trainer.train()`` ends.

    Args:
        watched: the Watch to draw (it calls :meth:`step` and :meth:`finish`).
        every: the steps between two redraws (None: the trainer's ``logging_steps``; a ratio below 1 of it counts
            in ``max_steps``).
        display: how to show a bundle or a widget (IPython's ``display`` by default; tests pass their own).

    Example:
        >>> from types import SimpleNamespace as R
        >>> trainer = R(args=R(logging_steps=2), state=R(max_steps=3))
        >>> watched = R(trainer=trainer, budget=None, steps=[], on_step=lambda f: None, on_end=lambda f: None)
        >>> shown = []
        >>> figure = WatchFigure(watched, display=lambda obj, **kw: shown.append(obj))
        >>> for step in (1, 2, 3):
        ...     watched.steps.append(R(step=step, peak_bytes=2**20, samples_per_s=4.0, categories={}))
        ...     figure.step(watched.steps[-1])
        >>> figure.redraws, len(figure.widget.data[0].x)  # steps 2 and 3 redrew (every 2, and the last)
        (2, 3)
        >>> figure.finish(); sorted(figure.record)  # one static form: the SVG (and a line of text)
        ['image/svg+xml', 'text/plain']
        >>> figure.timeline_record is None  # this stand-in watch kept no timeline
        True
    """

    def __init__(self, watched: Any, *, every: int | None = None, display: Callable[..., Any] | None = None) -> None:
        self.watch = watched
        self.every = every
        self.redraws = 0
        self.widget: go.FigureWidget | None = None
        self.handle: Any = None
        self.record: dict[str, Any] | None = None
        self.timeline_record: dict[str, Any] | None = None  # the costliest step's timeline, shown below at the end
        self._timeline_handle: Any = None
        self._display = display
        self._warned = False
        watched.on_step(self.step)
        watched.on_end(self.finish)

    def step(self, record: Any) -> None:
        """After a step: redraw when it is a logging step or the last one. Never raises."""
        every = self._every()
        max_steps = int(getattr(getattr(self.watch.trainer, "state", None), "max_steps", 0) or 0)
        if record.step % every == 0 or (max_steps and record.step >= max_steps):
            self._safely(self.draw)

    def draw(self) -> None:
        """Redraw now (shows the widget first where nothing is shown yet)."""
        series = step_series(self.watch.steps, self.watch.budget)
        if self.widget is None:
            self.widget = responsive_widget(steps_figure(series))
            self.handle = self._show(self.widget)
        else:
            with self.widget.batch_update():
                _fill(self.widget, series)
        self.redraws += 1

    def finish(self) -> None:
        """Training ended: the widget becomes its static record (an SVG and a line of text), the widget is closed."""
        self._safely(self._finish)

    def _finish(self) -> None:
        if not self.watch.steps:
            return
        series = step_series(self.watch.steps, self.watch.budget)
        self.record = figure_bundle(steps_text(series), steps_svg(series))
        if self.handle is not None and hasattr(self.handle, "update"):
            self.handle.update(self.record, raw=True)
        else:
            self.handle = self._show(self.record, raw=True)
        if self.widget is not None:
            self.widget._esm = ""  # see LiveOutput._finish: no 5 MB of plotly.js left in a saved notebook
            self.widget.close()
            self.widget = None
        timeline = getattr(self.watch, "timeline", None)
        if timeline is not None:
            self.timeline_record = timeline_bundle([timeline])
            if self._timeline_handle is not None and hasattr(self._timeline_handle, "update"):
                self._timeline_handle.update(self.timeline_record, raw=True)  # a second train() of the same watch
            else:
                self._timeline_handle = self._show(self.timeline_record, raw=True)

    def _every(self) -> int:
        if self.every is not None:
            return max(1, int(self.every))
        trainer = self.watch.trainer
        logging = float(getattr(getattr(trainer, "args", None), "logging_steps", 1) or 1)
        if logging < 1:  # transformers reads a ratio below 1 as a share of max_steps
            logging *= float(getattr(getattr(trainer, "state", None), "max_steps", 0) or 1)
        return max(1, int(logging))

    def _show(self, obj: Any, **keywords: Any) -> Any:
        if self._display is not None:
            return self._display(obj, display_id=True, **keywords)
        from IPython.display import display

        return display(obj, display_id=True, **keywords)

    def _safely(self, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception as error:  # noqa: BLE001 - a drawing problem must never stop the training
            if not self._warned:
                warnings.warn(f"memlab's watch figure could not draw: {error}", RuntimeWarning, stacklevel=3)
                self._warned = True


def show_watch(watched: Any, *, every: int | None = None) -> WatchFigure:
    """Draw ``watched`` (a :class:`memlab.trainer.watch.Watch`) live in the notebook; what ``memlab.watch(...,
    show=True)`` calls.

    Example:
        >>> from types import SimpleNamespace as R
        >>> watched = R(trainer=R(args=R(logging_steps=1)), budget=None, steps=[], on_step=lambda f: None,
        ...             on_end=lambda f: None)
        >>> show_watch(watched).every is None
        True
    """
    return WatchFigure(watched, every=every)
