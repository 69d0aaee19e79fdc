"""The timeline of the plan the user picks, under a panel's figure: a "timeline of" list of the plans run, a click on
a plan's bar in the figure, and the picked trial's step drawn as SVG
(:func:`memlab.report.timeline_figure.timelines_svg`).

The drawing is an SVG in an HTML widget: it needs no plotly to show, and the panel's saved widget state keeps it as it
keeps the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ipywidgets as widgets

from memlab.report.data import Trial
from memlab.report.timeline_figure import timelines_svg

__all__ = ["TimelineView"]


class TimelineView:
    """The picked plan's timeline: ``widget`` to show, :meth:`update` after each run, :meth:`follow_clicks` on the
    figure whose bars pick a plan.

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
    """

    def __init__(self) -> None:
        self.trials: list[Trial] = []
        self.picker = widgets.Dropdown(
            description="timeline of", options=[], value=None,
            tooltip="The plan whose step is drawn below: memory over the step by category, its phases, its peak "
                    "named (or click the plan's bar in the figure)",
            layout=widgets.Layout(width="auto"), style={"description_width": "initial"},
        )
        self.drawing = widgets.HTML(layout=widgets.Layout(width="100%"))
        self.widget = widgets.VBox([self.picker, self.drawing], layout=widgets.Layout(width="100%"))
        self.widget.add_class("memlab-timeline")
        self.picker.observe(self._picked, names="value")

    def update(self, trials: Sequence[Trial]) -> None:
        """The trials run so far (the figure's order); the last one with a timeline is shown."""
        self.trials = list(trials)
        options = [(f"{index + 1}. {trial.label}", index) for index, trial in enumerate(self.trials)
                   if trial.timeline is not None]
        self.picker.options = options
        self.widget.layout.display = None if options else "none"
        if options:
            self.show(options[-1][1])
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
        self.drawing.value = timelines_svg([timeline])
        if self.picker.value != index:
            self.picker.value = index

    def follow_clicks(self, figure: Any) -> None:
        """Pick a plan by clicking one of its bars in ``figure`` (a plotly FigureWidget drawing the same trials)."""
        for trace in figure.data:
            if trace.type == "bar":
                trace.on_click(self._clicked)

    def _clicked(self, trace: Any, points: Any, state: Any) -> None:
        if points.point_inds:
            self.show(int(points.point_inds[0]))

    def _picked(self, change: dict[str, Any]) -> None:
        if change["new"] is not None:
            self.show(int(change["new"]))
