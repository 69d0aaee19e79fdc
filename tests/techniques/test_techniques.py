"""The techniques as one step puts them on (issue 2), on real tiny models: apply then undo bit-exact, what undo keeps
of training, the refusals of a batch, loss or model a step cannot run, and a step's gradients checked against the
plain full batch. Each lever's own behaviour is in its file (test_accumulation.py, test_checkpointing.py, ...)."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from models import (
    MODELS,
    VOCAB,
    assert_same,
    fingerprint,
    lm_batch,
    mlp_batch,
    mlp_loss,
    optimizer_gradients,
    relative_error,
    tiny_gpt2,
    tiny_mlp,
)
from torch import nn

import memlab


@pytest.mark.parametrize("name", sorted(MODELS))
def test_apply_then_undo_without_training_is_bit_exact(name):
    build, make_batch, loss_fn = MODELS[name]
    model = build()
    model.eval()
    before = fingerprint(model)
    applied = memlab.apply(model, memlab.Plan(checkpointing=True, precision="bf16", accumulation=2), loss_fn=loss_fn)
    applied.undo()
    assert_same(before, fingerprint(model))


def test_undo_keeps_what_training_did_and_takes_the_rest_off():
    model, batch = tiny_gpt2(), lm_batch(rows=4)
    model.eval()
    before = fingerprint(model)
    applied = memlab.apply(model, memlab.Plan(checkpointing=True))
    applied.step(batch)
    applied.undo()
    after = fingerprint(model)
    assert not torch.equal(after["tensors"]["lm_head.weight"][1], before["tensors"]["lm_head.weight"][1])
    for key in ("training", "hooks", "patched", "checkpointing", "requires_grad", "param_ids"):
        assert after[key] == before[key], key
    with pytest.raises(RuntimeError, match="undone"):
        applied.step(batch)


def test_rows_repeat_when_the_plan_asks_for_more_than_the_batch_has():
    from memlab.techniques.accumulation import micro_batches

    parts = micro_batches({"x": torch.arange(3)}, memlab.Plan(micro_batch=2, accumulation=3))
    assert [p["x"].tolist() for p in parts] == [[0, 1], [2, 0], [1, 2]]


# Bad input: one clear error each, and the model unchanged.


def test_a_model_without_trainable_parameters_is_refused():
    model = tiny_mlp()
    for p in model.parameters():
        p.requires_grad_(False)
    before = fingerprint(model)
    with pytest.raises(memlab.MemlabError, match="no trainable parameters"):
        memlab.apply(model, memlab.Plan(), loss_fn=mlp_loss)
    with pytest.raises(memlab.MemlabError, match="no trainable parameters"):
        memlab.measure(model, mlp_batch(), memlab.Plan(), loss_fn=mlp_loss)
    assert_same(before, fingerprint(model))


def test_batch_tensors_that_disagree_on_rows_are_refused():
    model = tiny_gpt2()
    before = fingerprint(model)
    batch = {"input_ids": torch.randint(0, VOCAB, (4, 8)), "labels": torch.randint(0, VOCAB, (3, 8))}
    with pytest.raises(memlab.MemlabError, match="disagree on the number of rows"):
        memlab.measure(model, batch, memlab.Plan())
    with memlab.apply(model, memlab.Plan()) as applied, pytest.raises(memlab.MemlabError, match="disagree"):
        applied.step(batch)
    assert_same(before, fingerprint(model))


def test_a_loss_that_is_not_a_scalar_is_refused():
    model = tiny_mlp()
    model.eval()
    before = fingerprint(model)
    with memlab.apply(model, memlab.Plan(), loss_fn=lambda m, b: m(b[0])) as applied:
        with pytest.raises(memlab.MemlabError, match="not a scalar; reduce it"):
            applied.step(mlp_batch())
    assert_same(before, fingerprint(model))
    trial = memlab.measure(model, mlp_batch(), memlab.Plan(), loss_fn=lambda m, b: m(b[0]))
    assert trial.status == "error" and "not a scalar" in trial.error
    assert_same(before, fingerprint(model))


def test_a_dict_batch_for_a_model_without_loss_needs_a_loss_fn():
    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return {"hidden": x}

    model = Encoder()
    model.eval()
    before = fingerprint(model)
    with memlab.apply(model, memlab.Plan()) as applied, pytest.raises(memlab.MemlabError, match="pass loss_fn="):
        applied.step({"x": torch.randn(4, 8)})
    assert_same(before, fingerprint(model))
    with pytest.raises(memlab.MemlabError, match="needs a loss_fn"):
        memlab.measure(model, torch.randn(4, 8), memlab.Plan())




def test_import_memlab_pulls_in_no_jupyter_or_bitsandbytes():
    code = (
        "import sys, memlab\n"
        "heavy = [m for m in ('IPython', 'ipywidgets', 'plotly', 'anywidget', 'bitsandbytes') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)




def test_a_step_ignores_gradients_left_by_the_users_own_backward():
    model, batch = tiny_mlp(), mlp_batch()
    want = optimizer_gradients(model, batch, memlab.Plan(), mlp_loss)
    dirty = copy.deepcopy(model)
    mlp_loss(dirty, batch).backward()  # stale gradients the user left behind
    got = optimizer_gradients(dirty, batch, memlab.Plan(), mlp_loss)
    assert relative_error(got, want) < 1e-6


def test_a_step_that_fails_half_way_leaves_no_gradients_for_the_next():
    model, batch = tiny_mlp(), mlp_batch()
    want = optimizer_gradients(model, batch, memlab.Plan(micro_batch=4, accumulation=2), mlp_loss)
    calls = {"n": 0}

    def fails_on_second_micro_batch(m, b):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("out of memory (simulated)")
        return mlp_loss(m, b)

    twin = copy.deepcopy(model)
    applied = memlab.apply(twin, memlab.Plan(micro_batch=4, accumulation=2), loss_fn=fails_on_second_micro_batch)
    with pytest.raises(RuntimeError):
        applied.step(batch)
    assert all(p.grad is None for p in twin.parameters())
    seen: list[torch.Tensor] = []
    applied.optimizer.register_step_pre_hook(
        lambda opt, a, k: seen.extend(p.grad.clone() for g in opt.param_groups for p in g["params"])
    )
    applied.step(batch)
    applied.undo()
    assert relative_error(seen, want) < 1e-5
