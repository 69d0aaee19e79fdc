"""The adapter lever (LoRA, QLoRA, pure bf16; memlab.techniques.adapters): live, estimated, exported and read back.

LoRA, QLoRA and pure bf16 on live models on CPU: what each saves, and that the model comes back exactly.

lora_dropout and lora_alpha: measured, estimated, exported and read back from a user's peft model, on tiny models.

QLoRA holds the whole base in 4-bit, as 4-bit loading does, and follows the model's own rules for what stays in
higher precision (regression: T5's ``wo``, kept in fp32 by transformers, was quantized and the trial failed with a
raw RuntimeError; with ``lora_targets='attention'`` only the adapted layers were quantized).

Issue 61 item 17: QLoRA on a task model (a BERT classifier) ended in a raw ``RuntimeError: only Tensors of floating
point dtype can require gradients``, and ``to_code()`` of a QLoRA + bf16 plan failed when its script ran on models
outside the covering array's (a tiny Llama only). The cause was one: the new task head, which LoRA trains whole
(peft's ``modules_to_save``), was quantized to 4-bit with the base (transformers' own 4-bit load quantizes BERT's
``classifier``), and a 4-bit weight is ``uint8``, which cannot train. The head now stays in full precision in the
trial, the estimate and the exported script, as ``llm_int8_skip_modules`` keeps it when loading. The script is then
run on every transformers family the zoo builds.

A peft model built from an "all-linear" LoraConfig on a fused-MoE model, read back (issue 60): get_peft_model
rewrites the config in place for transformers 5's fused experts (the attention layers' names, the expert
parameters, ``gate_up_proj`` at twice the rank through ``rank_pattern``). memlab's plan of that model must build
exactly the adapters peft built, names and shapes, and its estimate must count them.

What an adapter trial trains is what the peft export trains, from one computation of the targets: a sequence
classifier's new head trained whole (``modules_to_save``), a mixture-of-experts model's fused experts
(``target_parameters``); ``Applied.undo()`` after adapter training loses nothing by default and releases the
optimizer; a user's peft model is read back as it is (``target_modules``)."""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

import pytest
import torch
import transformers
from models import (
    MOE_EXPERTS,
    assert_same,
    fingerprint,
    lm_batch,
    mlp_batch,
    mlp_loss,
    tiny_bert,
    tiny_gpt2,
    tiny_llama,
    tiny_mixtral,
    tiny_mlp,
    tiny_qwen3_moe,
)
from test_zoo import ZOO
from transformers import T5Config, T5ForConditionalGeneration

import memlab
from memlab import Plan
from memlab.errors import MemlabError, MemlabWarning
from memlab.export.accelerate import accelerate_script
from memlab.options import RunOptions
from memlab.plan import parse_grid
from memlab.runner.trial import TrialRunner
from memlab.techniques import adapters
from memlab.techniques.adapters import adapter_targets, attach_adapter, quantized_targets
from memlab.techniques.core.registry import REGISTRY
from memlab.trainer.source import TrainerSource

pytest.importorskip("peft")
bitsandbytes = pytest.importorskip("bitsandbytes")
pytest.importorskip("bitsandbytes")


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


@pytest.mark.slow
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


LORA = Plan(adapter="lora", lora_rank=4)
DROPOUT = LORA.replace(lora_dropout=0.05)


def test_the_plan_checks_and_normalises_them() -> None:
    assert Plan(lora_dropout=0.05, lora_alpha=8) == Plan()  # mean nothing without an adapter
    assert DROPOUT.lora_dropout == 0.05 and DROPOUT.label() == "lora r4 drop0.05"
    assert LORA.replace(lora_alpha=16).label() == "lora r4 alpha16"
    for bad in (-0.1, 1.0, "0.05", True):
        with pytest.raises(MemlabError, match="write"):
            LORA.replace(lora_dropout=bad)
    with pytest.raises(MemlabError, match="whole number"):
        LORA.replace(lora_alpha=0.5)
    grid = parse_grid(["lora_dropout=0,0.05", "lora_alpha=auto,32"], base=LORA)
    assert [(p.lora_dropout, p.lora_alpha) for p in grid] == [(0.0, None), (0.0, 32), (0.05, None), (0.05, 32)]


