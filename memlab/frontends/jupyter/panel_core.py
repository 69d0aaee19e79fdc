"""What the widget panel is in both modes: a control per lever of the plan class, a budget, Run and Clear, a one-line
status, the live figure and a table of every run.

:class:`PanelCore` is that panel; a mode is a small subclass that names its plan class and adds its own buttons:
:class:`memlab.frontends.jupyter.panel.Panel` (training: Apply and Undo) and
:class:`memlab.frontends.jupyter.inference_panel.InferencePanel` (inference: Largest batch).

A run happens in the kernel, synchronously: the controls are disabled until it is over. Mistakes (a budget that is
not a size, an impossible setting, an exception in the run) are one line in the status, never a traceback; a setting
that runs out of memory (or over the budget) is a "does not fit" result, not an error. Messages call the model by the
user's own variable name: ``name=`` when given, else the name the model has in the IPython user namespace (found by
identity, never by ``eval``), else "the model".
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import ipywidgets as widgets
import traitlets
from torch import nn

from memlab.errors import MemlabError
from memlab.events import Event
from memlab.frontends.jupyter.live import LiveFigure
from memlab.frontends.jupyter.timeline_view import TimelineView
from memlab.frontends.levers import panel_lever_specs
from memlab.live.batch import Batch, count_rows
from memlab.options import RunKeywords, RunOptions
from memlab.plan import InferencePlan, LeverSpec, Plan, format_bytes, parse_budget, parse_lever_value
from memlab.report import CATEGORIES, Report, Trial, one_line
from memlab.report.views.plan_axis import text_width
from memlab.report.views.svg import axis_number
from memlab.report.views.tables import held_line, judged_text
from memlab.runner.remeasure import close_contenders, settle_close_race
from memlab.runner.trial import compare

__all__ = ["AS_THE_MODEL_IS", "AUTO", "AutoCountBox", "BlocksDropdown", "PanelCore", "blocks_options", "descendants",
           "lever_control", "model_blocks", "user_variable_name"]

WIDE = {"description_width": "initial"}
_COLORS = {"info": "#333", "ok": "#2b7a2b", "warn": "#8a5a00", "error": "#b00020"}
_MAX_STATUS = 200

Action = Callable[[Any, RunKeywords], Report]
"""What a button runs: ``action(plan, options) -> Report`` (options are the panel's, with its budget and callback)."""


class PanelCore(widgets.VBox):
    """The panel both modes share (see the module docstring); a mode sets the class attributes and adds buttons.

    Attributes:
        report: the Report of every run since the panel was built or cleared (its budget is the last run's).
        controls: the input widgets by name: one per lever of :attr:`plan_class`, and ``budget``.
        run_button, clear_button: the buttons (``button.click()`` works without a browser).
        status: the one-line HTML message; table: the HTML table of runs; figure: the LiveFigure.

    Example:
        >>> import torch
        >>> options = RunOptions(loss_fn=lambda m, b: m(b).mean(), steps=1, progress=False)
        >>> p = PanelCore(torch.nn.Linear(4, 1), torch.randn(8, 4), options)
        >>> p.plan_class.__name__, sorted(p.controls)[:2], p.run().status, len(p.report)
        ('Plan', ['accumulation', 'adapter'], 'ok', 1)
    """

    plan_class: ClassVar[type[Plan] | type[InferencePlan]] = Plan
    rows_lever: ClassVar[str] = "micro_batch"
    """The lever whose value is the batch's rows when it says "all of them" (None in the plan)."""
    categories: ClassVar[tuple[str, ...]] = CATEGORIES
    rate_unit: ClassVar[str] = "samples/s"
    what: ClassVar[str] = "a setting"
    """How the greeting names what the controls choose."""

    def __init__(
        self,
        model: nn.Module,
        batch: Batch,
        options: RunOptions,
        *,
        name: str | None = None,
        min_interval_s: float = 0.25,
    ) -> None:
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise MemlabError(f"name={name!r} is not allowed; write the model's name as text, such as name='net'")
        if not isinstance(model, nn.Module):
            raise MemlabError(f"model must be a torch nn.Module, not {type(model).__name__}")
        self.rows = count_rows(batch)
        self.options = options
        self.model = model
        self.batch = batch
        self.name = name
        self.min_interval_s = min_interval_s
        self.report = Report([], budget=options.budget)
        self.figure = self._new_figure()
        self.specs: dict[str, LeverSpec] = panel_lever_specs(self.plan_class)
        self.controls: dict[str, widgets.ValueWidget] = {
            lever: lever_control(spec, self.rows if lever == self.rows_lever else None,
                                 cuts_rows=lever == self.rows_lever,
                                 blocks=model_blocks(model) if spec.type == "blocks" else None)
            for lever, spec in self.specs.items()
        }
        self.controls["budget"] = _budget_control(options.budget)
        self.run_button = widgets.Button(
            description="Run", icon="play", button_style="primary", tooltip=self._run_tooltip()
        )
        self.clear_button = widgets.Button(
            description="Clear",
            icon="trash",
            tooltip="Forget the results measured so far (the table and the figure); the model is not touched",
        )
        # No margin: ipywidgets adds one outside the 100% width, and the status line and the table would reach
        # 2 px past the output (the panel then scrolls sideways by 4 px).
        self.status = widgets.HTML(layout=widgets.Layout(width="100%", margin="0"))
        self.table = widgets.HTML(self.report._repr_html_(), layout=widgets.Layout(width="100%", margin="0"))
        self.timeline = TimelineView()  # the picked plan's step over time, under the table
        self.timeline.update([])
        self.timeline.follow_clicks(self.figure.widget)
        self._running = False
        self.run_button.on_click(lambda _: self.run())
        self.clear_button.on_click(lambda _: self.clear())
        self._say(f"Choose {self.what} and click Run to measure it on {self.model_name()}.", "info")
        buttons = widgets.HBox([self.run_button, *self._mode_buttons(), self.clear_button])
        super().__init__(children=[*self._lever_rows(), buttons, self.status, self.figure.widget, self.table,
                                   self.timeline.widget])
        self.add_class("memlab-panel")

    # --- what the controls say ------------------------------------------------------------------------------

    def plan(self) -> Plan | InferencePlan:
        """The plan the controls describe (all of the batch's rows is None, "the batch's rows").

        Example:
            >>> import torch
            >>> p = PanelCore(torch.nn.Linear(4, 1), torch.randn(8, 4), RunOptions())
            >>> p.controls["micro_batch"].value, p.controls["accumulation"].value = 2, 4
            >>> p.plan().label()
            'mb2x4'
        """
        values = {lever: self.controls[lever].value for lever in self.specs}
        if values[self.rows_lever] == self.rows:
            values[self.rows_lever] = None
        for lever, spec in self.specs.items():  # a count whose default is None shows None as "auto" (AutoCountBox)
            if spec.type == "blocks" or (lever != self.rows_lever and spec.type == "int" and spec.default is None):
                values[lever] = parse_lever_value(spec, str(values[lever]))
            if spec.type == "choice" and spec.default is None and values[lever] == AS_THE_MODEL_IS:
                values[lever] = None
        return self.plan_class(**values)

    def budget(self) -> int | None:
        """The budget field in bytes (None when empty); a MemlabError that says what to write when it is not a size.

        Example:
            >>> import torch
            >>> p = PanelCore(torch.nn.Linear(4, 1), torch.randn(8, 4), RunOptions())
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
            >>> PanelCore(torch.nn.Linear(4, 1), torch.randn(8, 4), RunOptions(), name="net").model_name()
            'net'
        """
        return self.name or user_variable_name(self.model) or "the model"

    # --- actions --------------------------------------------------------------------------------------------

    def run(self) -> Trial | None:
        """Measure the current setting on the live model (what the Run button does); the Trial, or None.

        Never raises for a bad setting or a failing trial: the status line says what happened.

        Example:
            >>> import torch
            >>> p = PanelCore(torch.nn.Linear(4, 1), torch.randn(8, 4), RunOptions(steps=1, progress=False))
            >>> p.controls["budget"].value = "lots"
            >>> p.run() is None, "budget 'lots' is not understood" in html.unescape(p.status.value)
            (True, True)
        """
        return self._measure(lambda plan, options: compare(self.model, self.batch, [plan], **options), settle=True)

    def clear(self) -> None:
        """Forget the results measured so far (what the Clear button does): the report, the table and the figure
        start empty again (the old figure's widget is closed). The model is not touched.

        Example:
            >>> import torch
            >>> options = RunOptions(loss_fn=lambda m, b: m(b).mean(), steps=1, progress=False)
            >>> p = PanelCore(torch.nn.Linear(4, 1), torch.randn(8, 4), options)
            >>> p.run().status, len(p.report)
            ('ok', 1)
            >>> p.clear(); len(p.report), len(p.figure.report)
            (0, 0)
        """
        if self._running:
            return
        count = len(self.report)
        self.report = Report([], budget=self.report.budget)
        old = self.figure
        self.figure = self._new_figure()
        # Only the figure changes: containers rebuilt here would stay open, holding the buttons and so the model.
        children: tuple[widgets.Widget, ...] = tuple(self.children)  # type: ignore[has-type]
        self.children = tuple(self.figure.widget if child is old.widget else child for child in children)
        old.widget.close()
        self.table.value = self.report._repr_html_()
        self.timeline.update([])
        self.timeline.follow_clicks(self.figure.widget)
        results = "1 result" if count == 1 else f"{count} results"
        self._say(f"Cleared {results}; {self.model_name()} is untouched", "info")

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any] | None:
        """The widget view, with a line of text and of HTML beside it for whatever cannot draw the widget (nbconvert,
        GitHub, an untrusted notebook): what the panel is and that it needs the kernel that made it.

        Example:
            >>> import torch
            >>> p = PanelCore(torch.nn.Linear(4, 1), torch.randn(8, 4), RunOptions(), name="net")
            >>> bundle = p._repr_mimebundle_()
            >>> bundle["text/plain"]
            'memlab panel on net (it needs the kernel that made it: run the cell to use it)'
        """
        bundle: dict[str, Any] | None = super()._repr_mimebundle_(**kwargs)
        if bundle is not None:
            needs = "it needs the kernel that made it: run the cell to use it"
            bundle["text/plain"] = f"memlab panel on {self.model_name()} ({needs})"
            bundle["text/html"] = f"<p class='memlab-panel-static'>{html.escape(bundle['text/plain'])}</p>"
        return bundle

    def close(self) -> None:
        """Close the panel and every widget in it, so that the kernel can let the model and its runs go.

        ipywidgets keeps every widget until it is closed, and a panel's buttons hold the panel, which holds the
        model: a panel that is only deleted keeps the model alive.

        Example:
            >>> import torch
            >>> p = PanelCore(torch.nn.Linear(4, 1), torch.randn(8, 4), RunOptions())
            >>> p.close(); p.run_button.comm is None, p.figure.widget.comm is None
            (True, True)
        """
        for widget in descendants(self):
            widget.close()
        super().close()

    # --- what a mode adds or changes ------------------------------------------------------------------------

    def _mode_buttons(self) -> list[widgets.Button]:
        """The mode's own buttons, between Run and Clear (built before the core's ``__init__`` runs)."""
        return []

    def _lever_rows(self) -> list[widgets.Widget]:
        """The rows of controls above the buttons: every lever and the budget, wrapped."""
        return [widgets.HBox(list(self.controls.values()), layout=widgets.Layout(flex_flow="row wrap"))]

    def _refusal(self) -> str | None:
        """Why a run cannot start now (shown as a warning), or None."""
        return None

    def _run_tooltip(self) -> str:
        return "Measure this setting on the live model"

    def _rate(self, trial: Trial) -> float | None:
        return trial.samples_per_s

    # --- running --------------------------------------------------------------------------------------------

    def _measure(self, action: Action, *, settle: bool = False) -> Trial | None:
        """Run ``action`` on the controls' plan and budget, with the live figure fed; keep what it measured (also
        what was measured before a Ctrl-C) and say one line about it. The trial shown, or None. With ``settle``, a
        close race between the new trial and earlier runs is timed again in turn first (:meth:`settle`)."""
        if self._running:
            return None
        refusal = self._refusal()
        if refusal is not None:
            self._say(refusal, "warn")
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
            result = action(plan, self.options.keywords(budget=budget, callback=self._on_event))
            self._keep(result.trials, budget)
            if settle and len(result.trials) == 1:
                self.settle(budget)
                result = Report([self.report.trials[-1]], budget=budget)
            shown = result.best if len(result) > 1 else (result.trials[-1] if result.trials else None)
            self._say(*self._message(shown, result))
            return shown
        except KeyboardInterrupt as interrupt:
            finished = getattr(interrupt, "report", None)  # what was measured before Ctrl-C
            kept = list(finished.trials) if isinstance(finished, Report) else []
            self._keep(kept, budget)
            measured = f" ({len(kept)} setting(s) measured are in the table)" if kept else ""
            self._say(f"Interrupted; {self.model_name()} is as it was{measured}", "warn")
            return None
        except Exception as error:  # noqa: BLE001 - shown in the panel, never raised into the kernel
            self._say(f"Error: {one_line(error, limit=None)}", "error")
            return None
        finally:
            self.figure.flush()
            self.table.value = self.report._repr_html_()
            self.timeline.update(self.report.trials)
            self._set_busy(False)

    def settle(self, budget: int | None) -> list[tuple[Trial, Trial]]:
        """Where the newest run is in a close race with earlier ones (the rule ``compare`` follows:
        :func:`~memlab.runner.remeasure.close_contenders`, when the panel's options time to a noise target), time
        the contenders again in turn, A B A B, and put the pooled trials in their places in :attr:`report` and the
        figure: runs measured minutes apart on a machine whose load changed never decide the best by that drift.
        Returns the (before, after) pairs, empty when the race is not close.

        Example:
            >>> import torch
            >>> options = RunOptions(loss_fn=lambda m, b: m(b).mean(), steps=2, noise=0.05, time_limit=0.05,
            ...                      progress=False)
            >>> p = PanelCore(torch.nn.Linear(4, 1), torch.randn(8, 4), options)
            >>> _ = p.run(); _ = p.run()  # the same setting twice: as fast as itself, whatever the load did
            >>> [len(trial.step_runs) for trial in p.report]  # each run once, then three more rounds in turn
            [4, 4]
        """
        trials = self.report.trials
        if self.options.noise <= 0 or len(trials) < 2:
            return []
        contenders = close_contenders(trials, budget)
        if not any(trial is trials[-1] for trial in contenders):
            return []
        names = ", ".join(trial.label for trial in contenders)
        self._say(f"{names} are close in speed: timing them again, in turn, so that noise does not decide", "info")
        keywords = self.options.keywords(budget=budget, callback=None, progress=False)

        def run_again(plan: Any, index: int) -> Trial:
            return compare(self.model, self.batch, [plan], **keywords).trials[0]

        pairs = settle_close_race(trials, run_again, budget)
        self.figure.show_report(self.report)
        return pairs

    def _keep(self, trials: list[Trial], budget: int | None) -> None:
        self.report.trials.extend(trials)
        self.report.budget = budget

    def _message(self, trial: Trial | None, report: Report) -> tuple[str, str]:
        """The status line of a result, and its kind."""
        if trial is None:
            return "nothing fits the budget", "warn"
        if trial.status == "oom":
            budget = "" if trial.budget is None else f" in {format_bytes(trial.budget)}"
            reached = f", reached {format_bytes(trial.peak_bytes)}" if trial.peak_bytes else ""
            return f"{trial.label}: does not fit{budget} (out of memory{reached})", "warn"
        if trial.status == "error":
            return f"{trial.label}: error: {one_line(trial.error or 'unknown error', limit=None)}", "error"
        # The figure the verdict judged: what the card will show where it is known, else the allocated peak.
        if not report.fits(trial):
            # Memory the process held before the run is named only where it changes this verdict.
            held = held_line(Report([trial], budget=trial.budget if report.budget is None else report.budget))
            why = "" if held is None else (
                f"; {format_bytes(trial.preexisting_bytes)} of it was held before the run: without it, it would fit"
            )
            return f"{trial.label}: does not fit: {judged_text(trial)} is over the budget{why}", "warn"
        rate = self._rate(trial)
        speed = "" if rate is None else f", {axis_number(rate)} {self.rate_unit}"
        if report.budget is None and trial.budget is None:  # nothing to fit: "fits" would claim a verdict
            return f"{trial.label}: {judged_text(trial)}{speed} (no budget set)", "ok"
        return f"{trial.label}: fits, {judged_text(trial)}{speed}", "ok"

    # --- display --------------------------------------------------------------------------------------------

    def _new_figure(self) -> LiveFigure:
        return LiveFigure(self.report.budget, min_interval_s=self.min_interval_s, categories=self.categories)

    def _on_event(self, event: Event) -> None:
        self.figure(event)
        if self.options.callback is not None:
            self.options.callback(event)

    def _set_busy(self, running: bool) -> None:
        self._running = running
        for widget in [*self.controls.values(), self.run_button, *self._mode_buttons(), self.clear_button]:
            widget.disabled = running

    def _say(self, message: str, kind: str) -> None:
        """Show one line; a line cut short keeps all of it as its tooltip."""
        cut = len(message) > _MAX_STATUS
        text = message[: _MAX_STATUS - 3] + "..." if cut else message
        title = f" title='{html.escape(message, quote=True)}'" if cut else ""
        self.status.value = (
            f"<div class='memlab-status memlab-{kind}'{title} "
            f"style='color:{_COLORS[kind]};white-space:nowrap;overflow:hidden;text-overflow:ellipsis'>"
            f"{html.escape(text)}</div>"
        )


