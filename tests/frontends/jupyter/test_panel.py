"""The widget panel without a browser: buttons clicked from Python, as ipywidgets' own tests do."""

from __future__ import annotations

from collections.abc import Iterator
from html import unescape
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go
import pytest
import torch
import traitlets
from models import assert_same, fingerprint, lm_batch, tiny_gpt2

import memlab
from memlab.errors import MemlabError
from memlab.events import Event, TrialFinished
from memlab.frontends.jupyter.live import LiveFigure
from memlab.frontends.jupyter.panel import Panel, panel, user_variable_name
from memlab.plan import LEVERS, Plan
from memlab.report import CATEGORIES, Report
from memlab.runner.apply import Applied

MIB = 1024**2
NAMED_IN_DESIGN = (
    "micro_batch", "accumulation", "checkpointing", "precision", "weights", "optimizer", "offload", "adapter",
    "lora_rank", "lora_targets", "loss", "optimizer_in_backward",
)
# One control per lever the registry declares but the colocated vLLM engine's (no live step runs them), and the budgets.
# the levers a built trainer sets (a GRPOTrainer's vLLM engine, a DPOTrainer's precompute_ref) have no control
HIDDEN = {"vllm_memory", "vllm_sleep", "precompute_ref"}
TECHNIQUES = (*(lever for lever in LEVERS if lever not in HIDDEN), "budget", "host_budget")


def small_batch() -> dict[str, torch.Tensor]:
    return lm_batch(rows=4, length=8)


KEEP: set[int] = set()
"""Panels a module-scoped fixture shares between tests; every other panel is closed after its test."""


@pytest.fixture(autouse=True)
def close_new_panels() -> Iterator[None]:
    # ipywidgets keeps every open widget, and a panel holds its model: without this, each test's model would stay
    # alive for the rest of the session and count as memory held before in later tests' trials.
    yield
    for widget in list(widgets.Widget.widgets.values()):
        if isinstance(widget, Panel) and id(widget) not in KEEP:
            widget.close()


@pytest.fixture(scope="module")
def two_runs() -> Iterator[dict[str, Any]]:
    """Run plain, switch checkpointing on, run again; note what the buttons looked like during the runs."""
    model = tiny_gpt2()
    before = fingerprint(model)
    seen: list[dict[str, bool]] = []

    def watch(event: Event) -> None:
        if isinstance(event, TrialFinished):
            return
        seen.append(
            {
                "run": p.run_button.disabled,
                "apply": p.apply_button.disabled,
                "undo": p.undo_button.disabled,
                **{name: control.disabled for name, control in p.controls.items()},
            }
        )

    p = panel(model, small_batch(), steps=1, noise=0, callback=watch)
    KEEP.add(id(p))
    p.run_button.click()
    p.controls["checkpointing"].value = True
    p.run_button.click()
    yield {"panel": p, "model": model, "before": before, "seen": seen}
    KEEP.discard(id(p))
    p.close()


def test_panel_is_a_widget_with_a_control_per_technique(two_runs: dict[str, Any]) -> None:
    p: Panel = two_runs["panel"]
    assert isinstance(p, widgets.VBox)
    assert isinstance(p.figure, LiveFigure) and isinstance(p.figure.widget, go.FigureWidget)
    assert set(p.controls) == set(TECHNIQUES) and set(NAMED_IN_DESIGN) <= set(p.controls)
    descriptions = {name: control.description for name, control in p.controls.items()}
    assert descriptions["checkpointing"] == "checkpointing"
    assert descriptions["precision"] == "precision" and descriptions["optimizer"] == "optimizer"
    assert descriptions["offload"] == "offload" and descriptions["budget"] == "budget"
    assert (descriptions["micro_batch"], descriptions["accumulation"]) == ("micro-batch", "accumulation")
    assert all(control.tooltip for control in p.controls.values())
    assert list(p.children[0].children[:2]) == [p.controls["micro_batch"], p.controls["accumulation"]]
    buttons = (p.run_button, p.apply_button, p.undo_button, p.clear_button)
    assert [b.description for b in buttons] == ["Run", "Apply", "Undo", "Clear"]
    assert p.figure.widget in p.children and p.table in p.children and p.status in p.children