def test_dropout_on_the_adapter_input_keeps_its_mask_for_backward_measured_and_estimated() -> None:
    model, batch = tiny_llama(), lm_batch(rows=4, length=32)
    before = fingerprint(model)
    report = memlab.compare(model, batch, [LORA, DROPOUT], steps=1, warmup=0, noise=0)
    assert_same(before, fingerprint(model))
    plain, dropped = report.trials
    assert plain.status == dropped.status == "ok"
    assert dropped.breakdown["activations"] > plain.breakdown["activations"]
    assert dropped.breakdown["params"] == plain.breakdown["params"]

    shapes = {"input_ids": (4, 32), "labels": (4, 32)}
    estimated = [memlab.estimate(model, shapes, plan, device="cpu") for plan in (LORA, DROPOUT)]
    assert estimated[1].peak_bytes > estimated[0].peak_bytes
    # The estimate on fake tensors sees the same extra bytes the CPU measured (within a tenth).
    measured_extra = dropped.peak_bytes - plain.peak_bytes
    estimated_extra = estimated[1].peak_bytes - estimated[0].peak_bytes
    assert measured_extra > 0 and abs(estimated_extra - measured_extra) <= 0.1 * measured_extra


def test_alpha_scales_the_adapters_and_costs_no_memory() -> None:
    model, batch = tiny_llama(), lm_batch(rows=2, length=8)
    applied = memlab.apply(model, LORA.replace(lora_alpha=32))
    try:
        adapted = [m for m in model.modules() if isinstance(getattr(m, "scaling", None), dict) and m.scaling]
        scalings = {m.scaling["default"] for m in adapted}
        assert scalings == {32 / 4}
        applied.step(batch)
    finally:
        applied.undo()
    report = memlab.compare(model, batch, [LORA, LORA.replace(lora_alpha=32)], steps=1, warmup=0, noise=0)
    assert report.trials[0].peak_bytes == report.trials[1].peak_bytes


def test_every_export_carries_them() -> None:
    plan = DROPOUT.replace(lora_alpha=32)
    config = plan.to_peft_config()
    assert (config.r, config.lora_alpha, config.lora_dropout) == (4, 32, 0.05)
    assert LORA.to_peft_config().lora_alpha == 8  # auto: twice the rank
    code = plan.to_code()
    namespace: dict[str, Any] = {}
    lora_line = next(line for line in code.splitlines() if "LoraConfig(" in line and "get_peft_model" in line)
    exec("from peft import LoraConfig\nconfig = " + lora_line.split("get_peft_model(model, ", 1)[1][:-1], namespace)
    assert (namespace["config"].lora_alpha, namespace["config"].lora_dropout) == (32, 0.05)
    script = accelerate_script(plan)
    assert "lora_alpha=32" in script and "lora_dropout=0.05" in script
    with pytest.raises(MemlabError, match="get_peft_model"):
        plan.to_training_arguments()


