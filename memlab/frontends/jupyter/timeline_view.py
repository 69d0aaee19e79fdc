"""The timeline of the plan the user picks: a "timeline of" list of the plans run, a click on a plan's bar in the
figure, and the picked trial's step drawn as SVG (:func:`memlab.report.views.static.timeline_bundle`).

Two forms, one picker:

- under a panel's figure (the default): the drawing is an SVG in an HTML widget beside the list; it needs no plotly to
  show, and the panel's saved widget state keeps it as it keeps the table;
- in ``%%memfit``'s output (``keep=True``): the list is a widget, and the drawing a plain output of its own that each
  pick updates in place (a display id), a static record as the run's figure is: a saved notebook, nbconvert and
  GitHub show the timeline last picked without a kernel. The magic's figure is that static record once its run ends,
  so there the list picks. The list lasts until :meth:`TimelineView.close` (the magic closes it when the next cell
  runs): its output then becomes a line of text naming the plan drawn, so that a notebook saved afterwards holds no
  widget that a reload without its kernel would show as an error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as widgets

from memlab.report.data import Trial
from memlab.report.views.static import timeline_bundle

__all__ = ["TimelineView"]

_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


class TimelineView:
    """The picked plan's timeline: ``widget`` to show, :meth:`update` after each run, :meth:`follow_clicks` on the
    figure whose bars pick a plan; with ``keep``, :meth:`display` shows the list and the kept record instead.

    Args:
        keep: draw into a static record of its own (``record``, shown by :meth:`display`) rather than the widget.
        display: how to show a bundle (IPython's ``display`` by default; tests pass their own).

    Example:
        >>> import memlab, torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
        >>> report = memlab.compare(model, torch.randn(4, 4), [memlab.Plan(), memlab.Plan(accumulation=2)],
        ...                         loss_fn=lambda m, b: m(b).mean(), steps=1, noise=0, progress=False)
        >>> view = TimelineView()
        >>> view.update(report.trials); view.picker.value, "accum2: peak" in view.drawing.value
        (1, True)
        >>> view.show(0); "plain: peak" in view.drawing.value
        True
        >>> kept = TimelineView(keep=True, display=lambda obj, **kw: None)
        >>> kept.update(report.trials, pick=0); kept.record["text/plain"].startswith("memlab timeline: plain")
        True
    """

    def __init__(self, *, keep: bool = False, display: Callable[..., Any] | None = None) -> None:
        self.trials: list[Trial] = []
        self.keep = keep
        self.record: dict[str, Any] | None = None  # what the kept output shows (keep=True)
        self.handle: Any = None
        self.list_handle: Any = None  # the list's output (keep=True), a line of text once closed
        self._display = display
        self.picker = widgets.Dropdown(
            description="timeline of", options=[], value=None,
            tooltip="The plan whose step is drawn below: memory over the step by category, its phases, its peak "
                    "named" + ("" if keep else " (or click the plan's bar in the figure)"),
            layout=widgets.Layout(width="auto"), style={"description_width": "initial"},
        )
        # 100% wide and no margin (a widget's 2 px would take the drawing past the cell's right edge)
        self.drawing = widgets.HTML(layout=widgets.Layout(width="100%", margin="0"))
        self.widget = widgets.VBox([self.picker] if keep else [self.picker, self.drawing],
                                   layout=widgets.Layout(width="100%", margin="0"))
        self.widget.add_class("memlab-timeline")
        self.picker.observe(self._picked, names="value")

    def update(self, trials: Sequence[Trial], pick: int | None = None) -> None:
        """The trials run so far (the figure's order); trial ``pick`` is shown, else the last one with a timeline."""
        self.trials = list(trials)
        # "timeline of bf16 (plan 3)": the plan's name first, its number (the figure's order) after it
        options = [(f"{trial.label} (plan {index + 1})", index) for index, trial in enumerate(self.trials)
                   if trial.timeline is not None]
        self.picker.options = options
        self.widget.layout.display = None if options else "none"
        if options:
            shown = [index for _, index in options]
            self.show(pick if pick in shown else shown[-1])
        else:
            self.drawing.value = ""

    def show(self, index: int) -> None:
        """Draw the timeline of trial ``index`` (nothing where it has none)."""
        if not 0 <= index < len(self.trials) or self.trials[index].timeline is None:
            return
        trial = self.trials[index]
        timeline = trial.timeline
        assert timeline is not None
        timeline.label = trial.label
        bundle = timeline_bundle([timeline])
        if self.keep:
            self.record = bundle
            if self.handle is not None:
                self.handle.update(bundle, raw=True)  # the kept output, in place: the notebook saves this pick
        else:
            self.drawing.value = bundle["image/svg+xml"]
        if self.picker.value != index:
            self.picker.value = index

    def display(self) -> None:
        """Show the list and, below it, the kept record of the picked timeline (``keep=True``; nothing where no trial
        has a timeline). The list's own text, for a front end without its widget state, names the plan drawn."""
        if self.record is None:
            return
        shown = dict(self.widget._repr_mimebundle_() or {})
        shown["text/plain"] = f"timeline of {self._picked_label()} (a kernel picks another plan in this list)"
        self.list_handle = self._show({key: shown[key] for key in (_WIDGET_VIEW, "text/plain") if key in shown})
        self.handle = self._show(self.record)

    def close(self) -> None:
        """End the picking (``keep=True``): the list's output becomes a line naming the plan drawn, the widget is
        closed, and the drawing stays as last picked.

        Example:
            >>> view = TimelineView(keep=True, display=lambda obj, **kw: None)
            >>> view.close(); view.picker.comm is None
            True
        """
        if self.list_handle is not None:
            self.list_handle.update({"text/plain": f"timeline of {self._picked_label()}"}, raw=True)
            self.list_handle = None
        self.widget.close()
        self.picker.close()
        self.drawing.close()

    def _picked_label(self) -> str:
        return next((text for text, index in self.picker.options if index == self.picker.value), "")

    def follow_clicks(self, figure: Any) -> None:
        """Pick a plan by clicking one of its bars in ``figure`` (a plotly FigureWidget drawing the same trials)."""
        for trace in figure.data:
            if trace.type == "bar":
                trace.on_click(self._clicked)

    def _show(self, bundle: dict[str, Any]) -> Any:
        if self._display is not None:
            return self._display(bundle, raw=True, display_id=True)
        from IPython.display import display

        return display(bundle, raw=True, display_id=True)

    def _clicked(self, trace: Any, points: Any, state: Any) -> None:
        if points.point_inds:
            self.show(int(points.point_inds[0]))

    def _picked(self, change: dict[str, Any]) -> None:
        if change["new"] is not None:
            self.show(int(change["new"]))