def test_run_then_checkpointing_then_run_gives_two_trials_in_report_and_figure(two_runs: dict[str, Any]) -> None:
    p: Panel = two_runs["panel"]
    assert isinstance(p.report, Report)
    assert [trial.plan for trial in p.report] == [Plan(), Plan(checkpointing=True)]
    assert [trial.status for trial in p.report] == ["ok", "ok"]
    data = {trace.name: trace for trace in p.figure.widget.data if trace.xaxis == "x2"}
    for name in CATEGORIES:
        assert data[name].x == ("plain", "ckpt")
        assert all(value is not None for value in data[name].y)
    assert data["params"].y[0] == pytest.approx(p.report[0].breakdown["params"] / MIB)
    speed = next(trace for trace in p.figure.widget.data if trace.name == "samples/s")
    assert speed.x == ("plain", "ckpt") and all(value > 0 for value in speed.y)
    points = [trace for trace in p.figure.widget.data if trace.xaxis == "x4"]
    # Both points are there; spaced_labels names the best first and leaves a point too close to it unnamed, which a
    # loaded machine (two runs at nearly one speed) can make happen.
    named = sorted(label for trace in points for label in trace.text)
    assert len(named) == 2 and set(named) - {""} <= {"ckpt", "plain"} and set(named) - {""}
    assert "plain" in p.table.value and "ckpt" in p.table.value
    # no budget: nothing to fit, so the status says no verdict, and the figure's legend has no "fits"
    assert "ckpt: peak" in p.status.value and "(no budget set)" in p.status.value and "fits" not in p.status.value
    assert [trace.showlegend for trace in points if trace.name == "fits"] == [False]
    assert_same(two_runs["before"], fingerprint(two_runs["model"]))


def test_controls_are_disabled_while_running_and_enabled_after(two_runs: dict[str, Any]) -> None:
    p: Panel = two_runs["panel"]
    seen = two_runs["seen"]
    assert seen, "the callback saw no events"
    assert all(all(state.values()) for state in seen), "something was clickable during a run"
    assert not p.run_button.disabled and not p.apply_button.disabled
    assert not any(control.disabled for control in p.controls.values())
    assert p.undo_button.disabled  # nothing applied yet


def test_out_of_memory_is_does_not_fit_not_an_error() -> None:
    p = panel(tiny_gpt2(), small_batch(), steps=1, noise=0, budget="64KiB")
    trial = p.run()
    assert trial is not None and trial.status == "oom"
    assert "does not fit" in p.status.value and "memlab-warn" in p.status.value
    assert "does not fit" in p.table.value
    for html in (p.status.value, p.table.value):
        assert "Traceback" not in html and 'File "' not in html
    bar = next(trace for trace in p.figure.widget.data if trace.name == "out of memory" and trace.type == "bar")
    # as high as what is known of its peak (the 64 KiB budget that stopped it, or more where it reached more), marked
    # as a bound
    assert bar.y[0] == pytest.approx(max(64 / 1024, trial.peak_bytes / 2**20))
    assert bar.text[0].startswith("does not fit: \u2265 ")
    assert p.report.budget == 64 * 1024
    assert not p.run_button.disabled


def test_the_same_setting_run_twice_is_two_columns_of_the_figure() -> None:
    p = panel(tiny_gpt2(), small_batch(), steps=1, noise=0)
    first, second = p.run(), p.run()
    assert first is not None and second is not None
    assert p.figure.report.trials == p.report.trials == [first, second]


def test_bad_budget_is_one_line_in_the_panel_and_nothing_runs() -> None:
    p = panel(tiny_gpt2(), small_batch(), steps=1, noise=0)
    p.controls["budget"].value = "lots of memory"
    p.run_button.click()  # must not raise
    assert len(p.report) == 0
    status = p.status.value
    assert "memlab-error" in status and "budget" in status and "8GiB" in status
    assert "\n" not in status and "Traceback" not in status
    assert not p.run_button.disabled and not p.controls["budget"].disabled


def test_an_exception_in_the_loss_is_one_line_and_the_panel_stays_usable() -> None:
    def broken_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
        raise RuntimeError("the loss broke\nsecond line of detail")

    p = panel(tiny_gpt2(), small_batch(), loss_fn=broken_loss, steps=1, noise=0)
    p.run_button.click()
    assert [trial.status for trial in p.report] == ["error"]
    status = p.status.value
    assert "memlab-error" in status and "the loss broke" in status
    assert "second line" not in status and "Traceback" not in status
    assert not p.run_button.disabled


