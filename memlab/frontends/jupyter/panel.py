"""The widget panel: choose a setting with one control per technique, run it on the live model, compare, apply.

``memlab.panel(model, batch)`` returns a :class:`Panel`, an ``ipywidgets.VBox``:

* a control per lever of :data:`memlab.plan.LEVERS` (micro-batch, accumulation, checkpointing, precision, weights,
  optimizer, offload, adapter, lora-rank), each labelled with the lever's name and with its ``help`` (what it does,
  what it costs) as its tooltip, a memory budget (such as ``8GiB``; empty for none) and a host budget (the host
  memory a setting may keep: offloaded optimizer state and activations, a paged optimizer's spill; empty: what the
  machine has available), a setting over it "does not fit (host)";
* **Run** measures the setting on the live model (``memlab.compare`` with the live figure as its callback; the
  model is left bit-exact), **Apply** puts the setting on the model for real training (``memlab.apply``; the
  result is ``panel.applied``), **Undo** takes it off again, **Clear** forgets the results measured so far (the
  report, the table and the figure; the model is not touched);
* a one-line status, the live figure (:class:`memlab.frontends.jupyter.live.LiveFigure`) and a table of every run.

Apply of a setting that no "ok" run of this panel measured still applies it (Apply is undone with one click, and
the setting may have been measured elsewhere), but the status says plainly that it was not measured and may not
fit, and to Undo and Run it first.

``memlab.panel(trainer)`` takes a ``transformers.Trainer`` (TRL's too) where the model goes, the batch optional
(:func:`memlab.trainer.entry.live_target`): Run measures its model with its ``compute_loss`` on the given batch, or
on its train dataset's worst batch; the controls start at the trainer's own settings; Apply puts the setting on the
trainer (``memlab.apply(trainer, plan)``: the next ``trainer.train()`` trains with it) and Undo gives the trainer
back. A GRPOTrainer's Run measures its whole step, generation first (its phases on the timeline).

Messages call the model by the user's own variable name: ``name=`` when given, else the name the model has in the
IPython user namespace (found by identity, never by ``eval``), else "the model".

What it shares with the inference mode (the controls, Run, Clear, the status, the figure, the table, how a run is
shown) is :class:`memlab.frontends.jupyter.panel_core.PanelCore`; this module adds Apply and Undo.
"""

from __future__ import annotations

from typing import Any, cast

import ipywidgets as widgets
from torch import nn
from typing_extensions import Unpack

from memlab.frontends.jupyter.panel_core import PanelCore, descendants, size_control, user_variable_name
from memlab.live.batch import Batch, LossFn, resolve_loss_fn
from memlab.options import RunOptions, TrialKeywords
from memlab.plan import Plan, format_bytes
from memlab.report import Report, Trial, one_line
from memlab.runner.apply import Applied, apply
from memlab.trainer.entry import live_target

__all__ = ["Panel", "descendants", "panel", "user_variable_name"]


