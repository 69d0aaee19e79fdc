"""The FSDP2 dry run: one steady-state training step of a plan, sharded over ``gpus`` GPUs, run on fake tensors.

The model and batch are the single-GPU estimate's (:func:`memlab.estimation.dryrun.fake.fake_setup`, on CPU kernels: the
fake process group's device mesh is a CPU mesh). The model is sharded with ``torch.distributed.fsdp.fully_shard``
over a device mesh of a *fake* process group (``backend="fake"``, from ``torch.testing._internal.distributed.fake_pg``:
collectives that move nothing, one process standing for rank 0 of ``gpus``). The wrapping is accelerate's
``TRANSFORMER_BASED_WRAP`` (:func:`shard_units`, then the root), with ``reshard_after_forward=True`` and, for
``precision="bf16"/"fp16"``, accelerate's FSDP2 ``MixedPrecisionPolicy`` (parameters, reductions and outputs in that
dtype). The step is memlab's own :class:`~memlab.runner.step.TrainingStep` (autocast, checkpointing, the optimizer,
as for one GPU), for one micro-batch (``batch`` is what ONE GPU sees per micro-step), tracked by PyTorch's
``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker``, which tells sharded from unsharded parameters and
gradients, the all-gather and reduce-scatter buffers, optimizer state and activations. What it cannot see is what
any fake-tensor estimate cannot (see :mod:`memlab.estimation.dryrun.single_gpu`), plus NCCL's own buffers. Where the
plan offloads the optimizer, FSDP2's ``CPUOffloadPolicy`` keeps the sharded parameters, gradients and optimizer state in
CPU memory: the per-GPU peak is then the largest module-level snapshot without them (they are reported in
``host_bytes``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from memlab.errors import MemlabError
from memlab.estimation.configs import one_line
from memlab.estimation.cuda.attention import attention_note
from memlab.estimation.cuda.devices import target_device
from memlab.estimation.cuda.gpus import GpuKind, kind_or_default
from memlab.estimation.cuda.kernels import EMULATED_NOTE, OWN_CHECKPOINT_NOTE, cuda_kernels, run_emulated
from memlab.estimation.depth.carry import ShallowModel, plan_carries, shallow_model
from memlab.estimation.depth.extend import check_layers, source_layers
from memlab.estimation.depth.log import DepthLog, Event, LayerPaths
from memlab.estimation.dryrun.fake import BLIND_SPOTS, fake_setup, one_thread
from memlab.estimation.dryrun.load import apply_load, load_dtype, plan_loads
from memlab.estimation.dryrun.masks import FULL_MASK_DROPPED, model_made_positions, without_full_mask
from memlab.estimation.dryrun.reserved import ReservedTrace, reserved_notes
from memlab.estimation.dryrun.single_gpu import adamw8bit_state_bytes
from memlab.estimation.dryrun.triton_guard import skipped_kernels_note
from memlab.estimation.dryrun.unknown import foreign_ops_note
from memlab.estimation.sharded.fsdp2.depth import FSDP2_EDGE, carried_books, logging_tracker
from memlab.estimation.sharded.fsdp2.speed import foreach_split_once, fsdp_mem_tracker, strided_flag_once
from memlab.estimation.sharded.fsdp2.units import fsdp2_layout
from memlab.events import StepFinished, TrialStarted
from memlab.live.batch import LossFn
from memlab.live.compat import fsdp2_api, propagation_apart
from memlab.live.quiet import quiet
from memlab.live.sharding import ZeroSettings
from memlab.live.structure import trainable_parameters
from memlab.measure.tracker import CATEGORIES
from memlab.plan import Plan
from memlab.report import Trial
from memlab.runner.collection import without_full_collections
from memlab.runner.step import TrainingStep
from memlab.sizes import format_bytes
from memlab.techniques.accumulation import micro_batches
from memlab.techniques.optimizer import EIGHT_BIT_OPTIMIZERS, build_optimizer, state_tensors
from memlab.techniques.weights import cast_weights

__all__ = [
    "DETAIL", "FSDP2_REFUSALS", "FSDP_NOTE", "ONE_STREAM_NOTE", "ShardedRequest", "ShardedTrial", "fake_process_group",
    "fsdp2_dry_run", "sharded_trial",
]

DETAIL = (
    "sharded_params",
    "unsharded_params",
    "persistent_params",
    "sharded_grads",
    "unsharded_grads",
    "optimizer",
    "activations",
    "communication",
    "inputs",
)
"""The finer categories of a sharded estimate (:attr:`ShardedTrial.detail`), in bytes per GPU at the peak:
``persistent_params`` are ZeRO-3's parameters under ``stage3_param_persistence_threshold``, whole on every GPU
beside their partition (none under FSDP)."""

FSDP_NOTE = "FSDP2 estimated with fully_shard on fake tensors and a fake process group (FSDPMemTracker)"
"""The note of every FSDP2 dry run."""

ONE_STREAM_NOTE = (
    "reserved_bytes assumes one CUDA stream: a real FSDP2 run all-gathers and reduce-scatters on their own streams, "
    "whose separate allocator pools may reserve more"
)
"""The note of an FSDP2 estimate that carries ``reserved_bytes``: the allocator model has one stream's pools."""

