"""The longest max_completion_length a GRPO suggestion names, found over multiples of 64 (the command line's) and
below the smallest multiple where none fits (issue 68), with a fake estimate: a length fits up to a limit."""

from __future__ import annotations

from typing import Any

import pytest

from memlab.kinds.grpo import suggest as grpo_suggest
from memlab.plan import Plan
from memlab.report import Trial


def _fits_up_to(limit: int, tried: list[int]) -> Any:
    def estimate(trainer: Any, plan: Plan, name: str, value: int, options: dict[str, Any]) -> Trial:
        tried.append(value)
        peak = 10 * value
        return Trial(plan, "ok", peak, {}, None, None, None, "cpu", budget=10 * limit, estimated=True)

    return estimate


@pytest.mark.parametrize(("completion", "limit", "multiple", "found"), [
    (1024, 700, 64, 640),   # the multiples: 640 fits, 704 does not
    (100, 30, 64, 30),      # 64 does not fit: the lengths below it, one by one
    (100, 0, 64, 0),        # not one token fits
    (40, 25, 64, 25),       # a completion not above the multiple: token by token
    (1024, 700, 1, 700),    # fit's own search: every length
])
def test_the_longest_that_fits(monkeypatch: pytest.MonkeyPatch, completion: int, limit: int, multiple: int,
                               found: int) -> None:
    tried: list[int] = []
    monkeypatch.setattr(grpo_suggest, "_estimate", _fits_up_to(limit, tried))
    longest, trial = grpo_suggest._longest_completion(object(), Plan(), completion, {}, multiple)
    assert longest == found and (trial is None) == (found == 0)
    assert len(tried) <= 16  # bisection, not a scan
