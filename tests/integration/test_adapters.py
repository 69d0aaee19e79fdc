"""LoRA, QLoRA and pure bf16 on live models on CPU: what each saves, and that the model comes back exactly."""

from __future__ import annotations

import pytest
import torch
from models import assert_same, fingerprint, lm_batch, mlp_batch, mlp_loss, tiny_llama, tiny_mlp

import memlab
from memlab.errors import MemlabError, MemlabWarning
from memlab.options import RunOptions
from memlab.runner.trial import TrialRunner

pytest.importorskip("peft")

LORA, QLORA = memlab.Plan(adapter="lora", lora_rank=8), memlab.Plan(adapter="qlora", lora_rank=8)
PURE_BF16 = memlab.Plan(weights="bf16")


def adapter_modules(model: torch.nn.Module) -> list[str]:
    return [name for name, module in model.named_modules() if "lora" in name or "peft" in type(module).__module__]


def test_lora_qlora_and_pure_bf16_each_save_what_they_promise_and_leave_the_model_exactly():
    model, batch = tiny_llama(width=256), lm_batch()
    before = fingerprint(model)
    plain, lora, qlora, bf16 = memlab.compare(model, batch, [memlab.Plan(), LORA, QLORA, PURE_BF16], steps=1, noise=0,
                                              progress=False).trials
    assert [t.status for t in (plain, lora, qlora, bf16)] == ["ok"] * 4, [t.error for t in (lora, qlora, bf16)]
    trained = plain.breakdown["grads"] + plain.breakdown["optimizer"]
    assert lora.breakdown["grads"] + lora.breakdown["optimizer"] <= 0.10 * trained
    assert qlora.breakdown["params"] <= 0.45 * lora.breakdown["params"]
    assert bf16.breakdown["params"] <= 0.55 * plain.breakdown["params"]
    assert bf16.breakdown["optimizer"] <= 0.55 * plain.breakdown["optimizer"]
    assert_same(before, fingerprint(model))
    assert adapter_modules(model) == []
    assert len(model(**batch, output_hidden_states=True).hidden_states) == 3


@pytest.mark.parametrize("plan", [LORA, QLORA], ids=["lora", "qlora"])
def test_apply_trains_only_the_adapters_and_undo_leaves_the_base_exactly(plan):
    model, batch = tiny_llama(width=64), lm_batch()
    before = fingerprint(model)
    applied = memlab.apply(model, plan, lr=1e-2)
    trained = {id(p) for group in applied.optimizer.param_groups for p in group["params"]}
    names = [n for n, p in model.named_parameters() if id(p) in trained]
    assert names and all("lora_" in n for n in names)
    losses = [applied.step(batch) for _ in range(8)]
    applied.undo(adapter="discard")
    assert losses[-1] < losses[0]
    assert_same(before, fingerprint(model))
    assert adapter_modules(model) == []


def test_a_session_of_adapter_trials_copies_no_frozen_weight():
    model, batch = tiny_llama(width=256), lm_batch()
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    runner = TrialRunner(model, batch, RunOptions(steps=1, noise=0, progress=False))
    with runner.session():
        assert [runner.run(plan).status for plan in (LORA, QLORA)] == ["ok", "ok"]
        assert runner.snapshot_bytes == buffers
        runner.run(memlab.Plan())  # a full fine-tune changes every weight: now they are copied
        assert runner.snapshot_bytes == buffers + weights


def test_pure_bf16_trains_in_bf16_and_apply_casts_back_afterwards():
    model, batch = tiny_mlp(), mlp_batch()
    frozen = model[0][0].weight
    frozen.requires_grad_(False)
    kept = frozen.detach().clone()
    with memlab.apply(model, PURE_BF16, loss_fn=mlp_loss) as applied:
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())
        state = applied.optimizer.state
        applied.step(batch)
        assert all(v.dtype == torch.bfloat16 for s in state.values() for v in s.values() if v.dim() > 0)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert torch.equal(frozen, kept)  # what did not train comes back bit-exact