# Which detail adds up into which of memlab's five categories.
_DETAIL_TO_CATEGORY = {
    "sharded_params": "params",
    "unsharded_params": "params",
    "persistent_params": "params",
    "sharded_grads": "grads",
    "unsharded_grads": "grads",
    "optimizer": "optimizer",
    "activations": "activations",
    "communication": "other",
    "inputs": "other",
}

# FSDPMemTracker's reference types (their values) -> detail.
_FSDP_KINDS = {
    "Sharded Param": "sharded_params",
    "Unsharded Param": "unsharded_params",
    "Buffer": "unsharded_params",
    "Sharded Grad": "sharded_grads",
    "Unsharded Grad": "unsharded_grads",
    "Activation": "activations",
    "Temp": "activations",
    "All Gather": "communication",
    "Reduce Scatter": "communication",
    "OptState": "optimizer",
    "Inputs": "inputs",
}
FSDP2_REFUSALS = {
    "adafactor": "optimizer='adafactor' does not run with FSDP2: transformers' Adafactor keeps its factored state as "
                 "plain tensors, which FSDP2's sharded (DTensor) gradients cannot be added to; write optimizer="
                 "'adamw' (or 'adamw8bit') with fsdp2, or shard with zero2 / zero3, where DeepSpeed steps on plain "
                 "tensors",
}
"""Why a plan's optimizer cannot train under FSDP2 (the real ``fully_shard`` step fails as the dry run does), each
saying what to write instead."""

_HOST_WITH_OFFLOAD = ("sharded_params", "sharded_grads", "optimizer")
_CPU = torch.device("cpu")


