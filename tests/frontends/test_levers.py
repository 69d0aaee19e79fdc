"""A built trainer's own setting (``precompute_ref``: a DPOTrainer's; ``vllm_memory``, ``vllm_sleep``: a GRPOTrainer's
vLLM engine) asked of a plain model: every entry point refuses it with one MemlabError that names whose setting it
is and what to write, before any trial runs (no event, no trial, the model as it was)."""

from __future__ import annotations

import pytest
from models import assert_same, fingerprint, lm_batch, tiny_gpt2

import memlab
from memlab.errors import MemlabError


@pytest.fixture(scope="module")
def model():
    return tiny_gpt2(layers=1, width=16)


@pytest.mark.parametrize("dry_run", [False, True], ids=["measured", "dry-run"])
@pytest.mark.parametrize("space", [{"precompute_ref": [True]}, {"precompute_ref": [None, True]},
                                   {"vllm_sleep": [False, True]}, {"vllm_memory": [0.3]}],
                         ids=["precompute", "precompute-or-not", "vllm-sleep", "vllm-memory"])
def test_fit_refuses_a_trainer_lever_on_a_model_before_any_trial(model, space, dry_run) -> None:
    before = fingerprint(model)
    events: list[object] = []
    with pytest.raises(MemlabError) as caught:
        memlab.fit(model, lm_batch(rows=2, length=8), budget="1GiB", space=space, dry_run=dry_run, steps=1, noise=0,
                   progress=False, callback=events.append)
    (name,) = space
    message = str(caught.value)
    assert message.startswith(f"{name} is a setting of a TRL "), message
    assert "fit was given a GPT2LMHeadModel" in message and f"memlab.fit(trainer, space={{'{name}'" in message
    assert message.endswith(f"or drop {name}"), message
    assert events == []
    assert_same(before, fingerprint(model))


def test_fit_takes_the_trainer_default_on_a_model(model) -> None:
    report = memlab.fit(model, lm_batch(rows=2, length=8), budget="1GiB", dry_run=True, progress=False,
                        space={"precompute_ref": [None], "precision": ["fp32"], "optimizer": ["adamw"]})
    assert report.best is not None


@pytest.mark.parametrize("entry", ["measure", "compare"])
@pytest.mark.parametrize("plan", [memlab.Plan(precompute_ref=True), memlab.Plan(vllm_memory=0.3)],
                         ids=["precompute", "vllm"])
def test_measure_and_compare_refuse_before_any_trial(model, entry, plan) -> None:
    events: list[object] = []
    with pytest.raises(MemlabError, match="write the plan without"):
        if entry == "measure":
            memlab.measure(model, lm_batch(rows=2, length=8), plan, steps=1, noise=0, callback=events.append)
        else:  # the refused plan second: nothing runs, the first plan included
            memlab.compare(model, lm_batch(rows=2, length=8), [memlab.Plan(), plan], steps=1, noise=0,
                           callback=events.append)
    assert events == []