def test_a_plan_error_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    p = panel(tiny_gpt2(), small_batch(), steps=1, noise=0)

    def impossible() -> Plan:
        raise MemlabError("offload='disk' is not known; write one of none, optimizer, activations, all")

    monkeypatch.setattr(p, "plan", impossible)
    p.run_button.click()
    p.apply_button.click()
    assert "Cannot apply: offload=&#x27;disk&#x27; is not known" in p.status.value
    assert len(p.report) == 0 and p.applied is None


def test_apply_then_undo_leaves_the_model_bit_exact() -> None:
    model = tiny_gpt2()
    before = fingerprint(model)
    p = panel(model, small_batch(), steps=1, noise=0)
    p.controls["checkpointing"].value = True
    p.controls["micro_batch"].value = 2
    p.controls["accumulation"].value = 2
    p.apply_button.click()
    assert isinstance(p.applied, memlab.Applied) and p.applied.active
    assert p.applied.plan == Plan(micro_batch=2, accumulation=2, checkpointing=True)
    assert model.transformer.gradient_checkpointing  # on the live model
    assert not p.undo_button.disabled
    p.run_button.click()  # refused while a plan is applied
    assert len(p.report) == 0 and "click Undo" in p.status.value
    p.undo_button.click()
    assert p.applied is None and p.undo_button.disabled
    assert_same(before, fingerprint(model))


def test_effective_batch_and_plan_follow_the_controls() -> None:
    p = panel(tiny_gpt2(), small_batch(), steps=1, noise=0)
    assert p.plan() == Plan()  # all rows of the batch: micro_batch=None
    p.controls["micro_batch"].value = 1
    p.controls["accumulation"].value = 4
    p.controls["precision"].value = "bf16"
    assert p.plan() == Plan(micro_batch=1, accumulation=4, precision="bf16")
    assert "4 rows per optimizer step" in p.effective.value


def test_a_batch_that_needs_a_loss_fn_says_so_when_the_panel_is_built() -> None:
    with pytest.raises(MemlabError, match="loss_fn"):
        panel(torch.nn.Linear(4, 1), torch.randn(8, 4))


def test_the_fine_tuning_levers_have_controls_and_make_plans() -> None:
    p = panel(tiny_gpt2(), small_batch(), steps=1, noise=0)
    assert list(p.controls["adapter"].options) == ["none", "lora", "qlora"]
    assert list(p.controls["weights"].options) == ["fp32", "bf16"]
    assert p.controls["lora_rank"].description == "lora-rank" and p.controls["lora_rank"].value == 16
    p.controls["adapter"].value = "lora"
    p.controls["lora_rank"].value = 4
    assert p.plan() == Plan(adapter="lora", lora_rank=4)


def test_lora_alpha_shows_auto_never_zero() -> None:
    """lora_alpha's default None (twice the rank) shows as "auto", not as 0; a number typed is the plan's alpha,
    "auto" again is None, and a word the control does not know is said when Run is clicked."""
    p = panel(tiny_gpt2(), small_batch(), steps=1, noise=0)
    alpha = p.controls["lora_alpha"]
    assert alpha.value == "auto" and "auto" in alpha.options and "twice the rank" in alpha.tooltip
    p.controls["adapter"].value = "lora"
    assert p.plan() == Plan(adapter="lora") and p.plan().lora_alpha is None
    alpha.value = "32"
    assert p.plan() == Plan(adapter="lora", lora_alpha=32)
    alpha.value = 8  # as a plan's value is set on it (a trainer's own settings)
    assert alpha.value == "8" and p.plan().lora_alpha == 8
    alpha.value = None
    assert alpha.value == "auto" and p.plan().lora_alpha is None
    alpha.value = "lots"
    p.run_button.click()
    assert "lora_alpha='lots' is not a whole number" in unescape(p.status.value) and not p.report.trials


def test_closing_a_panel_lets_its_model_go() -> None:
    import gc
    import weakref

    model = tiny_gpt2()
    alive = weakref.ref(model)
    p = panel(model, small_batch(), steps=1, noise=0)
    p.run_button.click()
    p.close()
    del p, model
    gc.collect()
    assert alive() is None


