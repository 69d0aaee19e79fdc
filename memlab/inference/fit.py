"""``fit_inference``: the largest batch (or the fastest setting) of inference that fits a memory budget.

Two goals:

- ``goal="batch"`` (default): the largest ``batch_size`` of the ``base`` plan whose measured peak fits. Batch sizes
  1 and 2 are measured, the peak's line through them predicts the largest that fits, and that prediction is
  measured; from there the search measures one more row (expected not to fit). Where a prediction fails it steps
  back an eighth of the way to the largest size that fitted and predicts again from there (a line through sizes 1
  and 2 overshoots by a few rows at size 200); after a second failed prediction it bisects between the largest
  size that fitted and the smallest that did not. Inference memory is close to a line
  in the batch (weights plus per-row activations and cache), so a search usually measures four or five sizes. The
  answer is always a measured trial.
- ``goal="speed"``: every combination of ``space`` (settings of :class:`~memlab.plan.InferencePlan`, on
  top of ``base``) is measured against the budget, and ``report.best`` is the fastest that fits, judged with the
  noise rules of :class:`memlab.Report`.

Example:
    >>> import torch
    >>> from torch import nn
    >>> import memlab
    >>> model, rows = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8)), torch.randn(4, 64)
    >>> one_row = memlab.measure(model, rows, InferencePlan(batch_size=1), steps=1, noise=0)
    >>> report = fit_inference(model, rows, budget=3 * one_row.peak_bytes, steps=1, noise=0, progress=False)
    >>> largest = report.best.rows_per_step
    >>> largest > 2, [t.fits for t in report if t.rows_per_step == largest + 1]  # one more row does not fit
    (True, [False])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn
from typing_extensions import Unpack

from memlab.errors import MemlabError, refuse_class
from memlab.inference.run import InferenceRunner, check_inference_options, compare_inference
from memlab.live.batch import Batch
from memlab.live.device import model_device
from memlab.measure.cuda import cuda_card_capacity
from memlab.options import RunKeywords, RunOptions
from memlab.plan import InferencePlan, parse_inference_grid
from memlab.report import Report, Trial
from memlab.runner.progress import run_progress
from memlab.runner.trial import keep_on_interrupt

__all__ = ["GOALS", "LargestBatchReport", "fit_inference", "search_largest_batch"]

GOALS = ("batch", "speed")
_MAX_BATCH = 65536
_MAX_FAILED_PREDICTIONS = 2


@dataclass(repr=False)  # Report's own views (the table) show it, in IPython too
class LargestBatchReport(Report):
    """The Report of a largest-batch search: ``best`` is the largest batch that fits (the lower peak among equals),
    not the fastest; there are no ties.

    Example:
        >>> from memlab.report import InferenceTrial
        >>> small = InferenceTrial(InferencePlan(batch_size=1), "ok", 10, {}, 0.1, 10.0, None, "cpu", rows_per_step=1)
        >>> large = InferenceTrial(InferencePlan(batch_size=8), "ok", 50, {}, 0.4, 20.0, None, "cpu", rows_per_step=8)
        >>> LargestBatchReport([small, large], budget=60).best.label, LargestBatchReport([small, large], budget=40).ties
        ('fp32 bs8', [])
    """

    @property
    def best(self) -> Trial | None:
        fitting = [trial for trial in self.trials if self.fits(trial)]
        return max(fitting, key=lambda trial: (trial.rows_per_step or 0, -trial.peak_bytes), default=None)

    @property
    def ties(self) -> list[Trial]:
        return []


def fit_inference(
    model: nn.Module,
    batch: Batch,
    base: InferencePlan | None = None,
    *,
    goal: str = "batch",
    space: Mapping[str, Sequence[Any]] | str | Sequence[str] | None = None,
    max_batch: int = _MAX_BATCH,
    **options: Unpack[RunKeywords],
) -> Report:
    """The largest batch (``goal="batch"``) or the fastest setting (``goal="speed"``) of inference within
    ``budget``, measured on the live model (restored bit-exact afterwards); see the module's docstring for the
    search.

    Args:
        model: the model, on its device. batch: one batch; its rows repeat to make larger batches.
        base: the setting to search from (default ``InferencePlan()``); its ``batch_size`` is searched for
            ``goal="batch"``.
        goal: ``"batch"`` or ``"speed"``.
        space: for ``goal="speed"``: the settings to try, ``{"weights": ["fp32", "bf16"], "batch_size": [1, 8]}``
            or ``"weights=fp32,bf16 quantize=none,nf4"``; every combination is measured.
        max_batch: the largest batch size ``goal="batch"`` tries.
        options: :class:`~memlab.options.RunKeywords` (no ``loss_fn``). ``budget``: bytes or a size such as
            ``"8GiB"``; default on CUDA what this process can hold there; on CPU it must be given.

    Ctrl-C stops the search; the KeyboardInterrupt carries the trials measured so far as ``.report``.

    Example:
        >>> import torch
        >>> model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
        >>> report = fit_inference(model, torch.randn(4, 8), goal="speed", space={"weights": ["fp32", "bf16"]},
        ...                        budget="1MiB", steps=1, noise=0, progress=False)
        >>> sorted(t.label for t in report)
        ['bf16', 'fp32']
    """
    refuse_class(model, "fit_inference")
    run_options = RunOptions.from_keywords(options)
    check_inference_options(run_options)
    if not isinstance(model, nn.Module):
        raise MemlabError(f"model must be a torch nn.Module, not {type(model).__name__}")
    base = InferencePlan() if base is None else base
    if not isinstance(base, InferencePlan):
        raise MemlabError(f"base={base!r} is not an InferencePlan; write base=memlab.InferencePlan(...)")
    if goal not in GOALS:
        raise MemlabError(f"goal={goal!r} is not known; write goal='batch' (the largest batch) or goal='speed'")
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise MemlabError(f"max_batch={max_batch!r} is not allowed; write a whole number >= 1")
    budget = run_options.budget
    device = model_device(model)
    if budget is None:
        if device.type != "cuda":
            raise MemlabError(f"fit on {device.type} needs a budget; write for example budget='8GiB' or budget='500MB'")
        budget = cuda_card_capacity(device)  # the card's figure: what the process can hold, and its CUDA context
    run_options = run_options.replace(budget=budget)
    if goal == "speed":
        plans = parse_inference_grid(space if space is not None else {}, base)
        return compare_inference(model, batch, plans, **run_options.keywords())
    if space is not None:
        raise MemlabError(
            "space= is for goal='speed'; goal='batch' searches batch_size of base: write base=memlab.InferencePlan("
            "...) for the other settings"
        )
    return _largest_batch(model, batch, base, max_batch, run_options)


def _largest_batch(
    model: nn.Module, batch: Batch, base: InferencePlan, max_batch: int, options: RunOptions
) -> LargestBatchReport:
    budget = options.budget
    assert budget is not None
    measured: list[Trial] = []
    at_most = max(2, 2 * math.ceil(math.log2(max_batch + 1)) + 2)
    with keep_on_interrupt(measured, budget), run_progress(at_most, options.progress, at_most=True) as progress:
        runner = InferenceRunner(model, batch, options, listener=progress)
        runner.check(base.replace(batch_size=1))
        with runner.session():

            def fits(rows: int) -> bool:
                trial = runner.run(base.replace(batch_size=rows), len(measured), at_most)
                measured.append(trial)
                progress.advance(len(measured))
                if trial.status == "error":
                    raise _Failed(trial)
                return trial.fits

            try:
                search_largest_batch(fits, lambda: _points(measured), budget, max_batch)
            except _Failed:
                pass
    return LargestBatchReport(measured, budget=budget)


class _Failed(Exception):
    """A trial failed for another reason than memory: the search stops, and the report shows its error."""

    def __init__(self, trial: Trial) -> None:
        super().__init__(trial.error)
        self.trial = trial


def _points(trials: list[Trial]) -> list[tuple[int, int]]:
    return sorted((t.rows_per_step or 0, t.peak_bytes) for t in trials if t.fits)


def search_largest_batch(
    fits: Callable[[int], bool], points: Callable[[], list[tuple[int, int]]], budget: int, max_batch: int
) -> int:
    """The largest batch size that fits (0: none), measuring sizes through ``fits(rows)``; ``points()`` gives
    ``(rows, peak)`` of the sizes measured to fit, in order of rows.

    Example (a memory of 100 + 10 bytes a row, a budget of 1000: 90 rows fit):
        >>> tried = []
        >>> def fits(rows):
        ...     tried.append(rows)
        ...     return 100 + 10 * rows <= 1000
        >>> points = lambda: [(r, 100 + 10 * r) for r in sorted(tried) if 100 + 10 * r <= 1000]
        >>> search_largest_batch(fits, points, 1000, 4096), tried
        (90, [1, 2, 90, 91])
    """
    if not fits(1):
        return 0
    low, high = 1, None  # the largest size that fits, the smallest that does not
    failed_predictions = 0
    while low < max_batch and (high is None or high - low > 1):
        upper = max_batch if high is None else high - 1
        known = points()
        predicting = failed_predictions < _MAX_FAILED_PREDICTIONS and len(known) >= 2
        if predicting:
            (rows_a, peak_a), (rows_b, peak_b) = known[-2], known[-1]
            per_row = (peak_b - peak_a) / (rows_b - rows_a) if rows_b != rows_a else 0.0
            candidate = rows_b + int((budget - peak_b) // per_row) if per_row > 0 else upper
            if high is not None and candidate >= high:
                # The line through the first sizes overshot a little (a few rows of noise in a long
                # extrapolation): step back an eighth of the gap, and predict again from the size found there.
                candidate = high - max(1, (high - low) // 8)
        elif high is None:
            candidate = low * 2
        else:
            candidate = (low + high) // 2
        candidate = min(max(candidate, low + 1), upper)
        if fits(candidate):
            low = candidate
        else:
            high = candidate
            failed_predictions += predicting  # two failed predictions: bisect from now on
    return low