class _BlocksValue(traitlets.Unicode):  # type: ignore[type-arg]
    """The drop-down's value as text, taking False, True and counts too, as the plan holds them ("off", "all",
    "2"; the model's own number of blocks is "all", the same plan)."""

    def validate(self, obj: Any, value: Any) -> Any:
        if isinstance(value, bool) or isinstance(value, int):
            count = getattr(obj, "blocks", None)
            value = "all" if value is True or (count is not None and value == count) else str(value or "off")
        return super().validate(obj, value)


def blocks_options(blocks: int | None) -> list[tuple[str, str]]:
    """The checkpointing drop-down's choices, (label, value): off, every block, and, where the model's number of
    repeated blocks is known, each count from 1 to one fewer (all of them is "every block", the same plan).

    Example:
        >>> blocks_options(3)
        [('off', 'off'), ('every block', 'all'), ('1 of 3 blocks', '1'), ('2 of 3 blocks', '2')]
        >>> blocks_options(None)
        [('off', 'off'), ('every block', 'all')]
    """
    counts = [(f"{k} of {blocks} blocks", str(k)) for k in range(1, blocks)] if blocks else []
    return [("off", "off"), ("every block", "all"), *counts]


class BlocksDropdown(widgets.Dropdown):
    """The checkpointing control: a drop-down of off, every block and each number of the model's blocks
    (:func:`blocks_options`), so that no value the plan would refuse can be chosen; ``value = True`` (or False, or
    2) shows as the plan's value would, and the plan reads it through the ``--try`` parser.

    Example:
        >>> box = BlocksDropdown(blocks=4); box.value = True; (box.value, box.label), (setattr(box, "value", 2),
        ...     box.label)[1], (setattr(box, "value", 4), box.label)[1]  # all four is every block
        (('all', 'every block'), '2 of 4 blocks', 'every block')
    """

    value = _BlocksValue("off", help="off, all or a number of blocks")

    def __init__(self, blocks: int | None = None, **kwargs: Any) -> None:
        self.blocks = blocks
        super().__init__(options=blocks_options(blocks), value="off", **kwargs)