def test_a_users_peft_model_reports_its_own_settings(tmp_path: Any) -> None:
    from peft import LoraConfig, get_peft_model
    from trainers import make_trainer

    trainer = make_trainer(tmp_path)
    config = LoraConfig(r=8, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear")
    trainer.model = get_peft_model(trainer.model, config)
    plan = TrainerSource.plan_of(trainer)
    assert (plan.adapter, plan.lora_rank, plan.lora_alpha, plan.lora_dropout) == ("lora", 8, 32, 0.05)
    trainer.model = get_peft_model(make_trainer(tmp_path).model, LoraConfig(r=4, lora_alpha=8))
    plan = TrainerSource.plan_of(trainer)
    assert (plan.lora_rank, plan.lora_alpha, plan.lora_dropout) == (4, None, 0.0)  # alpha twice the rank: auto


def test_the_panel_offers_them() -> None:
    from memlab.frontends.jupyter.panel_core import PanelCore
    from memlab.options import RunOptions

    panel = PanelCore(torch.nn.Linear(4, 1), torch.randn(8, 4), RunOptions())
    assert (panel.controls["lora_alpha"].value, panel.controls["lora_dropout"].value) == ("auto", 0.0)
    assert "twice the rank" in panel.controls["lora_alpha"].tooltip
    panel.controls["adapter"].value = "lora"
    panel.controls["lora_dropout"].value = 0.05
    assert (panel.plan().lora_alpha, panel.plan().lora_dropout) == (None, 0.05)  # auto: the plan's None
    panel.controls["lora_alpha"].value = 64
    assert panel.plan().label() == "lora alpha64 drop0.05"


def tiny_t5() -> T5ForConditionalGeneration:
    torch.manual_seed(0)
    config = T5Config(
        d_model=32, d_ff=64, d_kv=16, num_layers=1, num_heads=2, vocab_size=64, decoder_start_token_id=0, pad_token_id=0
    )
    return T5ForConditionalGeneration(config)


def test_t5_keeps_wo_out_of_quantization_and_the_trial_runs() -> None:
    model = tiny_t5()
    assert "wo" in (model._keep_in_fp32_modules or [])
    assert not [name for name in quantized_targets(model) if name.endswith(".wo")]
    batch = {"input_ids": torch.randint(0, 64, (2, 8)), "labels": torch.randint(0, 64, (2, 8))}
    before = fingerprint(model)
    trial = memlab.measure(model, batch, memlab.Plan(adapter="qlora", lora_rank=4), steps=1, noise=0, progress=False)
    assert trial.status == "ok", trial.error
    assert_same(before, fingerprint(model))


def test_the_t5_estimate_quantizes_what_the_trial_does() -> None:
    model = tiny_t5()
    shapes = {"input_ids": (2, 8), "labels": (2, 8)}
    trial = memlab.estimate(model, shapes, memlab.Plan(adapter="qlora", lora_rank=4), device="cpu")
    assert trial.status == "ok", trial.error


def test_qlora_quantizes_the_whole_base_whatever_lora_targets_adapts() -> None:
    model = tiny_llama(width=64)
    base, attention = set(adapter_targets(model)), adapter_targets(model, "attention")
    undo = attach_adapter(model, memlab.Plan(adapter="qlora", lora_rank=2, lora_targets="attention"))
    try:
        four_bit = {n for n, m in model.named_modules() if isinstance(m, bitsandbytes.nn.Linear4bit)}
        assert {name.removesuffix(".base_layer") for name in four_bit} == base  # every linear layer but the head
        assert len(base) > len(attention)
    finally:
        assert undo is not None
        undo()
    assert not any(isinstance(m, bitsandbytes.nn.Linear4bit) for m in model.modules())
    model(**lm_batch())


def test_qlora_holds_gpt2s_conv1d_layers_in_4bit_as_transformers_loads_them() -> None:
    """transformers' bitsandbytes integration loads GPT-2's Conv1D layers in 4-bit: QLoRA is measured and estimated
    on them, and the model comes back as it was."""
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                                      bos_token_id=0, eos_token_id=0))
    assert "transformer.h.0.attn.c_attn" in quantized_targets(gpt2) and "lm_head" not in quantized_targets(gpt2)
    shapes = {"input_ids": (1, 8), "labels": (1, 8)}
    estimated = memlab.estimate(gpt2, shapes, memlab.Plan(adapter="qlora"), device="cpu")
    batch = {name: torch.randint(0, 64, shape) for name, shape in shapes.items()}
    before = fingerprint(gpt2)
    measured = memlab.measure(gpt2, batch, memlab.Plan(adapter="qlora"), steps=1, noise=0, progress=False)
    assert estimated.status == measured.status == "ok", (estimated.error, measured.error)
    assert_same(before, fingerprint(gpt2))
    assert estimated.breakdown["optimizer"] == measured.breakdown["optimizer"]  # the same adapters train
    assert abs(estimated.breakdown["params"] - measured.breakdown["params"]) <= 0.1 * measured.breakdown["params"]