@dataclass
class ShardedTrial(Trial):
    """A :class:`~memlab.report.Trial` for one GPU of ``gpus`` training with ``strategy``.

    ``peak_bytes`` and ``breakdown`` are per GPU (the five categories of every Trial: ``"other"`` holds the
    communication buffers and the batch); ``detail`` splits the peak finer (:data:`DETAIL`: sharded and unsharded
    parameters and gradients, optimizer state, activations, communication buffers, inputs); ``model_state_bytes`` is
    what each GPU holds between steps for the weights, gradients and optimizer state; ``host_bytes`` is each rank's
    CPU memory for offloaded state. A trainer's answer says its load beside the step (None elsewhere,
    :mod:`memlab.estimation.sharded.loading`): ``load_bytes``, each GPU's bytes while its model is loaded and wrapped,
    and ``load_host_bytes``, a node's host bytes meanwhile. ``composed``: made from one GPU's dry run
    (:mod:`memlab.estimation.sharded.composed`), not a sharded one.

    Example:
        >>> t = ShardedTrial(Plan(), "ok", 10, {"params": 10}, None, None, None, "cuda", gpus=8, strategy="zero3")
        >>> t.gpus, t.strategy, t.breakdown["other"]
        (8, 'zero3', 0)
    """

    gpus: int = 1
    strategy: str = "none"
    detail: dict[str, int] = field(default_factory=dict)
    model_state_bytes: int = 0
    load_bytes: int | None = None
    load_host_bytes: int | None = None
    composed: bool = False

    @property
    def verdict_bytes(self) -> int:
        """The figure a budget verdict judges (:attr:`Trial.verdict_bytes`), or the load's with the CUDA context where
        it is higher: the run's peak per GPU is then its load, which must fit too.

        Example:
            >>> t = ShardedTrial(Plan(), "ok", 10, {}, None, None, None, "cpu", gpus=2, strategy="fsdp2", load_bytes=12)
            >>> t.verdict_bytes
            12
        """
        figure = super().verdict_bytes
        return figure if self.load_bytes is None else max(figure, self.load_bytes + (self.context_bytes or 0))

    @property
    def label(self) -> str:
        """The plan's label, then the strategy and the number of GPUs (``"ckpt bf16 fsdp2 x8"``), so that the
        trials of several strategies tell apart in one Report (its table and figure).

        Example:
            >>> ShardedTrial(Plan(checkpointing=True), "ok", 1, {}, None, None, None, "cuda", gpus=8,
            ...              strategy="fsdp2").label
            'ckpt fsdp2 x8'
            >>> ShardedTrial(Plan(), "ok", 1, {}, None, None, None, "cuda").label
            'plain'
        """
        label = super().label
        if self.strategy == "none":
            return label
        where = f"{self.strategy} x{self.gpus}"
        return where if label == "plain" else f"{label} {where}"


def sharded_trial(
    plan: Plan,
    detail: dict[str, int],
    target: torch.device,
    budget: int | None,
    gpus: int,
    strategy: str,
    held: int,
    host: int,
    notes: Sequence[str],
) -> ShardedTrial:
    """The estimated trial of one GPU from its :data:`DETAIL` bytes at the peak (summed into the five categories),
    the model states it holds between steps (``held``) and its share of offloaded CPU memory (``host``).

    Example:
        >>> trial = sharded_trial(Plan(), {"sharded_params": 4, "communication": 2}, torch.device("cuda"), None, 2,
        ...                       "fsdp2", 4, 0, [])
        >>> trial.peak_bytes, trial.breakdown["params"], trial.breakdown["other"], trial.label
        (6, 4, 2, 'fsdp2 x2')
    """
    breakdown = dict.fromkeys(CATEGORIES, 0)
    for name, nbytes in detail.items():
        breakdown[_DETAIL_TO_CATEGORY[name]] += nbytes
    peak = sum(breakdown.values())
    return ShardedTrial(
        plan, "ok", peak, breakdown, None, None, None, str(target),
        budget=budget, notes=tuple(dict.fromkeys(notes)), estimated=True, gpus=gpus, strategy=strategy,
        detail=detail, model_state_bytes=held, host_bytes=host,
    )


