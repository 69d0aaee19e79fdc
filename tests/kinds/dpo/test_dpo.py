"""TRL's DPOTrainer as the live object (issue 59): measured, estimated and fitted as the user set it up, with a
reference model, with precomputed reference log-probs and with a peft model (the reference its adapters off).
Tiny Llamas on CPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("peft")
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from test_trainer_contract import llama, tokenizer  # noqa: E402
from trl_trainers import trained_with  # noqa: E402

import memlab  # noqa: E402

FAST: dict[str, Any] = {"steps": 1, "warmup": 0, "noise": 0, "progress": False}


def preferences(count: int = 8) -> Dataset:
    """Prompts of uneven lengths, one much longer; chosen and rejected completions of other lengths."""
    rows = []
    for i in range(count):
        prompt = 3 + (i * 5) % 11 + (24 if i == 5 else 0)
        rows.append({"prompt": " ".join(f"w{(i + j) % 60}" for j in range(prompt)),
                     "chosen": " ".join(f"w{(i * 3 + j) % 60}" for j in range(2 + i % 4)),
                     "rejected": " ".join(f"w{(i * 7 + j) % 60}" for j in range(1 + (i * 3) % 9))})
    return Dataset.from_list(rows)


def dpo(tmp_path: Any, setup: str = "reference", **settings: Any) -> trl.DPOTrainer:
    """``setup``: "reference" (a separate reference model), "precomputed" (precompute_ref_log_probs=True, none
    held), "peft" (a LoRA model whose reference is its base with adapters off)."""
    config = dict(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no", max_steps=1,
                  per_device_train_batch_size=2, disable_tqdm=True, bf16=False, seed=0)
    config.update(settings)
    if setup == "precomputed":
        config["precompute_ref_log_probs"] = True
    model, reference = llama(), None
    if setup == "reference":
        reference = llama()
    elif setup == "peft":
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    return trl.DPOTrainer(model=model, ref_model=reference, args=trl.DPOConfig(**config),
                          train_dataset=preferences(), processing_class=tokenizer())


def _held(trainer: Any) -> dict[str, Any]:
    """What the trainer holds, by identity, and its models' weights."""
    held = {name: getattr(trainer, name) for name in ("args", "model", "ref_model", "train_dataset", "data_collator",
                                                      "_metrics", "optimizer")}
    held["callbacks"] = list(trainer.callback_handler.callbacks)
    held["weights"] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    if trainer.ref_model is not None:
        held["reference"] = {k: v.clone() for k, v in trainer.ref_model.state_dict().items()}
    return held


def _same(trainer: Any, held: dict[str, Any]) -> None:
    now = _held(trainer)
    for name in ("args", "model", "ref_model", "train_dataset", "data_collator", "_metrics", "optimizer"):
        assert now[name] is held[name], name
    assert now["callbacks"] == held["callbacks"]
    assert all(torch.equal(now["weights"][k], v) for k, v in held["weights"].items())
    if "reference" in held:
        assert all(torch.equal(now["reference"][k], v) for k, v in held["reference"].items())
        assert all(p.grad is None for p in trainer.ref_model.parameters())


@pytest.mark.parametrize("setup", ["reference", "precomputed", "peft"])
def test_dpo_measured_and_estimated_as_set_up(tmp_path: Any, setup: str) -> None:
    trainer = dpo(tmp_path, setup)
    held = _held(trainer)
    own = memlab.Plan.from_trainer(trainer)
    assert (own.adapter == "lora") == (setup == "peft")
    measured = memlab.measure(trainer, **FAST)
    assert measured.status == "ok", measured.error
    assert measured.plan == own and measured.rows_per_step == 2
    assert "rows 5" in " ".join(measured.notes)  # the long prompt's example is in the worst batch
    estimated = memlab.estimate(trainer)
    assert estimated.status == "ok" and estimated.plan == own
    assert abs(estimated.peak_bytes - measured.peak_bytes) <= 0.05 * measured.peak_bytes
    _same(trainer, held)