def test_a_model_already_wrapped_with_peft_is_measured_as_it_is():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_llama(width=64), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    batch = lm_batch()
    plain, again = memlab.compare(model, batch, [memlab.Plan(), LORA], steps=1, noise=0, progress=False).trials
    assert plain.status == "ok"
    trained = [p for p in model.parameters() if p.requires_grad]
    # Two fp32 moments per adapter weight and one fp32 step counter per tensor: the user's adapters train.
    assert plain.breakdown["optimizer"] == 2 * sum(p.numel() * 4 for p in trained) + 4 * len(trained)
    assert again.status == "error" and "already carries peft adapters" in again.error


def test_a_model_loaded_in_bf16_says_it_trains_pure_bf16():
    model = tiny_llama(width=64).to(torch.bfloat16)
    trial = memlab.measure(model, lm_batch(), memlab.Plan(), steps=1, noise=0, progress=False)
    assert trial.status == "ok" and trial.label == "bf16-weights" and trial.model_weights == "bf16"
    assert any("loaded in bf16" in note for note in trial.notes)
    assert memlab.Trial.from_dict(trial.to_dict()) == trial


def test_fit_searches_adapters_only_when_asked():
    model, batch = tiny_llama(width=128), lm_batch()
    plain = memlab.measure(model, batch, memlab.Plan(), steps=1, noise=0, progress=False)
    budget = int(plain.peak_bytes * 0.6)
    space = {"precision": ["fp32"], "optimizer": ["adamw"], "checkpointing": [False], "micro_batch": [8],
             "adapter": ["none", "lora", "qlora"], "lora_rank": [8]}
    report = memlab.fit(model, batch, budget=budget, space=space, steps=1, noise=0, progress=False)
    assert report.best is not None and report.best.plan.adapter in ("lora", "qlora")
    assert report.best.peak_bytes <= budget
    default = memlab.fit(model, batch, budget=budget, steps=1, noise=0, progress=False,
                         space={"precision": ["fp32"], "micro_batch": [8]})
    assert all(t.plan.adapter == "none" for t in default.trials)


@pytest.mark.parametrize(
    "plan",
    [PURE_BF16, LORA, QLORA, memlab.Plan(adapter="qlora", lora_rank=8, precision="bf16", checkpointing=True)],
    ids=["bf16-weights", "lora", "qlora", "qlora-bf16-ckpt"],
)
def test_estimate_of_each_fine_tuning_lever_is_within_10_percent_of_measure(plan):
    model, batch = tiny_llama(width=128), lm_batch()
    before = fingerprint(model)
    measured = memlab.measure(model, batch, plan, steps=1, noise=0, progress=False)
    estimated = memlab.estimate(model, batch, plan)
    assert estimated.status == "ok", estimated.error
    assert estimated.plan == plan and estimated.estimated
    # What other tests left alive in this process counts in a measured peak (held before), never in an estimate.
    peak = measured.peak_bytes - measured.preexisting_bytes
    assert abs(estimated.peak_bytes / peak - 1) <= 0.10, (estimated.peak_bytes, peak)
    for category in ("params", "optimizer"):
        assert abs(estimated.breakdown[category] - measured.breakdown[category]) <= 0.05 * measured.peak_bytes
    assert_same(before, fingerprint(model))


def test_when_nothing_fits_fit_suggests_the_levers_outside_its_space():
    model, batch = tiny_llama(width=256), lm_batch()
    lora = memlab.measure(model, batch, memlab.Plan(adapter="lora"), steps=1, noise=0, progress=False)
    budget = int((lora.peak_bytes - lora.preexisting_bytes) * 1.3)  # LoRA fits; no full fine-tune can
    report = memlab.fit(model, batch, budget=budget, steps=1, noise=0, progress=False,
                        space={"precision": ["fp32"], "micro_batch": [8], "optimizer": ["adamw"]})
    assert report.best is None
    suggested = [t.plan.adapter for t in report.suggestions]
    assert "lora" in suggested and "qlora" in suggested
    assert all(t.estimated and t.peak_bytes <= budget for t in report.suggestions)
    assert suggested.index("lora") < suggested.index("qlora")  # LoRA is expected faster: named first
    assert "Estimated to fit, outside the searched space: lora" in report.to_text()
    assert memlab.Report.from_dict(report.to_dict()).suggestions == report.suggestions