def test_every_control_has_its_lever_name_and_a_tooltip_that_says_what_it_does_and_costs() -> None:
    p = panel(tiny_gpt2(), small_batch(), steps=1, noise=0)
    assert not HIDDEN & set(p.controls)  # no live step switches them
    for name, spec in LEVERS.items():
        if name in HIDDEN:
            continue
        control = p.controls[name]
        assert control.description == name.replace("_", "-")
        assert control.tooltip == spec.help, name
    assert p.controls["accumulation"].description == "accumulation"
    assert "steps" not in p.controls["accumulation"].description
    budget = p.controls["budget"]
    assert budget.description == "budget" and "8GiB" in budget.tooltip and "does not fit" in budget.tooltip
    # every input and button anywhere in the panel, not only those in p.controls (text to read is no control)
    shown = (widgets.HTML, widgets.HTMLMath, widgets.Label)
    inputs = [
        w for w in _widgets_in(p) if isinstance(w, (widgets.ValueWidget, widgets.Button)) and not isinstance(w, shown)
    ]
    assert len(inputs) == len(p.controls) + 4 + 1  # and the four buttons, and the timeline's "timeline of" list
    assert all(isinstance(w.tooltip, str) and len(w.tooltip) > 10 for w in inputs), [
        w.description for w in inputs if not w.tooltip
    ]


def _widgets_in(widget: widgets.Widget) -> list[widgets.Widget]:
    found = []
    for child in getattr(widget, "children", ()):
        found += [child, *_widgets_in(child)]
    return found


def test_clear_empties_the_report_table_and_figure_and_leaves_the_model_alone() -> None:
    model = tiny_gpt2()
    before = fingerprint(model)
    p = panel(model, small_batch(), steps=1, noise=0, budget="64MiB")
    p.run_button.click()
    assert len(p.report) == 1 and "plain" in p.table.value
    assert "plain: fits, peak" in p.status.value  # a budget to fit: the verdict is said
    assert next(trace for trace in p.figure.widget.data if trace.name == "fits").showlegend is True
    old_figure = p.figure
    p.clear_button.click()
    assert len(p.report) == 0 and p.report.budget == 64 * MIB
    assert "plain" not in p.table.value
    assert len(p.figure.report) == 0 and p.figure is not old_figure
    assert p.figure.widget in p.children and old_figure.widget not in p.children
    assert all(len(trace.x or ()) == 0 for trace in p.figure.widget.data)  # nothing drawn, live trace included
    assert "Cleared 1 result" in p.status.value
    assert_same(before, fingerprint(model))
    p.run_button.click()  # the panel goes on working after a Clear
    assert [trial.label for trial in p.report] == ["plain"] and len(p.figure.report) == 1


def test_apply_of_a_setting_this_panel_did_not_measure_applies_it_with_a_warning() -> None:
    p = panel(tiny_gpt2(), small_batch(), steps=1, noise=0)
    p.run_button.click()  # measures plain
    p.controls["checkpointing"].value = True
    p.apply_button.click()
    assert isinstance(p.applied, Applied) and p.applied.plan == Plan(checkpointing=True)
    status = p.status.value
    assert "memlab-warn" in status and "Not measured" in status and "may not fit" in status and "Run" in status
    p.undo_button.click()
    p.controls["checkpointing"].value = False
    p.apply_button.click()  # plain was measured: no warning
    assert "memlab-ok" in p.status.value and "measured peak" in p.status.value
    p.undo_button.click()
    p.clear_button.click()
    p.apply_button.click()  # cleared: not measured any more
    assert "Not measured" in p.status.value
    p.undo_button.click()


def test_apply_after_a_run_that_did_not_fit_warns() -> None:
    p = panel(tiny_gpt2(), small_batch(), steps=1, noise=0, budget="64KiB")
    assert p.run().status == "oom"
    p.controls["budget"].value = ""
    p.apply_button.click()
    assert "Not measured" in p.status.value
    p.undo_button.click()


@pytest.fixture
def ipython() -> Iterator[Any]:
    from IPython.testing import globalipapp

    shell = globalipapp.get_ipython()  # the session's one test shell (see tests/frontends/jupyter/magic/test_magic.py)
    names = set(shell.user_ns)
    yield shell
    for name in set(shell.user_ns) - names:
        shell.user_ns.pop(name)


