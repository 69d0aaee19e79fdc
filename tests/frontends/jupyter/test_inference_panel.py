"""Inference mode in Jupyter: ``%memfit --inference`` in a real IPython shell (a grid of inference settings, the
largest batch within a budget, a dry run, and bad input as one-line UsageErrors before the model is touched), and
the panel's inference mode with real widgets (buttons clicked from Python)."""

from __future__ import annotations

import builtins
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.testing import globalipapp
from models import assert_same, fingerprint, tiny_llama

import memlab
from memlab.inference import LargestBatchReport
from memlab.plan import INFERENCE_LEVERS
from memlab.report import INFERENCE_CATEGORIES, InferenceTrial

FAST = "--steps 1 --warmup 0 --noise 0 --quiet"


@pytest.fixture(scope="module")
def shell() -> Iterator[InteractiveShell]:
    builtins.__dict__.pop("_", None)
    ip = globalipapp.get_ipython()
    assert ip is not None
    ip.run_line_magic("load_ext", "memlab")
    ip.user_ns.update(lm=tiny_llama(layers=1, width=32).eval(), prompts={"input_ids": torch.randint(0, 128, (2, 8))})
    yield ip
    for name in ("lm", "prompts"):
        ip.user_ns.pop(name, None)


def memfit(shell: InteractiveShell, line: str, body: str | None = None) -> Any:
    if body is None:
        return shell.run_line_magic("memfit", line)
    return shell.run_cell_magic("memfit", line, body)


def test_inference_grid_measures_every_setting_and_leaves_the_model_alone(shell: InteractiveShell) -> None:
    before = fingerprint(shell.user_ns["lm"])
    report = memfit(shell, f"lm prompts --inference --try weights=fp32,bf16 new_tokens=0,3 {FAST}")
    assert [t.label for t in report] == ["fp32", "fp32 gen3", "bf16", "bf16 gen3"]
    assert all(isinstance(t, InferenceTrial) and t.status == "ok" for t in report)
    assert report[2].breakdown["params"] * 2 == report[0].breakdown["params"]
    assert report[1].kv_cache_end_bytes > 0
    assert_same(before, fingerprint(shell.user_ns["lm"]))
    cell = memfit(shell, f"lm prompts --inference {FAST}", "\n")  # the cell form with an empty body
    assert [t.label for t in cell] == ["fp32"]


def test_budget_alone_finds_the_largest_batch(shell: InteractiveShell) -> None:
    one = memfit(shell, f"lm prompts --inference --try batch_size=1 {FAST}")[0]
    budget = one.peak_bytes + 256 * 1024
    report = memfit(shell, f"lm prompts --inference --budget {budget}B --try new_tokens=2 {FAST}")
    assert isinstance(report, LargestBatchReport)
    assert report.best is not None and report.best.rows_per_step > 1 and report.best.plan.new_tokens == 2


def test_dry_run_estimates_inference(shell: InteractiveShell) -> None:
    report = memfit(shell, f"lm prompts --inference --dry-run --try quantize=none,nf4 {FAST}")
    assert [t.estimated for t in report] == [True, True]
    assert report[1].breakdown["params"] < report[0].breakdown["params"]


@pytest.mark.parametrize(
    ("line", "body", "says"),
    [
        ("lm prompts --inference --try precision=bf16", None, "'precision' is not an inference setting"),
        ("lm prompts --inference --apply", None, "--apply does not go with --inference"),
        ("lm prompts --inference --batch-size 8", None, "write --try batch_size=N"),
        ("lm prompts --inference --search --try weights=fp32,bf16", None, "add --try KEY=V1,V2 and --budget SIZE"),
        ("lm prompts --inference", "loss = lm(**prompts).logits.sum()", "leave the body empty"),
        ("lm prompts --inference --try quantize=int3", None, "write one of none, int8, nf4"),
        ("lm nothing --inference", None, "BATCH 'nothing' is not defined"),
        ("lm prompts --inference --lr 0.1", None, "--lr does not go with --inference.*drop --lr"),
        ("lm prompts --inference --dry-run --search --budget 1GiB --try weights=fp32,bf16", None,
         "--search does not go with --inference: a dry run estimates memory, not speed"),
    ],
)
def test_bad_input_is_one_usage_error(shell: InteractiveShell, line: str, body: str | None, says: str) -> None:
    before = fingerprint(shell.user_ns["lm"])
    with pytest.raises(UsageError, match=says) as caught:
        memfit(shell, line, body)
    assert "\n" not in str(caught.value)
    assert_same(before, fingerprint(shell.user_ns["lm"]))


