"""``fit``: the fastest plan whose measured peak fits a memory budget at a fixed effective batch.

The space is every combination of micro_batch (a divisor of ``batch_size``; accumulation makes up the rest),
checkpointing, precision, optimizer and offload. Measuring all of it is slow, so the search measures a few plans,
fits two small models to what it measured, and skips what cannot fit or cannot win:

- Memory (:class:`MemoryModel`): ``peak = params + other + optimizer + grads + activations``, each part from the
  measured breakdowns: optimizer bytes per optimizer (8-bit AdamW unmeasured: a quarter of AdamW's), gradients
  held at the peak (with accumulation, all of them), and activations as a line ``intercept + per_row *
  micro_batch`` per (checkpointing, precision, activation offload). A line needs two micro-batch sizes; from one
  size it leans low (proportional below it, flat above unless an out-of-memory trial showed more); for a
  combination never measured, per-row bytes are a neighbour's times the ratio each technique was measured to have,
  and 0 while a ratio is unknown (an unmeasured technique might save everything). The first plan runs without the
  budget's cap, so its whole breakdown is known even when it does not fit.
- Speed (:class:`SpeedModel`): ``log(samples/s)`` is a sum of one effect per setting, fitted by least squares. A
  plan's speed is predicted only where the measurements determine it; otherwise it could be the fastest and must
  be measured. On CUDA throughput is assumed never to fall when micro_batch grows with the same techniques, so a
  plan is at most as fast as its larger-micro-batch twin (on a CPU that does not hold; every size is measured).
- Stop rule (:class:`Search`): a plan is skipped when it needs at least the memory of a plan that did not fit
  (:func:`needs_at_least`), when its predicted peak is over ``FIT_MARGIN * budget`` (1.1; borderline plans are
  measured), when a measured plan that fits does its work or less (:func:`faster_twins`), or when it cannot beat
  the best so far: a predicted speed must exceed ``SPEED_MARGIN * best`` (0.9, the model's error) and a measured
  twin's speed must exceed ``best``. The rest are measured fastest-expected first (plans predicted to fit before
  borderline ones) until none is left or ``max_trials`` (15) were measured, so the answer is a measured trial.
"""

from __future__ import annotations

from memlab.search.fit import MAX_TRIALS, fit
from memlab.search.memory import FIT_MARGIN, Line, MemoryModel, fit_line, one_point_line
from memlab.search.space import (
    best_of,
    candidate_plans,
    default_space,
    divisors,
    faster_twins,
    fits,
    micro_batch_of,
    needs_at_least,
    runs_as,
)
from memlab.search.speed import SPEED_MARGIN, SpeedModel, SpeedPrior, speed_prior
from memlab.search.strategy import Search, SearchResult

__all__ = [
    "MAX_TRIALS",
    "FIT_MARGIN",
    "Line",
    "MemoryModel",
    "SPEED_MARGIN",
    "Search",
    "SearchResult",
    "SpeedModel",
    "SpeedPrior",
    "best_of",
    "candidate_plans",
    "default_space",
    "divisors",
    "faster_twins",
    "fit",
    "fit_line",
    "fits",
    "micro_batch_of",
    "needs_at_least",
    "one_point_line",
    "runs_as",
    "speed_prior",
]
