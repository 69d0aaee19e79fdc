"""The single-GPU dry run: training and inference plans estimated on fake tensors, exactly as :func:`memlab.measure`
runs them (the same :class:`~memlab.runner.step.TrainingStep`, the same :class:`~memlab.measure.tracker.MemoryTracker`,
the same warm-up and baseline, through :class:`~memlab.runner.trial.TrialRunner` or
:class:`~memlab.inference.run.InferenceRunner` with a :class:`~memlab.measure.probes.FakeProbe`, which never reads or
caps a real allocator and times nothing), on the fake model and batch of :mod:`memlab.estimation.dryrun.fake`.

Both workloads share one flow (:func:`_dry_run`): the fake model and batch built once, the runner's session under
the fake mode, each plan run with CUDA's kernels emulated and its allocations traced where the estimate is for CUDA
(:mod:`memlab.estimation.cuda.kernels`, :mod:`memlab.estimation.dryrun.reserved`), and each trial turned into an
estimate with its notes. :func:`estimate_plans` (training) and :func:`estimate_inference` say only what differs: the
runner, and how one plan's trial runs. Adapter plans put their adapters on the fake model first
(:mod:`memlab.estimation.dryrun.adapters`); bitsandbytes' 8-bit AdamW, where its operators cannot run on fake tensors,
gets its state from its known size (:func:`adamw8bit_state_bytes`).

What an estimate cannot see (each Trial's ``notes`` say so for the first point, and for the last two where they
apply):

- allocator rounding and fragmentation, kernel workspaces (memory an operator takes and gives back inside
  itself), the CUDA context, and memory held outside the step;
- values: code that reads a tensor's value (``.item()``, ``if tensor:``) reads 0 on fake tensors, so
  data-dependent branches take one side. Hugging Face models build their attention mask explicitly on fake tensors
  (they cannot see that it is all ones), a few bytes per token pair more than the real run;
- CUDA, when this PyTorch cannot reach a GPU: a ``"cuda"`` estimate then runs CPU kernels under CPU autocast rules
  (and AdamW's fused update, as the Trainer builds it on CUDA); CPU offload moves its host copies off the GPU's
  count there too (:mod:`memlab.techniques.offload`);
- bitsandbytes, where its operators cannot run on fake tensors: its 8-bit state is then computed from its known
  size (:func:`adamw8bit_state_bytes`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypedDict

import torch
import torch.utils.checkpoint
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode, is_fake
from typing_extensions import Unpack

from memlab.estimation.configs import one_line
from memlab.estimation.cuda.allocator import assumed_allocator, expandable_segments_assumed
from memlab.estimation.cuda.attention import CudaAttention, attention_note
from memlab.estimation.cuda.gpus import GpuKind, kind_or_default
from memlab.estimation.cuda.kernels import (
    EMULATED_NOTE,
    OWN_CHECKPOINT_NOTE,
    cuda_kernels,
    kernel_emulation,
    run_emulated,
)
from memlab.estimation.depth.carry import (
    ShallowModel,
    ShallowRun,
    carried_trial,
    live_shallow_model,
    plan_carries,
    shallow_model,
)
from memlab.estimation.depth.extend import check_layers, source_layers
from memlab.estimation.depth.log import DepthLog, Event, LayerPaths
from memlab.estimation.dryrun.adapters import attach_fake_adapter, bitsandbytes_version, kept_inputs_note
from memlab.estimation.dryrun.fake import BLIND_SPOTS, FakeMode, FakeSetup, fake_setup, one_thread
from memlab.estimation.dryrun.liger import on_fake_model
from memlab.estimation.dryrun.load import Load, apply_load, inference_loads, live_load_note, load_dtype, plan_loads
from memlab.estimation.dryrun.masks import FULL_MASK_DROPPED, model_made_positions, without_full_mask
from memlab.estimation.dryrun.reserved import (
    CUBLAS_WORKSPACES,
    INFERENCE_CUBLAS_WORKSPACES,
    ReservedTrace,
    cublas_workspace_bytes,
    reserved_notes,
)
from memlab.estimation.dryrun.triton_guard import skipped_kernels_note
from memlab.estimation.dryrun.unknown import foreign_ops_note
from memlab.live.batch import LossFn
from memlab.live.patching import patched
from memlab.live.quiet import quiet
from memlab.live.rebind import first_layers
from memlab.live.structure import trainable_parameters
from memlab.measure.probes import FakeProbe
from memlab.measure.tracker import CATEGORIES
from memlab.options import RunOptions
from memlab.plan import InferencePlan, Plan, parse_budget
from memlab.report import Report, Trial
from memlab.runner.collection import without_full_collections
from memlab.runner.core import Runner
from memlab.runner.trial import TrialRunner, check_plans
from memlab.techniques.fp8 import estimate_note as fp8_note
from memlab.techniques.offload import NOTHING_TO_MOVE

__all__ = [
    "adamw8bit_state_bytes", "cpu_rng_kept", "dry_run_inference", "dry_run_plans", "estimate_inference",
    "estimate_plans", "estimate_trainer_model", "fake_checkpoints", "is_inference", "with_cublas_workspaces",
]

_EMULATED_INFERENCE = (
    "estimated on CPU kernels with CUDA's attention backends emulated; what other kernels hold inside themselves "
    "as the CPU runs them"
)
_BNB_COMPUTED = (
    "bitsandbytes cannot run on fake tensors here: its 8-bit state is computed from its known size "
    "(2 bytes per parameter, fp32 moments below 4096 elements)"
)

# bitsandbytes' 8-bit optimizers: tensors below this many elements keep fp32 state; 8-bit state is quantized in
# blocks of this many elements, each with a float32 absmax; one 256-entry float32 map per moment is shared.
_BNB_MIN_8BIT_SIZE = 4096
_BNB_BLOCK = 256
_BNB_QMAP_BYTES = 2 * 256 * 4


class FakeRunKeywords(TypedDict, total=False):
    """The keywords every estimate on fake tensors takes (:func:`memlab.estimate`'s): ``estimate_plans(model, batch,
    plans, **keywords)`` passes them on whole to the dry run of training or inference plans."""

    loss_fn: LossFn | None
    budget: int | str | None
    device: str | torch.device | None
    gpu: GpuKind | None
    load: Mapping[str, Any] | None


@without_full_collections()
def estimate_plans(
    model_or_config: Any,
    batch: Any,
    plans: Sequence[Plan] | Plan | Sequence[InferencePlan] | InferencePlan,
    *,
    lr: float = 1e-5,
    **keywords: Unpack[FakeRunKeywords],
) -> Report:
    """:func:`memlab.estimate` for several plans, building the fake model once: a Report of estimated Trials.

    The keywords are :func:`memlab.estimate`'s; each plan's weights are materialised as ``load`` (or the load the
    plan implies) loads them (:mod:`memlab.estimation.dryrun.load`). A CUDA estimate made without CUDA emulates CUDA's
    kernels on the GPU kind ``gpu`` (default an 80 GB H100; :mod:`memlab.estimation.cuda.kernels`; the trial's notes
    say so), and its allocated peak holds the step's two cuBLAS workspaces (:func:`with_cublas_workspaces`).
    Inference plans are :func:`estimate_inference`'s.

    A plan that fails on fake tensors is an ``"error"`` trial; the others still run.

    Example:
        >>> model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
        >>> report = estimate_plans(model, torch.randn(8, 16), [Plan(), Plan(checkpointing=True)],
        ...                         loss_fn=lambda m, b: m(b).mean())
        >>> [t.status for t in report], [t.estimated for t in report]
        (['ok', 'ok'], [True, True])
    """
    if is_inference(plans):
        return estimate_inference(model_or_config, batch, plans, **keywords)  # type: ignore[arg-type]
    report = dry_run_plans(model_or_config, batch, plans, lr=lr, **keywords)  # type: ignore[arg-type]
    return with_cublas_workspaces(report, CUBLAS_WORKSPACES, keywords.get("gpu"))


def estimate_trainer_model(model: nn.Module, batch: Any, plan: Plan, **keywords: Any) -> Trial:
    """:func:`estimate_plans` of one training plan of a Trainer's model (its route's), whose repeated layers are
    carried from a dry run of a few where it is on the meta device, as a config's are (:func:`dry_run_plans`'
    ``live_layers``); ``keywords`` are :func:`estimate_plans`'.

    Example:
        >>> model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
        >>> estimate_trainer_model(model, torch.randn(8, 16), Plan(), loss_fn=lambda m, b: m(b).mean()).status
        'ok'
    """
    report = dry_run_plans(model, batch, [plan], live_layers=True, **keywords)
    return with_cublas_workspaces(report, CUBLAS_WORKSPACES, keywords.get("gpu"))[0]


@without_full_collections()
def dry_run_plans(
    model_or_config: Any,
    batch: Any,
    plans: Sequence[Plan] | Plan,
    *,
    loss_fn: LossFn | None = None,
    budget: int | str | None = None,
    lr: float = 1e-5,
    device: str | torch.device | None = None,
    gpu: GpuKind | None = None,
    load: Mapping[str, Any] | None = None,
    live_layers: bool = False,
) -> Report:
    """:func:`estimate_plans` of training plans without cuBLAS's workspaces in the allocated peak: what the sharded
    routes compose their per-GPU figures from (:mod:`memlab.estimation.sharded.composed`), which do not count them.
    With ``live_layers``, a live model whose layers repeat is carried from its first few layers as a config is
    (:func:`~memlab.estimation.depth.carry.live_shallow_model`: a Trainer's model, as its route asks).

    Example:
        >>> model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
        >>> batch = torch.randn(8, 16)
        >>> bare = dry_run_plans(model, batch, Plan(), loss_fn=lambda m, b: m(b).mean(), gpu=kind_or_default(None))[0]
        >>> held = estimate_plans(model, batch, Plan(), loss_fn=lambda m, b: m(b).mean(), gpu=kind_or_default(None))[0]
        >>> held.peak_bytes - bare.peak_bytes == 2 * 32 * 2**20
        True
    """
    from memlab.estimation.cuda.devices import asked_device

    device = asked_device(gpu, device)  # a GPU kind named is a CUDA estimate, wherever the model is
    checked = check_plans(plans)  # type: ignore[arg-type]
    options = RunOptions(loss_fn=loss_fn, lr=lr, steps=1, warmup=1)  # validates before anything is built
    loads = plan_loads(model_or_config, checked, load)
    shallow = None
    if any(plan_carries(plan) for plan in checked):
        shallow = shallow_model(model_or_config)
        if shallow is None and live_layers and isinstance(model_or_config, nn.Module) and load is None:
            shallow = live_shallow_model(model_or_config)
    if shallow is None:
        training = _Workload(TrialRunner, _training_trial, loads=loads)
        return _dry_run(model_or_config, batch, checked, options, training, budget=budget, device=device, gpu=gpu)
    # A model whose layers repeat: each plan from dry runs of three and two layers (memlab.estimation.depth.carry), or
    # of every layer where its step does not repeat layer by layer.
    limit = parse_budget(budget)
    trials = []
    for number, plan in enumerate(checked):
        with _plan_allocator(plan):  # carried to the model's depth by replays of the allocator's model
            trial = _carried(shallow, batch, plan, options, load, device=device, gpu=gpu, limit=limit)
        if trial is None:
            whole = _Workload(TrialRunner, _training_trial, loads=loads[number:number + 1])
            trial = _dry_run(model_or_config, batch, [plan], options, whole, budget=budget, device=device,
                             gpu=gpu).trials[0]
        trials.append(trial)
    return Report(trials, budget=limit)


def _carried(
    shallow: ShallowModel, batch: Any, plan: Plan, options: RunOptions, load: Mapping[str, Any] | None, *,
    device: str | torch.device | None, gpu: GpuKind | None, limit: int | None,
) -> Trial | None:
    """``plan``'s estimate at the model's depth from its dry runs of three and two layers, None where they do not
    carry (:func:`~memlab.estimation.depth.carry.carried_trial`)."""
    if not plan_carries(plan):
        return None
    runs: dict[int, ShallowRun] = {}
    fell_back: dict[int, bool] = {}
    for layers in (source_layers(), check_layers()):
        try:
            shallow_input = (shallow.shallow(layers) if shallow.live is None
                             else first_layers(shallow.live, shallow.paths.container, layers))
            workload = _Workload(TrialRunner, _training_trial, loads=plan_loads(shallow_input, [plan], load))
            place, (run,) = _plan_runs(shallow_input, batch, [plan], options, workload, device=device, gpu=gpu,
                                       paths=shallow.paths)
        except Exception:  # noqa: BLE001 - a live model's copy of a few layers that cannot be set up: dry-run whole
            if shallow.live is None:
                raise
            return None
        if run.events is None or run.trial.status != "ok":
            return None
        runs[layers] = ShallowRun(run.trial, run.reserved, run.events, run.root)
        fell_back[layers] = run.fell_back
    carried = carried_trial(shallow, runs, CATEGORIES, _capacity(kind_or_default(gpu)))
    if carried is None or fell_back[source_layers()] != fell_back[check_layers()]:
        return None
    trial, reserved = carried
    return _estimated(_PlanRun(trial, reserved, fell_back[source_layers()]), place, limit, workload)


@without_full_collections()
def estimate_inference(
    model_or_config: Any,
    batch: Any,
    plans: Sequence[InferencePlan] | InferencePlan,
    **keywords: Unpack[FakeRunKeywords],
) -> Report:
    """:func:`dry_run_inference` with, on CUDA, the forward's cuBLAS workspace in the allocated peak
    (:func:`with_cublas_workspaces`): what a process that runs only this inference holds.

    Example:
        >>> from transformers import LlamaConfig
        >>> from memlab.plan import InferencePlan
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        ...                      num_key_value_heads=2, vocab_size=256)
        >>> shapes, plan = {"input_ids": (1, 16)}, InferencePlan(weights="bf16", new_tokens=2)
        >>> h100 = kind_or_default(None)
        >>> held = estimate_inference(config, shapes, plan, gpu=h100)[0]
        >>> held.peak_bytes - dry_run_inference(config, shapes, plan, gpu=h100)[0].peak_bytes == 32 * 2**20
        True
    """
    report = dry_run_inference(model_or_config, batch, plans, **keywords)
    return with_cublas_workspaces(report, INFERENCE_CUBLAS_WORKSPACES, keywords.get("gpu"))


@without_full_collections()
def dry_run_inference(
    model_or_config: Any,
    batch: Any,
    plans: Sequence[InferencePlan] | InferencePlan,
    **keywords: Unpack[FakeRunKeywords],
) -> Report:
    """Inference plans estimated on fake tensors: the same :class:`~memlab.inference.run.InferenceRunner` as
    ``memlab.measure`` (the same steps, tracker and categories) with a :class:`~memlab.measure.probes.FakeProbe`.

    ``batch`` may be shapes, ``{"input_ids": (rows, context)}``. Quantized weights cannot run bitsandbytes on fake
    tensors: each quantized layer holds bitsandbytes' bytes (:func:`memlab.inference.weights.quantized_bytes`)
    and makes its full weight for the product, as bitsandbytes does on CPU. ``loss_fn`` must be None (inference
    computes no loss); the other keywords are :func:`memlab.estimate`'s. With ``load=`` (a config, a name or a meta
    model), the weights are held as that load materialises them (:mod:`memlab.estimation.dryrun.load`), and each plan
    runs in the dtype the load gives them (:func:`memlab.estimation.dryrun.load.inference_loads`). No cuBLAS
    workspace is in the allocated peak: a GRPO estimate puts this beside a training step's, which holds them.

    Example:
        >>> from transformers import LlamaConfig
        >>> from memlab.plan import InferencePlan
        >>> from memlab.inference.kv import kv_cache_bytes
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        ...                      num_key_value_heads=2, vocab_size=256)
        >>> trial = dry_run_inference(config, {"input_ids": (4, 1024)}, InferencePlan(weights="bf16"), device="cpu")[0]
        >>> trial.kv_cache_end_bytes == kv_cache_bytes(config, tokens=1024, batch=4, dtype="bf16"), trial.estimated
        (True, True)
    """
    from memlab.estimation.cuda.devices import asked_device
    from memlab.inference.run import InferenceRunner, check_inference_options, check_inference_plans

    gpu = keywords.get("gpu")
    device = asked_device(gpu, keywords.get("device"))  # a GPU kind named is a CUDA estimate, wherever the model is
    checked = check_inference_plans(plans)
    options = RunOptions(loss_fn=keywords.get("loss_fn"), steps=1, warmup=0, noise=0)
    check_inference_options(options)
    checked, loads = inference_loads(model_or_config, checked, keywords.get("load"))
    inference = _Workload(InferenceRunner, _inference_trial, check_first=True, notes=_quantized_note,
                          emulated_note=_EMULATED_INFERENCE, cublas_handles=INFERENCE_CUBLAS_WORKSPACES, loads=loads)
    return _dry_run(model_or_config, batch, checked, options, inference, budget=keywords.get("budget"), device=device,
                    gpu=gpu)


def with_cublas_workspaces(report: Report, handles: int, gpu: GpuKind | None = None) -> Report:
    """``report`` with ``handles`` cuBLAS workspaces (as PyTorch sizes them for the GPU kind ``gpu``) under
    ``other`` all through each CUDA trial's step. PyTorch takes a handle's workspace from the caching allocator at
    its first matrix product and keeps it, so a real step's ``max_memory_allocated`` holds them: ``memlab.measure``
    on CUDA read 64.1 to 67.9 MiB of ``other`` in every training trial of the H100 and H200 runs, the two handles'
    32 MiB, where the estimates held under 1 MiB. The reserved figure counts them already
    (:mod:`memlab.estimation.dryrun.reserved`).

    Example:
        >>> from memlab.plan import Plan
        >>> trial = Trial(Plan(), "ok", 100, {"params": 100}, None, None, None, "cuda", estimated=True)
        >>> held = with_cublas_workspaces(Report([trial]), 2, kind_or_default(None))[0]
        >>> held.peak_bytes - 100 == held.breakdown["other"] == 2 * 32 * 2**20
        True
    """
    workspaces = handles * cublas_workspace_bytes(kind_or_default(gpu).capability)
    if not workspaces:
        return report
    trials = []
    for trial in report.trials:
        if trial.status == "ok" and str(trial.device).startswith("cuda"):
            breakdown = dict(trial.breakdown)
            breakdown["other"] = breakdown.get("other", 0) + workspaces
            timeline = trial.timeline and trial.timeline.shifted("other", workspaces, "cuBLAS workspaces")
            trial = dataclasses.replace(trial, peak_bytes=trial.peak_bytes + workspaces, breakdown=breakdown,
                                        timeline=timeline)
        trials.append(trial)
    return dataclasses.replace(report, trials=trials)


# --- the one dry run both workloads share ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Workload:
    """What the training and the inference dry run do differently; :func:`_dry_run` does everything else."""

    runner: Callable[..., Runner[Any, Any]]
    """The runner class: :class:`~memlab.runner.trial.TrialRunner` or :class:`~memlab.inference.run.InferenceRunner`."""
    trial: Callable[[Runner[Any, Any], Any, FakeSetup, ReservedTrace | None], Trial]
    """One plan's trial, run under the trial's modes (the reserved trace follows it, CUDA's kernels emulated)."""
    check_first: bool = False
    """Whether every plan is checked against the model (``runner.check``) before any runs: a clear error instead
    of an ``"error"`` trial."""
    notes: Callable[[Any], tuple[str, ...]] = lambda plan: ()
    """What a plan's estimate says after the dry run's own notes."""
    emulated_note: str = EMULATED_NOTE
    """The note of a trial made with CUDA's kernels emulated."""
    cublas_handles: int = 2
    """cuBLAS handles the workload's steps use, each with its workspace: training's forward and backward threads,
    inference's one."""
    loads: Sequence[Load | None] = ()
    """Each plan's load (:func:`plan_loads`), made on the fake model before the trial places it; None (or no
    entry): the model as it is."""


def _dry_run(
    model_or_config: Any,
    batch: Any,
    plans: Sequence[Any],
    options: RunOptions,
    workload: _Workload,
    *,
    budget: int | str | None,
    device: str | torch.device | None,
    gpu: GpuKind | None,
) -> Report:
    """The flow of a one-device dry run: each plan's run (:func:`_plan_runs`), each trial turned into an estimate
    with its notes."""
    limit = parse_budget(budget)
    place, runs = _plan_runs(model_or_config, batch, plans, options, workload, device=device, gpu=gpu)
    return Report([_estimated(run, place, limit, workload) for run in runs], budget=limit)


@dataclass
class _PlanRun:
    """One plan's dry run: its trial (its notes, before it is made an estimate), its reserved peak (CUDA), whether
    CUDA's kernels could not be emulated, and the events a depth log kept (where one was asked for)."""

    trial: Trial
    reserved: int | None
    fell_back: bool
    events: list[Event] | None = None
    root: str = ""
    """The name the model itself ran under in the depth log (its class's: the recording's root)."""


@contextlib.contextmanager
def cpu_rng_kept() -> Iterator[None]:
    """The CPU's random-number state read before a dry run and put back after it, outside every fake and emulating
    mode: a dry run draws from it where it builds real tensors whose values it throws away (peft's initialisers of
    the adapters it makes fake), and the user's next draw must be what it would have been. The runner inside saves
    and restores no random-number state of its own (its model is fake), and the device's is never read: no real
    CUDA call is made under a dry run's modes (DESIGN.md 2.4), and a dry run runs no CUDA kernel that draws from it.

    Example:
        >>> before = torch.random.get_rng_state()
        >>> with cpu_rng_kept():
        ...     _ = torch.rand(3)
        >>> torch.equal(torch.random.get_rng_state(), before)
        True
    """
    state = torch.random.get_rng_state()
    try:
        yield
    finally:
        torch.random.set_rng_state(state)


@contextlib.contextmanager
def fake_checkpoints() -> Iterator[None]:
    """``torch.utils.checkpoint`` keeps no device's random-number state for fake tensors while a dry run runs.

    Checkpointing stashes the RNG state of every device its inputs are on (``get_device_states``:
    ``torch.cuda.get_rng_state``) and puts it back around the recomputation in backward (``fork_rng``,
    ``set_device_states``: ``torch.cuda.set_rng_state``). On a machine with CUDA a dry run's fake tensors are on
    ``cuda``, so each checkpointed block of a dry run read and set the real CUDA generator under the fake mode, which
    clones the state into a fake tensor before it is set (issue 57: the CUDA context broken on an H200, an
    SFTTrainer's checkpointed LoRA plan). A fake step has no values for the RNG to reproduce: the devices of fake
    inputs are skipped, so no state of theirs is read or set; real inputs keep theirs as before.

    Example:
        >>> from memlab.estimation.dryrun.fake import FakeMode
        >>> with FakeMode() as mode, fake_checkpoints():
        ...     fake = mode.from_tensor(torch.ones(2))
        ...     torch.utils.checkpoint.get_device_states(fake)
        ([], [])
    """
    original = torch.utils.checkpoint.get_device_states

    def device_states(*args: Any) -> tuple[list[int], list[torch.Tensor]]:
        leaves = torch.utils._pytree.tree_leaves(args)
        return original(*[leaf for leaf in leaves if isinstance(leaf, torch.Tensor) and not is_fake(leaf)])

    with patched(torch.utils.checkpoint, get_device_states=device_states):
        yield


@cpu_rng_kept()
def _plan_runs(
    model_or_config: Any,
    batch: Any,
    plans: Sequence[Any],
    options: RunOptions,
    workload: _Workload,
    *,
    device: str | torch.device | None,
    gpu: GpuKind | None,
    paths: LayerPaths | None = None,
) -> tuple[tuple[torch.device, torch.device], list[_PlanRun]]:
    """The fake model and batch (:func:`~memlab.estimation.dryrun.fake.fake_setup`, once), the workload's runner on a
    :class:`~memlab.measure.probes.FakeProbe`, each plan run under the fake mode (with CUDA's kernels emulated and
    its allocations traced where the estimate is for CUDA); with ``paths``, each plan's events kept by a
    :class:`~memlab.estimation.depth.log.DepthLog` (:mod:`memlab.estimation.depth.carry`). Returns the (target, kernels)
    devices and the runs."""
    kind = kind_or_default(gpu)
    emulated = kernel_emulation(model_or_config, device)
    batch, dropped = without_full_mask(batch)
    setup = fake_setup(model_or_config, batch, device, options.verbose)
    mode, target, kernels = setup.mode, setup.target, setup.kernels
    trace = (ReservedTrace(kernels, kind.capability, workload.cublas_handles, _capacity(kind))
             if target.type == "cuda" else None)
    log = DepthLog(paths, setup.model) if paths is not None else None
    probe = FakeProbe(kernels, target=target, on_release=trace.release if trace is not None else None)
    listeners = [listen for listen in (trace and trace.listen, log and log.listen) if listen]
    runner = workload.runner(setup.model, setup.batch, options, probe=probe,
                             listener=(lambda event: [listen(event) for listen in listeners]) if listeners else None)
    if log is not None:
        mode.tagger, probe.recorder = log, log.step_recorder
        if trace is not None:
            trace.log = log
    if workload.check_first:
        for plan in plans:
            runner.check(plan)
    runs: list[_PlanRun] = []
    with one_thread(), quiet(options.verbose), fake_checkpoints(), on_fake_model(setup.model) as liger, mode, \
            runner.session(), model_made_positions(batch):
        for number, plan in enumerate(plans):
            load = workload.loads[number] if number < len(workload.loads) else None

            def run(emulate: bool, plan: Any = plan, load: Load | None = load) -> tuple[Trial, CudaAttention | None]:
                attention = None
                with contextlib.ExitStack() as stack:
                    if log is not None:
                        stack.enter_context(log.watching())
                    if load is not None:  # the weights as the user loads them, before the trial places them
                        stack.callback(apply_load(setup.model, load, mode, kernels))
                    if trace is not None:
                        stack.enter_context(_plan_allocator(plan))
                        stack.enter_context(trace.trial(setup.model, setup.batch, mode))
                    if emulated:
                        attention = stack.enter_context(cuda_kernels(kind, kernels=emulate))
                    mode.foreign_ops.clear()
                    mode.skipped_kernels.clear()
                    return workload.trial(runner, plan, setup, trace), attention

            staged = load.staging_bytes(setup.model) if load is not None else 0  # before the load: as built
            (trial, attention), fell_back = run_emulated(partial(_followed, run, mode), emulated)
            notes = [note for note in (attention and attention_note(attention), dropped and FULL_MASK_DROPPED,
                                       *setup.notes, foreign_ops_note(mode.foreign_ops),
                                       skipped_kernels_note(mode.skipped_kernels),
                                       _load_note(load, workload, setup, plan), _four_bit_note(plan, load),
                                       load and staged > trial.host_bytes and load.staging_note(),
                                       fp8_note(plan, target.type, kind.capability, kind.name), *liger.notes)
                     if note]
            trial = dataclasses.replace(trial, notes=(*trial.notes, *notes, *workload.notes(plan)),
                                        host_bytes=max(trial.host_bytes, staged))  # the load, then the step
            runs.append(_PlanRun(trial, _reserved(trial, trace), fell_back,
                                 list(log.events) if log is not None else None,
                                 log.watch.root if log is not None else ""))
    return (target, kernels), runs


def _plan_allocator(plan: Any) -> contextlib.AbstractContextManager[None]:
    """The allocator a plan's card figure assumes: expandable segments where its lever asks (or the estimate does)."""
    return assumed_allocator(expandable_segments_assumed() or getattr(plan, "expandable_segments", False) is True)


def _capacity(kind: GpuKind) -> int:
    """What CUDA can give the caching allocator on a GPU of this kind: its memory less the CUDA context."""
    return kind.memory_bytes - kind.context_bytes


def _estimated(run: _PlanRun, place: tuple[torch.device, torch.device], limit: int | None,
               workload: _Workload) -> Trial:
    """A plan's run made an estimate: the devices, the budget, the reserved peak and the notes it needs."""
    target, kernels = place
    with _plan_allocator(run.trial.plan):  # its reserved notes say the allocator it assumed
        trial = _as_estimate(run.trial, target, kernels, limit, run.reserved)
    emulated_note = OWN_CHECKPOINT_NOTE if run.fell_back else workload.emulated_note
    if emulated_note != EMULATED_NOTE:
        trial = dataclasses.replace(trial, notes=tuple(
            emulated_note if note == EMULATED_NOTE else note for note in trial.notes))
    return trial


def _followed(run: Callable[[bool], Any], mode: FakeMode, emulate: bool) -> Any:
    """``run(emulate)`` with the runner's trackers following the fake mode rather than stacked on it as modes (the
    same operators, fewer Python calls per operator); again as modes where a tensor subclass's operators came,
    which a tracker mode would not see one by one (:attr:`~memlab.estimation.dryrun.fake.FakeMode.followable`)."""
    mode.followable, mode.unfollowed = True, False
    try:
        result = run(emulate)
        if mode.unfollowed:
            mode.followable = False
            result = run(emulate)
    finally:
        mode.followable = False
    return result


def _load_note(load: Load | None, workload: _Workload, setup: FakeSetup, plan: Any) -> str | None:
    """The load a trial assumed; for a live model that the plan casts or quantizes, on CUDA, what that means."""
    if load is not None:
        return load.note(load_dtype(setup.model, load))
    if workload.loads and setup.target.type == "cuda":
        return live_load_note(setup.model, plan)
    return None


def _four_bit_note(plan: Any, load: Load | None) -> str | None:
    """For training with 4-bit layers (QLoRA, or adapters on a 4-bit load), what the modelled bitsandbytes keeps."""
    four_bit = getattr(plan, "adapter", None) == "qlora" or (load is not None and load.quantize in ("nf4", "fp4"))
    return kept_inputs_note(bitsandbytes_version()) if four_bit and isinstance(plan, Plan) else None


def _training_trial(runner: Runner[Any, Any], plan: Plan, setup: FakeSetup, trace: ReservedTrace | None) -> Trial:
    """A training plan's trial: adapters put on the fake model first; 8-bit AdamW's state computed where
    bitsandbytes cannot run on fake tensors."""
    if plan.adapter != "none":
        return _adapter_trial(runner, setup.model, plan, setup.mode, setup.kernels, trace)
    if trace is not None:
        trace.pause()
    trial = runner.run(plan)
    if trial.status == "error" and plan.optimizer in ("adamw8bit", "paged_adamw8bit"):
        trial = _computed_8bit_trial(runner, plan, trial, setup.model)
    return trial


def _inference_trial(
    runner: Runner[Any, Any], plan: InferencePlan, setup: FakeSetup, trace: ReservedTrace | None
) -> Trial:
    """An inference plan's trial: the runner's own."""
    if trace is not None:
        trace.pause()
    return runner.run(plan)


def _quantized_note(plan: InferencePlan) -> tuple[str, ...]:
    """What an estimate of quantized weights says: where their bytes come from."""
    return (f"{plan.quantize} weights counted from bitsandbytes' layout",) if plan.quantize != "none" else ()


def is_inference(plans: Any) -> bool:
    """Whether ``plans`` (one plan or a list) asks for inference: an :class:`~memlab.plan.InferencePlan`.

    Example:
        >>> from memlab.plan import InferencePlan
        >>> is_inference([Plan(), InferencePlan()]), is_inference(Plan())
        (True, False)
    """
    if isinstance(plans, InferencePlan):
        return True
    return isinstance(plans, (list, tuple)) and any(isinstance(plan, InferencePlan) for plan in plans)


def _adapter_trial(
    runner: Runner[Any, Any], model: nn.Module, plan: Plan, mode: FakeTensorMode, device: torch.device,
    trace: ReservedTrace | None = None,
) -> Trial:
    """A dry run of an adapter plan: the adapters are put on the fake model here (see
    :mod:`memlab.estimation.dryrun.adapters`), and the runner trains what they leave trainable."""
    try:
        undo = attach_fake_adapter(model, plan, mode, device)
    except Exception as error:  # noqa: BLE001 - reported as the plan's estimate, like any failure of a plan
        return Trial(plan, "error", 0, {c: 0 for c in CATEGORIES}, None, None, None, str(device),
                     error=one_line(error))
    if trace is not None:
        trace.pause()
    try:
        trial = runner.run(plan.replace(adapter="none"))
    finally:
        undo()
    note = "4-bit weights counted from bitsandbytes' NF4 layout" if plan.adapter == "qlora" else ""
    return dataclasses.replace(trial, plan=plan, notes=(*trial.notes, *([note] if note else [])))


def _computed_8bit_trial(runner: Runner[Any, Any], plan: Plan, failed: Trial, model: nn.Module) -> Trial:
    """The 8-bit plan from the AdamW plan's estimate, its optimizer state replaced by the known 8-bit size."""
    adamw = runner.run(plan.replace(optimizer="adamw"))
    if adamw.status != "ok":
        return failed
    state = adamw8bit_state_bytes(trainable_parameters(model))
    breakdown = dict(adamw.breakdown)
    peak = adamw.peak_bytes - breakdown["optimizer"] + state
    # The state is there all through the step: the same timeline, its optimizer bytes the 8-bit size.
    timeline = adamw.timeline and adamw.timeline.shifted("optimizer", state - breakdown["optimizer"])
    breakdown["optimizer"] = state
    host = adamw.host_bytes + (state if plan.optimizer == "paged_adamw8bit" else 0)  # a paged state's spill, at most
    return dataclasses.replace(adamw, plan=plan, peak_bytes=peak, breakdown=breakdown,
                               notes=(*adamw.notes, _BNB_COMPUTED), timeline=timeline, host_bytes=host)


def _reserved(trial: Trial, trace: ReservedTrace | None) -> int | None:
    """The reserved peak of a CUDA trial's replayed allocations; None where it has no trace of its own (an error, a
    CPU estimate, or 8-bit state computed from its size rather than allocated)."""
    if trace is None or trial.status != "ok" or _BNB_COMPUTED in trial.notes:
        return None
    return trace.reserved_bytes


def _as_estimate(
    trial: Trial, target: torch.device, kernels: torch.device, budget: int | None, reserved: int | None = None
) -> Trial:
    notes = [BLIND_SPOTS]
    if kernels != target:
        notes.append(EMULATED_NOTE)  # an offload plan's own note says how its host side is modelled
    for note in trial.notes:
        # Notes about the CPU the kernels ran on do not apply to the CUDA device the estimate is for.
        if kernels != target and (note == NOTHING_TO_MOVE or note.startswith("fp16 on CPU")):
            continue
        notes.append(note)
    if reserved is not None:
        notes += reserved_notes()
    return dataclasses.replace(
        trial,
        device=str(target) if kernels != target else trial.device,
        step_time_s=None,
        samples_per_s=None,
        tokens_per_s=None,
        budget=budget,
        reserved_bytes=reserved,
        rss_bytes=None,
        notes=tuple(dict.fromkeys(notes)),
        estimated=True,
        timeline=trial.timeline and dataclasses.replace(trial.timeline, device=str(target)),
    )


def adamw8bit_state_bytes(parameters: Sequence[torch.Tensor]) -> int:
    """Bytes of ``bitsandbytes.optim.AdamW8bit`` state for ``parameters`` (what it holds after its first step).

    Tensors of 4096 elements or more keep two uint8 moments (2 bytes per element) and a float32 absmax per
    256-element block for each moment; smaller tensors keep two float32 moments (8 bytes per element). The two
    256-entry float32 quantization maps are shared by all tensors.

    Example:
        >>> adamw8bit_state_bytes([torch.empty(4096), torch.empty(10)])  # 8192 + 2 * 4 * 16 + 8 * 10 + 2048
        10448
    """
    total = 0
    quantized = False
    for parameter in parameters:
        count = parameter.numel()
        if count >= _BNB_MIN_8BIT_SIZE:
            quantized = True
            blocks = -(-count // _BNB_BLOCK)
            total += 2 * count + 2 * 4 * blocks
        else:
            total += 8 * count
    return total + (_BNB_QMAP_BYTES if quantized else 0)