@pytest.mark.parametrize("make", ["gpt2", "llama_classifier", "t5"])
def test_to_codes_4bit_layers_are_the_ones_the_trial_quantizes(make: str) -> None:
    """The exported script's quantize_nf4 holds in 4-bit exactly the layers memlab's QLoRA trial does (transformers'
    choice: GPT-2's Conv1D in, a classifier's new head and T5's ``wo`` out), and runs a second time on a model that
    is already in 4-bit without touching it."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from memlab.techniques.adapters import quantize_code

    if make == "gpt2":
        model = tiny_gpt2()
    elif make == "llama_classifier":
        model = LlamaForSequenceClassification(LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=2, num_labels=3, pad_token_id=0))
    else:
        model = tiny_t5()
    expected = quantized_targets(model)
    namespace = {"torch": torch, "bnb": pytest.importorskip("bitsandbytes"), "model": model}
    exec("\n".join(quantize_code(memlab.Plan(adapter="qlora"))), namespace)  # noqa: S102 (memlab's own export)
    held = [name for name, module in model.named_modules() if type(module).__name__ == "Linear4bit"]
    assert held == expected and held
    exec("\n".join(quantize_code(memlab.Plan(adapter="qlora"))), namespace)  # noqa: S102
    assert [name for name, module in model.named_modules() if type(module).__name__ == "Linear4bit"] == expected


QLORA = Plan(adapter="qlora", lora_rank=4)
QUICK: dict[str, Any] = dict(steps=1, warmup=0, noise=0, progress=False)


def _classifier_batch() -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(0)),
            "labels": torch.tensor([0, 1, 2, 0])}


@pytest.mark.parametrize("plan", [QLORA, QLORA.replace(precision="bf16")], ids=lambda p: p.label())
def test_qlora_on_a_bert_classifier_trains_its_head_in_full_precision(plan: Plan) -> None:
    model, batch = tiny_bert(), _classifier_batch()
    assert "classifier" in quantized_targets(model)  # what a plain 4-bit load quantizes
    measured = memlab.measure(model, batch, plan, **QUICK)  # first: what the issue met
    estimated = memlab.estimate(model, batch, plan, device="cpu")
    assert measured.status == "ok", measured.error
    assert estimated.status == "ok", estimated.error
    assert "classifier" not in adapters.qlora_targets(model)
    assert "classifier" in (adapters.qlora_skip_modules(model) or [])
    applied = memlab.apply(model, plan, lr=1e-2)
    try:
        trained = {name for name, p in model.named_parameters() if p.requires_grad}
        assert any(name.startswith("classifier.modules_to_save.") for name in trained)
        assert any("lora_A" in name for name in trained)
        head = next(p for name, p in model.named_parameters() if name.startswith("classifier.modules_to_save."))
        before = head.detach().clone()
        applied.step(batch)
        assert head.dtype == torch.float32 and not torch.equal(before, head.detach())
    finally:
        applied.undo(adapter="discard")


def test_a_4bit_load_that_skips_the_heads_quantizes_what_qlora_quantizes(tmp_path: Any) -> None:
    model = tiny_bert()
    model.save_pretrained(tmp_path)
    import bitsandbytes as bnb

    skip = adapters.qlora_skip_modules(model)
    config = transformers.BitsAndBytesConfig(load_in_4bit=True, llm_int8_skip_modules=skip)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = type(model).from_pretrained(tmp_path, quantization_config=config, device_map="cpu")
    assert [n for n, m in loaded.named_modules() if isinstance(m, bnb.nn.Linear4bit)] == adapters.qlora_targets(model)


# What the script cannot run, and why (none of it QLoRA's): each checked to fail as said, so that a fix shows.
NOT_QLORA: dict[str, str] = {
    # peft matches modules_to_save by suffix: "classifier" also names pre_classifier, which 'all-linear' adapts
    "distilbert": "modules_to_save cannot be applied",
    # DeBERTa-v2 fills a bf16 tensor with float32's minimum under autocast
    "deberta_v2": "without overflow",
    # nothing a bitsandbytes load quantizes (Falcon's FalconLinear, a ResNet's convolutions): refused, saying why
    "falcon": "has none besides its head",
    "resnet (vision)": "has none besides its head",
}
FAMILIES = [name for name in ZOO if not name.startswith(("lstm", "conv,", "mlp,"))]


# bf16 on every family; fp32 on a sample (the script differs from bf16's only in its autocast)
SAMPLE = ("bert", "roberta", "vit (vision)", "llama")
CASES = [(name, "bf16") for name in FAMILIES] + [(name, "fp32") for name in SAMPLE]


@pytest.mark.parametrize(("name", "precision"), CASES)
def test_the_qlora_script_runs_on_every_family(name: str, precision: str) -> None:
    model, batch, _ = ZOO[name]()
    assert isinstance(model, transformers.PreTrainedModel) and isinstance(batch, dict)
    code = QLORA.replace(precision=precision).to_code()
    namespace: dict[str, Any] = {"model": model, "batches": [batch]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if name in NOT_QLORA:
            with pytest.raises(Exception, match=NOT_QLORA[name]):
                exec(compile(code, QLORA.label(), "exec"), namespace)  # noqa: S102 - the export under test
            return
        exec(compile(code, QLORA.label(), "exec"), namespace)  # noqa: S102 - the export under test
    trained = namespace["model"]
    assert any(p.requires_grad for p in trained.parameters())
    assert not any(p.requires_grad and not p.dtype.is_floating_point for p in trained.parameters())


def _lora_gradients(model: torch.nn.Module, batch: dict) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    model(**batch).loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if "lora_" in name and p.grad is not None}


def _evaluated_then_trained(model: torch.nn.Module) -> None:
    """An evaluation in the middle of training, as a user's loop has, checked against a copy that never evaluates:
    the same logits, then the same adapters' gradients. On a CPU with AVX512-BF16, bitsandbytes repacked each 4-bit
    weight at the first forward in eval mode: a 32 x 32 layer raised "shape '[32, 0]' is invalid for input of size
    16" (what the issue's QLoRA bf16 script met), and a repacked layer gave its input no gradient afterwards."""
    batch = lm_batch(rows=2, seed=3)
    never_evaluated = copy.deepcopy(model)
    with torch.no_grad():
        expected = never_evaluated(**batch).logits
    model.eval()
    with torch.no_grad():
        evaluated = model(**batch).logits
    torch.testing.assert_close(evaluated, expected)
    model.train()
    gradients, expected_gradients = _lora_gradients(model, batch), _lora_gradients(never_evaluated, batch)
    assert gradients.keys() == expected_gradients.keys() and gradients
    for name, gradient in gradients.items():
        torch.testing.assert_close(gradient, expected_gradients[name], msg=name)