def test_messages_name_the_users_own_variable(ipython: Any) -> None:
    import IPython

    assert IPython.get_ipython() is ipython
    net = tiny_gpt2()
    ipython.user_ns.update(net=net, rows=small_batch())
    p = panel(net, ipython.user_ns["rows"], steps=1, noise=0)
    assert "on net." in p.status.value
    ipython.user_ns["board"] = p
    p.controls["checkpointing"].value = True
    p.apply_button.click()
    status = p.status.value
    assert "applied to net" in status and "board.applied.step(rows)" in status
    p.run_button.click()
    assert "applied to net; click Undo" in p.status.value
    p.undo_button.click()
    p.clear_button.click()
    assert "net is untouched" in p.status.value
    said = [p.status.value]
    p.run_button.click()
    said.append(p.status.value)
    assert not any("model" in text for text in said), said


def test_messages_without_a_variable_say_the_model_or_the_given_name(ipython: Any) -> None:
    p = panel(tiny_gpt2(), small_batch(), steps=1, noise=0)  # the model is in no variable
    assert "on the model." in p.status.value
    p.apply_button.click()
    assert "to the model" in p.status.value and "the panel&#x27;s applied.step(...)" in p.status.value
    p.undo_button.click()
    ipython.user_ns["net"] = p.model
    named = panel(p.model, small_batch(), steps=1, noise=0, name="trainer.model")
    assert named.model_name() == "trainer.model" and "on trainer.model." in named.status.value
    with pytest.raises(MemlabError, match="name="):
        panel(tiny_gpt2(), small_batch(), name="")


def test_user_variable_name_is_by_identity_and_skips_output_history() -> None:
    value = [1, 2]
    assert user_variable_name(value, {"_": value, "_3": value, "copy": [1, 2], "mine": value}) == "mine"
    assert user_variable_name(value, {"copy": [1, 2]}) is None


def test_close_runs_are_timed_again_in_turn_so_noise_never_crowns_a_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """The panel's own earlier run, timed while the machine was busy (84 samples/s), and a new one at 110: the
    panel times both again in turn, A B A B as ``compare`` does, and names the best from those rounds alone."""
    from memlab.frontends.jupyter import panel_core
    from memlab.report import Trial

    order: list[str] = []
    # seconds per step of 8 rows, per plan in the order it is run: plain first under load; in the three rounds in
    # turn that follow, plain is the faster one
    seconds = {"plain": iter([8 / 84, 0.060, 0.061, 0.059]), "ckpt": iter([8 / 110, 0.070, 0.071, 0.069])}

    def compare(model: Any, batch: Any, plans: list[Plan], **options: Any) -> Report:
        (plan,) = plans
        order.append(plan.label())
        step = next(seconds[plan.label()])
        times = (step * 0.99, step, step * 1.01)
        trial = Trial(plan, "ok", 50 * MIB, {"params": 50 * MIB}, step, 8 / step, None, "cpu", rows_per_step=8,
                      step_times=times, budget=options.get("budget"))
        return Report([trial], budget=options.get("budget"))

    monkeypatch.setattr(panel_core, "compare", compare)
    p = panel(torch.nn.Sequential(torch.nn.Linear(4, 4)), torch.randn(8, 4), loss_fn=lambda m, b: m(b).sum(),
              steps=3, noise=0.05)
    p.run()
    p.controls["checkpointing"].value = True
    shown = p.run()
    assert order == ["plain", "ckpt", *["ckpt", "plain"] * 3]  # then in turn, the fastest so far first
    assert [len(trial.step_runs) for trial in p.report] == [4, 4]
    best = p.report.best
    assert best is not None and best.label == "plain"  # not ckpt, which only its single run under load favoured
    assert shown is not None and shown.label == "ckpt" and "timed again in turn" in shown.notes[-1]
    assert p.figure.report.trials == p.report.trials
    # noise=0 (steps counted, not timed to a noise target): no race is settled, as in compare
    order.clear()
    quiet = panel(torch.nn.Sequential(torch.nn.Linear(4, 4)), torch.randn(8, 4), loss_fn=lambda m, b: m(b).sum(),
                  steps=1, noise=0)
    seconds = {"plain": iter([0.1, 0.1])}
    quiet.run()
    quiet.run()
    assert order == ["plain", "plain"]


