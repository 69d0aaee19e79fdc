"""The routes of an estimate, each a function of the one :class:`~memlab.estimation.request.EstimateRequest`
(:data:`ROUTES`), and :func:`route`, which checks a request and runs it down its route:

- ``"trainer"``: a ``transformers.Trainer`` in the model's place; its model, ``compute_loss`` and worst batch make
  a new request, which goes down one of the routes below;
- ``"inference"``: an :class:`memlab.InferencePlan` on one device;
- ``"sharded"``: training sharded over ``gpus`` GPUs (:mod:`memlab.estimation.sharded.per_gpu`);
- ``"one_gpu"``: training on one device (:mod:`memlab.estimation.dryrun.single_gpu`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from memlab.errors import MemlabError
from memlab.estimation.cuda.allocator import assumed_allocator
from memlab.estimation.cuda.context import card_context
from memlab.estimation.cuda.devices import asked_device
from memlab.estimation.cuda.gpus import kind_or_default
from memlab.estimation.request import EstimateRequest
from memlab.live.sharding import check_sharding
from memlab.options import parse_host_budget
from memlab.plan import Plan
from memlab.report import Trial
from memlab.runner.collection import without_full_collections
from memlab.techniques.core.registry import step_refusal
from memlab.techniques.vllm import no_engine

if TYPE_CHECKING:
    from memlab.plan import InferencePlan

__all__ = ["FIRST_STEP_FITS", "ROUTES", "Route", "first_step_said", "gpu_note", "route", "route_name"]


Route = Callable[[EstimateRequest], Trial]


def _trainer(request: EstimateRequest) -> Trial:
    """A Trainer in the model's place: its model, loss and (without a batch) worst batch, then the other routes (its
    model's repeated layers carried from a few where it is on the meta device: ``live_layers``); a trainer kind with
    a dry run of its own (:func:`memlab.live.trainer_kinds.kind_of`), that one: a GRPO trainer's step with its
    generation (:mod:`memlab.kinds.grpo.estimate`). A trainer set up for DeepSpeed or FSDP goes down the sharded
    route per GPU (:func:`memlab.trainer.sharding.sharded_trainer_request`), and the load of its models said beside
    the step (:func:`memlab.estimation.sharded.loading.with_load`)."""
    from memlab.estimation.dryrun.liger import liger_kernels
    from memlab.estimation.sharded.loading import with_load
    from memlab.live.trainer_kinds import kind_of
    from memlab.trainer.entry import live_target, noted, split_plans
    from memlab.trainer.reference import sharded_as, with_reference
    from memlab.trainer.sharding import sharded_trainer_request, zero3_gathering_off

    kind = kind_of(request.model)
    request, sharding_note = sharded_trainer_request(request)
    trainer = request.model
    # the model loaded and wrapped before the step, said beside it (one GPU: nothing)
    world_size = sharding_note.sharding.world_size if sharding_note else int(getattr(trainer.args, "world_size", 1))
    loaded = partial(with_load, trainer=trainer, own=sharding_note is not None, world_size=world_size)
    # its dry runs put on Liger's kernels as train() would, and hold its reference as the strategy does
    precision = request.plan.precision if isinstance(request.plan, Plan) else None
    with liger_kernels(request.model), zero3_gathering_off(), sharded_as(request.strategy, precision):
        if kind.estimate is not None:
            trial = cast(Trial, kind.estimate(request))
            if sharding_note is not None:
                engine = (sharding_note.note, sharding_note.host_note(trial.host_bytes))
                trial = dataclasses.replace(trial, notes=(*trial.notes, *filter(None, engine)))
            return cast(Trial, loaded(trial))

        batch, plan = split_plans(request.batch, request.plan)
        target = live_target(request.model, batch, request.loss_fn, sharded=request.sharded)
        plan = target.plan_for(plan)
        if sharding_note:
            plan = sharding_note.plan_for(plan)
        inner = request.replace(model=target.model, batch=target.batch, loss_fn=target.loss_fn, plan=plan,
                                live_layers=True)
        trial = route(inner)
        said = [target.note]
        if sharding_note:
            said += [sharding_note.note, sharding_note.host_note(trial.host_bytes)]
        return cast(Trial, loaded(with_reference(noted([trial], "; ".join(filter(None, said)) or None)[0], trainer)))


def _inference(request: EstimateRequest) -> Trial:
    """An :class:`memlab.InferencePlan` on one device."""
    from memlab.estimation.dryrun.single_gpu import estimate_inference

    if request.sharded or request.gpus != 1:
        raise MemlabError("an InferencePlan is estimated on one device; drop gpus= and strategy=")
    inference = cast("InferencePlan", request.plan)
    return card_context(estimate_inference(request.model, request.batch, [inference], loss_fn=request.loss_fn,
                                           budget=request.budget, device=request.device, gpu=request.gpu,
                                           load=request.load)[0], request.gpu)


def _sharded(request: EstimateRequest) -> Trial:
    """Training sharded over ``gpus`` GPUs: the per-GPU estimate of :mod:`memlab.estimation.sharded.per_gpu`."""
    from memlab.estimation.sharded.forked import in_forked_child, launched, refused_by_autograd
    from memlab.estimation.sharded.per_gpu import sharded_estimate

    if isinstance(request.plan, Plan) and no_engine(request.plan):
        raise MemlabError(no_engine(request.plan))
    if launched():  # a launched script's rank: its process group cannot share the process with the dry run's
        return refused_by_autograd(in_forked_child(lambda: sharded_estimate(request)))
    return sharded_estimate(request)


def _one_gpu(request: EstimateRequest) -> Trial:
    """Training on one device."""
    from memlab.estimation.dryrun.single_gpu import estimate_plans, estimate_trainer_model

    plan = request.training_plan
    refusal = step_refusal(plan, request.loss_fn) if isinstance(plan, Plan) else ""  # each lever's own
    if refusal:
        raise MemlabError(refusal)
    keywords: dict[str, Any] = dict(loss_fn=request.loss_fn, budget=request.budget, lr=request.lr,
                                    device=request.device, gpu=request.gpu, load=request.load)
    if request.live_layers and isinstance(plan, Plan):
        trial = estimate_trainer_model(request.model, request.batch, plan, **keywords)
    else:
        trial = estimate_plans(request.model, request.batch, [plan], **keywords)[0]
    return card_context(trial, request.gpu)


ROUTES: dict[str, Route] = {"trainer": _trainer, "inference": _inference, "sharded": _sharded, "one_gpu": _one_gpu}
"""Every route an estimate can take, each a function of the one :class:`EstimateRequest`."""


def route_name(request: EstimateRequest) -> str:
    """Which of :data:`ROUTES` a request takes: a Trainer first, then an inference plan, then the sharding.

    Example:
        >>> route_name(EstimateRequest("llama-7b", {}, Plan(), gpus=2, strategy="zero3"))
        'sharded'
        >>> route_name(EstimateRequest("llama-7b", {}, Plan()))
        'one_gpu'
    """
    from memlab.estimation.dryrun.single_gpu import is_inference
    from memlab.trainer.source import is_trainer

    if is_trainer(request.model):
        return "trainer"
    if request.batch is None:
        raise MemlabError(
            "no batch was given; write the shapes, e.g. memlab.estimate(config, {'input_ids': (1, 512), "
            "'labels': (1, 512)}, plan), or pass a transformers Trainer"
        )
    if is_inference(request.plan):
        return "inference"
    return "sharded" if check_sharding(request.gpus, request.strategy)[1] != "none" else "one_gpu"


def gpu_note(request: EstimateRequest, *, inference: bool = False) -> str:
    """What the GPU kind a CUDA estimate is for does differently with the request's plan, as a note (``""`` where
    nothing, and for a CPU estimate): bf16 on a GPU without native bf16 runs emulated, as a trial on that GPU runs it
    (:func:`memlab.techniques.precision.bf16_emulated`).

    Example:
        >>> from memlab.estimation.cuda.gpus import GPUS
        >>> "emulates it" in gpu_note(EstimateRequest("llama-7b", {}, Plan(precision="bf16"), gpu=GPUS["T4-16GB"]))
        True
        >>> gpu_note(EstimateRequest("llama-7b", {}, Plan(precision="bf16"), gpu=GPUS["T4-16GB"], device="cpu"))
        ''
    """
    from memlab.estimation.cuda.devices import target_device
    from memlab.techniques.precision import bf16_emulated

    if isinstance(request.plan, (list, tuple)) or target_device(request.model, request.device).type != "cuda":
        return ""
    kind = kind_or_default(request.gpu)
    return bf16_emulated(kind.capability, kind.name, precision=getattr(request.plan, "precision", None),
                         weights=getattr(request.plan, "weights", None) if inference else None)


@without_full_collections()
def route(request: EstimateRequest) -> Trial:
    """The request checked and run down its route (:func:`route_name`).

    Example:
        >>> from transformers import LlamaConfig
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        ...                      num_attention_heads=2, vocab_size=256)
        >>> trial = route(EstimateRequest(config, {"input_ids": (1, 16), "labels": (1, 16)}, Plan(), device="cpu"))
        >>> trial.status, trial.estimated
        ('ok', True)
    """
    request = request.replace(device=asked_device(request.gpu, request.device))
    if isinstance(request.plan, (list, tuple)):
        raise MemlabError(
            "estimate takes one plan, and this is a list; write memlab.estimate(model, batch, plan) for each, or "
            "estimate_plans(model, batch, [...]) for all (from memlab.estimation.estimate import estimate_plans)"
        )
    if not isinstance(request.expandable_segments, bool):
        raise MemlabError(f"expandable_segments={request.expandable_segments!r} is not True or False; write "
                          "expandable_segments=True for PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or leave "
                          "it out for PyTorch's default allocator")
    host_budget = parse_host_budget(request.host_budget)
    name = route_name(request)
    # a trainer's own route comes back here with its model and plan
    note = "" if name == "trainer" else gpu_note(request, inference=name == "inference")
    # the keyword or the plan's lever: every allocator model the route makes assumes them
    expandable = request.expandable_segments or getattr(request.plan, "expandable_segments", False) is True
    from memlab.trainer.entry import trainer_state  # here: the trainer builds on the estimation

    # a trainer's step (given, or behind the loss) reads its own accelerate state, emptied by arguments made since
    with assumed_allocator(expandable), trainer_state(request.model, request.batch, request.loss_fn):
        trial = ROUTES[name](request.checked() if name in ("sharded", "one_gpu") else request)
    if note and note not in trial.notes:
        trial = dataclasses.replace(trial, notes=(*trial.notes, note))
    trial = first_step_said(trial)
    return trial if host_budget is None else dataclasses.replace(trial, host_budget=host_budget)


FIRST_STEP_FITS = "step 1 fits the budget and the steps after it do not"


def first_step_said(trial: Trial) -> Trial:
    """``trial`` with a note where its first training step fits its budget and the steady step (the estimate) does
    not: step 1's ``optimizer.step()`` makes the optimizer state, which every later step holds from its start
    (:meth:`memlab.report.timeline.Timeline.first_step`). Unchanged otherwise, and where the note is there already.

    Example:
        >>> from memlab.report.timeline import Timeline, TimelinePeak
        >>> line = Timeline(("optimizer", "activations"), [0, 1, 2], {"optimizer": [4, 4, 4],
        ...                 "activations": [0, 5, 1]}, [("backward", 0, 1), ("optimizer", 2, 2)],
        ...                 TimelinePeak(9, "backward", "", {"optimizer": 4, "activations": 5}, {}, at=1))
        >>> trial = Trial(Plan(), "ok", 9, {"optimizer": 4, "activations": 5}, None, None, None, "cpu", timeline=line,
        ...               budget=8)
        >>> first_step_said(trial).notes[-1][:57]
        'step 1 fits the budget and the steps after it do not: its'
    """
    from memlab.sizes import format_bytes

    timeline = trial.timeline
    if trial.status != "ok" or trial.budget is None or timeline is None or trial.device_fits or any(
            FIRST_STEP_FITS in note for note in trial.notes):
        return trial
    first = timeline.first_step()
    if first is None or trial.verdict_bytes - (trial.peak_bytes - first.peak.bytes) > trial.budget:
        return trial
    state = timeline.peak.by_category.get("optimizer", 0)
    note = (f"{FIRST_STEP_FITS}: its peak is {format_bytes(first.peak.bytes)} against "
            f"{format_bytes(trial.peak_bytes)}, as its optimizer.step() makes the optimizer state "
            f"({format_bytes(state)}) that every later step holds from its start; "
            "trial.timeline.plot(first_step=True) draws both steps")
    return dataclasses.replace(trial, notes=(*trial.notes, note))
