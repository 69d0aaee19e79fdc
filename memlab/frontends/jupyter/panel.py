"""The widget panel: choose a setting with one control per technique, run it on the live model, compare, apply.

``memlab.panel(model, batch)`` returns a :class:`Panel`, an ``ipywidgets.VBox``:

* a control per lever of :data:`memlab.plan.LEVERS` (micro-batch, accumulation, checkpointing, precision, weights,
  optimizer, offload, adapter, lora-rank), each labelled with the lever's name and with its ``help`` (what it does,
  what it costs) as its tooltip, and a memory budget (such as ``8GiB``; empty for none);
* **Run** measures the setting on the live model (``memlab.compare`` with the live figure as its callback; the
  model is left bit-exact), **Apply** puts the setting on the model for real training (``memlab.apply``; the
  result is ``panel.applied``), **Undo** takes it off again, **Clear** forgets the results measured so far (the
  report, the table and the figure; the model is not touched);
* a one-line status, the live figure (:class:`memlab.frontends.jupyter.live.LiveFigure`) and a table of every run.

Apply of a setting that no "ok" run of this panel measured still applies it (Apply is undone with one click, and
the setting may have been measured elsewhere), but the status says plainly that it was not measured and may not
fit, and to Undo and Run it first.

Messages call the model by the user's own variable name: ``name=`` when given, else the name the model has in the
IPython user namespace (found by identity, never by ``eval``), else "the model".

A run happens in the kernel, synchronously: the controls are disabled until it is over. Mistakes (a budget that is
not a size, an impossible setting, an exception in the loss) are shown as one line in the status, never as a
traceback; a setting that runs out of memory (or over the budget) is a "does not fit" result, not an error.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

import ipywidgets as widgets
from torch import nn
from typing_extensions import Unpack

from memlab.errors import MemlabError
from memlab.events import Event
from memlab.frontends.jupyter.live import LiveFigure
from memlab.options import RunOptions, TrialKeywords
from memlab.plan import LEVERS, LeverSpec, Plan, format_bytes, parse_budget
from memlab.report import Report, Trial, one_line
from memlab.runner.apply import Applied, apply
from memlab.runner.batch import Batch, LossFn, count_rows, resolve_loss_fn
from memlab.runner.trial import compare

__all__ = ["Panel", "panel", "user_variable_name"]

_WIDE = {"description_width": "initial"}
_COLORS = {"info": "#333", "ok": "#2b7a2b", "warn": "#8a5a00", "error": "#b00020"}
_MAX_STATUS = 200


class Panel(widgets.VBox):
    """The memlab widget panel on a live model and batch (see the module docstring).

    Args:
        model: the model to measure (its parameters, buffers, flags and hooks are left as they were).
        batch: a batch as ``memlab.measure`` takes it (a dict of tensors, a tensor, or a tuple of tensors).
        loss_fn: ``loss_fn(model, micro_batch) -> loss``; the default is ``model(**batch).loss``.
        name: what messages call the model (such as ``"trainer.model"``); by default the model's variable name in
            the IPython user namespace, else "the model".
        min_interval_s: the least time between two redraws of the live figure during a run.
        options: :class:`~memlab.options.TrialKeywords` (``budget`` is what the budget field starts with; ``callback``
            is called with every progress event as well as the live figure).

    Attributes:
        report: the Report of every run since the panel was built or cleared (its budget is the last run's).
        applied: the ``memlab.Applied`` of the last Apply, or None.
        controls: the input widgets by name: one per lever of :data:`memlab.plan.LEVERS` (``micro_batch``,
            ``accumulation``, ``checkpointing``, ...), and ``budget``.
        run_button, apply_button, undo_button, clear_button: the buttons (``button.click()`` works without a
            browser).
        status: the one-line HTML message; table: the HTML table of runs; figure: the LiveFigure.

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        >>> p = Panel(model, torch.randn(4, 8), loss_fn=lambda m, b: m(b).mean(), steps=1)
        >>> p.controls["checkpointing"].value = True
        >>> p.run_button.click()
        >>> [trial.label for trial in p.report], p.run_button.disabled
        (['ckpt'], False)
    """

    def __init__(
        self,
        model: nn.Module,
        batch: Batch,
        loss_fn: LossFn | None = None,
        *,
        name: str | None = None,
        min_interval_s: float = 0.25,
        **options: Unpack[TrialKeywords],
    ) -> None:
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise MemlabError(f"name={name!r} is not allowed; write the model's name as text, such as name='net'")
        self.rows = count_rows(batch)
        self.options = RunOptions.from_keywords({**options, "loss_fn": loss_fn, "progress": False})
        resolve_loss_fn(batch, loss_fn)  # a batch that needs a loss_fn says so now, not at the first Run
        self.model = model
        self.batch = batch
        self.loss_fn = loss_fn
        self.name = name
        self.min_interval_s = min_interval_s
        budget = self.options.budget
        self.report = Report([], budget=budget)
        self.applied: Applied | None = None
        self.figure = LiveFigure(self.report.budget, min_interval_s=min_interval_s)
        self.controls: dict[str, widgets.ValueWidget] = _controls(self.rows, budget)
        self.run_button = widgets.Button(
            description="Run", icon="play", button_style="primary", tooltip="Measure this setting on the live model"
        )
        self.apply_button = widgets.Button(
            description="Apply", icon="check", tooltip="Put this setting on the live model (memlab.apply)"
        )
        self.undo_button = widgets.Button(
            description="Undo", icon="undo", disabled=True, tooltip="Take the applied setting off the model again"
        )
        self.clear_button = widgets.Button(
            description="Clear",
            icon="trash",
            tooltip="Forget the results measured so far (the table and the figure); the model is not touched",
        )
        self.status = widgets.HTML(layout=widgets.Layout(width="100%"))
        self.table = widgets.HTML(self.report._repr_html_())
        self.effective = widgets.HTML()
        self._running = False
        self.run_button.on_click(lambda _: self.run())
        self.apply_button.on_click(lambda _: self.apply())
        self.undo_button.on_click(lambda _: self.undo())
        self.clear_button.on_click(lambda _: self.clear())
        for lever in ("micro_batch", "accumulation"):
            self.controls[lever].observe(lambda _: self._show_effective(), names="value")
        self._show_effective()
        self._say(f"Choose a setting and click Run to measure it on {self.model_name()}.", "info")
        super().__init__(children=self._layout())
        self.add_class("memlab-panel")

    # --- actions --------------------------------------------------------------------------------------------

    def plan(self) -> Plan:
        """The Plan the controls describe (a micro-batch of all the batch's rows is ``micro_batch=None``).

        Example:
            >>> import torch
            >>> p = Panel(torch.nn.Linear(4, 1), torch.randn(8, 4), loss_fn=lambda m, b: m(b).mean())
            >>> p.controls["micro_batch"].value, p.controls["accumulation"].value = 2, 4
            >>> p.plan().label()
            'mb2x4'
        """
        values = {name: self.controls[name].value for name in LEVERS}
        if values["micro_batch"] == self.rows:
            values["micro_batch"] = None
        return Plan(**values)

    def budget(self) -> int | None:
        """The budget field in bytes (None when empty); a MemlabError when it is not a size.

        Example:
            >>> import torch
            >>> p = Panel(torch.nn.Linear(4, 1), torch.randn(8, 4), loss_fn=lambda m, b: m(b).mean())
            >>> p.controls["budget"].value = "2 MiB"
            >>> p.budget()
            2097152
        """
        text = str(self.controls["budget"].value).strip()
        return parse_budget(text) if text else None

    def model_name(self) -> str:
        """What messages call the model: ``name=``, else its variable in the IPython user namespace, else
        "the model".

        Example:
            >>> import torch
            >>> p = Panel(torch.nn.Linear(4, 1), torch.randn(8, 4), loss_fn=lambda m, b: m(b).mean(), name="net")
            >>> p.model_name()
            'net'
        """
        return self.name or user_variable_name(self.model) or "the model"

    def measured(self, plan: Plan) -> Trial | None:
        """The last "ok" trial of ``plan`` measured in this panel (since it was built or cleared), or None.

        Example:
            >>> import torch
            >>> p = Panel(torch.nn.Linear(4, 1), torch.randn(8, 4), loss_fn=lambda m, b: m(b).mean(), steps=1)
            >>> p.measured(p.plan()) is None, p.run().status, p.measured(p.plan()).status
            (True, 'ok', 'ok')
        """
        found = [trial for trial in self.report.trials if trial.status == "ok" and trial.plan == plan]
        return found[-1] if found else None

    def run(self) -> Trial | None:
        """Measure the current setting on the live model (what the Run button does); the Trial, or None.

        Never raises for a bad setting or a failing trial: the status line says what happened.

        Example:
            >>> import torch
            >>> p = Panel(torch.nn.Linear(4, 1), torch.randn(8, 4), loss_fn=lambda m, b: m(b).mean(), steps=1)
            >>> p.controls["budget"].value = "lots"
            >>> p.run() is None, "budget 'lots' is not understood" in html.unescape(p.status.value)
            (True, True)
            >>> p.controls["budget"].value = ""
            >>> p.run().status
            'ok'
        """
        if self._running:
            return None
        if self.applied is not None and self.applied.active:
            self._say(
                f"{self.applied.plan.label()} is applied to {self.model_name()}; click Undo before running", "warn"
            )
            return None
        try:
            plan, budget = self.plan(), self.budget()
        except Exception as error:  # noqa: BLE001 - shown in the panel, never raised into the kernel
            self._say(f"Cannot run: {one_line(error, limit=None)}", "error")
            return None
        self._set_busy(True)
        self._say(f"Running {plan.label()}...", "info")
        try:
            self.figure.budget = budget
            self.figure.start_run()
            report = compare(
                self.model, self.batch, [plan], **self.options.keywords(budget=budget, callback=self._on_event)
            )
            trial = report.trials[0]
            self.report.trials.append(trial)
            self.report.budget = budget
            self._say(*_trial_message(trial, self.report))
            return trial
        except KeyboardInterrupt:
            self._say(f"Interrupted; {self.model_name()} is as it was", "warn")
            return None
        except Exception as error:  # noqa: BLE001 - shown in the panel, never raised into the kernel
            self._say(f"Error: {one_line(error, limit=None)}", "error")
            return None
        finally:
            self.figure.flush()
            self.table.value = self.report._repr_html_()
            self._set_busy(False)

    def apply(self) -> Applied | None:
        """Put the current setting on the live model (what the Apply button does); see ``memlab.apply``.

        A setting applied before is undone first. Train with ``panel.applied.step(batch)``; Undo takes it off.
        A setting that no "ok" run of this panel measured is applied too, with a warning that it was not measured
        and may not fit.

        Example:
            >>> import torch
            >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
            >>> p = Panel(model, torch.randn(8, 4), loss_fn=lambda m, b: m(b).mean())
            >>> p.controls["checkpointing"].value = True
            >>> applied = p.apply()
            >>> "not measured" in p.status.value
            True
            >>> loss = applied.step(torch.randn(8, 4))
            >>> p.undo(); p.applied is None
            True
        """
        if self._running:
            return None
        try:
            plan = self.plan()
            if self.applied is not None:
                self.applied.undo()
            self.applied = apply(self.model, plan, loss_fn=self.loss_fn, lr=self.options.lr)
        except Exception as error:  # noqa: BLE001 - shown in the panel, never raised into the kernel
            self.applied = None
            self._say(f"Cannot apply: {one_line(error, limit=None)}", "error")
        else:
            self._say(*self._applied_message(plan))
        self._set_busy(False)
        return self.applied

    def undo(self) -> None:
        """Take the applied setting off the model again (what the Undo button does); see :meth:`apply`."""
        if self._running or self.applied is None:
            return
        try:
            self.applied.undo()
            self._say(f"Undid {self.applied.plan.label()}; weights keep what training did", "info")
        except Exception as error:  # noqa: BLE001 - shown in the panel, never raised into the kernel
            self._say(f"Cannot undo: {one_line(error, limit=None)}", "error")
        self.applied = None
        self._set_busy(False)

    def clear(self) -> None:
        """Forget the results measured so far (what the Clear button does): the report, the table and the figure
        start empty again. The model, and a setting applied to it, are not touched.

        Example:
            >>> import torch
            >>> p = Panel(torch.nn.Linear(4, 1), torch.randn(8, 4), loss_fn=lambda m, b: m(b).mean(), steps=1)
            >>> p.run().status, len(p.report)
            ('ok', 1)
            >>> p.clear(); len(p.report), len(p.figure.report)
            (0, 0)
        """
        if self._running:
            return
        count = len(self.report)
        self.report = Report([], budget=self.report.budget)
        self._replace_figure(LiveFigure(self.report.budget, min_interval_s=self.min_interval_s))
        self.table.value = self.report._repr_html_()
        results = "1 result" if count == 1 else f"{count} results"
        self._say(f"Cleared {results}; {self.model_name()} is untouched", "info")

    def close(self) -> None:
        """Close the panel and every widget in it, so that the kernel can let the model and its runs go.

        ipywidgets keeps every widget until it is closed, and a panel's buttons hold the panel, which holds the
        model: a panel that is only deleted keeps the model alive. A plan still applied stays applied.

        Example:
            >>> import torch
            >>> p = panel(torch.nn.Linear(4, 1), torch.randn(8, 4), loss_fn=lambda m, b: m(b).mean())
            >>> p.close(); p.run_button.comm is None
            True
        """
        for widget in descendants(self):
            widget.close()
        super().close()

    # --- display --------------------------------------------------------------------------------------------

    def _on_event(self, event: Event) -> None:
        self.figure(event)
        if self.options.callback is not None:
            self.options.callback(event)

    def _replace_figure(self, figure: LiveFigure) -> None:
        old = self.figure
        self.figure = figure
        children: tuple[widgets.Widget, ...] = tuple(self.children)  # type: ignore[has-type]
        self.children = tuple(figure.widget if child is old.widget else child for child in children)
        old.widget.close()

    def _applied_message(self, plan: Plan) -> tuple[str, str]:
        train = _training_hint(user_variable_name(self), user_variable_name(self.batch))
        measured = self.measured(plan)
        if measured is None:
            return (
                f"Not measured: {plan.label()} is applied to {self.model_name()}, but this panel has not measured it, "
                f"so it may not fit; Undo and Run it first, or {train}",
                "warn",
            )
        peak = format_bytes(measured.peak_bytes)
        return f"Applied {plan.label()} to {self.model_name()} (measured peak {peak}): {train}; Undo takes it off", "ok"

    def _set_busy(self, running: bool) -> None:
        self._running = running
        for control in self.controls.values():
            control.disabled = running
        self.run_button.disabled = running
        self.apply_button.disabled = running
        self.undo_button.disabled = running or self.applied is None or not self.applied.active
        self.clear_button.disabled = running

    def _say(self, message: str, kind: str) -> None:
        text = message if len(message) <= _MAX_STATUS else message[: _MAX_STATUS - 3] + "..."
        self.status.value = (
            f"<div class='memlab-status memlab-{kind}' title='{html.escape(message, quote=True)}' "
            f"style='color:{_COLORS[kind]};white-space:nowrap;overflow:hidden;text-overflow:ellipsis'>"
            f"{html.escape(text)}</div>"
        )

    def _show_effective(self) -> None:
        rows = int(self.controls["micro_batch"].value or 0) * int(self.controls["accumulation"].value or 0)
        self.effective.value = f"<span style='color:#555'>= {rows} rows per optimizer step</span>"

    def _layout(self) -> list[widgets.Widget]:
        c = self.controls
        accumulation = widgets.HBox([c["micro_batch"], c["accumulation"], self.effective])
        others = [c[name] for name in LEVERS if name not in ("micro_batch", "accumulation")]
        levers = widgets.HBox([*others, c["budget"]], layout=widgets.Layout(flex_flow="row wrap"))
        buttons = widgets.HBox([self.run_button, self.apply_button, self.undo_button, self.clear_button])
        return [accumulation, levers, buttons, self.status, self.figure.widget, self.table]


def panel(model: nn.Module, batch: Batch, loss_fn: LossFn | None = None, **kwargs: Any) -> Panel:
    """The memlab widget panel on a live model: one control per technique, Run, Apply/Undo, live figure, table.

    Keyword arguments go to :class:`Panel` (``name``, ``budget``, ``steps``, ``warmup``, ``lr``, ``callback``,
    ``noise``, ``time_limit``, ``verbose``).

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        >>> p = panel(model, torch.randn(4, 8), loss_fn=lambda m, b: m(b).mean(), steps=1)
        >>> p.run_button.click()
        >>> len(p.report), p.report.trials[0].status
        (1, 'ok')
    """
    return Panel(model, batch, loss_fn, **kwargs)


def user_variable_name(value: Any, namespace: Mapping[str, Any] | None = None) -> str | None:
    """The name of a variable that holds ``value`` itself (by identity, nothing is evaluated), or None.

    ``namespace`` defaults to the IPython user namespace (None outside IPython). Names that start with ``_``
    (IPython's output history, such as ``_`` and ``_3``) do not count: they are not names the user chose.

    Example:
        >>> net = object()
        >>> user_variable_name(net, {"_": net, "other": 1, "net": net}), user_variable_name(net, {})
        ('net', None)
    """
    if namespace is None:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None:
            return None
        namespace = shell.user_ns
    for name, held in list(namespace.items()):
        if held is value and not name.startswith("_"):
            return name
    return None


def _training_hint(panel_name: str | None, batch_name: str | None) -> str:
    """How to train with the applied setting, in the user's own names where they are known."""
    applied = f"{panel_name}.applied" if panel_name else "the panel's applied"
    return f"train with {applied}.step({batch_name or '...'})"


def _controls(rows: int, budget: int | None) -> dict[str, widgets.ValueWidget]:
    """A control per lever of :data:`memlab.plan.LEVERS` (named after it, its help as the tooltip), and the budget."""
    controls = {name: _lever_control(spec, rows) for name, spec in LEVERS.items()}
    controls["budget"] = widgets.Text(
        value="" if budget is None else format_bytes(budget),
        description="budget",
        placeholder="e.g. 8GiB; empty: none",
        tooltip="the memory a setting may use, with a unit (8GiB, 500MB): over it a setting does not fit; empty: none",
        style=_WIDE,
        layout=widgets.Layout(width="230px"),
    )
    return controls


def _lever_control(spec: LeverSpec, rows: int) -> widgets.ValueWidget:
    """The widget for one lever: a number box for counts, a checkbox for switches, a drop-down for choices."""
    description = spec.name.replace("_", "-")
    if spec.type == "bool":
        return widgets.Checkbox(
            value=spec.default, description=description, tooltip=spec.help, indent=False,
            layout=widgets.Layout(width="140px"),
        )
    if spec.type == "choice":
        return widgets.Dropdown(
            options=list(spec.choices), value=spec.default, description=description, tooltip=spec.help,
            style=_WIDE, layout=widgets.Layout(width="200px"),
        )
    return widgets.BoundedIntText(
        value=rows if spec.default is None else spec.default, min=1, max=1_000_000, description=description,
        tooltip=spec.help, style=_WIDE, layout=widgets.Layout(width="170px"),
    )


def _trial_message(trial: Trial, report: Report) -> tuple[str, str]:
    speed = "" if trial.samples_per_s is None else f", {trial.samples_per_s:.3g} samples/s"
    if trial.status == "oom":
        budget = "" if trial.budget is None else f" in {format_bytes(trial.budget)}"
        reached = f", reached {format_bytes(trial.peak_bytes)}" if trial.peak_bytes else ""
        return f"{trial.label}: does not fit{budget} (out of memory{reached})", "warn"
    if trial.status == "error":
        return f"{trial.label}: error: {one_line(trial.error or 'unknown error', limit=None)}", "error"
    if not report.fits(trial):
        return f"{trial.label}: does not fit: peak {format_bytes(trial.peak_bytes)} is over the budget", "warn"
    return f"{trial.label}: fits, peak {format_bytes(trial.peak_bytes)}{speed}", "ok"


def descendants(widget: widgets.Widget) -> list[widgets.Widget]:
    """Every widget inside ``widget``, depth first: what closing a panel must close too.

    Example:
        >>> inner = widgets.Label("x")
        >>> len(descendants(widgets.VBox([widgets.HBox([inner])])))
        2
    """
    found: list[widgets.Widget] = []
    for child in getattr(widget, "children", ()):
        found += [child, *descendants(child)]
    return found