@pytest.mark.parametrize(("budget", "named"), [("80MiB", True), ("60MiB", False)])
def test_memory_held_before_is_named_only_where_it_changes_the_verdict(
    budget: str, named: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memlab.frontends.jupyter import panel_core
    from memlab.report import Trial

    def compare(model: Any, batch: Any, plans: list[Plan], **options: Any) -> Report:
        trial = Trial(plans[0], "ok", 90 * MIB, {"params": 70 * MIB, "other": 20 * MIB}, 0.1, 80.0, None, "cpu",
                      rows_per_step=8, budget=options.get("budget"), preexisting_bytes=16 * MIB)
        return Report([trial], budget=options.get("budget"))

    monkeypatch.setattr(panel_core, "compare", compare)
    p = panel(torch.nn.Sequential(torch.nn.Linear(4, 4)), torch.randn(8, 4), loss_fn=lambda m, b: m(b).sum(),
              steps=1, noise=0, budget=budget)
    p.run()
    assert "does not fit" in p.status.value
    # 90 MiB with 16 MiB held before: over 80 MiB only because of it (named), over 60 MiB either way (not named)
    assert ("16.0 MiB of it was held before the run: without it, it would fit" in p.status.value) is named
    assert ("Held before the trials: 16.0 MiB" in p.table.value) is named


def test_checkpointing_is_a_drop_down_of_exactly_the_values_the_model_allows() -> None:
    """The checkpointing control is a real ipywidgets drop-down (no text box): off, every block, and 1 to L - 1 of
    the model's L blocks (L of L is every block, the same plan); the plan gets False, True or the count, and a value
    the plan would refuse (more blocks than the model has, a word, an index past the list) cannot be set."""
    blocks = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()) for _ in range(4)))
    model = torch.nn.Sequential(blocks, torch.nn.Linear(4, 1))
    p = panel(model, torch.randn(8, 4), loss_fn=lambda m, b: m(b).mean(), steps=1, noise=0)
    control = p.controls["checkpointing"]
    assert isinstance(control, widgets.Dropdown) and not isinstance(control, widgets.Text | widgets.Combobox)
    assert control.options == (("off", "off"), ("every block", "all"), ("1 of 4 blocks", "1"), ("2 of 4 blocks", "2"),
                               ("3 of 4 blocks", "3"))
    assert control.label == "off" and p.plan() == Plan()
    made = {}
    for index in range(len(control.options)):  # as the browser picks: by index
        control.index = index
        made[control.label] = p.plan().checkpointing
    assert made == {"off": False, "every block": True, "1 of 4 blocks": 1, "2 of 4 blocks": 2, "3 of 4 blocks": 3}
    assert [type(value) for value in made.values()] == [bool, bool, int, int, int]
    control.value = 4  # all four of four is every block
    assert control.label == "every block" and p.plan().checkpointing is True
    control.value = 2
    for invalid in (5, "5", "lots", "on", -1):
        with pytest.raises(traitlets.TraitError):
            control.value = invalid
    with pytest.raises(traitlets.TraitError):
        control.index = len(control.options)
    assert control.label == "2 of 4 blocks" and p.plan().checkpointing == 2
    # A model with no repeated blocks offers no count at all; tiny GPT-2's two blocks offer one.
    assert panel(torch.nn.Linear(4, 1), torch.randn(8, 4), loss_fn=lambda m, b: m(b).mean()).controls[
        "checkpointing"].options == (("off", "off"), ("every block", "all"))
    assert [label for label, _ in panel(tiny_gpt2(), small_batch()).controls["checkpointing"].options] == [
        "off", "every block", "1 of 2 blocks"]


def test_the_budget_fields_are_wide_enough_for_their_label_and_placeholder() -> None:
    """Issue 84 item 9: the host budget's placeholder was cut ("e.g. 64GiB; empty: the mac") in its 260-px field.
    Each text field of the panel is as wide as its label and its whole placeholder at JupyterLab's 13 px, estimated
    generously (a character is 0.6 of the font size), with room for the field's padding."""
    from memlab.report.views.plan_axis import text_width

    board = panel(tiny_gpt2(), small_batch(), steps=1, noise=0)
    fields = [control for control in board.controls.values() if isinstance(control, widgets.Text)]
    assert {field.description for field in fields} >= {"budget", "host budget"}
    for field in fields:
        needs = text_width(field.description, 13) + text_width(field.placeholder, 13) + 24
        assert int(field.layout.width.removesuffix("px")) >= needs, (field.description, field.layout.width, needs)