@pytest.mark.parametrize("width", [32, 64])
def test_the_qlora_scripts_model_evaluates_and_trains_on(width: int) -> None:
    pytest.importorskip("bitsandbytes")
    namespace: dict[str, Any] = {"model": tiny_llama(width=width), "batches": [lm_batch(rows=4)]}
    plan = QLORA.replace(precision="bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(plan.to_code(), plan.label(), "exec"), namespace)  # noqa: S102 - the export under test
        _evaluated_then_trained(namespace["model"])


@pytest.mark.parametrize("width", [32, 64])
def test_an_applied_qlora_plan_evaluates_and_trains_on(width: int) -> None:
    pytest.importorskip("bitsandbytes")
    model = tiny_llama(width=width)
    applied = memlab.apply(model, QLORA.replace(precision="bf16"))
    try:
        applied.step(lm_batch())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _evaluated_then_trained(model)
    finally:
        applied.undo(adapter="discard")


def _wrapped(base: torch.nn.Module, **keywords: Any) -> Any:
    from peft import LoraConfig, get_peft_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return get_peft_model(copy.deepcopy(base), LoraConfig(r=4, lora_alpha=8, **keywords))


def _trained_moe_lora_readback(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {name.removeprefix("base_model.model."): tuple(p.shape)
            for name, p in model.named_parameters() if p.requires_grad}


def _plan_of(peft_model: Any) -> memlab.Plan:
    """The plan memlab reads from a peft model (each lever's ``from_peft``, as ``Plan.from_trainer`` does)."""
    config = next(iter(peft_model.peft_config.values()))
    values = {name: lever.from_peft(config) for name, lever in REGISTRY.items() if lever.from_peft is not None}
    return memlab.Plan(adapter="lora", **{name: value for name, value in values.items() if value is not None})


CONFIGS = {
    "all-linear+experts": dict(target_modules="all-linear", target_parameters=list(MOE_EXPERTS)),
    "all-linear": dict(target_modules="all-linear"),
}


@pytest.mark.parametrize("keywords", list(CONFIGS.values()), ids=list(CONFIGS))
@pytest.mark.parametrize("build", [tiny_qwen3_moe, tiny_mixtral], ids=["qwen3-moe", "mixtral"])
def test_the_plan_of_a_converted_config_builds_peft_s_adapters(build: Any, keywords: dict[str, Any]) -> None:
    base = build()
    wrapped = _wrapped(base, **keywords)
    user = _trained_moe_lora_readback(wrapped)
    assert any(".mlp.experts." in name for name in user)
    plan = _plan_of(wrapped)
    undo = attach_adapter(base, plan)
    assert undo is not None
    try:
        assert _trained_moe_lora_readback(base) == user  # the fused gate_up_proj at peft's 2r, not at r
    finally:
        undo()
    for config in (plan.to_peft_config(), plan.to_peft_config(model=base)):
        assert _trained_moe_lora_readback(_wrapped(base, **{k: v for k, v in vars(config).items() if k in (
            "target_modules", "target_parameters", "rank_pattern", "alpha_pattern", "modules_to_save")})) == user


@pytest.mark.parametrize("build", [tiny_qwen3_moe, tiny_mixtral], ids=["qwen3-moe", "mixtral"])
def test_the_estimate_of_the_plan_read_back_counts_peft_s_adapters(build: Any) -> None:
    base = build()
    wrapped = _wrapped(base, **CONFIGS["all-linear+experts"])
    user = _trained_moe_lora_readback(wrapped)
    ids = torch.randint(3, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": ids}
    plan = _plan_of(wrapped)
    # AdamW's two fp32 moments of every weight peft trains, and a 4-byte step count per tensor
    expected = 8 * sum(math.prod(shape) for shape in user.values()) + 4 * len(user)
    assert memlab.estimate(base, batch, plan).breakdown["optimizer"] == expected
    assert memlab.estimate(wrapped, batch, plan).breakdown["optimizer"] == expected


def test_plan_from_a_trainer_over_the_peft_model_builds_peft_s_adapters(tmp_path: Any) -> None:
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    base = tiny_qwen3_moe()
    wrapped = _wrapped(base, target_modules="all-linear")
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no", max_steps=1,
                             per_device_train_batch_size=2)
    data = Dataset.from_dict({"input_ids": [[(i + j) % 90 + 3 for j in range(8)] for i in range(4)]})
    plan = memlab.Plan.from_trainer(Trainer(model=wrapped, args=args, train_dataset=data))
    assert plan.adapter == "lora" and plan.lora_rank == 4
    undo = attach_adapter(base, plan)
    assert undo is not None
    try:
        assert _trained_moe_lora_readback(base) == _trained_moe_lora_readback(wrapped)
    finally:
        undo()


LORA_trained_as_exported = memlab.Plan(adapter="lora", lora_rank=2)


def _mixtral() -> torch.nn.Module:
    config = transformers.MixtralConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2, num_local_experts=4,
                                        num_experts_per_tok=2)
    return transformers.MixtralForCausalLM(config)


def _trained_by_peft(model: torch.nn.Module, config: Any) -> dict[str, tuple[int, ...]]:
    from peft import get_peft_model

    wrapped = get_peft_model(copy.deepcopy(model), config)
    return {name.removeprefix("base_model.model."): tuple(p.shape)
            for name, p in wrapped.named_parameters() if p.requires_grad}


def _trained_by_the_trial(model: torch.nn.Module, plan: memlab.Plan) -> dict[str, tuple[int, ...]]:
    undo = attach_adapter(model, plan)
    assert undo is not None
    try:
        return {name: tuple(p.shape) for name, p in model.named_parameters() if p.requires_grad}
    finally:
        undo()


@pytest.mark.parametrize("build", [tiny_bert, _mixtral], ids=["bert classifier", "mixtral (fused experts)"])
def test_the_peft_export_trains_exactly_what_the_trial_trained(build: Any) -> None:
    model = build()
    config = LORA_trained_as_exported.to_peft_config(model=model)
    trial = _trained_by_the_trial(model, LORA_trained_as_exported)
    assert trial == _trained_by_peft(model, config)
    if isinstance(model, transformers.BertForSequenceClassification):
        assert config.modules_to_save == ["classifier"]
        assert any(name.startswith("classifier.modules_to_save.") for name in trial)  # the new head trains
    else:
        assert {"gate_up_proj", "down_proj"} <= set(config.target_parameters)
        assert any(".mlp.experts." in name for name in trial)  # peft adapts the fused experts: so does the trial


@pytest.mark.parametrize("build", [tiny_bert, _mixtral], ids=["bert classifier", "mixtral (fused experts)"])
def test_undo_after_training_merges_what_trained(build: Any) -> None:
    model = build()
    ids = torch.randint(3, 100, (4, 16), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": torch.tensor([0, 1, 2, 1]) if build is tiny_bert else ids}
    head = model.classifier.weight.detach().clone() if build is tiny_bert else None
    applied = memlab.apply(model, LORA_trained_as_exported, lr=1e-2)
    for _ in range(2):
        applied.step(batch)
    model.eval()
    with torch.no_grad():
        trained = model(**batch).logits
    with pytest.warns(MemlabWarning, match="merged"):
        applied.undo()
    assert not any("lora_" in name or "modules_to_save" in name for name, _ in model.named_parameters())
    if build is tiny_bert:
        assert not torch.equal(model.classifier.weight, head)
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, trained, rtol=1e-4, atol=1e-4)


def test_undo_without_training_changes_nothing_and_says_nothing() -> None:
    model = tiny_bert()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    applied = memlab.apply(model, LORA_trained_as_exported)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MemlabWarning)
        applied.undo()
    assert all(torch.equal(before[name], p) for name, p in model.named_parameters())