def test_panel_inference_mode_runs_settings_and_finds_the_largest_batch() -> None:
    model = tiny_llama(layers=1, width=32).eval()
    prompts = {"input_ids": torch.randint(0, 128, (2, 8))}
    before = fingerprint(model)
    panel = memlab.panel(model, prompts, inference=True, steps=1, warmup=0, noise=0)
    try:
        assert set(panel.controls) == {*INFERENCE_LEVERS, "budget"}
        for name, spec in INFERENCE_LEVERS.items():
            assert panel.controls[name].tooltip == spec["help"]
            assert panel.controls[name].description == name.replace("_", "-")
        panel.controls["weights"].value = "bf16"
        panel.controls["new_tokens"].value = 3
        panel.run_button.click()
        assert [trial.label for trial in panel.report] == ["bf16 gen3"]
        assert "(no budget set)" in panel.status.value and not panel.run_button.disabled
        assert [trace.name for trace in panel.figure.widget.data][:4] == list(INFERENCE_CATEGORIES)
        assert panel.figure.widget.data[2].y[0] > 0  # the KV cache's bar
        peak = panel.report[0].peak_bytes
        panel.controls["budget"].value = f"{peak + 64 * 1024}B"
        panel.largest_button.click()
        found = [trial for trial in panel.report if trial.fits and trial.rows_per_step]
        assert max(trial.rows_per_step or 0 for trial in found) > 2
        panel.controls["budget"].value = "lots"
        panel.run_button.click()
        assert "Cannot run" in panel.status.value and "write" in panel.status.value
        panel.controls["budget"].value = "plenty"
        assert panel.largest_batch() is None  # a status line, never an exception out of a button
        assert "budget &#x27;plenty&#x27; is not understood" in panel.status.value
        panel.clear_button.click()
        assert len(panel.report) == 0
    finally:
        panel.close()
    assert_same(before, fingerprint(model))


def test_the_live_figure_stacks_the_inference_categories(
    shell: InteractiveShell, monkeypatch: pytest.MonkeyPatch
) -> None:
    import IPython.display

    from memlab.frontends.jupyter.live import LiveOutput
    from memlab.frontends.jupyter.magic import render as magic_render

    shown: list[Any] = []

    class Handle:
        def update(self, obj: Any, **keywords: Any) -> None:
            shown.append(obj)

    def display(obj: Any, *args: Any, **keywords: Any) -> Handle:
        shown.append(obj)
        return Handle()

    made: list[LiveOutput] = []

    class Recorded(LiveOutput):
        def __init__(self, *args: Any, **keywords: Any) -> None:
            super().__init__(*args, **keywords)
            made.append(self)

    monkeypatch.setattr(IPython.display, "display", display)
    monkeypatch.setattr(magic_render, "shows_widgets", lambda shell: True)  # as in a Jupyter kernel
    monkeypatch.setattr(magic_render, "LiveOutput", Recorded)
    report = memfit(shell, "lm prompts --inference --try new_tokens=0,2 --steps 1 --warmup 0 --noise 0")
    figure = made[0].figure
    assert figure is not None
    assert [trace.name for trace in figure.widget.data][:4] == list(INFERENCE_CATEGORIES)
    assert list(figure.widget.data[0].x) == [trial.label for trial in report]
    record = shown[-1]  # the static record that replaced the live figure
    assert "kv_cache" in record["image/svg+xml"] and "grads" not in record["image/svg+xml"]


def test_a_closed_panel_lets_the_model_go_after_runs_and_clear() -> None:
    import gc
    import weakref

    model = tiny_llama(layers=1, width=32).eval()
    panel = memlab.panel(model, {"input_ids": torch.randint(0, 128, (2, 8))}, inference=True, steps=1, warmup=0,
                         noise=0)
    panel.run_button.click()
    old_figure = panel.figure.widget
    panel.clear_button.click()
    assert old_figure.comm is None and panel.figure.widget in panel.children  # the old figure is closed
    panel.close()
    assert panel.run_button.comm is None and panel.controls["weights"].comm is None
    model_ref = weakref.ref(model)
    del model, panel, old_figure
    gc.collect()
    assert model_ref() is None  # ipywidgets keeps open widgets: one left open would keep the model alive
    with pytest.raises(memlab.MemlabError, match="drop lr"):
        memlab.panel(tiny_llama(layers=1, width=32), {"input_ids": torch.randint(0, 128, (2, 8))}, inference=True,
                     lr=0.1)


def test_ctrl_c_in_the_panel_keeps_the_settings_measured_before_it() -> None:
    model = tiny_llama(layers=1, width=32).eval()

    def interrupt_large_batches(module: torch.nn.Module, args: Any) -> None:
        if args[0].shape[0] > 2:  # the search's third size, after 1 and 2 rows
            raise KeyboardInterrupt

    handle = model.model.layers[0].register_forward_pre_hook(interrupt_large_batches)
    panel = memlab.panel(model, {"input_ids": torch.randint(0, 128, (2, 8))}, inference=True, steps=1, warmup=0,
                         noise=0, budget="64MiB")
    try:
        before = fingerprint(model)
        assert panel.largest_batch() is None
        assert [trial.rows_per_step for trial in panel.report] == [1, 2]
        assert "Interrupted" in panel.status.value and "2 setting(s) measured" in panel.status.value
        assert_same(before, fingerprint(model))
    finally:
        panel.close()
        handle.remove()