def _trained(plan: memlab.Plan, steps: int = 3) -> tuple[torch.nn.Module, dict, memlab.Applied]:
    model, batch = tiny_llama(width=64), lm_batch()
    applied = memlab.apply(model, plan, lr=1e-2)
    for _ in range(steps):
        applied.step(batch)
    return model, batch, applied


@pytest.mark.parametrize("plan", [LORA, QLORA], ids=["lora", "qlora"])
def test_undo_merge_adds_the_trained_adapters_into_the_base_weights(plan):
    model, batch, applied = _trained(plan)
    model.eval()
    with torch.no_grad():
        adapted = model(**batch).logits
    dtypes = {name: p.dtype for name, p in tiny_llama(width=64).named_parameters()}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", MemlabWarning)
        applied.undo(adapter="merge")
    assert adapter_modules(model) == []
    assert {name: p.dtype for name, p in model.named_parameters()} == dtypes
    with torch.no_grad():
        merged = model(**batch).logits
    # QLoRA trained on the 4-bit base: merged into the full-precision weights, the outputs are those of that base.
    tolerance = 1e-4 if plan.adapter == "lora" else 0.1
    torch.testing.assert_close(merged, adapted, rtol=tolerance, atol=tolerance)
    untrained = tiny_llama(width=64).parameters()
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), untrained, strict=True))


def test_undo_keep_leaves_the_trained_adapters_on_the_model():
    model, batch, applied = _trained(LORA)
    trained = {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" in name}
    assert trained
    applied.undo(adapter="keep")
    kept = {name: p for name, p in model.named_parameters() if "lora_" in name}
    assert kept.keys() == trained.keys()
    for name, p in kept.items():
        assert p.requires_grad, name
        torch.testing.assert_close(p.detach(), trained[name], rtol=0, atol=0, msg=name)
    assert not applied.active


def test_a_plain_undo_after_adapter_training_merges_it_with_one_warning():
    model, batch = tiny_llama(width=64), lm_batch()
    before = fingerprint(model)
    applied = memlab.apply(model, LORA, lr=1e-2)
    for _ in range(2):
        applied.step(batch)
    model.eval()
    with torch.no_grad():
        adapted = model(**batch).logits
    with pytest.warns(MemlabWarning, match=r"(?s)merged.*2 steps.*undo\(adapter='keep'\).*'discard'") as caught:
        applied.undo()
    assert len([w for w in caught if issubclass(w.category, MemlabWarning)]) == 1
    assert adapter_modules(model) == []
    with torch.no_grad():  # nothing of the training is lost: the model computes what the adapted one did
        torch.testing.assert_close(model(**batch).logits, adapted, rtol=1e-4, atol=1e-4)
    assert fingerprint(model).keys() == before.keys()


def test_undo_discard_gives_back_the_model_as_it_was():
    model, batch = tiny_llama(width=64), lm_batch()
    before = fingerprint(model)
    applied = memlab.apply(model, LORA, lr=1e-2)
    applied.step(batch)
    applied.undo(adapter="discard")
    assert_same(before, fingerprint(model))


def test_undo_with_an_adapter_choice_refuses_what_does_not_apply():
    model = tiny_llama(width=64)
    before = fingerprint(model)
    applied = memlab.apply(model, memlab.Plan(), lr=1e-2)
    with pytest.raises(MemlabError, match="adapter="):
        applied.undo(adapter="merge")
    applied.undo(adapter="discard")
    assert_same(before, fingerprint(model))
    applied = memlab.apply(model, LORA)
    with pytest.raises(MemlabError, match="'merge'"):
        applied.undo(adapter="fold")  # type: ignore[arg-type]
    applied.undo()  # nothing trained: no warning needed
