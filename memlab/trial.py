"""Run plans on a live model and measure them: snapshot once, then for each plan apply, step, measure, restore.

A trial's steps: ``max(warmup, 1)`` untimed warm-up steps (the first creates the optimizer state, so what follows is a
steady-state step), one tracked step that gives the peak and its composition by category, and ``steps`` timed steps
without tracking, whose median is the step time.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from memlab.batch import Batch, LossFn, count_rows, count_tokens, named_tensors, resolve_loss_fn
from memlab.errors import MemlabError
from memlab.events import Callback, MemorySample, StepFinished, TrialFinished, TrialStarted
from memlab.measure.cuda import CudaPeak, cap_cuda_memory
from memlab.measure.oom import is_oom_error, release_error, release_memory
from memlab.measure.tracker import CATEGORIES, MemoryTracker
from memlab.module_state import ModelValues, ModuleStructure, trainable_parameters, unique_parameters
from memlab.plan import Plan, parse_budget
from memlab.report import Report, Trial
from memlab.step import TrainingStep, model_device
from memlab.techniques.accumulation import micro_batches
from memlab.techniques.optimizer import state_tensors

Clock = Callable[[], float]
# fp16's GradScaler skips the optimizer step while the scale is too high, so the optimizer state may not exist
# after the requested warm-up; at most this many more steps are run to reach a steady state.
_EXTRA_WARMUP_LIMIT = 8


def measure(
    model: nn.Module,
    batch: Batch,
    plan: Plan,
    *,
    loss_fn: LossFn | None = None,
    steps: int = 3,
    warmup: int = 1,
    budget: int | str | None = None,
    lr: float = 1e-5,
    callback: Callback | None = None,
) -> Trial:
    """Measure one plan on the live model: peak memory by category and throughput. The model is left as it was.

    Example:
        >>> model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
        >>> trial = measure(model, torch.randn(8, 16), Plan(), loss_fn=lambda m, b: m(b).mean())
        >>> trial.status, trial.breakdown["params"] == 4 * sum(p.numel() for p in model.parameters())
        ('ok', True)
    """
    report = compare(
        model, batch, [plan], loss_fn=loss_fn, steps=steps, warmup=warmup, budget=budget, lr=lr,
        callback=callback, progress=False,
    )
    return report.trials[0]


def compare(
    model: nn.Module,
    batch: Batch,
    plans: Sequence[Plan],
    *,
    loss_fn: LossFn | None = None,
    steps: int = 3,
    warmup: int = 1,
    budget: int | str | None = None,
    lr: float = 1e-5,
    callback: Callback | None = None,
    progress: bool = True,
) -> Report:
    """Measure every plan in turn on the live model; a plan that runs out of memory or fails does not stop the rest.

    Example:
        >>> model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
        >>> report = compare(model, torch.randn(8, 16), [Plan(), Plan(micro_batch=2, accumulation=4)],
        ...                  loss_fn=lambda m, b: m(b).mean(), progress=False)
        >>> [t.status for t in report.trials]
        ['ok', 'ok']
    """
    runner = TrialRunner(
        model, batch, loss_fn=loss_fn, steps=steps, warmup=warmup, budget=budget, lr=lr, callback=callback
    )
    plans = check_plans(plans)
    trials: list[Trial] = []
    with runner.session(), progress_bar(len(plans), progress) as bar:
        for index, plan in enumerate(plans):
            bar.set_postfix_str(plan.label())
            trials.append(runner.run(plan, index, len(plans)))
            bar.update(1)
    return Report(trials, budget=runner.budget)


def check_plans(plans: Sequence[Plan] | Plan) -> list[Plan]:
    if isinstance(plans, Plan):
        return [plans]
    if isinstance(plans, str):
        raise MemlabError(
            f"plans={plans!r} is text; pass a list of memlab.Plan, or memlab.plan.parse_grid({plans!r}) for a grid"
        )
    plans = list(plans)
    if not plans:
        raise MemlabError("no plans to compare; pass a list such as [memlab.Plan(), memlab.Plan(checkpointing=True)]")
    for plan in plans:
        if not isinstance(plan, Plan):
            raise MemlabError(f"{plan!r} is not a memlab.Plan; write memlab.Plan(...) for each setting")
    return plans


class TrialRunner:
    """Runs plans on one model and batch, with what every trial shares checked and captured once."""

    def __init__(
        self,
        model: nn.Module,
        batch: Batch,
        *,
        loss_fn: LossFn | None = None,
        steps: int = 3,
        warmup: int = 1,
        budget: int | str | None = None,
        lr: float = 1e-5,
        callback: Callback | None = None,
        clock: Clock = time.perf_counter,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise MemlabError(f"model must be a torch nn.Module, not {type(model).__name__}")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise MemlabError(f"steps={steps!r} is not allowed; write a whole number >= 1")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise MemlabError(f"warmup={warmup!r} is not allowed; write a whole number >= 0")
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
            raise MemlabError(f"lr={lr!r} is not allowed; write a positive learning rate such as lr=1e-5")
        if not trainable_parameters(model):
            raise MemlabError("the model has no trainable parameters; set requires_grad=True on what should train")
        self.rows = count_rows(batch)
        self.model = model
        self.batch = batch
        self.loss_fn = resolve_loss_fn(batch, loss_fn)
        self.steps = steps
        self.warmup = max(warmup, 1)
        self.budget = parse_budget(budget)
        self.lr = lr
        self.callback = callback
        self.clock = clock
        self.device = model_device(model)
        self._values: ModelValues | None = None
        self._structure: ModuleStructure | None = None
        self._held_before: list[torch.Tensor] = []
        self._held_bytes = 0
        # Cutting the batch once here turns a batch that cannot be sliced into one clear error, before any trial.
        micro_batches(batch, Plan(micro_batch=1))

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Capture the model once; whatever happens inside, it comes back bit-exact."""
        self._structure = ModuleStructure.capture(self.model)
        self._held_before = self._memory_held_before() if self.device.type == "cpu" else []
        if self._held_before:
            self._held_bytes = _unique_storage_bytes(self._held_before, exclude=self._own_tensors())
        self._values = ModelValues.capture(self.model)
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

    def _memory_held_before(self) -> list[torch.Tensor]:
        """On CPU, what the process already holds besides the model and the batch (the user's optimizer state,
        gradients, other variables): the device must hold it too, so it counts under "other".

        Found by one scan of live objects per session (CUDA reads the same from its allocator instead).
        """
        from torch._subclasses.fake_tensor import is_fake

        own = {id(t) for t in self._own_tensors()}
        if any(is_fake(t) for t in self.model.parameters()):
            return []  # a dry run: this process's memory is not the hypothetical device's
        gc.collect()
        held = []
        with warnings.catch_warnings():  # isinstance() on some deprecated torch proxies warns
            warnings.simplefilter("ignore")
            objects = gc.get_objects()
            tensors = [obj for obj in objects if isinstance(obj, torch.Tensor)]
        del objects
        for obj in tensors:
            if (
                id(obj) not in own
                and obj.device.type == "cpu"
                and not obj.is_sparse
                and not is_fake(obj)
            ):
                held.append(obj)
        seen = {id(t) for t in held}
        held += [p.grad for p in unique_parameters(self.model) if p.grad is not None and id(p.grad) not in seen]
        return held

    def run(self, plan: Plan, index: int = 0, total: int = 1) -> Trial:
        """Measure one plan; the model is restored afterwards (inside ``session()``)."""
        if self._values is None or self._structure is None:
            with self.session():
                return self.run(plan, index, total)
        self._emit(TrialStarted(plan=plan, index=index, total=total))
        measurement = _Measurement(plan=plan, device=self.device, budget=self.budget)
        measurement.preexisting_bytes = self._held_bytes
        step: TrainingStep | None = None
        try:
            step = TrainingStep(self.model, plan, loss_fn=self.loss_fn, lr=self.lr)
            measurement.notes.extend(step.notes)
            with cap_cuda_memory(self.budget if self.device.type == "cuda" else None, self.device):
                self._warm_up(step, plan, index, measurement)
                self._tracked_step(step, plan, index, measurement)
                self._timed_steps(step, plan, index, measurement)
            measurement.status = "ok"
        except KeyboardInterrupt as interrupt:
            # The traceback would keep the step's frames, and so its optimizer state and activations, alive
            # for as long as the notebook keeps the exception; the running frames are skipped.
            traceback.clear_frames(interrupt.__traceback__)
            measurement.error = "interrupted"
            raise
        except Exception as error:  # noqa: BLE001 - every failure of a plan is reported, never raised
            measurement.fail(error)
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
            release_memory(collect=measurement.status != "ok" or measurement.error is not None)
        trial = measurement.to_trial(self._rows_per_step(plan), self._tokens_per_step(plan))
        self._emit(TrialFinished(trial=trial, index=index, total=total))
        return trial

    def _warm_up(self, step: TrainingStep, plan: Plan, index: int, measurement: _Measurement) -> None:
        # On CPU the budget is enforced by tracking, so the warm-up is tracked too when there is a budget:
        # the first step (which creates the optimizer state) must fit as well.
        for number in range(self.warmup + _EXTRA_WARMUP_LIMIT):
            if number >= self.warmup and state_tensors(step.optimizer):
                break
            started = self.clock()
            if self.budget is not None and self.device.type != "cuda":
                with MemoryTracker(baseline=self._baseline(step), budget=self.budget, device=self.device) as tracker:
                    try:
                        loss = step(self.batch, tracker)
                    finally:
                        measurement.peak_bytes = max(measurement.peak_bytes, tracker.peak_bytes)
                        measurement.breakdown = dict(tracker.breakdown)
            else:
                loss = step(self.batch)
            self._emit(StepFinished(plan, index, number, "warmup", self.clock() - started, loss, None, None))

    def _tracked_step(self, step: TrainingStep, plan: Plan, index: int, measurement: _Measurement) -> None:
        started = self.clock()
        on_cpu = self.device.type != "cuda"

        def sample(live_bytes: int) -> None:
            self._emit(MemorySample(plan=plan, index=index, seconds=self.clock() - started, live_bytes=live_bytes))

        tracker = MemoryTracker(
            baseline=self._baseline(step),
            budget=self.budget if on_cpu else None,
            device=self.device,
            on_sample=sample if self.callback else None,
        )
        cuda_peak = CudaPeak(self.device) if not on_cpu else contextlib.nullcontext()
        try:
            with cuda_peak, tracker:
                measurement.tracked_at_start = tracker.live_bytes
                loss = step(self.batch, tracker)
        finally:
            measurement.record_peak(tracker, cuda_peak if isinstance(cuda_peak, CudaPeak) else None)
        self._emit(
            StepFinished(
                plan, index, 0, "tracked", self.clock() - started, loss, tracker.live_bytes, measurement.peak_bytes
            )
        )

    def _timed_steps(self, step: TrainingStep, plan: Plan, index: int, measurement: _Measurement) -> None:
        for number in range(self.steps):
            _synchronize(self.device)
            started = self.clock()
            loss = step(self.batch)
            _synchronize(self.device)
            seconds = self.clock() - started
            measurement.step_times.append(seconds)
            self._emit(StepFinished(plan, index, number, "timed", seconds, loss, None, None))

    def _baseline(self, step: TrainingStep) -> dict[str, list[torch.Tensor]]:
        tensors = [*unique_parameters(self.model), *self.model.buffers()]
        other = [tensor for _, tensor in named_tensors(self.batch)] + self._held_before
        return {"params": tensors, "optimizer": state_tensors(step.optimizer), "other": other}

    def _rows_per_step(self, plan: Plan) -> int:
        return plan.rows_per_step(self.rows)

    def _tokens_per_step(self, plan: Plan) -> int | None:
        counts = [count_tokens(part) for part in micro_batches(self.batch, plan)]
        if any(count is None for count in counts):
            return None
        return sum(c for c in counts if c is not None)

    def _emit(self, event: Any) -> None:
        if self.callback is not None:
            self.callback(event)


