"""The one runner: a session on a live model that runs plans of any :class:`~memlab.runner.workload.Workload`.

Snapshot once, then for each plan: put it on, step, measure, take it off, restore. A trial's steps: ``max(warmup,
1)`` untimed warm-up steps (training's first creates the optimizer state, so what follows is a steady-state step;
a dry run of a step that leaves no state, an inference request, has none: it times nothing, so nothing is warmed),
one tracked step that gives the peak and its composition by category, and at least ``steps`` timed steps without
tracking, whose median is the step time. Timing goes on until the 95% interval of that median is within ``noise``
of it (:mod:`memlab.report.noise`) or ``time_limit`` seconds of timed steps have run. The first trial of a process
on a device also warms up until two warm-up steps take about the same time: a cold process (lazy initialisation, an
allocator that has not grown yet) would otherwise make the first plan look slow. What differs by device (how the
budget is enforced, where the peak is read, what memory is held before) is the
:class:`~memlab.measure.probes.Probe`'s business; what differs between training and inference is the workload's.

Which runner runs a plan is chosen once, by the plan's type (:func:`register_runner`, :func:`runner_for`).
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Generic, TypeVar, cast

import torch
from torch import nn

from memlab.errors import MemlabError
from memlab.events import Callback, Event, MemorySample, StepFinished, TrialFinished, TrialSettled, TrialStarted
from memlab.live.batch import Batch, count_rows, named_tensors
from memlab.live.inputs import check_inputs
from memlab.live.module_state import ModelValues
from memlab.live.quiet import quiet
from memlab.live.structure import ModuleStructure, unique_parameters
from memlab.measure.compiled import CompiledStepTracker, compiled_reading
from memlab.measure.cuda import CudaPeak
from memlab.measure.oom import release_error
from memlab.measure.probes import Probe, probe_for
from memlab.measure.reading import PeakReading, read_failed_peak, read_peak
from memlab.measure.tracker import MemoryTracker
from memlab.options import RunOptions
from memlab.plan import Plan
from memlab.report import Trial
from memlab.report.noise import fewest_values, relative_half_width
from memlab.runner.remeasure import settle_close_race
from memlab.runner.workload import Attempt, RunContext, TrialRecord, Workload

__all__ = [
    "EXTRA_WARMUP_LIMIT",
    "Runner",
    "check_real_tensors",
    "register_runner",
    "runner_for",
    "timed_enough",
    "warmed_up",
]

Clock = Callable[[], float]
EXTRA_WARMUP_LIMIT = 8
"""At most this many warm-up steps beyond ``warmup`` are run: until a cold process is steady, and for training
until the optimizer state exists (fp16's GradScaler skips the optimizer step while the scale is too high)."""
# A cold process warms up until two consecutive warm-up steps differ by at most this fraction.
_STEADY_WARMUP = 0.2
# However small the noise target, no plan is timed for more steps than this.
_MAX_TIMED_STEPS = 100
# The device types on which this process has already run a trial (and so is warm), whatever its workload.
_WARM_DEVICE_TYPES: set[str] = set()

PlanT = TypeVar("PlanT")
TrialT = TypeVar("TrialT", bound=Trial)


class Runner(Generic[PlanT, TrialT]):
    """Runs plans on one model and batch, with what every trial shares checked and captured once; its workload
    (the class's ``workload_type``, or ``workload=``) says what a plan and a step are.

    Args:
        model, batch: the live model and one batch.
        options: how trials run (default: ``RunOptions()``).
        workload: the :class:`~memlab.runner.workload.Workload` class (default: the runner class's).
        probe: how memory is bounded and read (default: :func:`~memlab.measure.probes.probe_for` the model; a dry
            run passes a :class:`~memlab.measure.probes.FakeProbe`).
        clock: the clock timed steps read (for tests).
        listener: called with every event besides ``options.callback`` (the progress bar); unlike the callback it
            does not turn on the memory samples of the tracked step.

    Example:
        >>> from memlab.runner.training import TrainingWorkload
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        >>> options = RunOptions(loss_fn=lambda m, b: m(b).mean(), steps=1)
        >>> runner = Runner(model, torch.randn(4, 4), options, workload=TrainingWorkload)
        >>> with runner.session():
        ...     trials = [runner.run(Plan()), runner.run(Plan(checkpointing=True))]
        >>> [t.status for t in trials]
        ['ok', 'ok']
    """

    workload_type: ClassVar[type[Workload[Any, Any, Any]] | None] = None

    def __init__(
        self,
        model: nn.Module,
        batch: Batch,
        options: RunOptions | None = None,
        *,
        workload: type[Workload[Any, Any, Any]] | None = None,
        probe: Probe | None = None,
        clock: Clock = time.perf_counter,
        listener: Callback | None = None,
    ) -> None:
        workload = workload or self.workload_type
        if workload is None:
            raise TypeError(f"{type(self).__name__} needs a workload: pass workload=, or set workload_type")
        if not isinstance(model, nn.Module):
            raise MemlabError(f"model must be a torch nn.Module, not {type(model).__name__}")
        workload.check_model(model)
        if probe is None:
            check_real_tensors(model, batch)  # only a dry run (with its own probe) can take tensors without data
            probe = probe_for(model)
        self.probe = probe
        self.options = options or RunOptions()
        self.rows = count_rows(batch)
        check_inputs(model, batch)
        self.model = model
        self.batch = batch
        self.device = probe.device
        self.clock = clock
        self.workload: Workload[Any, Any, TrialT] = workload(
            RunContext(model, batch, self.options, probe, clock, self.rows)
        )
        self._listeners = [callback for callback in (listener, self.options.callback) if callback is not None]
        self._values: ModelValues | None = None
        self._structure: ModuleStructure | None = None
        self._held_before: list[torch.Tensor] = []
        self._held_bytes = 0

    @property
    def snapshot_bytes(self) -> int:
        """Host memory the session's copies of the model hold now (0 outside a session): buffers, and trainable
        weights once a trial that trains them has run."""
        return 0 if self._values is None else self._values.host_bytes

    @property
    def budget(self) -> int | None:
        """The budget in bytes every trial is held to (from the options)."""
        return self.options.budget

    def check(self, plan: PlanT) -> None:
        """A clear error, before anything runs, for a plan this model or batch cannot run (the workload's rules)."""
        self.workload.check(plan)

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Capture the model once; whatever happens inside, it comes back bit-exact."""
        self._structure = ModuleStructure.capture(self.model)
        own = [*self.model.parameters(), *self.model.buffers(), *(t for _, t in named_tensors(self.batch))]
        held = self.probe.held_before(own, [p.grad for p in unique_parameters(self.model)])
        self._held_before, self._held_bytes = held.tensors, held.bytes
        # Parameters are copied when the first trial that trains them comes: a session of adapter (or inference)
        # trials never copies the frozen base. A dry run's session (a fake probe) reads no random-number state: it
        # opens under the fake mode, where no CUDA function may be called.
        self._values = ModelValues.capture(self.model, parameters=False, rng=self.probe.real)
        self._values.detach_grads()
        try:
            yield
        finally:
            self._structure.restore()
            self._values.restore()
            self._values = self._structure = None
            self._held_before = []
            self._held_bytes = 0
            self.probe.release(collect=False)

    def run(self, plan: PlanT, index: int = 0, total: int = 1, *, capped: bool = True) -> TrialT:
        """Measure one plan; the model is restored afterwards (inside ``session()``, or in one of its own).

        With ``capped=False`` the trial runs without the budget's limit (so that its whole peak is known even when
        it does not fit) and is still judged against the budget: ``trial.fits`` says whether it fits.
        """
        if self._values is None or self._structure is None:
            self.check(plan)
            with self.session():
                return self.run(plan, index, total, capped=capped)
        with quiet(self.options.verbose):
            return self._run(plan, index, total, capped=capped)

    def settle(self, trials: list[Trial], say: Callable[[str], None] | None = None) -> list[tuple[Trial, Trial]]:
        """Time the close contenders among ``trials`` again in turn, A B A B, and put the pooled trials in their
        places, each announced as :class:`~memlab.events.TrialSettled`
        (:func:`~memlab.runner.remeasure.settle_close_race`); inside ``session()``."""
        total = len(trials)
        return settle_close_race(
            trials, lambda plan, index: self.run(cast(Any, plan), index, total), self.budget, say,
            settled=lambda trial, index: self.announce(TrialSettled(trial, index, total)),
        )

    def announce(self, event: Event) -> None:
        """Send ``event`` to this runner's listeners (the progress bar, the run's ``callback``): how ``compare`` and
        ``fit`` tell a live figure that a trial was settled (:class:`~memlab.events.TrialSettled`).

        Example:
            >>> from memlab.runner.training import TrainingWorkload
            >>> seen = []
            >>> options = RunOptions(callback=seen.append, loss_fn=lambda m, b: m(b).sum())
            >>> runner = Runner(nn.Linear(2, 1), torch.randn(2, 2), options, workload=TrainingWorkload)
            >>> trial = Trial(Plan(), "ok", 10, {}, 0.5, 4.0, None, "cpu")
            >>> runner.announce(TrialSettled(trial, 0, 1)); seen[0].index
            0
        """
        for listener in self._listeners:
            listener(event)

    def _run(self, plan: PlanT, index: int, total: int, *, capped: bool) -> TrialT:
        assert self._values is not None and self._structure is not None  # run() opened the session
        workload = self.workload
        if workload.copies_parameters(plan):
            self._values.include_parameters(self.model)
        limit = self.probe.bound(self.budget if capped else None)
        shown = cast(Plan, plan)  # events carry any workload's plan (they read its label)
        self.announce(TrialStarted(plan=shown, index=index, total=total))
        record = workload.new_record(plan, self._held_bytes)
        record.host_budget = self.options.host_budget
        if record.host_budget is None:
            record.host_budget = self.probe.host_available()  # a live run: what the machine has available now
        attempt: Attempt | None = None
        try:
            attempt = workload.put_on(plan, record)
            with self.probe.cap(limit):
                self._warm_up(attempt, shown, index, limit, record)
                self._tracked_step(attempt, shown, index, limit, record)
                if self.probe.times_steps:
                    self._timed_steps(attempt, shown, index, record)
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
            if attempt is not None:
                record.host_bytes = attempt.host_bytes()
                attempt.take_off()
            del attempt
            self._structure.restore()
            self._values.restore()
            self._values.detach_grads()
            self.probe.release(collect=record.status != "ok" or record.error is not None)
        trial = workload.to_trial(record, budget=self.budget, rss_bytes=self.probe.rss_bytes())
        self.announce(TrialFinished(trial=trial, index=index, total=total))
        return trial

    def _tracker(self, attempt: Attempt, budget: int | None, on_sample: Any = None) -> MemoryTracker:
        other = [tensor for _, tensor in named_tensors(self.batch)] + self._held_before
        # A compiled step runs its compiled code under a tracker that lets dynamo do so; its budget is judged on the
        # allocator's peak afterwards (the tracker cannot see the compiled kernels' buffers).
        kind = CompiledStepTracker if attempt.compiles else MemoryTracker
        return kind(
            baseline={**attempt.baseline(), "other": other},
            budget=budget if self.probe.tracker_enforces_budget and not attempt.compiles else None,
            device=self.device,
            on_sample=on_sample,
            categories=self.workload.categories,
        )

    def _warm_up(self, attempt: Attempt, plan: Plan, index: int, limit: int | None, record: TrialRecord) -> None:
        # Where tracking enforces a limit, the warm-up is tracked too: the first step (which creates training's
        # optimizer state) must fit as well. Where the allocator is the truth, its peak is what a failed warm-up
        # reached.
        tracked = limit is not None and self.probe.tracker_enforces_budget and not attempt.compiles
        # A dry run times nothing, so it needs no warm process (and leaves the process as cold as it was).
        cold = self.probe.times_steps and self.device.type not in _WARM_DEVICE_TYPES
        # A dry run of a step that leaves no state (a request) has nothing to warm: its first step is the tracked one.
        minimum = 0 if not self.probe.times_steps and not attempt.warms_state else max(self.options.warmup, 1)
        seconds_taken: list[float] = []
        allocator: CudaPeak | None = None
        finished = False
        try:
            with self.probe.allocator_peak() as allocator:
                for number in range(minimum + EXTRA_WARMUP_LIMIT):
                    if number >= minimum and attempt.steady() and (not cold or warmed_up(seconds_taken)):
                        break
                    self.probe.synchronize()
                    started = self.clock()
                    if tracked:
                        with self._tracker(attempt, limit) as tracker:
                            try:
                                loss = attempt.step(tracker, "warmup")
                            finally:
                                record.reading = PeakReading(
                                    max(record.reading.peak_bytes, tracker.peak_bytes), dict(tracker.breakdown)
                                )
                    else:
                        loss = attempt.step(None, "warmup")
                    self.probe.synchronize()
                    seconds = self.clock() - started
                    seconds_taken.append(seconds)
                    self.announce(StepFinished(plan, index, number, "warmup", seconds, loss, None, None))
            finished = True
            if attempt.compiles and seconds_taken and self.probe.times_steps:
                record.compile_seconds = seconds_taken[0]
            if self.probe.times_steps:
                _WARM_DEVICE_TYPES.add(self.device.type)
        finally:
            if not finished:
                record.reading = read_failed_peak(record.reading, allocator)

    def _tracked_step(self, attempt: Attempt, plan: Plan, index: int, limit: int | None, record: TrialRecord) -> None:
        started = self.clock()

        def sample(live_bytes: int) -> None:
            self.announce(MemorySample(plan=plan, index=index, seconds=self.clock() - started, live_bytes=live_bytes))

        tracker = self._tracker(attempt, limit, sample if self.options.callback else None)
        allocator: CudaPeak | None = None
        history: dict[str, Any] | None = None
        recorder = self.probe.step_recorder(self.model, tracker.categories)
        compiled: Any = None
        try:
            with self.probe.memory_history() as history, self.probe.allocator_peak() as allocator, tracker, \
                    recorder.recording(tracker), self.probe.compiled_peak(tracker, attempt.compiles) as compiled:
                loss = attempt.step(tracker, "tracked")
        finally:
            # Read after the allocator's block has ended (its peak is read on exit), out of memory or not.
            record.reading = read_peak(tracker, allocator) if not attempt.compiles else compiled_reading(
                tracker, compiled or allocator)
            record.recording = recorder.result
            record.allocator_snapshot = history.get("snapshot") if history is not None else None
        self.announce(
            StepFinished(
                plan, index, 0, "tracked", self.clock() - started, loss, tracker.live_bytes, record.reading.peak_bytes
            )
        )

    def _timed_steps(self, attempt: Attempt, plan: Plan, index: int, record: TrialRecord) -> None:
        spent = 0.0
        while True:
            self.probe.synchronize()
            started = self.clock()
            loss = attempt.step(None, "timed")
            self.probe.synchronize()
            seconds = self.clock() - started
            spent += seconds
            number = len(record.step_times)
            record.step_times.append(seconds)
            self.announce(StepFinished(plan, index, number, "timed", seconds, loss, None, None))
            if timed_enough(record.step_times, spent, self.options):
                return


_RUNNERS: dict[type, type[Runner[Any, Any]]] = {}


def register_runner(plan_type: type, runner: type[Runner[Any, Any]]) -> None:
    """Plans of ``plan_type`` run on ``runner`` (a :class:`Runner` configured with their workload): how
    ``memlab.measure`` and ``memlab.compare`` choose, once, between training and inference.

    Example:
        >>> from memlab.runner.trial import TrialRunner
        >>> register_runner(Plan, TrialRunner); runner_for([Plan()]) is TrialRunner
        True
    """
    _RUNNERS[plan_type] = runner


def runner_for(plans: object) -> type[Runner[Any, Any]] | None:
    """The runner registered for the first plan's type (``plans`` is one plan or a list); None when there is none
    (the caller's default then checks the plans and says what is wrong).

    Example:
        >>> runner_for("not a plan") is None
        True
    """
    first = plans[0] if isinstance(plans, (list, tuple)) and plans else plans
    return _RUNNERS.get(type(first))


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