def test_undo_releases_the_optimizer_so_a_later_trial_peaks_as_before() -> None:
    model, batch = tiny_mlp(), mlp_batch()
    options: dict[str, Any] = dict(loss_fn=mlp_loss, steps=1, warmup=0, noise=0, progress=False)
    first = memlab.compare(model, batch, [memlab.Plan()], **options)[0]
    applied = memlab.apply(model, memlab.Plan(), loss_fn=mlp_loss, lr=1e-3)
    optimizer = applied.optimizer
    applied.step(batch)
    assert optimizer.state
    applied.undo()
    assert applied.optimizer is None and not optimizer.state  # the state goes even where the user holds it
    again = memlab.compare(model, batch, [memlab.Plan()], **options)[0]
    assert again.preexisting_bytes == first.preexisting_bytes
    assert again.peak_bytes == first.peak_bytes, (again.breakdown, first.breakdown)


def test_a_users_peft_model_gives_its_targets_to_the_plan() -> None:
    from peft import LoraConfig, get_peft_model

    wrapped = get_peft_model(copy.deepcopy(tiny_bert()), LoraConfig(r=4, target_modules=["query", "value"]))
    config = wrapped.peft_config["default"]
    read = {name: lever.from_peft(config) for name, lever in REGISTRY.items() if lever.from_peft is not None}
    assert read["lora_targets"] == ("query", "value") and read["lora_rank"] == 4
    plan = memlab.Plan(adapter="lora").replace(**{k: v for k, v in read.items() if v is not None})
    assert sorted(plan.to_peft_config(model=tiny_bert()).target_modules) == sorted(
        name for name, _ in tiny_bert().named_modules() if name.endswith((".query", ".value")))
    assert LoraConfig(target_modules="all-linear").target_modules == "all-linear"
    assert REGISTRY["lora_targets"].from_peft(LoraConfig(target_modules="all-linear")) == "all-linear"
    assert REGISTRY["lora_targets"].from_peft(LoraConfig()) == "attention"
