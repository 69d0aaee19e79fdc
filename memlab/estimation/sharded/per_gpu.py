"""Per-GPU estimates of a training step sharded over several GPUs: FSDP2, DeepSpeed ZeRO-2 and ZeRO-3.

memlab never shards anything itself: the engines do (accelerate with FSDP2, DeepSpeed). This module answers, before
the machines are booked, how much each GPU will hold (:func:`sharded_estimate`, what ``memlab.estimate(...,
gpus=, strategy=)`` runs), and :func:`smallest_gpus` how many GPUs each strategy needs. ``batch`` is always what ONE
GPU sees per micro-step (the per-GPU micro-batch); data parallelism multiplies it.

**FSDP2** runs for real, on fake tensors (:mod:`memlab.estimation.sharded.fsdp2`): ``fully_shard`` over a fake process
group, memlab's own training step, PyTorch's ``FSDPMemTracker``. **ZeRO-2 / ZeRO-3** are computed
(:mod:`memlab.estimation.sharded.zero`): DeepSpeed's formulas for the model states, the activations from the FSDP2 dry
run. The strategies and DeepSpeed's bucket sizes are in :mod:`memlab.live.sharding` (no torch), which the names
below re-export; a trainer's own DeepSpeed settings come in the request (``zero``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from memlab.errors import MemlabError
from memlab.estimation.configs import frozen_count, layer_counts, model_on_meta, persistent_count
from memlab.estimation.cuda.context import card_context
from memlab.estimation.cuda.gpus import GpuKind
from memlab.estimation.dryrun.single_gpu import estimate_plans
from memlab.estimation.sharded.composed import composed_estimate, needs_composition, one_gpu_runs_kept
from memlab.estimation.sharded.engine_settings import engine_settings
from memlab.estimation.sharded.fsdp2 import (
    DETAIL,
    FSDP2_REFUSALS,
    ShardedRequest,
    ShardedTrial,
    fsdp2_dry_run,
    shard_units,
)
from memlab.estimation.sharded.zero import BASIS_GPUS, zero_basis, zero_model_states, zero_trial
from memlab.live.batch import LossFn
from memlab.live.sharding import (
    DS_ALLGATHER_BUCKET,
    DS_PREFETCH_BUCKET,
    DS_REDUCE_BUCKET,
    STRATEGIES,
    ZeroSettings,
    check_sharding,
    parse_gpus,
)
from memlab.plan import Plan, parse_budget
from memlab.report import Trial
from memlab.techniques.offload import OPTIMIZER_OFFLOADS, SHARDED_ONLY

if TYPE_CHECKING:  # the route's request, read here; request.py routes to this module
    from memlab.estimation.request import EstimateRequest

__all__ = [
    "DETAIL",
    "DS_ALLGATHER_BUCKET",
    "DS_PREFETCH_BUCKET",
    "DS_REDUCE_BUCKET",
    "FSDP1_NOTE",
    "STRATEGIES",
    "ShardedTrial",
    "check_sharding",
    "fsdp1_trial",
    "layer_counts",
    "parse_gpus",
    "shard_units",
    "sharded_estimate",
    "sharded_lines",
    "sharded_one",
    "search_gpus",
    "sharded_trials",
    "smallest_gpus",
    "zero_model_states",
]

PLAIN = Plan()
"""The plain plan: AdamW, nothing offloaded (what ZeRO's basis runs)."""


def sharded_estimate(request: EstimateRequest) -> ShardedTrial:
    """The peak of one steady-state training step per GPU, sharded over the request's ``gpus`` GPUs with its
    ``strategy``.

    :func:`memlab.estimate` with ``gpus=``/``strategy=`` takes this route with its one request
    (:class:`~memlab.estimation.request.EstimateRequest`), whose ``batch`` is the per-GPU micro-batch.
    ``strategy="fsdp2"`` runs ``fully_shard`` on fake tensors; ``"zero2"``/``"zero3"`` compute DeepSpeed's partitioning
    (the module docstring gives the formulas); ``"fsdp1"`` is FSDP2's dry run with FSDP1's root kept gathered
    (:func:`fsdp1_trial`). Adapter plans (LoRA, QLoRA), a quantized ``load`` and the chunked loss are composed from
    their one-GPU dry run under every strategy (:mod:`memlab.estimation.sharded.composed`). ``offload="params"`` keeps
    each GPU's shards in CPU memory (FSDP ``offload_params``, DeepSpeed ZeRO-3 ``offload_param``). For CUDA each GPU's
    trial carries the CUDA context of the GPU kind ``gpu`` (:func:`memlab.estimation.cuda.context.card_context`), and
    its ``fits`` judges the card figure; its notes name the engine settings assumed.

    Example:
        >>> from transformers import LlamaConfig
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        ...                      num_attention_heads=2, vocab_size=256)
        >>> batch = {"input_ids": (1, 32), "labels": (1, 32)}
        >>> from memlab.estimation.request import EstimateRequest
        >>> one = sharded_estimate(EstimateRequest(config, batch, gpus=2, strategy="fsdp2", device="cpu"))
        >>> four = sharded_estimate(EstimateRequest(config, batch, gpus=4, strategy="fsdp2", device="cpu"))
        >>> one.status, four.model_state_bytes < one.model_state_bytes, sum(one.breakdown.values()) == one.peak_bytes
        ('ok', True, True)
    """
    gpus, strategy = check_sharding(request.gpus, request.strategy)
    plan, gpu = request.training_plan, request.gpu
    _check_plan(plan)
    limit = parse_budget(request.budget)
    if strategy == "none":
        trial = estimate_plans(request.model, request.batch, [plan], loss_fn=request.loss_fn, budget=request.budget,
                               lr=request.lr, device=request.device, gpu=gpu, load=request.load)[0]
        return card_context(ShardedTrial(**{f.name: getattr(trial, f.name) for f in dataclasses.fields(Trial)}), gpu)
    if strategy.startswith("fsdp") and plan.optimizer in FSDP2_REFUSALS:
        raise MemlabError(FSDP2_REFUSALS[plan.optimizer])
    return card_context(sharded_one(ShardedRequest(request.model, request.batch, plan, gpus, strategy,
                                                   loss_fn=request.loss_fn, lr=request.lr, device=request.device,
                                                   budget=limit, gpu=gpu, load=request.load,
                                                   live_layers=request.live_layers, zero=request.zero)), gpu)


def sharded_one(request: ShardedRequest, basis: Trial | None = None,
                made: list[tuple[ShardedTrial, list[dict[str, int]]]] | None = None) -> ShardedTrial:
    """One strategy's per-GPU trial (without the CUDA context): the route each plan takes, chosen once here. The
    composed route (:mod:`memlab.estimation.sharded.composed`) for adapters, quantized loads and the chunked loss;
    FSDP2's dry run for FSDP2 (FSDP1 from it, :func:`fsdp1_trial`); DeepSpeed's formulas over ``basis`` (a
    :func:`~memlab.estimation.sharded.zero.zero_basis` already made, or a new one) for ZeRO. The notes name the engine
    settings assumed. ``made``: where FSDP's dry run (its trial and peaks) is added, for a ZeRO basis to start from.

    Example:
        >>> from transformers import LlamaConfig
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        ...                      num_attention_heads=2, vocab_size=256)
        >>> trial = sharded_one(ShardedRequest(config, {"input_ids": (1, 16), "labels": (1, 16)},
        ...                                    Plan(offload="params"), 2, "fsdp1", device="cpu"))
        >>> trial.label, trial.host_bytes > 0, any("offload_params=True" in note for note in trial.notes)
        ('offload-params fsdp1 x2', True, True)
    """
    model_or_config, plan, strategy = request.model, request.plan, request.strategy
    if needs_composition(plan, strategy, request.load):
        return composed_estimate(request)
    settings = engine_settings(plan, strategy, request.zero)
    if strategy in ("fsdp1", "fsdp2"):
        # FSDP's one CPU offload (offload_params) moves the shards of weights, gradients and optimizer state
        trial, peaks = fsdp2_dry_run(request.replace(plan=fsdp_run_plan(plan)))
        if made is not None:
            made.append((trial, peaks))
        trial = dataclasses.replace(trial, plan=plan, notes=(*trial.notes, settings))
        return fsdp1_trial(trial, model_or_config) if strategy == "fsdp1" else trial
    if basis is None:
        basis = zero_basis(request)
    stage, zero = int(strategy[-1]), request.zero or ZeroSettings()
    persistent = persistent_count(model_or_config, zero.stage3_param_persistence_threshold) if stage == 3 else 0
    trial = zero_trial(basis, layer_counts(model_or_config), plan, request.gpus, stage, request.budget,
                       frozen=frozen_count(model_or_config), persistent=persistent, zero=zero)
    return dataclasses.replace(trial, notes=(*trial.notes, settings))


def fsdp_run_plan(plan: Plan) -> Plan:
    """The plan FSDP's dry run runs for ``plan``: FSDP's one CPU offload (``offload_params``) moves the shards of
    the weights, gradients and optimizer state, which the dry run books as the optimizer's offload.

    Example:
        >>> fsdp_run_plan(Plan(offload="params")).offload, fsdp_run_plan(Plan(offload="all")).offload
        ('optimizer', 'all')
    """
    return plan.replace(offload=OPTIMIZER_OFFLOADS[0]) if plan.offload == SHARDED_ONLY else plan


FSDP1_NOTE = (
    "FSDP1 estimated by FSDP2's dry run, where the two hold the same bytes (flat parameters all-gathered one unit "
    "at a time, limit_all_gathers' two units in flight as FSDP2's prefetch of one), with FSDP1's root unit (the "
    "embeddings, final norm and output head) kept gathered from forward to the end of backward"
)
"""The note of an FSDP1 estimate made from FSDP2's dry run."""


def fsdp1_trial(trial: ShardedTrial, model_or_config: Any) -> ShardedTrial:
    """An FSDP1 trial from the FSDP2 dry run of the same plan: FSDP1's root unit (accelerate's TRANSFORMER_BASED_WRAP
    leaves the embeddings, the final norm and the head in it) is not resharded after forward, where FSDP2's layout
    reshards the input embeddings; the embeddings' gathered weights are added to the peak (in the dtype the run
    gathers). Everything else is FSDP2's (:data:`FSDP1_NOTE`).

    Example:
        >>> from transformers import LlamaConfig
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        ...                      num_attention_heads=2, vocab_size=256)
        >>> from memlab.estimation.request import EstimateRequest
        >>> two = sharded_estimate(EstimateRequest(config, {"input_ids": (1, 16), "labels": (1, 16)}, gpus=2,
        ...                                        strategy="fsdp2", device="cpu"))
        >>> one = fsdp1_trial(two, config)
        >>> one.peak_bytes - two.peak_bytes == 4 * 256 * 64, one.strategy
        (True, 'fsdp1')
    """
    if trial.status != "ok":
        return dataclasses.replace(trial, strategy="fsdp1")
    model = model_on_meta(model_or_config)
    plan = trial.plan
    element = 2 if plan.precision != "fp32" or plan.weights == "bf16" else 4
    embed, head = (_module(model, name) for name in ("get_input_embeddings", "get_output_embeddings"))
    tied = embed is not None and head is not None and any(
        p is q for p in embed.parameters() for q in head.parameters())
    extra = 0 if embed is None or tied else element * sum(p.numel() for p in embed.parameters())
    detail = dict(trial.detail)
    detail["unsharded_params"] = detail.get("unsharded_params", 0) + extra
    breakdown = dict(trial.breakdown)
    breakdown["params"] = breakdown.get("params", 0) + extra
    return dataclasses.replace(trial, strategy="fsdp1", detail=detail, breakdown=breakdown,
                               peak_bytes=trial.peak_bytes + extra, notes=(*trial.notes, FSDP1_NOTE))


def smallest_gpus(
    model_or_request: Any,
    batch: Any = None,
    plan: Plan | None = None,
    *,
    budget: int | str | None = None,
    strategies: Sequence[str] = ("fsdp2", "zero2", "zero3"),
    candidates: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
    loss_fn: LossFn | None = None,
    lr: float = 1e-5,
    device: str | torch.device | None = None,
    gpu: GpuKind | None = None,
    load: Mapping[str, Any] | None = None,
    say: Callable[[str], None] | None = None,
) -> dict[str, ShardedTrial | None]:
    """For each strategy, the estimate at the smallest number of GPUs in ``candidates`` whose per-GPU peak fits
    ``budget`` (None when none does: ZeRO-2 keeps whole
    weights on every GPU, so it may never fit; the error trial where every dry run failed, such as Adafactor under
    FSDP2). For CUDA, what fits is each GPU's card figure (the CUDA context of the GPU kind ``gpu`` included) where it
    is known. ``strategies`` may name ``"fsdp1"`` too; ``load`` is how the user loads the model (as for
    :func:`memlab.estimate`). The model, batch (one GPU's micro-step), plan and the dry run's settings come as
    keywords, as a notebook writes them, or as one :class:`ShardedRequest` (its ``budget`` in bytes; its ``gpus`` and
    ``strategy`` are not read).

    The per-GPU peak falls as GPUs are added, so the candidates are searched as a bisection would, each probe
    where the last estimate predicts the boundary (:func:`_search`: the bisection's answer, often in two probes):
    FSDP runs a dry run per probe, ZeRO one dry run in all (its model states are a formula of N).
    ``say`` is told, before each dry run, what it estimates (a command line prints it: a large model takes minutes).

    Example:
        >>> from transformers import LlamaConfig
        >>> config = LlamaConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=2,
        ...                      num_attention_heads=8, vocab_size=32000)  # 99M parameters: 1.6 GB with AdamW
        >>> # each GPU also holds ZeRO-3's reduce bucket, 5e8 elements (2 GB in fp32), whatever the model
        >>> found = smallest_gpus(config, {"input_ids": (1, 16), "labels": (1, 16)}, Plan(), budget="3.5GiB",
        ...                       strategies=["zero3"], device="cpu")
        >>> found["zero3"].gpus, found["zero3"].fits
        (2, True)
    """
    if isinstance(model_or_request, ShardedRequest):
        if batch is not None or plan is not None or budget is not None:
            raise MemlabError("smallest_gpus takes a ShardedRequest alone or the model, batch, plan and budget; "
                              "write smallest_gpus(request, strategies=...) or smallest_gpus(model, batch, plan, "
                              "budget='80GiB')")
        request = model_or_request
    else:
        request = ShardedRequest(model_or_request, batch, plan if plan is not None else Plan(), 1, loss_fn=loss_fn,
                                 lr=lr, device=device, gpu=gpu, load=load,
                                 budget=None if budget is None else parse_budget(budget))
    plan, gpu, load = request.plan, request.gpu, request.load
    _check_plan(plan)
    if request.budget is None:
        raise MemlabError("smallest_gpus needs a budget; write budget='80GiB' (or give its ShardedRequest one)")
    numbers = sorted({check_sharding(int(n), "fsdp2")[0] for n in candidates})
    if not numbers:
        raise MemlabError("candidates is empty; write numbers of GPUs such as candidates=(1, 2, 4, 8)")
    names = [check_sharding(2, s)[1] for s in strategies]
    if "none" in names:
        raise MemlabError('strategies lists "none"; write "fsdp2", "fsdp1", "zero2" or "zero3"')
    found: dict[str, ShardedTrial | None] = {}
    single: Trial | None = None
    composed = needs_composition(plan, "fsdp2", load)
    made: list[tuple[ShardedTrial, list[dict[str, int]]]] = []  # FSDP's dry runs, for ZeRO's basis
    for name in names:
        if name.startswith("zero") and single is None and not composed:
            ran = _basis_run(plan, made, BASIS_GPUS)  # the basis's own dry run, if the search made it
            if ran is None:
                _tell(say, f"estimating {plan.label()}: the dry run that ZeRO's activations come from")
            single = zero_basis(request, run=ran)

        def run(n: int, name: str = name, one: Trial | None = single) -> ShardedTrial:
            if name.startswith("fsdp") or composed:
                _tell(say, f"estimating {plan.label()} with {name} on {n} GPU{'s' if n > 1 else ''}")
            return card_context(sharded_one(request.replace(gpus=n, strategy=name), basis=one, made=made), gpu)

        with one_gpu_runs_kept():  # a composed estimate's one-GPU dry run made once for every number probed
            found[name] = _search(run, numbers)
    return found


def _basis_run(plan: Plan, made: Sequence[tuple[ShardedTrial, list[dict[str, int]]]], gpus: int | None = None
               ) -> tuple[ShardedTrial, list[dict[str, int]]] | None:
    """An FSDP dry run already made that ZeRO's basis can start from: the plan's own where it is the basis's plan
    (AdamW, nothing offloaded) and ran, on ``gpus`` GPUs (any, or only :data:`BASIS_GPUS`, the basis's own)."""
    if plan.optimizer != PLAIN.optimizer or plan.offload != PLAIN.offload:
        return None
    for trial, peaks in made:
        if trial.status == "ok" and gpus in (None, trial.gpus):
            return dataclasses.replace(trial, budget=None), peaks
    return None


def sharded_trials(
    model_or_config: Any,
    batch: Any,
    plans: Sequence[Plan],
    *,
    gpus: int | str,
    strategies: Sequence[str] | None = None,
    budget: int | str | None = None,
    loss_fn: LossFn | None = None,
    lr: float = 1e-5,
    device: str | torch.device | None = None,
    gpu: GpuKind | None = None,
    say: Callable[[str], None] | None = None,
    load: Mapping[str, Any] | None = None,
) -> list[tuple[Plan, str, ShardedTrial | None]]:
    """Per-GPU estimates of every plan under every strategy: ``(plan, strategy, trial)``, plans outer.

    What ``memlab estimate --gpus`` and ``%%memfit --dry-run --gpus`` run. ``gpus`` is a number, or ``"auto"``
    (needs ``budget``): then each trial is the one at the smallest number that fits (:func:`smallest_gpus`), and
    None where no number up to 1024 does. ``strategies`` defaults to ``"fsdp2"``, ``"zero2"`` and ``"zero3"``
    (``"fsdp1"`` when named); ZeRO-2 and ZeRO-3 share one dry run per plan, which is FSDP2's own where the plan
    trains with AdamW without offload (so all three cost one dry run). ``gpu`` is the GPU kind of a CUDA estimate
    (its CUDA context is in each trial's card figure, which ``fits`` judges where it is known). ``say`` is told,
    before each dry run, what it estimates. ``load``: how the user loads the model, as for :func:`memlab.estimate`.

    Example:
        >>> from transformers import LlamaConfig
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        ...                      num_attention_heads=2, vocab_size=256)
        >>> rows = sharded_trials(config, {"input_ids": (1, 16), "labels": (1, 16)}, [Plan()], gpus=2,
        ...                       strategies=["zero2", "zero3"], device="cpu")
        >>> [(name, trial.label) for _, name, trial in rows]
        [('zero2', 'zero2 x2'), ('zero3', 'zero3 x2')]
    """
    gpus = parse_gpus(gpus)
    names = [check_sharding(2, s)[1] for s in (strategies or ("fsdp2", "zero2", "zero3"))]
    if not names or "none" in names:
        raise MemlabError('strategies must name "fsdp2", "fsdp1", "zero2" or "zero3"; write for example '
                          'strategies=["fsdp2"]')
    limit = parse_budget(budget)
    plans = list(plans)
    for plan in plans:
        _check_plan(plan)
        if plan.optimizer_in_backward:
            raise MemlabError(_IN_BACKWARD)
    rows: list[tuple[Plan, str, ShardedTrial | None]] = []
    if gpus == "auto" and limit is None:
        raise MemlabError("gpus='auto' needs a budget; write for example a budget of 80GiB")
    for plan in plans:
        request = ShardedRequest(model_or_config, batch, plan, gpus if isinstance(gpus, int) else 1, loss_fn=loss_fn,
                                 lr=lr, device=device, budget=limit, gpu=gpu, load=load)
        if gpus == "auto":
            rows += [(plan, name, trial) for name, trial in smallest_gpus(request, strategies=names, say=say).items()]
            continue
        composed = needs_composition(plan, "fsdp2", load)
        basis: Trial | None = None
        for name in names:
            if name.startswith("fsdp") or composed:
                n = request.gpus
                _tell(say, f"estimating {plan.label()} with {name} on {n} GPU{'s' if n > 1 else ''}")
            if name == "fsdp2" and not composed:
                trial, peaks = fsdp2_dry_run(request.replace(plan=fsdp_run_plan(plan)))
                trial = dataclasses.replace(trial, plan=plan, notes=(*trial.notes, engine_settings(plan, name)))
                ran = _basis_run(plan, [(trial, peaks)])
                if ran is not None and basis is None:  # ZeRO's dry run too: same plan
                    basis = zero_basis(request, run=ran)
            else:
                if name.startswith("zero") and basis is None and not composed:
                    _tell(say, f"estimating {plan.label()}: the dry run that ZeRO's activations come from")
                    basis = zero_basis(request)
                trial = sharded_one(request.replace(strategy=name), basis=basis)
            rows.append((plan, name, card_context(trial, gpu)))
    return rows


def sharded_lines(trials: Sequence[tuple[Plan, str, ShardedTrial | None]], budget: int | None) -> list[str]:
    """One line per ``(plan, strategy, trial or None)`` of :func:`sharded_trials`: GPUs, the allocated peak per GPU,
    on CUDA what each card will show (the allocator's reserve and the CUDA context: "card figure unknown" until both
    are known), where the peak goes, and whether it fits ``budget`` (bytes), by which figure on CUDA.

    Example:
        >>> sharded_lines([(Plan(), "zero2", None)], 2**30)
        ['plain        zero2  no number of GPUs up to 1024 fits 1.00 GiB']
        >>> trial = ShardedTrial(Plan(), "ok", 2**30, {}, None, None, None, "cuda", budget=2**31, gpus=2,
        ...                      strategy="zero3", detail={"activations": 2**30}, reserved_bytes=2**30 + 2**29)
        >>> print(sharded_lines([(Plan(), "zero3", trial)], 2**31)[0])
        plain        zero3  x2: 1.00 GiB allocated per GPU, card figure unknown (activations 1.00 GiB); fits by the \
allocated peak
        >>> print(sharded_lines([(Plan(), "zero3", dataclasses.replace(trial, context_bytes=2**29))], 2**31)[0])
        plain        zero3  x2: 1.00 GiB allocated per GPU, card 2.00 GiB (activations 1.00 GiB); fits by the card \
figure
    """
    from memlab.plan import format_bytes
    from memlab.report.views.tables import card_text, verdict_text

    lines = []
    for plan, name, trial in trials:
        if trial is None:
            lines.append(f"{plan.label():12s} {name:6s} no number of GPUs up to 1024 fits {format_bytes(budget)}")
            continue
        if trial.status != "ok":
            lines.append(f"{plan.label():12s} {name:6s} x{trial.gpus}: error {trial.error}")
            continue
        parts = ", ".join(f"{key} {format_bytes(value)}" for key, value in trial.detail.items() if value)
        card = card_text(trial)
        if card is None:  # not on CUDA: no card to speak of
            verdict = "" if budget is None else f"  {verdict_text(trial, trial.fits)}"
            lines.append(f"{plan.label():12s} {name:6s} x{trial.gpus}: {format_bytes(trial.peak_bytes)} per GPU "
                         f"({parts}){verdict}")
            continue
        verdict = "" if budget is None else f"; {verdict_text(trial, trial.fits)}"
        lines.append(f"{plan.label():12s} {name:6s} x{trial.gpus}: {format_bytes(trial.peak_bytes)} allocated per "
                     f"GPU, {card} ({parts}){verdict}")
    return lines


def _module(model: torch.nn.Module, getter: str) -> torch.nn.Module | None:
    """``model.get_input_embeddings()`` (or another getter) where the model has it, else None."""
    method = getattr(model, getter, None)
    found = method() if callable(method) else None
    return found if isinstance(found, torch.nn.Module) else None


def _tell(say: Callable[[str], None] | None, text: str) -> None:
    """Progress of a long estimate: ``text`` to ``say`` when one was given."""
    if say is not None:
        say(text)


def search_gpus(run: Callable[[int], ShardedTrial], numbers: Sequence[int]) -> ShardedTrial | None:
    """The trial at the fewest of ``numbers`` (ascending) whose per-GPU figure fits its budget, ``run(n)`` making
    the estimate at ``n`` GPUs; None where none does (or the error trial where every estimate failed). What
    :func:`smallest_gpus` searches with, for any estimate that answers per GPU (a Trainer's: ``memlab estimate MODEL
    --trainer sft --gpus auto``).

    Example:
        >>> from memlab.plan import Plan
        >>> def run(n):
        ...     return ShardedTrial(Plan(), "ok", 64 // n, {}, None, None, None, "cuda", budget=10, gpus=n)
        >>> search_gpus(run, [1, 2, 4, 8, 16]).gpus
        8
    """
    return _search(run, list(numbers))


def _search(run: Callable[[int], ShardedTrial], numbers: list[int]) -> ShardedTrial | None:
    """The trial at the fewest ``numbers`` that fits; None where none does, or the error trial where every dry run
    failed (what failed is said, not "no number of GPUs fits").

    The search's premise (the per-GPU peak does not rise as GPUs are added) leaves one boundary, the fewest that
    fits; it is found as a bisection finds it, each probe narrowing the interval that holds it, so that the answer
    is the bisection's. The probes differ: after the first (the middle), each is the number the last estimate
    predicts to be the boundary (:func:`_predicted`), clamped into the interval, for at most :data:`_PREDICTED`
    probes; then the middle again. A 70B model at 80 GiB probes 32 GPUs (over) and 64 (fits): done, where the
    bisection ran 32, 256 and 64 (the 256-GPU dry run the slowest of the three).
    """
    low, high = 0, len(numbers) - 1
    best: ShardedTrial | None = None
    failed: ShardedTrial | None = None
    last: ShardedTrial | None = None
    predicted = 0
    while low <= high:
        guess = _predicted(last, numbers, low, high) if predicted < _PREDICTED else None
        predicted += guess is not None
        index = (low + high) // 2 if guess is None else guess
        trial = run(numbers[index])
        if trial.status == "ok":
            last = trial
        else:
            failed = trial
        if trial.status == "ok" and trial.fits:
            best, high = trial, index - 1
        else:
            low = index + 1
    return best if best is not None or last is not None else failed


_PREDICTED = 2
"""How many of a search's probes (:func:`_search`) go where the last estimate predicts the boundary."""


def _predicted(trial: ShardedTrial | None, numbers: list[int], low: int, high: int) -> int | None:
    """The index in ``numbers[low:high + 1]`` that ``trial`` (an estimate that ran, at ``trial.gpus``) predicts to be
    the fewest that fits its budget: what it holds sharded (parameters, gradients, optimizer state) scaled by the
    number of GPUs, the rest of its figure kept; ``high`` where none is predicted to fit (the number just below a
    fit: whether it fits settles the boundary), ``low`` where all are. None without a trial that ran with a budget.

    Example:
        >>> from memlab.plan import Plan
        >>> trial = ShardedTrial(Plan(), "ok", 100, {}, None, None, None, "cuda", budget=80, gpus=2,
        ...                      detail={"sharded_params": 40, "activations": 60})
        >>> numbers = [1, 2, 4, 8, 16]
        >>> _predicted(trial, numbers, 2, 4), _predicted(trial, numbers, 3, 4), _predicted(trial, numbers, 0, 1)
        (2, 3, 1)
    """
    if trial is None or trial.status != "ok" or trial.budget is None:
        return None
    sharded = sum(trial.detail.get(key, 0) for key in ("sharded_params", "sharded_grads", "optimizer"))
    for index in range(low, high + 1):
        if trial.verdict_bytes - sharded + sharded * trial.gpus / numbers[index] <= trial.budget:
            return index
    return high


# --- what cannot be estimated sharded -------------------------------------------------------------------------------


_IN_BACKWARD = (
    "optimizer_in_backward is not estimated sharded (FSDP and ZeRO step after the gradients' reduction); "
    "write optimizer_in_backward=False, or estimate it on one GPU (gpus=1)"
)


def _check_plan(plan: Plan) -> None:
    if not isinstance(plan, Plan):
        raise MemlabError(f"plan is a {type(plan).__name__}; pass a memlab.Plan")
    if plan.optimizer_in_backward:
        raise MemlabError(_IN_BACKWARD)
