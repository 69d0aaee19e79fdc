"""Run plans on a live model and measure them: snapshot once, then for each plan apply, step, measure, restore.

A trial's steps: ``max(warmup, 1)`` untimed warm-up steps (the first creates the optimizer state, so what follows is a
steady-state step), one tracked step that gives the peak and its composition by category, and at least ``steps``
timed steps without tracking, whose median is the step time. Timing goes on until the 95% interval of that median is
within ``noise`` of it (:mod:`memlab.report.noise`) or ``time_limit`` seconds of timed steps have run. The first trial
of a process on a device also warms up until two warm-up steps take about the same time: a cold process (lazy
initialisation, an allocator that has not grown yet) would otherwise make the first plan look slow. What differs by
device (how the budget is enforced, where the peak is read, what memory is held before) is the
:class:`~memlab.measure.probes.Probe`'s business.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from typing_extensions import Unpack

from memlab.errors import MemlabError
from memlab.events import Callback, Event, MemorySample, StepFinished, TrialFinished, TrialSettled, TrialStarted
from memlab.measure.cuda import CudaPeak
from memlab.measure.oom import is_oom_error, release_error, release_memory
from memlab.measure.probes import Probe, probe_for
from memlab.measure.reading import PeakReading, read_failed_peak, read_peak
from memlab.measure.remeasure import settle_close_race
from memlab.measure.tracker import MemoryTracker
from memlab.options import RunKeywords, RunOptions
from memlab.plan import Plan
from memlab.report import Report, Trial
from memlab.report.noise import fewest_values, relative_half_width
from memlab.runner.batch import Batch, count_rows, count_tokens, named_tensors, resolve_loss_fn
from memlab.runner.module_state import ModelValues, ModuleStructure, trainable_parameters, unique_parameters
from memlab.runner.progress import run_progress
from memlab.runner.quiet import quiet
from memlab.runner.step import TrainingStep, model_weights
from memlab.techniques.accumulation import micro_batches
from memlab.techniques.optimizer import state_tensors

if TYPE_CHECKING:
    from memlab.inference.plan import InferencePlan

__all__ = ["TrialRunner", "check_plans", "compare", "keep_on_interrupt", "measure", "timed_enough"]

Clock = Callable[[], float]
# fp16's GradScaler skips the optimizer step while the scale is too high, so the optimizer state may not exist
# after the requested warm-up; at most this many more steps are run to reach a steady state.
_EXTRA_WARMUP_LIMIT = 8
# A cold process warms up until two consecutive warm-up steps differ by at most this fraction.
_STEADY_WARMUP = 0.2
# However small the noise target, no plan is timed for more steps than this.
_MAX_TIMED_STEPS = 100
# The device types on which this process has already run a trial (and so is warm).
_WARM_DEVICE_TYPES: set[str] = set()


def measure(model: nn.Module, batch: Batch, plan: Plan | InferencePlan, **options: Unpack[RunKeywords]) -> Trial:
    """Measure one plan on the live model: peak memory by category and throughput. The model is left as it was.

    Keywords are :class:`~memlab.options.RunKeywords` (``loss_fn``, ``steps``, ``warmup``, ``budget``, ``lr``,
    ``callback``); no progress bar is shown for one plan. An :class:`memlab.InferencePlan` measures a forward or a
    generation under ``torch.inference_mode()`` instead of a training step, and returns an
    :class:`~memlab.report.InferenceTrial` (see :mod:`memlab.inference`).

    Example:
        >>> model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
        >>> trial = measure(model, torch.randn(8, 16), Plan(), loss_fn=lambda m, b: m(b).mean())
        >>> trial.status, trial.breakdown["params"] == 4 * sum(p.numel() for p in model.parameters())
        ('ok', True)
    """
    if isinstance(plan, (list, tuple)) or (isinstance(plan, Iterable) and not isinstance(plan, (str, bytes))):
        raise MemlabError(
            "measure takes one plan; write memlab.measure(model, batch, memlab.Plan(...)), or "
            "memlab.compare(model, batch, plans) for a list"
        )
    options["progress"] = False
    return compare(model, batch, [plan], **options).trials[0]  # type: ignore[arg-type]


def compare(
    model: nn.Module, batch: Batch, plans: Sequence[Plan] | Sequence[InferencePlan], **options: Unpack[RunKeywords]
) -> Report:
    """Measure every plan in turn on the live model; a plan that runs out of memory or fails does not stop the rest.

    Plans close in speed to the fastest are then timed again in turn, A B A B
    (:func:`~memlab.measure.remeasure.settle_close_race`), so that a shared machine's drift between two trials
    does not crown a winner; ``noise=0`` (time exactly ``steps`` steps) leaves that out.

    Keywords are :class:`~memlab.options.RunKeywords`. Ctrl-C stops the run; the model is restored and the
    KeyboardInterrupt raised again, carrying the trials finished so far as ``.report`` (in a notebook:
    ``sys.last_value.report``). A list of :class:`memlab.InferencePlan` compares inference settings
    (:func:`memlab.inference.compare_inference`); a list mixing both kinds is an error.

    Example:
        >>> model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
        >>> report = compare(model, torch.randn(8, 16), [Plan(), Plan(micro_batch=2, accumulation=4)],
        ...                  loss_fn=lambda m, b: m(b).mean(), progress=False)
        >>> [t.status for t in report.trials]
        ['ok', 'ok']
    """
    if isinstance(plans, Iterable) and not isinstance(plans, (str, bytes, list, tuple)):
        plans = cast("list[Plan]", list(plans))  # a generator: looked at twice below (which mode, then each plan)
    if _inference_plans(plans):
        from memlab.inference.run import compare_inference

        return compare_inference(model, batch, plans, **options)  # type: ignore[arg-type]
    run_options = RunOptions.from_keywords(options)
    plans = check_plans(plans)  # type: ignore[arg-type]
    trials: list[Trial] = []
    with keep_on_interrupt(trials, run_options.budget), run_progress(len(plans), run_options.progress) as progress:
        runner = TrialRunner(model, batch, run_options, listener=progress)
        with runner.session():
            for index, plan in enumerate(plans):
                trials.append(runner.run(plan, index, len(plans)))
                progress.advance(index + 1)
            if run_options.noise > 0:
                settle_close_race(
                    trials, lambda plan, index: runner.run(plan, index, len(plans)), run_options.budget, progress.say,
                    settled=lambda trial, index: runner.announce(TrialSettled(trial, index, len(plans))),
                )
    return Report(trials, budget=run_options.budget)


@contextlib.contextmanager
def keep_on_interrupt(trials: list[Trial], budget: int | None) -> Iterator[None]:
    """On Ctrl-C, the trials finished so far ride on the KeyboardInterrupt as ``.report`` (a Report), and the
    interrupt is raised again: in a notebook, ``sys.last_value.report`` has them.

    Example:
        >>> finished: list[Trial] = []
        >>> try:
        ...     with keep_on_interrupt(finished, budget=None):
        ...         raise KeyboardInterrupt
        ... except KeyboardInterrupt as interrupt:
        ...     report = interrupt.report
        >>> len(report)
        0
    """
    try:
        yield
    except KeyboardInterrupt as interrupt:
        interrupt.report = Report(list(trials), budget=budget)  # type: ignore[attr-defined]
        raise


def _inference_plans(plans: Any) -> bool:
    """Whether ``plans`` is (or holds) an :class:`memlab.InferencePlan`: then the inference mode runs them."""
    from memlab.inference.plan import InferencePlan

    if isinstance(plans, InferencePlan):
        return True
    if isinstance(plans, (list, tuple)):
        return any(isinstance(plan, InferencePlan) for plan in plans)
    return False


def check_plans(plans: Sequence[Plan] | Plan) -> list[Plan]:
    """The plans as a non-empty list of Plan; a clear error for anything else.

    Example:
        >>> check_plans(Plan()) == [Plan()]
        True
    """
    if isinstance(plans, Plan):
        return [plans]
    if isinstance(plans, str):
        raise MemlabError(
            f"plans={plans!r} is text; pass a list of memlab.Plan, or memlab.plan.parse_grid({plans!r}) for a grid"
        )
    if plans is None or not isinstance(plans, Iterable):
        raise MemlabError(
            f"plans={plans!r} is not a list of plans; pass e.g. [memlab.Plan(), memlab.Plan(checkpointing=True)]"
        )
    plans = list(plans)
    if not plans:
        raise MemlabError("no plans to compare; pass a list such as [memlab.Plan(), memlab.Plan(checkpointing=True)]")
    for plan in plans:
        if not isinstance(plan, Plan):
            raise MemlabError(f"{plan!r} is not a memlab.Plan; write memlab.Plan(...) for each setting")
    return plans


class TrialRunner:
    """Runs plans on one model and batch, with what every trial shares checked and captured once.

    Args:
        model, batch: the live model and one batch.
        options: how trials run (default: ``RunOptions()``).
        probe: how memory is bounded and read (default: :func:`~memlab.measure.probes.probe_for` the model).
        clock: the clock timed steps read (for tests).
        listener: called with every event besides ``options.callback`` (the progress bar); unlike the callback it
            does not turn on the memory samples of the tracked step.

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        >>> runner = TrialRunner(model, torch.randn(4, 4), RunOptions(loss_fn=lambda m, b: m(b).mean(), steps=1))
        >>> with runner.session():
        ...     trials = [runner.run(Plan()), runner.run(Plan(checkpointing=True))]
        >>> [t.status for t in trials]
        ['ok', 'ok']
    """

    def __init__(
        self,
        model: nn.Module,
        batch: Batch,
        options: RunOptions | None = None,
        *,
        probe: Probe | None = None,
        clock: Clock = time.perf_counter,
        listener: Callback | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise MemlabError(f"model must be a torch nn.Module, not {type(model).__name__}")
        if not trainable_parameters(model):
            raise MemlabError("the model has no trainable parameters; set requires_grad=True on what should train")
        if probe is None:
            check_real_tensors(model, batch)  # only a dry run (with its own probe) can take tensors without data
            probe = probe_for(model)
        self.probe = probe
        self.options = options or RunOptions()
        self.rows = count_rows(batch)
        self.model = model
        self.batch = batch
        self.loss_fn = resolve_loss_fn(batch, self.options.loss_fn)
        self.device = self.probe.device
        self.clock = clock
        self._listeners = [callback for callback in (listener, self.options.callback) if callback is not None]
        self._values: ModelValues | None = None
        self._structure: ModuleStructure | None = None
        self._held_before: list[torch.Tensor] = []
        self._held_bytes = 0
        # Cutting the batch once here turns a batch that cannot be sliced into one clear error, before any trial.
        micro_batches(batch, Plan(micro_batch=1))

    @property
    def snapshot_bytes(self) -> int:
        """Host memory the session's copies of the model hold now (0 outside a session): buffers, and trainable
        weights once a trial that trains them has run."""
        return 0 if self._values is None else self._values.host_bytes

    @property
    def budget(self) -> int | None:
        """The budget in bytes every trial is held to (from the options)."""
        return self.options.budget

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Capture the model once; whatever happens inside, it comes back bit-exact."""
        self._structure = ModuleStructure.capture(self.model)
        held = self.probe.held_before(self._own_tensors(), [p.grad for p in unique_parameters(self.model)])
        self._held_before, self._held_bytes = held.tensors, held.bytes
        # Parameters are copied when the first trial that trains them comes: a session of adapter trials never
        # copies the frozen base.
        self._values = ModelValues.capture(self.model, parameters=False)
        self._values.detach_grads()
        try:
            yield
        finally:
            self._structure.restore()
            self._values.restore()
            self._values = self._structure = None
            self._held_before = []
            self._held_bytes = 0
            release_memory(collect=False)

    def _own_tensors(self) -> list[torch.Tensor]:
        """The model's parameters and buffers and the batch's tensors: what a trial counts by name."""
        return [*self.model.parameters(), *self.model.buffers(), *(t for _, t in named_tensors(self.batch))]

    def run(self, plan: Plan, index: int = 0, total: int = 1, *, capped: bool = True) -> Trial:
        """Measure one plan; the model is restored afterwards (inside ``session()``, or in one of its own).

        With ``capped=False`` the trial runs without the budget's limit (so that its whole peak is known even when
        it does not fit) and is still judged against the budget: ``trial.fits`` says whether it fits.
        """
        if self._values is None or self._structure is None:
            with self.session():
                return self.run(plan, index, total, capped=capped)
        with quiet(self.options.verbose):
            return self._run(plan, index, total, capped=capped)

    def _run(self, plan: Plan, index: int, total: int, *, capped: bool) -> Trial:
        assert self._values is not None and self._structure is not None  # run() opened the session
        if plan.adapter == "none":
            self._values.include_parameters(self.model)
        limit = self.probe.bound(self.budget if capped else None)
        self._emit(TrialStarted(plan=plan, index=index, total=total))
        record = TrialRecord(plan, held_before_bytes=self._held_bytes)
        step: TrainingStep | None = None
        try:
            step = TrainingStep(
                self.model, plan, loss_fn=self.loss_fn, lr=self.options.lr,
                optimizer_device_type=self.probe.optimizer_device_type,
            )
            record.notes.extend(step.notes)
            record.model_weights = model_weights(plan, step.parameters)
            with self.probe.cap(limit):
                self._warm_up(step, plan, index, limit, record)
                self._tracked_step(step, plan, index, limit, record)
                if self.probe.times_steps:
                    self._timed_steps(step, plan, index, record)
            record.status = "ok"
        except KeyboardInterrupt as interrupt:
            # The traceback would keep the step's frames, and so its optimizer state and activations, alive
            # for as long as the notebook keeps the exception; the running frames are skipped.
            traceback.clear_frames(interrupt.__traceback__)
            record.error = "interrupted"
            raise
        except Exception as error:  # noqa: BLE001 - every failure of a plan is reported, never raised
            record.fail(error)
            release_error(error)
            del error
        finally:
            if step is not None:
                step.close()
                step.optimizer.zero_grad(set_to_none=True)
            del step
            self._structure.restore()
            self._values.restore()
            self._values.detach_grads()
            release_memory(collect=record.status != "ok" or record.error is not None)
        trial = record.to_trial(
            device=self.device,
            rows_per_step=plan.rows_per_step(self.rows),
            tokens_per_step=self._tokens_per_step(plan),
            budget=self.budget,
            rss_bytes=self.probe.rss_bytes(),
        )
        self._emit(TrialFinished(trial=trial, index=index, total=total))
        return trial

    def _tracker(self, step: TrainingStep, budget: int | None, on_sample: Any = None) -> MemoryTracker:
        tensors = [*unique_parameters(self.model), *self.model.buffers()]
        other = [tensor for _, tensor in named_tensors(self.batch)] + self._held_before
        return MemoryTracker(
            baseline={"params": tensors, "optimizer": state_tensors(step.optimizer), "other": other},
            budget=budget if self.probe.tracker_enforces_budget else None,
            device=self.device,
            on_sample=on_sample,
        )

    def _warm_up(self, step: TrainingStep, plan: Plan, index: int, limit: int | None, record: TrialRecord) -> None:
        # Where tracking enforces a limit, the warm-up is tracked too: the first step (which creates the optimizer
        # state) must fit as well. Where the allocator is the truth, its peak is what a failed warm-up reached.
        tracked = limit is not None and self.probe.tracker_enforces_budget
        # A dry run times nothing, so it needs no warm process (and leaves the process as cold as it was).
        cold = self.probe.times_steps and self.device.type not in _WARM_DEVICE_TYPES
        minimum = max(self.options.warmup, 1)
        seconds_taken: list[float] = []
        allocator: CudaPeak | None = None
        finished = False
        try:
            with self.probe.allocator_peak() as allocator:
                for number in range(minimum + _EXTRA_WARMUP_LIMIT):
                    if (
                        number >= minimum
                        and state_tensors(step.optimizer)
                        and (not cold or warmed_up(seconds_taken))
                    ):
                        break
                    self.probe.synchronize()
                    started = self.clock()
                    if tracked:
                        with self._tracker(step, limit) as tracker:
                            try:
                                loss = _finite(step(self.batch, tracker))
                            finally:
                                record.reading = PeakReading(
                                    max(record.reading.peak_bytes, tracker.peak_bytes), dict(tracker.breakdown)
                                )
                    else:
                        loss = _finite(step(self.batch))
                    self.probe.synchronize()
                    seconds = self.clock() - started
                    seconds_taken.append(seconds)
                    self._emit(StepFinished(plan, index, number, "warmup", seconds, loss, None, None))
            finished = True
            if self.probe.times_steps:
                _WARM_DEVICE_TYPES.add(self.device.type)
        finally:
            if not finished:
                record.reading = read_failed_peak(record.reading, allocator)

    def _tracked_step(self, step: TrainingStep, plan: Plan, index: int, limit: int | None, record: TrialRecord) -> None:
        started = self.clock()

        def sample(live_bytes: int) -> None:
            self._emit(MemorySample(plan=plan, index=index, seconds=self.clock() - started, live_bytes=live_bytes))

        tracker = self._tracker(step, limit, sample if self.options.callback else None)
        allocator: CudaPeak | None = None
        try:
            with self.probe.allocator_peak() as allocator, tracker:
                loss = _finite(step(self.batch, tracker))
        finally:
            # Read after the allocator's block has ended (its peak is read on exit), out of memory or not.
            record.reading = read_peak(tracker, allocator)
        self._emit(
            StepFinished(
                plan, index, 0, "tracked", self.clock() - started, loss, tracker.live_bytes, record.reading.peak_bytes
            )
        )

    def _timed_steps(self, step: TrainingStep, plan: Plan, index: int, record: TrialRecord) -> None:
        spent = 0.0
        while True:
            self.probe.synchronize()
            started = self.clock()
            loss = _finite(step(self.batch))
            self.probe.synchronize()
            seconds = self.clock() - started
            spent += seconds
            number = len(record.step_times)
            record.step_times.append(seconds)
            self._emit(StepFinished(plan, index, number, "timed", seconds, loss, None, None))
            if self._timed_enough(record.step_times, spent):
                return

    def _timed_enough(self, step_times: list[float], spent: float) -> bool:
        return timed_enough(step_times, spent, self.options)

    def _tokens_per_step(self, plan: Plan) -> int | None:
        counts = [count_tokens(part) for part in micro_batches(self.batch, plan)]
        if any(count is None for count in counts):
            return None
        return sum(c for c in counts if c is not None)

    def announce(self, event: Event) -> None:
        """Send ``event`` to this runner's listeners (the progress bar, the run's ``callback``): how ``compare`` and
        ``fit`` tell a live figure that a trial was settled (:class:`~memlab.events.TrialSettled`).

        Example:
            >>> from memlab.events import TrialSettled
            >>> seen = []
            >>> options = RunOptions(callback=seen.append, loss_fn=lambda m, b: m(b).sum())
            >>> runner = TrialRunner(nn.Linear(2, 1), torch.randn(2, 2), options)
            >>> trial = Trial(Plan(), "ok", 10, {}, 0.5, 4.0, None, "cpu")
            >>> runner.announce(TrialSettled(trial, 0, 1)); seen[0].index
            0
        """
        self._emit(event)

    def _emit(self, event: Any) -> None:
        for listener in self._listeners:
            listener(event)