def model_blocks(model: nn.Module) -> int | None:
    """How many blocks ``checkpointing=k`` counts in ``model`` (None where it has none to checkpoint).

    Example:
        >>> model_blocks(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))), model_blocks(nn.Linear(2, 2))
        (2, None)
    """
    from memlab.techniques.checkpointing import checkpoint_blocks

    try:
        return len(checkpoint_blocks(model)) or None
    except Exception:  # noqa: BLE001 - no repeated blocks: the drop-down offers off and every block
        return None


class _CountText(traitlets.Unicode):  # type: ignore[type-arg]
    """Text that takes None and counts too, as the plan holds them ("auto", "16")."""

    def validate(self, obj: Any, value: Any) -> Any:
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            value = AUTO if value is None else str(value)
        return super().validate(obj, value)


AUTO = "auto"
"""What a count whose default is None shows for None (``lora_alpha``: twice the rank), never 0."""


class AutoCountBox(widgets.Combobox):
    """A count whose default is None (``lora_alpha``): ``auto`` (None: what the lever's help says auto means) or a
    number, typed or picked; ``value = 32`` (or None) shows as the plan's value would. The plan reads it through the
    ``--try`` parser, so a word it does not know is said when Run is clicked.

    Example:
        >>> box = AutoCountBox(options=["auto", "16"], ensure_option=False); box.value = 32; box.value
        '32'
        >>> box.value = None; box.value
        'auto'
    """

    value = _CountText(AUTO, help="auto, or a whole number").tag(sync=True)


