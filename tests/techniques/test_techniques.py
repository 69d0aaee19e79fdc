"""Issue 2: each technique on real tiny models, gradients checked against the plain full batch."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from models import MODELS, VOCAB, assert_same, fingerprint, lm_batch, mlp_batch, mlp_loss, tiny_gpt2, tiny_mlp
from torch import nn

import memlab
from memlab.techniques.optimizer import state_tensors
from memlab.techniques.precision import ScaledStep


def optimizer_gradients(model: nn.Module, batch, plan: memlab.Plan, loss_fn=None) -> list[torch.Tensor]:
    """The gradients the optimizer sees at its first step (read by a step pre-hook), on a copy of the model."""
    model = copy.deepcopy(model)
    applied = memlab.apply(model, plan, loss_fn=loss_fn)
    seen: list[torch.Tensor] = []

    def grab(optimizer, args, kwargs):
        seen.extend(p.grad.detach().clone() for group in optimizer.param_groups for p in group["params"])

    applied.optimizer.register_step_pre_hook(grab)
    applied.step(batch)
    applied.undo()
    return seen


def relative_error(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    top = torch.sqrt(sum(((g - w).double() ** 2).sum() for g, w in zip(got, want, strict=False)))
    bottom = torch.sqrt(sum((w.double() ** 2).sum() for w in want))
    return float(top / bottom)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_accumulation_gives_the_full_batch_gradient(name):
    build, make_batch, loss_fn = MODELS[name]
    model, batch = build(), make_batch(rows=8)
    full = optimizer_gradients(model, batch, memlab.Plan(micro_batch=8, accumulation=1), loss_fn)
    for micro_batch, accumulation in ((2, 4), (4, 2)):
        plan = memlab.Plan(micro_batch=micro_batch, accumulation=accumulation)
        accumulated = optimizer_gradients(model, batch, plan, loss_fn)
        assert len(accumulated) == len(full)
        assert relative_error(accumulated, full) < 1e-4, plan.label()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_checkpointing_keeps_the_gradients(name):
    build, make_batch, loss_fn = MODELS[name]
    model, batch = build(), make_batch(rows=4)
    plain = optimizer_gradients(model, batch, memlab.Plan(), loss_fn)
    checkpointed = optimizer_gradients(model, batch, memlab.Plan(checkpointing=True), loss_fn)
    assert relative_error(checkpointed, plain) < 1e-5


def test_checkpointing_really_recomputes_the_blocks():
    model, batch = tiny_mlp(), mlp_batch(rows=4)
    calls = {"count": 0}
    block = model[0]
    inner = block[0]  # hooks on the block itself run outside the checkpoint; its insides run twice
    inner.register_forward_pre_hook(lambda module, args: calls.__setitem__("count", calls["count"] + 1))
    with memlab.apply(model, memlab.Plan(checkpointing=True), loss_fn=mlp_loss) as applied:
        applied.step(batch)
    assert calls["count"] == 2  # once in forward, once again in backward
    assert "forward" not in block.__dict__


def test_hugging_face_checkpointing_goes_back_to_the_previous_setting():
    model = tiny_gpt2()
    before = fingerprint(model)
    with memlab.apply(model, memlab.Plan(checkpointing=True)) as applied:
        assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
        applied.step(lm_batch(rows=2))
    after = fingerprint(model)
    assert after["checkpointing"] == before["checkpointing"]
    assert after["hooks"] == before["hooks"] and after["patched"] == before["patched"]


def test_8bit_adam_state_is_uint8_and_under_30_percent_of_adamw():
    model, batch = tiny_gpt2(width=128), lm_batch(rows=2)
    sizes = {}
    for optimizer in ("adamw", "adamw8bit"):
        with memlab.apply(copy.deepcopy(model), memlab.Plan(optimizer=optimizer)) as applied:
            applied.step(batch)
            tensors = state_tensors(applied.optimizer)
            sizes[optimizer] = sum(t.numel() * t.element_size() for t in tensors)
            if optimizer == "adamw8bit":
                moments = [t for t in tensors if t.numel() >= 4096]
                assert moments and all(t.dtype == torch.uint8 for t in moments)
    assert sizes["adamw8bit"] <= 0.30 * sizes["adamw"], sizes


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_keeps_fp32_master_weights_and_trains(precision):
    model, batch = tiny_gpt2(), lm_batch(rows=4)
    with memlab.apply(model, memlab.Plan(precision=precision), lr=1e-2) as applied:
        first = applied.step(batch)
        for _ in range(5):
            last = applied.step(batch)
        assert all(p.dtype == torch.float32 for p in model.parameters())
        assert isinstance(applied._step.parts.optimizer_step, ScaledStep) == (precision == "fp16")
    assert last < first
    if precision == "fp16":
        assert any("fp16 on CPU is slow" in note for note in applied.notes)


def test_bf16_measured_on_a_cpu_says_why_it_is_slow_where_its_speed_is_read():
    """Issue 71 item 11: notebook 06's bf16 plans ran about ten times slower than fp32 on a CPU and nothing said why.
    The trial says it (a note: the table's notes, the CLI's), and the figures say it from the trial, in the key under
    the static figure and in the plotly figure's hover of each such plan; an fp32 plan says nothing of it, nor does
    a dry run."""
    from memlab.report.figure import report_figure
    from memlab.report.static import report_svg
    from memlab.report.tables import text_table
    from memlab.techniques.precision import BF16_ON_CPU

    report = memlab.compare(tiny_gpt2(), lm_batch(rows=4), [memlab.Plan(), memlab.Plan(precision="bf16")],
                            steps=1, noise=0, progress=False)
    plain, bf16 = report.trials
    assert BF16_ON_CPU in bf16.notes and BF16_ON_CPU not in plain.notes
    assert "bf16 on a CPU is usually slow" in text_table(report, width=200)
    svg = report_svg(report)  # once, beside the key's title (a search of 24 plans has 12 in bf16)
    assert svg.count("which emulate bf16") == 1 and "bf16 plans: slow on most CPUs, which emulate bf16" in svg
    hovers = [text for trace in report_figure(report).data if trace.hovertext for text in trace.hovertext]
    assert any("which emulate bf16" in text for text in hovers if "bf16" in text.split("<br>")[0])
    assert not any("which emulate bf16" in text for text in hovers if "plain" in text.split("<br>")[0])
    estimate = memlab.estimate(tiny_gpt2(), lm_batch(rows=4), memlab.Plan(precision="bf16"), device="cpu")
    assert BF16_ON_CPU not in estimate.notes


def test_offload_on_cpu_moves_nothing_and_says_so():
    model, batch = tiny_mlp(), mlp_batch()
    with memlab.apply(model, memlab.Plan(offload="all"), loss_fn=mlp_loss) as applied:
        assert isinstance(applied.optimizer, torch.optim.AdamW)
        applied.step(batch)
    assert any("moves nothing" in note for note in applied.notes)


def test_offloaded_optimizer_updates_like_the_plain_one():
    from memlab.techniques.offload import OffloadedOptimizer

    model, batch = tiny_mlp(), mlp_batch()
    twin = copy.deepcopy(model)
    plain = torch.optim.AdamW(model.parameters(), lr=1e-2)
    offloaded = OffloadedOptimizer(list(twin.parameters()), lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    for net, optimizer in ((model, plain), (twin, offloaded)):
        for _ in range(3):
            mlp_loss(net, batch).backward()
            optimizer.step()
            optimizer.zero_grad()
    for a, b in zip(model.parameters(), twin.parameters(), strict=False):
        assert torch.allclose(a, b, atol=1e-6)


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


def test_checkpointing_a_model_without_repeated_blocks_is_refused():
    model = nn.Linear(4, 1)
    before = fingerprint(model)
    with pytest.raises(memlab.UnsupportedTechnique, match="no repeated blocks"):
        memlab.apply(model, memlab.Plan(checkpointing=True), loss_fn=lambda m, b: m(b).mean())
    assert_same(before, fingerprint(model))


def test_import_memlab_pulls_in_no_jupyter_or_bitsandbytes():
    code = (
        "import sys, memlab\n"
        "heavy = [m for m in ('IPython', 'ipywidgets', 'plotly', 'anywidget', 'bitsandbytes') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_8bit_adam_ignores_overrides_left_on_bitsandbytes_singleton_for_other_models():
    """The Trainer registers 32-bit embeddings on bitsandbytes' global manager, keyed by position and never
    cleared; memlab's 8-bit optimizer must not inherit that for a different model."""
    import bitsandbytes

    shared = bitsandbytes.optim.GlobalOptimManager.get_instance()
    saved = (dict(shared.index2config), dict(shared.pid2config), list(shared.module_weight_config_triple))
    other = tiny_gpt2(width=128)
    try:
        shared.register_module_override(other.transformer.wte, "weight", {"optim_bits": 32})
        stale = bitsandbytes.optim.AdamW8bit(other.parameters())
        stale.check_overrides()  # what the Trainer's optimizer does at its first step
        model = tiny_gpt2(width=128)
        with memlab.apply(model, memlab.Plan(optimizer="adamw8bit")) as applied:
            applied.step(lm_batch(rows=2))
            moments = [t for t in state_tensors(applied.optimizer) if t.numel() >= 4096]
        assert all(t.dtype == torch.uint8 for t in moments)
        # An override the user set for this very model is kept.
        shared.register_module_override(model.transformer.wte, "weight", {"optim_bits": 32})
        with memlab.apply(model, memlab.Plan(optimizer="adamw8bit")) as applied:
            applied.step(lm_batch(rows=2))
            embedding_state = applied.optimizer.state[model.transformer.wte.weight]
        assert embedding_state["state1"].dtype == torch.float32
    finally:
        shared.index2config, shared.pid2config = saved[0], saved[1]
        shared.module_weight_config_triple = saved[2]


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