def timed_enough(step_times: Sequence[float], spent: float, options: RunOptions) -> bool:
    """Whether the step times bound the noise well enough (or the time or step limit is reached): the rule every
    timed trial follows, training or inference.

    A noise target is met only by a true 95% interval: three steps that happen to agree within 5% prove
    nothing (:func:`~memlab.report.noise.fewest_values`), and a trial stopped there was ranked on luck.

    Example:
        >>> timed_enough([0.1, 0.1, 0.1], 0.3, RunOptions(steps=3, noise=0)), timed_enough([0.1], 0.1, RunOptions())
        (True, False)
    """
    if len(step_times) < options.steps:
        return False
    if options.noise == 0 or spent >= options.time_limit or len(step_times) >= _MAX_TIMED_STEPS:
        return True
    if len(step_times) < fewest_values():
        return False
    return relative_half_width(step_times) <= options.noise


def _finite(loss: float) -> float:
    """The loss itself; an error when it is NaN or infinite (such a step trains nothing, so it is no result)."""
    if not math.isfinite(loss):
        raise MemlabError(f"the loss is {loss}: the step trains nothing; check the data, the lr, or fp16 overflow")
    return loss


def warmed_up(seconds_taken: list[float]) -> bool:
    """Whether the last two warm-up steps took about the same time (a cold process has warmed up).

    Example:
        >>> warmed_up([0.9, 0.5, 0.51]), warmed_up([0.9, 0.5])
        (True, False)
    """
    if len(seconds_taken) < 2:
        return False
    last, before = seconds_taken[-1], seconds_taken[-2]
    return abs(last - before) <= _STEADY_WARMUP * max(before, 1e-9)