AS_THE_MODEL_IS = "model's"
"""What a choice control whose default is None shows for None (``attention``: the model's own implementation)."""


def lever_control(
    spec: LeverSpec, rows: int | None, *, cuts_rows: bool = False, blocks: int | None = None
) -> widgets.ValueWidget:
    """The widget for one lever, named after it, its help as the tooltip: a checkbox for a switch, a drop-down for
    choices and for checkpointing (off, every block, or a number of the model's ``blocks``: :class:`BlocksDropdown`),
    a number box for a number or a count. The count that cuts the batch (``cuts_rows``: None is all of its
    rows) starts at ``rows``; any other count whose default is None is an :class:`AutoCountBox` showing ``auto``
    (what the lever's help says None means: ``lora_alpha``'s twice the rank), never 0.

    Example:
        >>> from memlab.plan import LEVERS
        >>> control = lever_control(LEVERS["micro_batch"], 8, cuts_rows=True)
        >>> control.description, control.value, control.min
        ('micro-batch', 8, 1)
        >>> lever_control(LEVERS["lora_alpha"], None).value
        'auto'
    """
    description = spec.name.replace("_", "-")
    if spec.type == "bool":  # wide enough for its whole name (optimizer-in-backward), next to its box
        return widgets.Checkbox(
            value=spec.default, description=description, tooltip=spec.help, indent=False, style=WIDE,
            layout=widgets.Layout(width=f"{max(140, 36 + 8 * len(description))}px"),
        )
    if spec.type == "blocks":  # off, every block, or 1 to blocks - 1 of the model's blocks: read by the --try parser
        return BlocksDropdown(
            blocks, description=description, tooltip=spec.help, style=WIDE, layout=widgets.Layout(width="230px"),
        )
    if spec.type == "choice":
        # A choice whose default is None (attention) offers the model's own first, as text: a drop-down holding None
        # shows an empty box, and goes back to empty when picked again. The plan reads it as None.
        first = [AS_THE_MODEL_IS] if spec.default is None else []
        return widgets.Dropdown(
            options=first + list(spec.choices), value=AS_THE_MODEL_IS if spec.default is None else spec.default,
            description=description, tooltip=spec.help, style=WIDE, layout=widgets.Layout(width="200px"),
        )
    if spec.type == "float":
        return widgets.BoundedFloatText(
            value=spec.default, min=0.0, max=1_000_000.0, step=0.01, description=description, tooltip=spec.help,
            style=WIDE, layout=widgets.Layout(width="170px"),
        )
    if spec.default is None and not cuts_rows:
        return AutoCountBox(  # its help says what auto means
            value=AUTO, options=[AUTO, "8", "16", "32", "64", "128"], ensure_option=False, description=description,
            tooltip=spec.help, style=WIDE, layout=widgets.Layout(width="170px"),
        )
    if spec.default is None:
        start, least = (rows, 1) if rows is not None else (0, 0)
    else:
        start, least = spec.default, 0 if spec.default == 0 else 1
    return widgets.BoundedIntText(
        value=start, min=least, max=1_000_000,
        description=description, tooltip=spec.help, style=WIDE, layout=widgets.Layout(width="170px"),
    )


def size_control(value: int | None, *, description: str, placeholder: str, tooltip: str) -> widgets.Text:
    """A text field for a size (a budget), wide enough for its label and its whole placeholder: a field sized by hand
    cut its placeholder short ("e.g. 64GiB; empty: the mac" in the host budget's 260 px).

    Example:
        >>> box = size_control(None, description="budget", placeholder="e.g. 8GiB; empty: none", tooltip="...")
        >>> box.layout.width
        '249px'
    """
    # The label and the field's text at JupyterLab's 13 px, estimated generously; the field's padding and border, and
    # the gap between label and field.
    width = text_width(description, 13) + text_width(placeholder, 13) + 30
    return widgets.Text(
        value="" if value is None else format_bytes(value), description=description, placeholder=placeholder,
        tooltip=tooltip, style=WIDE, layout=widgets.Layout(width=f"{math.ceil(width)}px"),
    )


def _budget_control(budget: int | None) -> widgets.Text:
    return size_control(
        budget, description="budget", placeholder="e.g. 8GiB; empty: none",
        tooltip="the memory a setting may use, with a unit (8GiB, 500MB): over it a setting does not fit; empty: none",
    )


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
