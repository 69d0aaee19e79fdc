"""Bad input and odd endings: one clear MemlabError that says what to write, and the model as it was.

Each test here failed before its fix (a raw TypeError or torch error, an "ok" trial for a NaN loss, a second
applied plan that could not be undone, finished trials lost on Ctrl-C).
"""

from __future__ import annotations

import sys

import pytest
import torch
from models import assert_same, fingerprint, lm_batch, mlp_batch, mlp_loss, tiny_llama, tiny_mlp

import memlab
from memlab.errors import MemlabError, UnsupportedTechnique
from memlab.techniques.checkpointing import is_checkpointing


def test_compare_without_plans_says_what_to_pass() -> None:
    with pytest.raises(MemlabError, match="not a list of plans"):
        memlab.compare(tiny_mlp(), mlp_batch(), None, loss_fn=mlp_loss)  # type: ignore[arg-type]


def test_a_one_argument_loss_fn_is_refused_before_anything_runs() -> None:
    model = tiny_mlp()
    before = fingerprint(model)
    with pytest.raises(MemlabError, match=r"cannot be called as loss_fn\(model, batch\)"):
        memlab.measure(model, mlp_batch(), memlab.Plan(), loss_fn=lambda batch: batch[0].sum())
    assert_same(before, fingerprint(model))


def test_fp16_weights_with_fp16_precision_say_what_to_write() -> None:
    model = tiny_mlp().half()
    batch = tuple(t.half() for t in mlp_batch())
    trial = memlab.measure(model, batch, memlab.Plan(precision="fp16"), loss_fn=mlp_loss, steps=1)
    assert trial.status == "error" and "load the model in fp32" in (trial.error or "")
    with pytest.raises(UnsupportedTechnique, match="precision='bf16'"):
        memlab.apply(model, memlab.Plan(precision="fp16"), loss_fn=mlp_loss)


def test_a_model_or_batch_on_the_meta_device_points_to_estimate() -> None:
    with torch.device("meta"):
        meta_model = tiny_mlp()
    with pytest.raises(MemlabError, match="meta device .* memlab.estimate"):
        memlab.measure(meta_model, mlp_batch(), memlab.Plan(), loss_fn=mlp_loss)
    meta_batch = tuple(t.to("meta") for t in mlp_batch())
    with pytest.raises(MemlabError, match="the batch is on the meta device"):
        memlab.measure(tiny_mlp(), meta_batch, memlab.Plan(), loss_fn=mlp_loss)


def test_negative_shapes_in_estimate_are_refused() -> None:
    with pytest.raises(MemlabError, match="size below 1"):
        memlab.estimate(tiny_llama(), {"input_ids": (1, -8), "labels": (1, -8)}, device="cpu")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_loss_is_an_error_never_ok(value: float) -> None:
    model = tiny_mlp()
    before = fingerprint(model)
    trial = memlab.measure(model, mlp_batch(), memlab.Plan(), loss_fn=lambda m, b: mlp_loss(m, b) * value, steps=1)
    assert trial.status == "error" and f"the loss is {value}" in (trial.error or "")
    assert_same(before, fingerprint(model))


def test_applying_twice_then_undoing_leaves_the_model_as_it_was() -> None:
    model = tiny_llama()
    before = fingerprint(model)
    first = memlab.apply(model, memlab.Plan(checkpointing=True))
    with pytest.warns(UserWarning, match="ckpt was still applied"):
        second = memlab.apply(model, memlab.Plan(checkpointing=True))
    assert not first.active and second.active
    second.undo()
    assert not is_checkpointing(model)
    assert_same(before, fingerprint(model))


def test_ctrl_c_during_compare_keeps_the_finished_trials() -> None:
    model = tiny_mlp()
    before = fingerprint(model)
    calls = {"n": 0}

    def interrupted_in_the_second_plan(m: torch.nn.Module, b: object) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] > 4:  # plain takes 3 calls (warm-up, tracked, timed): this stops the second plan
            raise KeyboardInterrupt
        return mlp_loss(m, b)

    plans = [memlab.Plan(), memlab.Plan(checkpointing=True), memlab.Plan(micro_batch=2, accumulation=4)]
    with pytest.raises(KeyboardInterrupt) as caught:
        memlab.compare(model, mlp_batch(), plans, loss_fn=interrupted_in_the_second_plan, steps=1, warmup=1)
    report = caught.value.report  # type: ignore[attr-defined]
    assert [t.label for t in report] == ["plain"] and report[0].status == "ok"
    assert_same(before, fingerprint(model))


def test_an_interrupted_memfit_cell_returns_what_it_measured_and_keeps_no_traceback(capsys) -> None:
    from IPython.testing import globalipapp

    shell = globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "memlab")
    shell.user_ns.update(net=tiny_mlp(), pairs=mlp_batch(), calls=[])
    body = (
        "calls.append(1)\n"
        "if len(calls) > 4:\n"
        "    raise KeyboardInterrupt\n"
        "x, y = pairs\n"
        "loss = (net(x).squeeze(-1) - y).pow(2).mean()"
    )
    sys.last_value = None  # type: ignore[assignment]
    report = shell.run_cell_magic("memfit", "net pairs --try checkpointing=off,on --steps 1 --quiet", body)
    assert [t.label for t in report] == ["plain"]
    assert "Interrupted: 1 plan(s) were measured" in capsys.readouterr().out
    assert getattr(sys, "last_value", None) is None
    shell.user_ns.pop("calls")


def test_the_same_budget_rules_everywhere_a_budget_is_given() -> None:
    for call in (
        lambda: memlab.measure(tiny_mlp(), mlp_batch(), memlab.Plan(), loss_fn=mlp_loss, budget="1.5"),
        lambda: memlab.estimate(tiny_llama(), lm_batch(rows=1), budget="24", device="cpu"),
        lambda: memlab.panel(tiny_mlp(), mlp_batch(), loss_fn=mlp_loss, budget="24"),
    ):
        with pytest.raises(MemlabError, match="has no unit"):
            call()
