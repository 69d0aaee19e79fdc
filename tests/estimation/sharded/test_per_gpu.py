"""`--gpus auto`'s search of the fewest GPUs that fit: its probes go where the last estimate predicts the boundary,
and its answer is the bisection's whatever the predictions say."""

from __future__ import annotations

import random

from memlab import Plan
from memlab.estimation.sharded.fsdp2 import ShardedTrial
from memlab.estimation.sharded.per_gpu import _search

NUMBERS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


def _bisect(run, numbers):  # type: ignore[no-untyped-def]
    """The plain bisection the search replaced (memlab 97209b1), the reference its answers must equal."""
    low, high = 0, len(numbers) - 1
    best = failed = None
    ran = False
    while low <= high:
        middle = (low + high) // 2
        trial = run(numbers[middle])
        ran = ran or trial.status == "ok"
        failed = failed if trial.status == "ok" else trial
        if trial.status == "ok" and trial.fits:
            best, high = trial, middle - 1
        else:
            low = middle + 1
    return best if best is not None or ran else failed


def _trial(gpus: int, figure: int, sharded: int, budget: int, status: str = "ok") -> ShardedTrial:
    return ShardedTrial(Plan(), status, figure, {}, None, None, None, "cuda", budget=budget, gpus=gpus,
                        strategy="fsdp2", detail={"sharded_params": sharded, "activations": figure - sharded})


def test_a_70b_like_question_takes_two_probes_where_the_bisection_took_three() -> None:
    # figure(n) = 39 + 1540 / n (GiB-like units), budget 80: 32 is over (87.1), 64 fits (63.1)
    def run(n: int) -> ShardedTrial:
        probes.append(n)
        return _trial(n, 39 + 1540 // n, 1540 // n, 80)

    probes: list[int] = []
    found = _search(run, NUMBERS)
    assert found is not None and found.gpus == 64 and probes == [32, 64]
    probes.clear()
    assert _bisect(run, NUMBERS).gpus == 64 and probes == [32, 256, 64]


def test_the_answer_is_the_bisections_whatever_the_predictions_say() -> None:
    # A monotone figure (the search's premise) with sharded bytes that mislead the prediction either way; a
    # search that trusted a predicted boundary without the probe that settles it would answer differently.
    chance = random.Random(48)
    budget = 1000
    probes: list[int] = []
    for case in range(400):
        boundary = chance.randrange(len(NUMBERS) + 1)  # the first index that fits; len: none does
        errors = chance.random() < 0.1
        figures = {n: budget + chance.randrange(1, 500) if i < boundary else budget - chance.randrange(0, 500)
                   for i, n in enumerate(NUMBERS)}
        shares = {n: chance.randrange(0, 3000) for n in NUMBERS}

        def run(n: int, figures: dict[int, int] = figures, shares: dict[int, int] = shares,
                errors: bool = errors, budget: int = budget, probes: list[int] = probes) -> ShardedTrial:
            probes.append(n)
            if errors and figures[n] > budget:
                return _trial(n, 0, 0, budget, status="error")
            return _trial(n, figures[n], min(shares[n], figures[n]), budget)

        probes.clear()
        found = _search(run, NUMBERS)
        assert len(probes) <= 5, (case, probes)  # what memlab estimate's progress bar counts at most
        searched = probes[:]
        expected = _bisect(run, NUMBERS)
        assert found == expected, (case, searched, boundary)


def test_every_failed_probe_gives_the_error_trial() -> None:
    def run(n: int) -> ShardedTrial:
        return _trial(n, 0, 0, 10, status="error")

    found = _search(run, NUMBERS)
    assert found is not None and found.status == "error"
    assert _search(lambda n: _trial(n, 20, 10, 10), NUMBERS) is None  # ran, none fits