@dataclass(frozen=True)
class ShardedRequest:
    """What one sharded estimate is asked, as :func:`memlab.estimation.sharded.per_gpu.sharded_estimate` checked it: the
    model (a config, a name or a model), the batch ONE GPU sees per micro-step, the plan, the GPUs and the strategy
    that shards them, and what the dry run runs with (the loss, the learning rate, the device, the budget in bytes,
    the GPU kind whose kernels a CUDA estimate emulates, the user's load; ``live_layers``: a Trainer's model whose
    repeated layers the one-GPU dry runs may carry from a few, as its route asks), and the DeepSpeed settings a ZeRO
    estimate sizes its buffers by (``zero``). The sharded routes take it whole.

    Example:
        >>> request = ShardedRequest("gpt2", {"input_ids": (1, 16)}, Plan(), gpus=2)
        >>> request.strategy, request.replace(strategy="zero3").strategy
        ('fsdp2', 'zero3')
    """

    model: Any
    batch: Any
    plan: Plan
    gpus: int
    strategy: str = "fsdp2"
    loss_fn: LossFn | None = None
    lr: float = 1e-5
    device: str | torch.device | None = None
    budget: int | None = None
    gpu: GpuKind | None = None
    load: Mapping[str, Any] | None = None
    live_layers: bool = False
    zero: ZeroSettings | None = None
    """DeepSpeed's bucket sizes and persistence threshold a ZeRO estimate uses (a trainer's config read); None:
    DeepSpeed's defaults."""

    def replace(self, **changes: Any) -> ShardedRequest:
        """The same request with ``changes`` (field names as keywords)."""
        return dataclasses.replace(self, **changes)


