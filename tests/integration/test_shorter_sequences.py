"""When nothing in a fit's space fits, the report says how long the sequences could be with its lightest plan."""

from __future__ import annotations

from models import assert_same, fingerprint, lm_batch, tiny_llama

import memlab
from memlab.search.fit import fit

# One plan: the lightest plan the search has is then the plain one.
ONE_PLAN = {"micro_batch": [4], "checkpointing": [False], "precision": ["fp32"], "optimizer": ["adamw"],
            "loss": ["full"], "offload": ["none"]}


def test_nothing_fits_at_this_length_but_the_report_names_the_longest_that_would():
    model, batch = tiny_llama(), lm_batch(rows=4, length=256)
    short = memlab.estimate(model, lm_batch(rows=4, length=32), memlab.Plan(), device="cpu")
    full = memlab.estimate(model, batch, memlab.Plan(), device="cpu")
    budget = (short.peak_bytes + full.peak_bytes) // 2  # between the short batch's peak and this one's
    before = fingerprint(model)
    report = fit(model, batch, budget=budget, batch_size=4, space=ONE_PLAN, steps=1, noise=0, progress=False)
    assert report.best is None
    said = report.shorter_sequences
    assert said is not None and said.startswith("with plain, sequences of at most ") and "(this batch has 256)" in said
    longest = int(said.split("at most ")[1].split(" tokens")[0])
    assert 32 <= longest < 256
    # What it says holds: the plan is estimated to fit at that length.
    assert memlab.estimate(model, lm_batch(rows=4, length=longest), memlab.Plan(), device="cpu").peak_bytes <= budget
    assert f"Or shorter: {said}" in report.to_text()
    assert memlab.Report.from_dict(report.to_dict()).shorter_sequences == said
    assert_same(before, fingerprint(model))


def test_a_fit_that_finds_a_plan_says_nothing_of_shorter_sequences():
    model, batch = tiny_llama(), lm_batch(rows=4, length=16)
    report = fit(model, batch, budget="1GiB", batch_size=4, space=ONE_PLAN, steps=1, noise=0, progress=False)
    assert report.best is not None and report.shorter_sequences is None
