"""Vision-language models measured, estimated and fitted on CPU: Qwen2-VL, Qwen2.5-VL, LLaVA, Idefics3 (SmolVLM's
architecture) and Gemma 3, tiny models built from their config classes, batches made by their own processors
(``tests/vlms.py``: the processor classes with a tokenizer made from a tiny vocabulary; the image processors need
Pillow, and where it is missing a stand-in gives their keys, shapes and dtypes, checked against the real ones
where Pillow is installed). Qwen's batches do not share dimension 0 (flattened patches, one grid row per image):
memlab takes them whole, and a plan that would cut them says what to write. TRL's SFTTrainer with its VLM collator
goes through ``memlab.measure``, ``estimate`` and ``fit`` too."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

import memlab
from memlab.errors import MemlabError
from memlab.live.batch import count_rows, is_atomic

sys.path.insert(0, str(Path(__file__).resolve().parents[0]))
from models import assert_same, fingerprint  # noqa: E402
from vlms import FAMILIES, HAS_PILLOW, images  # noqa: E402

FAST: dict[str, Any] = {"steps": 1, "noise": 0, "progress": False}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The family's model, processor, batch and the measured trial of the plain plan (shared by its tests)."""
    built = FAMILIES[request.param]()
    model, processor = built.build()
    batch = built.batch(2)
    before = fingerprint(model)
    trial = memlab.measure(model, batch, memlab.Plan(), **FAST)
    return {"name": request.param, "family": built, "model": model, "processor": processor, "batch": batch,
            "before": before, "trial": trial}


def test_measured_whole_and_model_restored(family: dict[str, Any]) -> None:
    trial = family["trial"]
    assert trial.status == "ok", trial.error
    assert sum(trial.breakdown.values()) == trial.peak_bytes
    assert trial.breakdown["activations"] > 0 and trial.rows_per_step == 2
    assert_same(family["before"], fingerprint(family["model"]))


def test_estimated_on_fake_tensors_as_measured(family: dict[str, Any]) -> None:
    """The dry run takes the image inputs: the image token positions and grids keep their values, so the vision
    tower and the merge run as on real tensors (before, LLaVA's estimate was an error trial)."""
    estimate = memlab.estimate(family["model"], family["batch"], memlab.Plan(), device="cpu")
    assert estimate.status == "ok" and estimate.estimated, estimate.error
    trial = family["trial"]
    measured = trial.peak_bytes - (trial.preexisting_bytes or 0)  # what the process held before is not the step's
    assert abs(estimate.peak_bytes - measured) <= 0.02 * measured, (estimate.breakdown, trial.breakdown)
    assert_same(family["before"], fingerprint(family["model"]))


# the four plans measured below, and no other (the chunked loss and the attention kernel held as the model is)
SPACE = {"optimizer": ["adamw"], "checkpointing": [False, True], "precision": ["fp32", "bf16"], "loss": ["full"],
         "attention": [None]}


def test_fit_within_a_small_budget(family: dict[str, Any]) -> None:
    """The budget is what the plan that needs least measured, a hair above: fit answers with a plan that fits it,
    the batch taken whole; where a lever saves (more than 3% of the plain peak), the answer is not the plain plan.

    The budget comes from the plans measured here, not from a premise: on these tiny models the peak is at the
    optimizer step (weights, gradients, AdamW's state), so checkpointing and bf16 autocast may save nothing (the
    tiny LLaVA: 882,572 and 955,746 B against plain's 882,428 B), and a fixed 0.97 of plain held in some
    environments only."""
    plans = [memlab.Plan(checkpointing=c, precision=p) for c in SPACE["checkpointing"] for p in SPACE["precision"]]
    measured = list(memlab.compare(family["model"], family["batch"], plans, **FAST).trials)  # plain again, warm
    assert all(t.status == "ok" for t in measured), [(t.plan.label(), t.error) for t in measured]
    lowest = min(t.peak_bytes for t in measured)
    budget = int(lowest * 1.01)  # what the process holds beside a step may differ by a few bytes between runs
    report = memlab.fit(family["model"], family["batch"], budget=budget, max_trials=4, estimates=False, space=SPACE,
                        **FAST)
    assert report.best is not None and report.best.fits and report.best.peak_bytes <= budget, (
        budget, [(t.plan.label(), t.peak_bytes) for t in measured], [(t.plan.label(), t.status, t.peak_bytes,
                                                                    t.preexisting_bytes) for t in report.trials])
    assert report.best.rows_per_step == 2
    plain = measured[0].peak_bytes
    if budget < 0.97 * plain:  # a lever saves here: fit found it
        assert report.best.plan != memlab.Plan() and report.best.peak_bytes < plain
    assert_same(family["before"], fingerprint(family["model"]))


def test_processor_batch_as_pillow_makes_it() -> None:
    """The stand-in image processor gives what the real one does: same keys, shapes, dtypes and token ids."""
    if not HAS_PILLOW:
        pytest.skip("Pillow is not installed: transformers' image processors need it")
    for name, make in FAMILIES.items():
        built = make()
        real, stand_in = built.batch(2, real=True), built.batch(2, real=False)
        assert real.keys() == stand_in.keys(), name
        for key in real:
            assert (real[key].shape, real[key].dtype) == (stand_in[key].shape, stand_in[key].dtype), (name, key)
        assert torch.equal(real["input_ids"], stand_in["input_ids"]), name


