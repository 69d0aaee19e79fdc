"""The widget panel's inference mode: one control per inference lever, Run and Largest batch, the live figure and a
table of every run. ``memlab.panel(model, batch, inference=True)`` returns an :class:`InferencePanel`.

* a control per setting of :class:`memlab.InferencePlan` (batch-size, weights, quantize, new-tokens, kv-cache),
  labelled with its name and with its help (what it does, what it costs) as its tooltip, and a memory budget;
* **Run** measures the setting under ``torch.inference_mode()`` on the live model (``memlab.compare`` with the live
  figure as its callback; the model is left bit-exact); **Largest batch** searches the largest batch of the
  setting within the budget (:func:`memlab.fit_inference`); **Clear** forgets the results;
* a one-line status, the live figure (stacking params, activations, kv_cache and other) and the table of runs.

There is nothing to apply: inference changes nothing on the model. Mistakes are one line in the status.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as widgets
from torch import nn
from typing_extensions import Unpack

from memlab.errors import MemlabError
from memlab.events import Event
from memlab.frontends.jupyter.live import LiveFigure
from memlab.frontends.jupyter.panel import descendants
from memlab.inference.fit import fit_inference
from memlab.inference.plan import INFERENCE_LEVERS, InferencePlan
from memlab.inference.run import check_inference_options, compare_inference
from memlab.measure.device import model_device
from memlab.options import RunOptions, TrialKeywords
from memlab.plan import format_bytes, parse_budget
from memlab.report import INFERENCE_CATEGORIES, Report, Trial, one_line
from memlab.runner.batch import Batch, count_rows

__all__ = ["InferencePanel"]

_WIDE = {"description_width": "initial"}
_COLORS = {"info": "#333", "ok": "#2b7a2b", "warn": "#8a5a00", "error": "#b00020"}


class InferencePanel(widgets.VBox):
    """The memlab widget panel in inference mode (see the module docstring).

    Args:
        model, batch: the live model and a batch (for generation, a dict with ``input_ids``).
        min_interval_s: the least time between two redraws of the live figure during a run.
        options: :class:`~memlab.options.TrialKeywords` (``budget`` starts the budget field).

    Attributes:
        report: the Report of every run since the panel was built or cleared. controls: the input widgets by
        name (``batch_size``, ``weights``, ``quantize``, ``new_tokens``, ``kv_cache``, ``budget``). run_button,
        largest_button, clear_button: the buttons. status, table, figure: the message, the table, the LiveFigure.

    Example:
        >>> import torch
        >>> p = InferencePanel(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)),
        ...                    torch.randn(4, 8), steps=1, noise=0)
        >>> p.controls["weights"].value = "bf16"
        >>> p.run_button.click()
        >>> [trial.label for trial in p.report], p.status.value.count("fits")
        (['bf16'], 1)
    """

    def __init__(
        self, model: nn.Module, batch: Batch, *, min_interval_s: float = 0.25, **options: Unpack[TrialKeywords]
    ) -> None:
        if not isinstance(model, nn.Module):
            raise MemlabError(f"model must be a torch nn.Module, not {type(model).__name__}")
        self.rows = count_rows(batch)
        self.options = RunOptions.from_keywords({**options, "progress": False})
        check_inference_options(self.options)
        self.model = model
        self.batch = batch
        self.min_interval_s = min_interval_s
        self.report = Report([], budget=self.options.budget)
        self.figure = LiveFigure(self.options.budget, min_interval_s=min_interval_s, categories=INFERENCE_CATEGORIES)
        self.controls: dict[str, widgets.ValueWidget] = _controls(self.rows, self.options.budget)
        self.run_button = widgets.Button(
            description="Run", icon="play", button_style="primary",
            tooltip="Measure this setting on the live model under torch.inference_mode()",
        )
        self.largest_button = widgets.Button(
            description="Largest batch", icon="search",
            tooltip="Find the largest batch of this setting whose peak fits the budget",
        )
        self.clear_button = widgets.Button(description="Clear", icon="trash", tooltip="Forget the results so far")
        self.status = widgets.HTML(layout=widgets.Layout(width="100%"))
        self.table = widgets.HTML(self.report._repr_html_())
        self.run_button.on_click(lambda _: self.run())
        self.largest_button.on_click(lambda _: self.largest_batch())
        self.clear_button.on_click(lambda _: self.clear())
        self._say("Choose an inference setting and click Run to measure it on the model.", "info")
        super().__init__(children=self._layout())
        self.add_class("memlab-panel")

    def plan(self) -> InferencePlan:
        """The setting the controls show (a clear MemlabError for an impossible one).

        Example:
            >>> import torch
            >>> InferencePanel(torch.nn.Linear(4, 2), torch.randn(2, 4)).plan().label()
            'fp32'
        """
        values = {name: self.controls[name].value for name in INFERENCE_LEVERS}
        if values["batch_size"] == self.rows:
            values["batch_size"] = None
        return InferencePlan(**values)

    def budget(self) -> int | None:
        """The budget field in bytes (None when empty; a MemlabError that says what to write when unreadable).

        Example:
            >>> import torch
            >>> p = InferencePanel(torch.nn.Linear(4, 2), torch.randn(2, 4))
            >>> p.controls["budget"].value = "1KiB"
            >>> p.budget()
            1024
        """
        text = str(self.controls["budget"].value).strip()
        return parse_budget(text) if text else None

    def run(self) -> Trial | None:
        """Measure the setting (what Run does); the trial is added to :attr:`report`, the table and the figure."""
        return self._do(lambda plan, options: compare_inference(self.model, self.batch, [plan], **options))

    def largest_batch(self) -> Trial | None:
        """Search the largest batch of the setting within the budget (what Largest batch does); the largest trial
        that fits, or None (the status line says why).

        Example:
            >>> import torch
            >>> p = InferencePanel(torch.nn.Linear(4, 2), torch.randn(2, 4), steps=1, noise=0)
            >>> p.largest_batch() is None, "needs a budget" in p.status.value
            (True, True)
        """
        try:
            budget = self.budget()
        except MemlabError as error:
            self._say(f"Cannot run: {one_line(error, limit=None)}", "error")
            return None
        if budget is None and model_device(self.model).type != "cuda":
            self._say("Largest batch needs a budget: write one, such as 8GiB, in the budget field", "error")
            return None
        return self._do(lambda plan, options: fit_inference(self.model, self.batch, plan.replace(batch_size=None),
                                                            **options))

    def clear(self) -> None:
        """Forget the results so far (the model is not touched); the old figure's widget is closed.

        Example:
            >>> import torch
            >>> p = InferencePanel(torch.nn.Linear(4, 2), torch.randn(2, 4))
            >>> old = p.figure.widget
            >>> p.clear(); old.comm is None, p.figure.widget in p.children
            (True, True)
        """
        old = self.figure
        self.report = Report([], budget=self.report.budget)
        self.figure = LiveFigure(self.report.budget, min_interval_s=self.min_interval_s,
                                 categories=INFERENCE_CATEGORIES)
        self.table.value = self.report._repr_html_()
        # Only the figure changes: containers rebuilt here would stay open, holding the buttons and so the model.
        children: tuple[widgets.Widget, ...] = tuple(self.children)  # type: ignore[has-type]
        self.children = tuple(self.figure.widget if child is old.widget else child for child in children)
        old.widget.close()
        self._say("Cleared; the model is untouched", "info")

    def close(self) -> None:
        """Close the panel and every widget in it, so that the kernel can let the model and its runs go (ipywidgets
        keeps every widget until it is closed, and the buttons hold the panel, which holds the model).

        Example:
            >>> import torch
            >>> p = InferencePanel(torch.nn.Linear(4, 2), torch.randn(2, 4))
            >>> p.close(); p.run_button.comm is None, p.figure.widget.comm is None
            (True, True)
        """
        for widget in descendants(self):
            widget.close()
        super().close()

    def _do(self, action: Any) -> Trial | None:
        try:
            plan = self.plan()
            budget = self.budget()
        except MemlabError as error:
            self._say(f"Cannot run: {one_line(error, limit=None)}", "error")
            return None
        self._set_busy(True)
        self._say(f"Running {plan.label()}...", "info")
        self.figure.budget = budget
        self.figure.start_run()
        try:
            options = self.options.keywords(budget=budget, callback=self._on_event)
            result: Report = action(plan, options)
            self.report = Report([*self.report.trials, *result.trials], budget=budget)
            best = result.best if len(result) > 1 else result.trials[-1]
            self._say(*_message(best, result))
            return best
        except KeyboardInterrupt as interrupt:
            finished = getattr(interrupt, "report", None)  # what compare / fit_inference measured before Ctrl-C
            kept = list(finished.trials) if isinstance(finished, Report) else []
            self.report = Report([*self.report.trials, *kept], budget=budget)
            self._say(f"Interrupted; the model is as it was ({len(kept)} setting(s) measured are in the table)", "warn")
            return None
        except Exception as error:  # noqa: BLE001 - shown as one line, never a traceback in the panel
            self._say(f"Error: {one_line(error, limit=None)}", "error")
            return None
        finally:
            self.figure.flush()
            self.table.value = self.report._repr_html_()
            self._set_busy(False)

    def _on_event(self, event: Event) -> None:
        self.figure(event)
        if self.options.callback is not None:
            self.options.callback(event)

    def _set_busy(self, busy: bool) -> None:
        for widget in [*self.controls.values(), self.run_button, self.largest_button, self.clear_button]:
            widget.disabled = busy

    def _say(self, text: str, kind: str) -> None:
        self.status.value = f"<span style='color:{_COLORS[kind]}'>{html.escape(text)}</span>"

    def _layout(self) -> tuple[widgets.Widget, ...]:
        levers = widgets.HBox([self.controls[name] for name in INFERENCE_LEVERS],
                              layout=widgets.Layout(flex_flow="row wrap"))
        buttons = widgets.HBox([self.controls["budget"], self.run_button, self.largest_button, self.clear_button])
        return (levers, buttons, self.status, self.figure.widget, self.table)


def _message(trial: Trial | None, report: Report) -> tuple[str, str]:
    if trial is None:
        return "nothing fits the budget", "warn"
    if trial.status == "oom":
        return f"{trial.label}: does not fit (out of memory)", "warn"
    if trial.status == "error":
        return f"{trial.label}: error: {one_line(trial.error or 'unknown error', limit=None)}", "error"
    if not report.fits(trial):
        return f"{trial.label}: does not fit: peak {format_bytes(trial.peak_bytes)} is over the budget", "warn"
    speed = "" if trial.tokens_per_s is None else f", {trial.tokens_per_s:.3g} tokens/s"
    return f"{trial.label}: fits, peak {format_bytes(trial.peak_bytes)}{speed}", "ok"


def _controls(rows: int, budget: int | None) -> dict[str, widgets.ValueWidget]:
    """A control per inference setting (named after it, its help as the tooltip), and the budget."""
    controls: dict[str, widgets.ValueWidget] = {}
    for name, spec in INFERENCE_LEVERS.items():
        description = name.replace("_", "-")
        if name == "kv_cache":
            controls[name] = widgets.Checkbox(value=spec["default"], description=description, tooltip=spec["help"],
                                              indent=False, layout=widgets.Layout(width="120px"))
        elif spec["choices"]:
            controls[name] = widgets.Dropdown(options=list(spec["choices"]), value=spec["default"],
                                              description=description, tooltip=spec["help"], style=_WIDE,
                                              layout=widgets.Layout(width="190px"))
        else:
            low = 1 if name == "batch_size" else 0
            value = rows if name == "batch_size" else spec["default"]
            controls[name] = widgets.BoundedIntText(value=value, min=low, max=1_000_000, description=description,
                                                    tooltip=spec["help"], style=_WIDE,
                                                    layout=widgets.Layout(width="170px"))
    controls["budget"] = widgets.Text(
        value="" if budget is None else format_bytes(budget), description="budget",
        placeholder="e.g. 8GiB; empty: none",
        tooltip="the memory a setting may use, with a unit (8GiB, 500MB): over it a setting does not fit; empty: none",
        style=_WIDE, layout=widgets.Layout(width="230px"),
    )
    return controls