class Panel(PanelCore):
    """The memlab widget panel on a live model and batch (see the module docstring).

    Args:
        model: the model to measure (its parameters, buffers, flags and hooks are left as they were), or a
            ``transformers.Trainer`` (see the module docstring).
        batch: a batch as ``memlab.measure`` takes it (a dict of tensors, a tensor, or a tuple of tensors); for a
            trainer None measures its train dataset's worst batch.
        loss_fn: ``loss_fn(model, micro_batch) -> loss``; the default is ``model(**batch).loss``.
        name: what messages call the model (such as ``"trainer.model"``); by default the model's variable name in
            the IPython user namespace, else "the model".
        min_interval_s: the least time between two redraws of the live figure during a run.
        options: :class:`~memlab.options.TrialKeywords` (``budget`` is what the budget field starts with; ``callback``
            is called with every progress event as well as the live figure).

    Attributes:
        report: the Report of every run since the panel was built or cleared (its budget is the last run's).
        applied: the ``memlab.Applied`` of the last Apply (for a trainer, its ``TrainerApplied``), or None.
        trainer: the trainer the panel was given, or None for a model.
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
        model: nn.Module | Any,
        batch: Batch | None = None,
        loss_fn: LossFn | None = None,
        *,
        name: str | None = None,
        min_interval_s: float = 0.25,
        **options: Unpack[TrialKeywords],
    ) -> None:
        target = live_target(model, batch, loss_fn, generation=True)  # a GRPOTrainer's step generates first
        self.trainer: Any = model if target.source is not None else None
        if self.trainer is not None:
            name = name or user_variable_name(self.trainer) or "the trainer"
        model, batch, loss_fn = target.model, target.batch, target.loss_fn
        run_options = RunOptions.from_keywords({**options, "loss_fn": loss_fn, "progress": False})
        resolve_loss_fn(batch, loss_fn)  # a batch that needs a loss_fn says so now, not at the first Run
        self.loss_fn = loss_fn
        self.applied: Applied | None = None
        self.apply_button = widgets.Button(
            description="Apply", icon="check", tooltip="Put this setting on the live model (memlab.apply)"
        )
        self.undo_button = widgets.Button(
            description="Undo", icon="undo", disabled=True, tooltip="Take the applied setting off the model again"
        )
        self.effective = widgets.HTML()
        super().__init__(model, batch, run_options, name=name, min_interval_s=min_interval_s)
        self.apply_button.on_click(lambda _: self.apply())
        self.undo_button.on_click(lambda _: self.undo())
        for lever in ("micro_batch", "accumulation"):
            self.controls[lever].observe(lambda _: self._show_effective(), names="value")
        if target.plan is not None:
            self._start_at(target.plan)
        if target.note:
            self._say(f"Choose a setting and click Run to measure it on {self.model_name()} ({target.note}).", "info")
        self._show_effective()

    def plan(self) -> Plan:
        """The Plan the controls describe (a micro-batch of all the batch's rows is ``micro_batch=None``).

        Example:
            >>> import torch
            >>> p = Panel(torch.nn.Linear(4, 1), torch.randn(8, 4), loss_fn=lambda m, b: m(b).mean())
            >>> p.controls["micro_batch"].value, p.controls["accumulation"].value = 2, 4
            >>> p.plan().label()
            'mb2x4'
        """
        return cast(Plan, super().plan())

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
            if self.trainer is not None:
                self.applied = apply(self.trainer, plan)
            else:
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

    # --- the core's hooks -----------------------------------------------------------------------------------

    def _mode_buttons(self) -> list[widgets.Button]:
        return [self.apply_button, self.undo_button]

    def run(self) -> Trial | None:
        """Measure the current setting (what the Run button does), against the budget and the host budget fields.

        Example:
            >>> import torch
            >>> p = Panel(torch.nn.Linear(4, 1), torch.randn(8, 4), loss_fn=lambda m, b: m(b).mean(), steps=1)
            >>> p.controls["host_budget"].value = "64GiB"
            >>> p.run().host_budget == 64 * 2**30
            True
        """
        if self._running:
            return None
        try:
            text = str(self.controls["host_budget"].value).strip()
            self.options = self.options.replace(host_budget=text or None)
        except Exception as error:  # noqa: BLE001 - shown in the panel, never raised into the kernel
            self._say(f"Cannot run: {one_line(error, limit=None)}", "error")
            return None
        return super().run()

    def _lever_rows(self) -> list[widgets.Widget]:
        c = self.controls
        # The core builds the levers and the budget; the training panel adds the host budget beside them.
        c["host_budget"] = _host_budget_control(self.options.host_budget)
        accumulation = widgets.HBox([c["micro_batch"], c["accumulation"], self.effective])
        others = [control for name, control in c.items() if name not in ("micro_batch", "accumulation")]
        return [accumulation, widgets.HBox(others, layout=widgets.Layout(flex_flow="row wrap"))]

    def _message(self, trial: Trial | None, report: Report) -> tuple[str, str]:
        if trial is not None and trial.status == "ok" and not trial.host_fits:
            return (f"{trial.label}: does not fit (host): it keeps {format_bytes(trial.host_bytes)} of host memory, "
                    f"over the host budget of {format_bytes(trial.host_budget or 0)}", "warn")
        return super()._message(trial, report)

    def _refusal(self) -> str | None:
        if self.applied is not None and self.applied.active:
            return f"{self.applied.plan.label()} is applied to {self.model_name()}; click Undo before running"
        return None

    def _set_busy(self, running: bool) -> None:
        super()._set_busy(running)
        self.undo_button.disabled = running or self.applied is None or not self.applied.active

    # --- messages -------------------------------------------------------------------------------------------

    def _start_at(self, plan: Plan) -> None:
        """The controls at ``plan``'s values (a trainer's own settings), where a control can show them."""
        for lever, control in self.controls.items():
            value = getattr(plan, lever, None)
            if lever in self.specs and value is not None:
                try:
                    control.value = value
                except Exception:  # noqa: BLE001, S112 - a value a control cannot show keeps the control's default
                    continue

    def _applied_message(self, plan: Plan) -> tuple[str, str]:
        if self.trainer is not None:
            train = f"{user_variable_name(self.trainer) or 'the trainer'}.train() trains with it"
        else:
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

    def _show_effective(self) -> None:
        rows = int(self.controls["micro_batch"].value or 0) * int(self.controls["accumulation"].value or 0)
        self.effective.value = f"<span style='color:#555'>= {rows} rows per optimizer step</span>"


def _host_budget_control(host_budget: int | None) -> widgets.Text:
    return size_control(
        host_budget, description="host budget", placeholder="e.g. 64GiB; empty: free RAM",
        tooltip="the host (CPU) memory a setting may keep, with a unit (64GiB): offloaded optimizer state and "
        "activations, a paged optimizer's spill; over it a setting does not fit (host); empty: what the machine has "
        "available",
    )


def panel(model: nn.Module | Any, batch: Batch | None = None, loss_fn: LossFn | None = None, **kwargs: Any) -> Panel:
    """The memlab widget panel on a live model (or a ``transformers.Trainer``, the batch then optional): one control
    per technique, Run, Apply/Undo, live figure, table.

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


def _training_hint(panel_name: str | None, batch_name: str | None) -> str:
    """How to train with the applied setting, in the user's own names where they are known."""
    applied = f"{panel_name}.applied" if panel_name else "the panel's applied"
    return f"train with {applied}.step({batch_name or '...'})"