@pytest.fixture(scope="module")
def qwen() -> dict[str, Any]:
    built = FAMILIES["qwen2_vl"]()
    model, processor = built.build()
    return {"family": built, "model": model, "processor": processor, "batch": built.batch(2)}


def test_qwen_batch_is_atomic(qwen: dict[str, Any]) -> None:
    batch = qwen["batch"]
    assert batch["pixel_values"].shape[0] != batch["input_ids"].shape[0]  # patches, not rows
    assert is_atomic(batch) and count_rows(batch) == 2
    with pytest.raises(MemlabError, match="give them the same dimension 0"):
        count_rows({"input_ids": torch.zeros(2, 4), "labels": torch.zeros(3, 4)})  # text rows must still agree


@pytest.mark.parametrize("plan", [memlab.Plan(micro_batch=1, accumulation=2), memlab.Plan(micro_batch=4)])
def test_plan_that_would_cut_an_atomic_batch_says_what_to_write(qwen: dict[str, Any], plan: memlab.Plan) -> None:
    model, batch = qwen["model"], qwen["batch"]
    before = fingerprint(model)
    for run in (lambda: memlab.measure(model, batch, plan, **FAST), lambda: memlab.estimate(model, batch, plan)):
        with pytest.raises(MemlabError, match=r"atomic batch.*micro_batch=None.*Trainer whose collator"):
            run()
    with pytest.raises(MemlabError, match="atomic batch"):
        memlab.fit(model, batch, budget="1GiB", space={"micro_batch": [1]}, **FAST)
    with pytest.raises(MemlabError, match="not a multiple of its 2 rows"):
        memlab.fit(model, batch, budget="1GiB", batch_size=3, **FAST)
    assert_same(before, fingerprint(model))


def test_inference_takes_the_atomic_batch_whole(qwen: dict[str, Any]) -> None:
    model, batch = qwen["model"], qwen["batch"]
    trial = memlab.measure(model, batch, memlab.InferencePlan(), **FAST)
    assert trial.status == "ok", trial.error
    with pytest.raises(MemlabError, match=r"batch_size=4 would cut.*write batch_size=None"):
        memlab.measure(model, batch, memlab.InferencePlan(batch_size=4), **FAST)


def test_accumulation_runs_the_whole_batch_each_micro_step(qwen: dict[str, Any]) -> None:
    model, batch = qwen["model"], qwen["batch"]
    trial = memlab.measure(model, batch, memlab.Plan(accumulation=2), **FAST)
    assert trial.status == "ok" and trial.rows_per_step == 4, trial.error
    report = memlab.fit(model, batch, budget="1GiB", batch_size=4, max_trials=1, estimates=False,
                        space={"optimizer": ["adamw"], "checkpointing": [False], "precision": ["fp32"]}, **FAST)
    assert report.best is not None and (report.best.plan.micro_batch, report.best.plan.accumulation) == (2, 2)


def test_sft_trainer_with_its_vlm_collator(qwen: dict[str, Any]) -> None:
    """TRL's SFTTrainer over Qwen2-VL: its DataCollatorForVisionLanguageModeling runs the processor on each
    micro-batch's examples (text and images); memlab measures, estimates and fits through the trainer."""
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl")
    import numpy as np

    built, model, processor = qwen["family"], qwen["model"], qwen["processor"]
    texts = [f"{built.prompt} a photo of a {' '.join(['cat', 'dog', 'mat', 'red'][: 1 + k % 4])}" for k in range(6)]
    pictures = images(6, built.image_size)
    stored = pictures if HAS_PILLOW else [picture.tolist() for picture in pictures]
    data = datasets.Dataset.from_list([{"text": t, "images": [p]} for t, p in zip(texts, stored, strict=True)])
    if not HAS_PILLOW:  # datasets stores arrays as lists: they come back as arrays, as the processor takes them
        data = data.with_transform(lambda rows: {**rows, "images": [
            [np.asarray(image, dtype=np.uint8) for image in group] for group in rows["images"]]}
            if "images" in rows else rows)
    args = trl.SFTConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=2, max_steps=1, report_to=[],
                         dataset_kwargs={"skip_prepare_dataset": True}, remove_unused_columns=False, use_cpu=True)
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=data, processing_class=processor)
    assert type(trainer.data_collator).__name__ == "DataCollatorForVisionLanguageModeling"
    before = fingerprint(model)
    measured = memlab.measure(trainer, memlab.Plan(), **FAST)
    assert measured.status == "ok" and measured.rows_per_step == 2, measured.error
    estimated = memlab.estimate(trainer, memlab.Plan(), device="cpu")
    assert estimated.status == "ok", estimated.error
    step_bytes = measured.peak_bytes - (measured.preexisting_bytes or 0)
    assert abs(estimated.peak_bytes - step_bytes) <= 0.02 * step_bytes, (estimated.breakdown, measured.breakdown)
    report = memlab.fit(trainer, budget=int(measured.peak_bytes * 1.5), max_trials=2, estimates=False,
                        space={"optimizer": ["adamw"], "checkpointing": [False, True], "precision": ["fp32"]},
                        **FAST)
    assert report.best is not None and report.best.fits
    assert_same(before, fingerprint(model))