def test_dpo_fit_then_trained_under_watch_within_the_budget(tmp_path: Any) -> None:
    """issue 59: fit(dpo_trainer, budget=...) ended in TypeError: 'method' object is not subscriptable."""
    trainer = dpo(tmp_path, "reference")
    held = _held(trainer)
    space = {"micro_batch": [2, 1], "checkpointing": [True], "precision": ["fp32"], "optimizer": ["adamw"]}
    whole, split = memlab.compare(trainer, plans=[memlab.Plan(checkpointing=True),
                                                  memlab.Plan(checkpointing=True, accumulation=2)], **FAST).trials
    assert whole.peak_bytes > split.peak_bytes
    budget = (whole.peak_bytes + split.peak_bytes) // 2
    report = memlab.fit(trainer, budget=budget, space=space, **FAST)
    assert report.best is not None and report.best.plan.micro_batch == 1 and report.best.rows_per_step == 2
    _same(trainer, held)
    kwargs = report.best.plan.to_training_arguments()
    assert (kwargs["per_device_train_batch_size"], kwargs["gradient_accumulation_steps"]) == (1, 2)
    peak = trained_with(trainer, report.best.plan, budget)
    assert peak is not None and 0 < peak <= budget
    assert trainer.args is held["args"] and trainer.model is held["model"]


def test_a_watched_dpo_step_counts_pairs_as_the_trainer_does(tmp_path: Any) -> None:
    """issue 71 item 8's neighbour: memlab.watch counted a DPOTrainer's chosen and rejected rows as two samples each
    pair, twice the samples per second the trainer's own log says."""
    trainer = dpo(tmp_path, "reference", max_steps=2)
    watched = memlab.watch(trainer)
    metrics = trainer.train().metrics
    watched.remove()
    counted = [round(step.samples_per_s * step.step_time_s) for step in watched.steps]
    assert counted == [trainer.args.per_device_train_batch_size] * 2
    assert sum(counted) == round(metrics["train_samples_per_second"] * metrics["train_runtime"])
    assert all(len(step.lengths) == 2 * n for step, n in zip(watched.steps, counted, strict=True))  # chosen, rejected


@pytest.mark.parametrize(("setup", "share"), [("reference", 0.6), ("reference", 0.9), ("peft", 0.75)])
def test_dpo_fit_holds_when_trained_at_60_to_90_percent_of_the_plain_peak(
        tmp_path: Any, setup: str, share: float) -> None:
    """issue 68: fit named bf16 for a DPOTrainer built in fp32, and train() with it applied peaked as the fp32 step did
    (10.29 MB against a 5.8 MB estimate and a 6.1 MB budget): TRL prepares the reference model in the trainer's
    __init__, and the accelerator rebuilt for bf16 never prepared it again. The budget here is a share of the plain
    step's peak as watched over every batch of the dataset."""
    trainer = dpo(tmp_path / "plain", setup, max_steps=3)
    watched = memlab.watch(trainer)
    trainer.train()
    watched.remove()
    budget = int(share * watched.peak_bytes)  # type: ignore[operator]
    trainer = dpo(tmp_path / "fitted", setup, max_steps=3)
    reference = trainer.ref_model
    forward = vars(reference).get("forward") if reference is not None else None
    report = memlab.fit(trainer, budget=budget, **FAST)
    assert report.best is not None and report.best.peak_bytes <= budget
    peak = trained_with(trainer, report.best.plan, budget)
    assert peak is not None and 0 < peak <= budget, (report.best.plan.label(), peak, budget)
    if reference is not None:  # the reference's forward is its own again
        assert vars(reference).get("forward") is forward


def test_a_reference_prepared_for_bf16_runs_in_fp32_under_an_fp32_plan(tmp_path: Any) -> None:
    trainer = dpo(tmp_path, "reference", bf16=True)
    reference = trainer.ref_model
    wrapped = reference.forward
    seen: list[bool] = []
    inner = reference.get_decoder()  # called inside the forward, where accelerate's autocast is entered
    hook = inner.register_forward_pre_hook(lambda module, args: seen.append(torch.is_autocast_enabled("cpu")))
    with memlab.apply(trainer, memlab.Plan()):
        trainer.train()
    hook.remove()
    assert seen and not any(seen)  # as a trainer built in fp32 runs its reference
    assert reference.forward == wrapped
