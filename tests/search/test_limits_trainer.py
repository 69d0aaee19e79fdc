"""memlab.limits on trainers (issue 59): a GRPOTrainer's longest max_completion_length and most generations per
device, and a DPOTrainer's most examples per device, at which the trainer's step is estimated to fit a budget, each
answer checked against estimates of trainers whose config has that size; the trainer as it was afterwards; bad input
one MemlabError. Tiny Llamas on CPU."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("trl")
from test_grpo_step import _held, _rng, _same, grpo  # noqa: E402
from trl_trainers import make_dpo_trainer  # noqa: E402

import memlab  # noqa: E402
from memlab import MemlabError  # noqa: E402
from memlab.search.limits_trainer import sized  # noqa: E402


def _estimate(trainer: Any, vary: str, size: int, plan: memlab.Plan | None = None) -> memlab.Trial:
    """The trainer's step estimated with ``size`` set as a user would set it (its config's fields)."""
    with sized(trainer, vary, size):
        return memlab.estimate(trainer, plan, device="cpu")


def test_the_longest_completion_that_fits_straddles_the_budget(tmp_path: Any) -> None:
    trainer = grpo(tmp_path, "reference")
    held = _held(trainer)
    at_16, at_64 = _estimate(trainer, "tokens", 16), _estimate(trainer, "tokens", 64)
    assert at_16.peak_bytes < at_64.peak_bytes  # the KV cache and the logits grow with the completions
    budget = (at_16.peak_bytes + at_64.peak_bytes) // 2

    found = memlab.limits(trainer, budget=budget, vary="tokens", multiple=4, device="cpu")
    assert 16 <= found.value < 64 and found.next == found.value + 4, found.to_text()
    assert not found.measured and len(found.tried) <= memlab.search.limits.MAX_RUNS
    assert _estimate(trainer, "tokens", found.value).peak_bytes <= budget < \
        _estimate(trainer, "tokens", found.next).peak_bytes
    assert found.trial.plan.label() == memlab.Plan.from_trainer(trainer).label()  # the trainer as set up
    assert any("GRPO step: generation peak" in note for note in found.trial.notes)
    assert f"at most {found.value} completion tokens fit" in found.answer()
    assert "completion tokens" in found.to_text()
    held["rng"] = _rng()
    _same(trainer, held)
    assert trainer.max_completion_length == trainer.args.max_completion_length == 8


def test_the_most_generations_per_device_in_whole_prompts(tmp_path: Any) -> None:
    trainer = grpo(tmp_path, per_device_train_batch_size=2, num_generations=2)
    held = _held(trainer)
    at_2, at_8 = _estimate(trainer, "rows", 2), _estimate(trainer, "rows", 8)
    budget = (at_2.peak_bytes + at_8.peak_bytes) // 2
    found = memlab.limits(trainer, budget=budget, vary="rows", device="cpu")
    assert found.value % 2 == 0 and 2 <= found.value < 8 and found.next == found.value + 2, found.to_text()
    assert _estimate(trainer, "rows", found.value).peak_bytes <= budget < \
        _estimate(trainer, "rows", found.next).peak_bytes
    assert found.trial.rows_per_step == found.value  # gradient_accumulation_steps=1 kept
    assert "generations per device" in found.answer()
    # A plan splits each size into its accumulation: at least as many generations fit in two micro-batches.
    split = memlab.limits(trainer, memlab.Plan(accumulation=2), budget=budget, vary="rows", device="cpu")
    assert split.value >= found.value and split.trial.plan.accumulation == 2
    held["rng"] = _rng()
    _same(trainer, held)
    assert (trainer.args.per_device_train_batch_size, trainer.args.generation_batch_size) == (2, 2)


def test_bad_input_is_one_error_that_says_what_to_write(tmp_path: Any) -> None:
    trainer = grpo(tmp_path, num_generations=2)
    args = trainer.args
    with pytest.raises(MemlabError, match=r"takes none with it: write memlab.limits\(trainer, budget="):
        memlab.limits(trainer, budget="1GiB", batch={"input_ids": (2, 16)})
    with pytest.raises(MemlabError, match=r"fixes micro_batch=2; write the plan without it"):
        memlab.limits(trainer, memlab.Plan(micro_batch=2), budget="1GiB", vary="rows")
    with pytest.raises(MemlabError, match=r"multiple of 2 .* e.g. multiple=2"):
        memlab.limits(trainer, budget="1GiB", vary="rows", multiple=3)
    with pytest.raises(MemlabError, match=r"does not take batch_size"):
        memlab.limits(trainer, budget="1GiB", batch_size=2)
    with pytest.raises(MemlabError, match=r"gpus=2 needs a strategy"):  # per GPU: the sharding says how
        memlab.limits(trainer, budget="1GiB", gpus=2)
    assert trainer.args is args and args.per_device_train_batch_size == 2
    nothing = memlab.limits(trainer, budget="64KiB", multiple=4, device="cpu")
    assert nothing.value == 0 and nothing.reason and "nothing fits" in nothing.answer()


@pytest.mark.slow
def test_the_most_examples_per_device_of_a_dpo_trainer(tmp_path: Any) -> None:
    trainer = make_dpo_trainer(tmp_path)  # 6 preference pairs, 2 per device, a reference model held apart
    args, dataset, model = trainer.args, trainer.train_dataset, trainer.model
    at_1, at_6 = _estimate(trainer, "rows", 1), _estimate(trainer, "rows", 6)
    assert at_1.peak_bytes < at_6.peak_bytes
    budget = (at_1.peak_bytes + at_6.peak_bytes) // 2
    found = memlab.limits(trainer, budget=budget, vary="rows", device="cpu")
    assert 1 <= found.value < 6 and found.next == found.value + 1, found.to_text()
    assert _estimate(trainer, "rows", found.value).peak_bytes <= budget < \
        _estimate(trainer, "rows", found.next).peak_bytes
    assert found.trial.rows_per_step == found.value and "examples per device" in found.answer()
    everything = memlab.limits(trainer, budget="64GiB", vary="rows", device="cpu")
    assert everything.value == 6 and everything.next is None  # the dataset's length: more are not tried
    assert any("train dataset's length" in note for note in everything.notes)
    split = memlab.limits(trainer, memlab.Plan(accumulation=2), budget=budget, vary="rows", device="cpu")
    assert split.value % 2 == 0 and all(size % 2 == 0 for size, _ in split.tried)  # 2 micro-batches of each size
    with pytest.raises(MemlabError, match=r"multiple of 2 \(the plan's accumulation=2 divides"):
        memlab.limits(trainer, memlab.Plan(accumulation=2), budget=budget, vary="rows", multiple=3)
    with pytest.raises(MemlabError, match=r"its sequences are its dataset's: write memlab.limits\(trainer, budget="):
        memlab.limits(trainer, budget=budget, device="cpu")
    assert trainer.args is args and trainer.train_dataset is dataset and trainer.model is model
    assert args.per_device_train_batch_size == 2


def test_the_most_examples_per_gpu_of_a_trainer_sharded_over_several(tmp_path: Any) -> None:
    # Issue 85: limits on a trainer that will be launched on several GPUs answers per GPU: each size is the estimate
    # per GPU (gpus= and strategy= as memlab.estimate takes them, or the trainer's own deepspeed= / fsdp= setup).
    trainer = make_dpo_trainer(tmp_path)
    args = trainer.args

    def per_gpu(size: int) -> memlab.Trial:
        with sized(trainer, "rows", size):
            return memlab.estimate(trainer, gpus=2, strategy="fsdp2", device="cpu")

    at_1, at_6 = per_gpu(1), per_gpu(6)
    assert at_1.peak_bytes < at_6.peak_bytes < _estimate(trainer, "rows", 6).peak_bytes
    budget = (at_1.peak_bytes + at_6.peak_bytes) // 2
    found = memlab.limits(trainer, budget=budget, vary="rows", gpus=2, strategy="fsdp2", device="cpu")
    assert 1 <= found.value < 6, found.to_text()
    assert per_gpu(found.value).peak_bytes <= budget < per_gpu(found.next).peak_bytes
    assert found.trial.gpus == 2 and found.trial.strategy == "fsdp2"
    args.fsdp, args.fsdp_config = True, {"version": 2}  # set up for FSDP2: read, with the GPUs it will run on
    read = memlab.limits(trainer, budget=budget, vary="rows", gpus=2, device="cpu")
    assert read.value == found.value
    with pytest.raises(MemlabError, match=r"runs in one process here; say how many GPUs"):
        memlab.limits(trainer, budget=budget, vary="rows", device="cpu")
    with pytest.raises(MemlabError, match=r"memlab.limits\(trainer, budget=..., vary='rows', gpus=N\)"):
        memlab.fit(trainer, budget=budget)
    args.fsdp, args.fsdp_config = "", {}
    assert args.per_device_train_batch_size == 2