def check_real_tensors(model: nn.Module, batch: Batch) -> None:
    """A clear error for a model or batch without data (meta tensors), which only a dry run can take.

    Example:
        >>> check_real_tensors(nn.Linear(2, 1), torch.randn(2, 2))  # real: nothing to say
    """
    where = "model" if any(p.is_meta for p in model.parameters()) else None
    if where is None and any(t.is_meta for _, t in named_tensors(batch)):
        where = "batch"
    if where is not None:
        raise MemlabError(
            f"the {where} is on the meta device (it has no data); measure a real one, or predict this one with "
            "memlab.estimate(model, batch, plan)"
        )


class TrialRecord:
    """What one trial has found so far; becomes a Trial at the end, whatever stopped it."""

    def __init__(self, plan: Plan, held_before_bytes: int) -> None:
        self.plan = plan
        self.status = "error"
        self.error: str | None = None
        self.reading = PeakReading()
        self.held_before_bytes = held_before_bytes
        self.step_times: list[float] = []
        self.notes: list[str] = []
        self.model_weights: str | None = None

    def fail(self, error: BaseException) -> None:
        self.status = "oom" if is_oom_error(error) else "error"
        message = str(error).strip().splitlines()
        first_line = message[0] if message else ""
        self.error = f"{type(error).__name__}: {first_line}" if first_line else type(error).__name__

    def to_trial(
        self,
        *,
        device: torch.device,
        rows_per_step: int,
        tokens_per_step: int | None,
        budget: int | None,
        rss_bytes: int | None,
    ) -> Trial:
        step_time = statistics.median(self.step_times) if self.status == "ok" and self.step_times else None
        return Trial(
            plan=self.plan,
            status=self.status,
            peak_bytes=int(self.reading.peak_bytes),
            breakdown=dict(self.reading.breakdown),
            step_time_s=step_time,
            samples_per_s=rows_per_step / step_time if step_time else None,
            tokens_per_s=tokens_per_step / step_time if step_time and tokens_per_step else None,
            device=str(device),
            error=self.error,
            rows_per_step=rows_per_step,
            budget=budget,
            reserved_bytes=self.reading.reserved_bytes,
            rss_bytes=rss_bytes,
            preexisting_bytes=self.held_before_bytes,
            notes=tuple(dict.fromkeys(self.notes)),
            step_times=tuple(self.step_times) if self.status == "ok" else (),
            model_weights=self.model_weights,
        )