@contextlib.contextmanager
def fake_process_group(gpus: int) -> Iterator[Any]:
    """A fake process group of ``gpus`` ranks (this process is rank 0) and its CPU device mesh, for the block.

    Example:
        >>> with fake_process_group(4) as mesh:
        ...     mesh.size()
        4
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    if dist.is_initialized():
        raise MemlabError(
            "a torch.distributed process group is already initialised in this process; run the sharded estimate "
            "before init_process_group, or in a fresh kernel (memlab estimate on the command line)"
        )
    hook = sys.excepthook  # init_process_group wraps it to prefix tracebacks with "[rank0]": put it back after
    dist.init_process_group("fake", rank=0, world_size=gpus, store=FakeStore())
    try:
        yield init_device_mesh("cpu", (gpus,))
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook


@without_full_collections()
def fsdp2_dry_run(request: ShardedRequest) -> tuple[ShardedTrial, list[dict[str, int]]]:
    """The FSDP2 estimate of ``request``'s plan for one GPU of its ``gpus`` (its strategy is not read), and every
    module-level snapshot of the step as :data:`DETAIL` dicts (ZeRO takes its activations from them). A step that
    fails is an ``"error"`` trial. The request's ``load``: how the user loads the weights
    (:mod:`memlab.estimation.dryrun.load`; a dtype: a quantized load is composed instead, see
    :mod:`memlab.estimation.sharded.composed`), made on the fake model before it is sharded; None: as the config builds
    it.

    Example:
        >>> from transformers import LlamaConfig
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        ...                      num_attention_heads=2, vocab_size=256)
        >>> request = ShardedRequest(config, {"input_ids": (1, 16), "labels": (1, 16)}, Plan(), 2, device="cpu")
        >>> trial, snapshots = fsdp2_dry_run(request)
        >>> trial.status, trial.strategy, trial.detail["sharded_params"] > 0, len(snapshots) > 1
        ('ok', 'fsdp2', True, True)
    """
    plan, gpus, budget = request.plan, request.gpus, request.budget
    target = target_device(request.model, request.device)
    if plan.optimizer in FSDP2_REFUSALS:
        return ShardedTrial(plan, "error", 0, {}, None, None, None, str(target), error=FSDP2_REFUSALS[plan.optimizer],
                            budget=budget, estimated=True, gpus=gpus, strategy="fsdp2"), []
    # The sharded step always runs CPU kernels (the fake process group is gloo's): for a CUDA target they are
    # emulated as CUDA's, on the GPU kind ``gpu``, as a one-GPU estimate made without CUDA does.
    emulated = target.type == "cuda"

    def step(emulate: bool) -> tuple[ShardedTrial, list[dict[str, int]]]:
        def run(model: Any, paths: LayerPaths | None) -> _Fsdp2Run:
            return _fsdp2_run(request.replace(model=model), emulate, paths)

        return _fsdp2_step(request, run)

    with one_thread():
        (trial, peaks), fell_back = run_emulated(step, emulated)
    if fell_back:
        trial = dataclasses.replace(trial, notes=(*trial.notes, OWN_CHECKPOINT_NOTE))
    return trial, peaks


@dataclass
class _Fsdp2Run:
    """One FSDP2 dry run before it is a trial: the tracker's peak by :data:`DETAIL` and every module-level snapshot,
    what stays between steps (``held``), the notes, the allocator's reserved peak, 8-bit state computed from its size,
    and the events a depth log kept (``error`` where the step failed)."""

    detail: dict[str, int]
    peaks: list[dict[str, int]]
    held: int
    notes: list[str]
    reserved: int | None
    target: torch.device
    eight_bit_state: int | None = None
    events: list[Event] | None = None
    error: str | None = None
    held_by_layer: dict[int, int] = field(default_factory=dict)
    """What stays between steps in each layer (runs whose events are kept)."""


def _fsdp2_step(request: ShardedRequest, run_on: Callable[[Any, LayerPaths | None], _Fsdp2Run]
                ) -> tuple[ShardedTrial, list[dict[str, int]]]:
    """:func:`fsdp2_dry_run`'s step (``run_on(model, paths)``: one dry run of ``model``, CUDA's kernels emulated or
    not): from dry runs of five layers and four where the model's layers repeat
    (:mod:`memlab.estimation.sharded.fsdp2.depth`), else of every layer."""
    plan = request.plan
    carried = plan_carries(plan) and plan.optimizer not in EIGHT_BIT_OPTIMIZERS
    shallow = shallow_model(request.model) if carried else None
    run = None
    if shallow is not None and shallow.carries(FSDP2_EDGE):
        runs = {layers: run_on(shallow.shallow(layers), shallow.paths)
                for layers in (source_layers(FSDP2_EDGE), check_layers(FSDP2_EDGE))}
        run = _carried(shallow, runs, request.gpu)
    if run is None:
        run = run_on(request.model, None)
    return _fsdp2_trial(run, plan, request.gpus, request.budget)


def _carried(shallow: ShallowModel, runs: dict[int, _Fsdp2Run], gpu: GpuKind | None) -> _Fsdp2Run | None:
    """The dry run at the model's depth from its runs of five layers and four, None where they do not carry
    (:func:`~memlab.estimation.sharded.fsdp2.depth.carried_books`)."""
    source, check = runs[source_layers(FSDP2_EDGE)], runs[check_layers(FSDP2_EDGE)]
    if source.error or check.error or source.notes != check.notes or source.events is None or check.events is None:
        return None
    held = _carried_held(source, check, shallow.depth)
    if held is None:
        return None
    kind = kind_or_default(gpu)
    books = carried_books(shallow, {layers: (run.events or [], run.detail, run.peaks, run.reserved)
                                    for layers, run in runs.items()},
                          _fsdp_detail, list(_FSDP_KINDS), kind.memory_bytes - kind.context_bytes)
    if books is None:
        return None
    detail, peaks, reserved = books
    return dataclasses.replace(source, detail=detail, peaks=peaks, held=held, reserved=reserved, events=None)


def _carried_held(source: _Fsdp2Run, check: _Fsdp2Run, depth: int) -> int | None:
    """What stays between steps at the model's depth: each layer's shards, gradients and state, the same in every
    layer of both runs, and the rest, the same in both; None where they are not."""
    layers = [*source.held_by_layer.values(), *check.held_by_layer.values()]
    rest = {run.held - sum(run.held_by_layer.values()) for run in (source, check)}
    if not layers or len(set(layers)) != 1 or len(rest) != 1:
        return None
    return rest.pop() + depth * layers[0]


def _fsdp2_run(request: ShardedRequest, emulate: bool, paths: LayerPaths | None = None) -> _Fsdp2Run:
    """One FSDP2 dry run of ``request``'s model (its events kept by a depth log where ``paths`` says where its
    layers are)."""
    fully_shard, MixedPrecisionPolicy = fsdp2_api()
    model_or_config, batch, plan, gpus, gpu, lr = (request.model, request.batch, request.plan, request.gpus,
                                                   request.gpu, request.lr)
    device, load, loss_fn = request.device, request.load, request.loss_fn

    batch, dropped = without_full_mask(batch)
    setup = fake_setup(model_or_config, batch, device, kernels=_CPU)
    model, target = setup.model, setup.target
    loaded = plan_loads(model_or_config, [plan], load)[0] if load is not None else None
    if loaded is not None:  # the weights as the user loads them, before they are sharded
        apply_load(model, loaded, setup.mode, _CPU)
    # FSDP2 shards the dtype the weights have when fully_shard runs: cast before. Not with model.to(): it swaps
    # fake parameters for new ones, which the fake mode's weak references forbid; the weights technique sets .data.
    cast_weights(model, plan)
    upcast = accelerate_upcast(model, plan)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(plan.precision)
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype, output_dtype=dtype)
    notes = [BLIND_SPOTS, FSDP_NOTE, *setup.notes, *([FULL_MASK_DROPPED] if dropped else []),
             *([loaded.note(load_dtype(model, loaded))] if loaded is not None else [])]
    if emulate:
        notes.append(EMULATED_NOTE)
    if upcast:
        notes.append(f"accelerate upcasts the trained weights to fp32 under mixed precision before sharding them "
                     f"(fsdp2_prepare_model; {format_bytes(upcast)} more, whole): their shards, gradients and "
                     "optimizer state are fp32, the step computes in the policy's dtype")
    if plan.offloads_activations:
        notes.append("activation offload is not estimated sharded: shown as no change")
    eight_bit = plan.optimizer in EIGHT_BIT_OPTIMIZERS
    # One micro-step of one GPU: the first micro-batch of the plan (the step's own row selection), run as a step of
    # one micro-batch. bitsandbytes cannot run on fake tensors: AdamW runs, and its state is replaced below.
    part = micro_batches(setup.batch, plan)[0]
    one_step = plan.replace(micro_batch=None, accumulation=1, optimizer="adamw" if eight_bit else plan.optimizer)
    if upcast:  # the weights as accelerate leaves them (trained fp32, frozen bf16): the step casts none again
        one_step = one_step.replace(weights="fp32")
    held = 0
    held_by_layer: dict[int, int] = {}

    def measure_held(optimizer: torch.optim.Optimizer, *_: Any) -> None:
        # What stays between steps, right after the update and before the step sets the gradients to None.
        nonlocal held
        held = _local_bytes([*model.parameters(), *(p.grad for p in step.parameters if p.grad is not None),
                             *state_tensors(optimizer)])
        if paths is not None:  # and layer by layer, for a run carried to more layers
            by_layer: dict[int, list[torch.Tensor]] = {}
            for name, parameter in model.named_parameters():
                layer = paths.layer_of(name)
                if layer is not None:
                    state = [v for v in optimizer.state.get(parameter, {}).values() if isinstance(v, torch.Tensor)]
                    grad = [parameter.grad] if parameter.grad is not None else []
                    by_layer.setdefault(layer, []).extend([parameter, *grad, *state])
            held_by_layer.update({layer: _local_bytes(tensors) for layer, tensors in by_layer.items()})

    # The allocator's reserve is replayed where the dry run's allocations are the step's own (not where the optimizer
    # state is offloaded or computed from its size).
    traced = target.type == "cuda" and not eight_bit and not plan.offloads_optimizer
    # Each GPU's allocator, as the one-GPU estimate models it for the GPU kind: cuBLAS's workspaces as PyTorch sizes
    # them for its compute capability, and its room (memory less the CUDA context), past which cudaMalloc fails and
    # the allocator releases its cached segments and tries again (the FSDP2 step's freed gradient and optimizer
    # temporaries are many tens-of-MiB segments that activations' larger blocks cannot reuse).
    kind = kind_or_default(gpu)
    trace = ReservedTrace(_CPU, kind.capability, capacity=kind.memory_bytes - kind.context_bytes) if traced else None
    log = DepthLog(paths, model) if paths is not None else None
    with (fake_process_group(gpus) as mesh, quiet(), setup.mode, model_made_positions(batch),
          strided_flag_once(), foreach_split_once(), propagation_apart(), contextlib.ExitStack() as stack):
        if log is not None:
            setup.mode.tagger = log
            stack.enter_context(log.watching())
            if trace is not None:
                trace.log = log
        for units, reshard in fsdp2_layout(model):
            fully_shard(units, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        if log is not None:
            log.watch.learn(model)
        if trace is not None:
            # The sharded weights are what each GPU holds when the trial starts. The trace's tracker is a mode of its
            # own (not the fake mode's observer): only an active tracker follows FSDP2's storage resize_ calls.
            stack.enter_context(trace.trial(model, setup.batch))
            trace.listen(TrialStarted(plan, 0, 1))
        if log is not None:
            log.name_storages()
        attention = stack.enter_context(cuda_kernels(gpu, kernels=emulate)) if target.type == "cuda" else None
        try:
            step = TrainingStep(model, one_step, loss_fn=loss_fn, lr=lr, optimizer_device_type=target.type)
            if target.type == "cuda" and one_step.optimizer == "adamw":
                # The FSDP2 scripts memlab exports build torch's AdamW with its defaults: foreach on CUDA (fused is
                # not torch's default for DTensor parameters), whose temporaries are part of the peak. TrainingStep
                # builds the Trainer's fused AdamW, so the sharded step gets the exported optimizer instead.
                step.optimizer = build_optimizer(step.parameters, one_step, lr, device_type="cuda", fused=False)
            tracker = (fsdp_mem_tracker(model, step.optimizer) if log is None
                       else logging_tracker(model, step.optimizer, log))
            tracker.track_inputs((part,))
            # Steady state: the optimizer state exists before the tracked step (one update on zero gradients).
            for parameter in step.parameters:
                parameter.grad = torch.zeros_like(parameter)
            step.optimizer.step()
            step.optimizer.zero_grad(set_to_none=True)
            step.optimizer.register_step_post_hook(measure_held)
            _tell(trace, plan, "warmup")
            with tracker:
                step(part)
            _tell(trace, plan, "tracked")
        except MemlabError:
            raise
        except Exception as error:  # noqa: BLE001 - reported as the plan's estimate, like any failure
            return _Fsdp2Run({}, [], 0, notes, None, target, error=one_line(error))
        shards = [_local(p) for p in step.parameters]
        detail, peaks = _fsdp_detail(tracker.get_tracker_snapshot("peak"),
                                     [snapshot for stats in tracker.memory_tracking.values()
                                      for snapshots in getattr(stats, "snapshots", {}).values()
                                      for snapshot in snapshots])
    notes += [note for note in (attention and attention_note(attention), foreign_ops_note(setup.mode.foreign_ops),
                                skipped_kernels_note(setup.mode.skipped_kernels)) if note]
    return _Fsdp2Run(detail, peaks, held, notes, trace.reserved_bytes if trace is not None else None, target,
                     eight_bit_state=adamw8bit_state_bytes(shards) if eight_bit else None,
                     events=list(log.events) if log is not None else None, held_by_layer=held_by_layer)


def accelerate_upcast(model: nn.Module, plan: Plan) -> int:
    """accelerate's FSDP2 upcast (``fsdp2_prepare_model``, accelerate 1.15): under mixed precision every trained
    weight not in fp32 is made fp32 before ``fully_shard`` (FSDP2 wants one dtype among a unit's trained weights;
    the ``MixedPrecisionPolicy`` casts them to the compute dtype for the step), unless the model holds 4-bit weights.
    A bf16 model trained in full so holds fp32 shards, gradients and AdamW state. The bytes the cast adds, whole.

    Example:
        >>> model = nn.Linear(4, 4, dtype=torch.bfloat16)
        >>> accelerate_upcast(model, Plan(precision="bf16")), model.weight.dtype
        (40, torch.float32)
    """
    if plan.precision not in ("bf16", "fp16") or any(type(p).__name__ == "Params4bit" for p in model.parameters()):
        return 0
    added = 0
    for parameter in trainable_parameters(model):
        if parameter.is_floating_point() and parameter.dtype != torch.float32:
            added += parameter.numel() * (4 - parameter.element_size())
            parameter.data = parameter.data.float()  # .data: fake parameters cannot be swapped (see cast_weights)
    return added


def _fsdp2_trial(run: _Fsdp2Run, plan: Plan, gpus: int, budget: int | None
                 ) -> tuple[ShardedTrial, list[dict[str, int]]]:
    """A dry run made the per-GPU trial: 8-bit state by its size, offloaded parts in host memory, the notes."""
    target = run.target
    if run.error is not None:
        return ShardedTrial(plan, "error", 0, {}, None, None, None, str(target), error=run.error,
                            budget=budget, estimated=True, gpus=gpus, strategy="fsdp2"), []
    detail, peaks, held, notes = dict(run.detail), run.peaks, run.held, list(run.notes)
    host = 0
    if run.eight_bit_state is not None:
        held += run.eight_bit_state - detail["optimizer"]
        detail["optimizer"] = run.eight_bit_state
        notes.append("8-bit AdamW state computed from its known size (bitsandbytes cannot run on fake tensors)")
    if plan.offloads_optimizer:
        # CPUOffloadPolicy: sharded parameters, gradients and optimizer state live in CPU memory.
        host = sum(detail[k] for k in _HOST_WITH_OFFLOAD)
        detail = max(peaks, key=lambda d: sum(v for k, v in d.items() if k not in _HOST_WITH_OFFLOAD))
        host = max(host, held)
        detail = {k: (0 if k in _HOST_WITH_OFFLOAD else v) for k, v in detail.items()}
        held = 0
        notes.append("optimizer offload = FSDP2 CPUOffloadPolicy: sharded weights, gradients and optimizer state "
                     "in CPU memory (host_bytes)")
    if run.reserved is not None:
        notes += [*reserved_notes(), ONE_STREAM_NOTE]
    trial = sharded_trial(plan, detail, target, budget, gpus, "fsdp2", held, host, notes)
    return dataclasses.replace(trial, reserved_bytes=run.reserved), peaks


def _tell(trace: ReservedTrace | None, plan: Plan, kind: str) -> None:
    """Tell ``trace`` that a step of ``kind`` is done, as the runner's :class:`~memlab.events.StepFinished` does."""
    if trace is not None:
        trace.listen(StepFinished(plan, index=0, step=0, kind=kind, seconds=0.0, loss=None, live_bytes=None,
                                  peak_bytes=None))


def _fsdp_detail(peak: dict[Any, Any], snapshots: list[dict[Any, Any]]) -> tuple[dict[str, int], list[dict[str, int]]]:
    """The tracker's peak snapshot, and it with every module-level snapshot, as :data:`DETAIL` dicts (device
    summed)."""

    def convert(snapshot: Any) -> dict[str, int]:
        detail = dict.fromkeys(DETAIL, 0)
        for per_device in snapshot.values():
            for kind, nbytes in per_device.items():
                name = _FSDP_KINDS.get(getattr(kind, "value", kind))
                if name is not None:
                    detail[name] += int(nbytes)
        return detail

    peaks = [convert(peak), *(convert(snapshot) for snapshot in snapshots)]
    return peaks[0], peaks


def _local(tensor: torch.Tensor) -> torch.Tensor:
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def _local_bytes(tensors: Sequence[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for tensor in tensors:
        local = _local(tensor)
        storage = local.untyped_storage()
        seen[id(storage)] = int(storage.nbytes())
    return sum(seen.values())