class _Measurement:
    """What one trial has measured so far; becomes a Trial at the end, whatever stopped it."""

    def __init__(self, plan: Plan, device: torch.device, budget: int | None) -> None:
        self.plan = plan
        self.device = device
        self.budget = budget
        self.status = "error"
        self.error: str | None = None
        self.peak_bytes = 0
        self.reserved_bytes: int | None = None
        self.preexisting_bytes = 0
        self.tracked_at_start = 0
        self.breakdown: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        self.step_times: list[float] = []
        self.notes: list[str] = []

    def record_peak(self, tracker: MemoryTracker, cuda_peak: CudaPeak | None) -> None:
        breakdown = dict(tracker.breakdown)
        peak = tracker.peak_bytes
        if cuda_peak is not None and cuda_peak.peak_allocated:
            # The allocator's peak is the truth on CUDA; what tracking did not see (rounding, workspaces,
            # memory held before the trial) is "other".
            peak = cuda_peak.peak_allocated
            known = sum(v for k, v in breakdown.items() if k != "other")
            self.preexisting_bytes = max(0, cuda_peak.start_allocated - self.tracked_at_start)
            breakdown["other"] = max(0, peak - known)
            self.reserved_bytes = cuda_peak.peak_reserved
        self.peak_bytes = peak
        self.breakdown = breakdown

    def fail(self, error: BaseException) -> None:
        self.status = "oom" if is_oom_error(error) else "error"
        message = str(error).strip().splitlines()
        first_line = message[0] if message else ""
        self.error = f"{type(error).__name__}: {first_line}" if first_line else type(error).__name__

    def to_trial(self, rows_per_step: int, tokens_per_step: int | None) -> Trial:
        step_time = statistics.median(self.step_times) if self.status == "ok" and self.step_times else None
        rss = _process_rss() if self.device.type == "cpu" else None
        return Trial(
            plan=self.plan,
            status=self.status,
            peak_bytes=int(self.peak_bytes),
            breakdown={key: int(self.breakdown.get(key, 0)) for key in CATEGORIES},
            step_time_s=step_time,
            samples_per_s=rows_per_step / step_time if step_time else None,
            tokens_per_s=tokens_per_step / step_time if step_time and tokens_per_step else None,
            device=str(self.device),
            error=self.error,
            rows_per_step=rows_per_step,
            budget=self.budget,
            reserved_bytes=self.reserved_bytes,
            rss_bytes=rss,
            preexisting_bytes=self.preexisting_bytes,
            notes=tuple(dict.fromkeys(self.notes)),
        )


def _unique_storage_bytes(tensors: Sequence[torch.Tensor], exclude: Sequence[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``, leaving out storages that ``exclude`` uses."""
    excluded = {t.untyped_storage().data_ptr() for t in exclude if t.device.type == "cpu"}
    sizes: dict[int, int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in excluded:
            sizes[storage.data_ptr()] = storage.nbytes()
    return sum(sizes.values())


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _process_rss() -> int | None:
    import psutil

    return int(psutil.Process().memory_info().rss)


@contextlib.contextmanager
def progress_bar(total: int, enabled: bool) -> Iterator[Any]:
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc="memlab", unit="plan", disable=not enabled or total < 2, leave=False)
    try:
        yield bar
    finally:
        bar.close()
