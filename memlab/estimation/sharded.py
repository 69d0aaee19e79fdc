"""Per-GPU estimates of a training step sharded over several GPUs: FSDP2, DeepSpeed ZeRO-2 and ZeRO-3.

memlab never shards anything itself: the engines do (accelerate with FSDP2, DeepSpeed). This module answers, before
the machines are booked, how much each GPU will hold (:func:`sharded_estimate`, what ``memlab.estimate(...,
gpus=, strategy=)`` runs), and :func:`smallest_gpus` how many GPUs each strategy needs. ``batch`` is always what ONE
GPU sees per micro-step (the per-GPU micro-batch); data parallelism multiplies it.

**FSDP2** runs for real, on fake tensors (:mod:`memlab.estimation.fsdp2`): ``fully_shard`` over a fake process
group, memlab's own training step, PyTorch's ``FSDPMemTracker``. **ZeRO-2 / ZeRO-3** are computed
(:mod:`memlab.estimation.zero`): DeepSpeed's formulas for the model states, the activations from the FSDP2 dry run.
The strategies and DeepSpeed's bucket sizes are in :mod:`memlab.live.sharding` (no torch), which the names
below re-export.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from memlab.errors import MemlabError
from memlab.estimation.configs import frozen_count, layer_counts
from memlab.estimation.cuda_context import card_context
from memlab.estimation.fsdp2 import DETAIL, FSDP2_REFUSALS, ShardedTrial, fsdp2_dry_run, shard_units
from memlab.estimation.gpus import GpuKind, gpu_kind
from memlab.estimation.single_gpu import estimate_plans
from memlab.estimation.zero import zero_basis, zero_model_states, zero_trial
from memlab.live.batch import LossFn
from memlab.live.sharding import (
    DS_ALLGATHER_BUCKET,
    DS_PREFETCH_BUCKET,
    DS_REDUCE_BUCKET,
    STRATEGIES,
    check_sharding,
    parse_gpus,
)
from memlab.plan import Plan, parse_budget
from memlab.report import Trial

__all__ = [
    "DETAIL",
    "DS_ALLGATHER_BUCKET",
    "DS_PREFETCH_BUCKET",
    "DS_REDUCE_BUCKET",
    "STRATEGIES",
    "ShardedTrial",
    "check_sharding",
    "layer_counts",
    "parse_gpus",
    "shard_units",
    "sharded_estimate",
    "sharded_lines",
    "sharded_trials",
    "smallest_gpus",
    "zero_model_states",
]


def sharded_estimate(
    model_or_config: Any,
    batch: Any,
    plan: Plan | None = None,
    *,
    gpus: int,
    strategy: str,
    loss_fn: LossFn | None = None,
    budget: int | str | None = None,
    lr: float = 1e-5,
    device: str | torch.device | None = None,
    gpu: GpuKind | str | None = None,
) -> ShardedTrial:
    """The peak of one steady-state training step per GPU, sharded over ``gpus`` GPUs with ``strategy``.

    :func:`memlab.estimate` with ``gpus=``/``strategy=`` calls this; the arguments are its own, and ``batch`` is
    the per-GPU micro-batch. ``strategy="fsdp2"`` runs ``fully_shard`` on fake tensors; ``"zero2"``/``"zero3"``
    compute DeepSpeed's partitioning (the module docstring gives the formulas). Adapter plans and the chunked loss
    are not estimated sharded (a MemlabError says so). For CUDA each GPU's trial carries the CUDA context of the GPU
    kind ``gpu`` (:func:`memlab.estimation.cuda_context.card_context`), and its ``fits`` judges the card figure.

    Example:
        >>> from transformers import LlamaConfig
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        ...                      num_attention_heads=2, vocab_size=256)
        >>> batch = {"input_ids": (1, 32), "labels": (1, 32)}
        >>> one = sharded_estimate(config, batch, gpus=2, strategy="fsdp2", device="cpu")
        >>> four = sharded_estimate(config, batch, gpus=4, strategy="fsdp2", device="cpu")
        >>> one.status, four.model_state_bytes < one.model_state_bytes, sum(one.breakdown.values()) == one.peak_bytes
        ('ok', True, True)
    """
    gpus, strategy = check_sharding(gpus, strategy)
    plan = Plan() if plan is None else plan
    _check_plan(plan)
    gpu_kind(gpu)
    limit = parse_budget(budget)
    if strategy == "fsdp2" and plan.optimizer in FSDP2_REFUSALS:
        raise MemlabError(FSDP2_REFUSALS[plan.optimizer])
    if strategy == "fsdp2":
        return card_context(fsdp2_dry_run(model_or_config, batch, plan, gpus, loss_fn=loss_fn, lr=lr, device=device,
                                          budget=limit, gpu=gpu)[0], gpu)
    if strategy in ("zero2", "zero3"):
        basis = zero_basis(model_or_config, batch, plan, loss_fn=loss_fn, lr=lr, device=device, gpu=gpu)
        return card_context(zero_trial(basis, layer_counts(model_or_config), plan, gpus, int(strategy[-1]), limit,
                                       frozen=frozen_count(model_or_config)), gpu)
    trial = estimate_plans(model_or_config, batch, [plan], loss_fn=loss_fn, budget=budget, lr=lr, device=device,
                           gpu=gpu)[0]
    return card_context(ShardedTrial(**{f.name: getattr(trial, f.name) for f in dataclasses.fields(Trial)}), gpu)


def smallest_gpus(
    model_or_config: Any,
    batch: Any,
    plan: Plan | None = None,
    *,
    budget: int | str,
    strategies: Sequence[str] = ("fsdp2", "zero2", "zero3"),
    candidates: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
    loss_fn: LossFn | None = None,
    lr: float = 1e-5,
    device: str | torch.device | None = None,
    gpu: GpuKind | str | None = None,
    say: Callable[[str], None] | None = None,
) -> dict[str, ShardedTrial | None]:
    """For each strategy, the estimate at the smallest number of GPUs in ``candidates`` whose per-GPU peak fits
    ``budget`` (None when none does: ZeRO-2 keeps whole weights on every GPU, so it may never fit; the error trial
    where every dry run failed, such as Adafactor under FSDP2). For CUDA, what
    fits is each GPU's card figure (the CUDA context of the GPU kind ``gpu`` included) where it is known.

    The per-GPU peak falls as GPUs are added, so the candidates are bisected: FSDP2 runs a dry run per probe
    (about log2 of the number of candidates), ZeRO one dry run in all (its model states are a formula of N).
    ``say`` is told, before each dry run, what it estimates (a command line prints it: a large model takes minutes).

    Example:
        >>> from transformers import LlamaConfig
        >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        ...                      num_attention_heads=2, vocab_size=256)
        >>> found = smallest_gpus(config, {"input_ids": (1, 16), "labels": (1, 16)}, budget="3MiB",
        ...                       strategies=["zero3"], device="cpu")
        >>> found["zero3"].gpus, found["zero3"].fits
        (2, True)
    """
    plan = Plan() if plan is None else plan
    _check_plan(plan)
    limit = parse_budget(budget)
    if limit is None:
        raise MemlabError("smallest_gpus needs a budget; write for example budget='80GiB'")
    numbers = sorted({check_sharding(int(n), "fsdp2")[0] for n in candidates})
    if not numbers:
        raise MemlabError("candidates is empty; write numbers of GPUs such as candidates=(1, 2, 4, 8)")
    names = [check_sharding(2, s)[1] for s in strategies]
    gpu_kind(gpu)
    if "none" in names:
        raise MemlabError('strategies lists "none"; write "fsdp2", "zero2" or "zero3"')
    found: dict[str, ShardedTrial | None] = {}
    single: Trial | None = None
    counts: tuple[int, int] | None = None
    for name in names:
        if name != "fsdp2" and single is None:
            _tell(say, f"estimating {plan.label()}: the dry run that ZeRO's activations come from")
            single = zero_basis(model_or_config, batch, plan, loss_fn=loss_fn, lr=lr, device=device, gpu=gpu)
            counts = layer_counts(model_or_config)

        def run(n: int, name: str = name, one: Trial | None = single, sizes: Any = counts) -> ShardedTrial:
            if name == "fsdp2":
                _tell(say, f"estimating {plan.label()} with fsdp2 on {n} GPU{'s' if n > 1 else ''}")
                return card_context(fsdp2_dry_run(model_or_config, batch, plan, n, loss_fn=loss_fn, lr=lr,
                                                  device=device, budget=limit, gpu=gpu)[0], gpu)
            assert one is not None and sizes is not None
            return card_context(zero_trial(one, sizes, plan, n, int(name[-1]), limit,
                                           frozen=frozen_count(model_or_config)), gpu)

        found[name] = _bisect(run, numbers)
    return found


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
    gpu: GpuKind | str | None = None,
    say: Callable[[str], None] | None = None,
) -> list[tuple[Plan, str, ShardedTrial | None]]:
    """Per-GPU estimates of every plan under every strategy: ``(plan, strategy, trial)``, plans outer.

    What ``memlab estimate --gpus`` and ``%%memfit --dry-run --gpus`` run. ``gpus`` is a number, or ``"auto"``
    (needs ``budget``): then each trial is the one at the smallest number that fits (:func:`smallest_gpus`), and
    None where no number up to 1024 does. ``strategies`` defaults to all three (``"fsdp2"``, ``"zero2"``,
    ``"zero3"``); ZeRO-2 and ZeRO-3 share one dry run per plan, which is FSDP2's own where the plan trains with
    AdamW without offload (so all three cost one dry run). ``gpu`` is the GPU kind of a CUDA estimate (its CUDA
    context is in each trial's card figure, which ``fits`` judges where it is known). ``say`` is told, before
    each dry run, what it estimates.

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
    gpu_kind(gpu)  # an unknown GPU is refused before any dry run
    names = [check_sharding(2, s)[1] for s in (strategies or ("fsdp2", "zero2", "zero3"))]
    if not names or "none" in names:
        raise MemlabError('strategies must name "fsdp2", "zero2" or "zero3"; write for example strategies=["fsdp2"]')
    limit = parse_budget(budget)
    plans = list(plans)
    for plan in plans:
        _check_plan(plan)
    rows: list[tuple[Plan, str, ShardedTrial | None]] = []
    if gpus == "auto":
        if limit is None:
            raise MemlabError("gpus='auto' needs a budget; write for example a budget of 80GiB")
        for plan in plans:
            found = smallest_gpus(model_or_config, batch, plan, budget=limit, strategies=names, loss_fn=loss_fn,
                                  lr=lr, device=device, gpu=gpu, say=say)
            rows += [(plan, name, trial) for name, trial in found.items()]
        return rows
    assert isinstance(gpus, int)
    zero = any(name != "fsdp2" for name in names)
    counts = layer_counts(model_or_config) if zero else (0, 0)
    frozen = frozen_count(model_or_config) if zero else 0
    for plan in plans:
        single: Trial | None = None
        run: tuple[ShardedTrial, list[dict[str, int]]] | None = None
        for name in names:
            if name == "fsdp2":
                _tell(say, f"estimating {plan.label()} with fsdp2 on {gpus} GPU{'s' if gpus > 1 else ''}")
                trial, peaks = fsdp2_dry_run(model_or_config, batch, plan, gpus, loss_fn=loss_fn, lr=lr, device=device,
                                             budget=limit, gpu=gpu)
                if plan.optimizer == "adamw" and plan.offload == "none" and trial.status == "ok":
                    run = (dataclasses.replace(trial, budget=None), peaks)  # ZeRO's dry run too: same plan
            else:
                if single is None:
                    if run is None:
                        _tell(say, f"estimating {plan.label()}: the dry run that ZeRO's activations come from")
                    single = zero_basis(model_or_config, batch, plan, loss_fn=loss_fn, lr=lr, device=device, run=run,
                                        gpu=gpu)
                trial = zero_trial(single, counts, plan, gpus, int(name[-1]), limit, frozen=frozen)
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
    from memlab.report.tables import card_text, verdict_text

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


def _tell(say: Callable[[str], None] | None, text: str) -> None:
    """Progress of a long estimate: ``text`` to ``say`` when one was given."""
    if say is not None:
        say(text)


def _bisect(run: Any, numbers: list[int]) -> ShardedTrial | None:
    """The trial at the fewest ``numbers`` that fits; None where none does, or the error trial where every dry run
    failed (what failed is said, not "no number of GPUs fits")."""
    low, high = 0, len(numbers) - 1
    best: ShardedTrial | None = None
    failed: ShardedTrial | None = None
    ran = False
    while low <= high:
        middle = (low + high) // 2
        trial = run(numbers[middle])
        if trial.status == "ok":
            ran = True
        else:
            failed = trial
        if trial.status == "ok" and trial.fits:
            best, high = trial, middle - 1
        else:
            low = middle + 1
    return best if best is not None or ran else failed


# --- what cannot be estimated sharded -------------------------------------------------------------------------------


def _check_plan(plan: Plan) -> None:
    if not isinstance(plan, Plan):
        raise MemlabError(f"plan is a {type(plan).__name__}; pass a memlab.Plan")
    if plan.adapter != "none":
        raise MemlabError(
            f"adapter={plan.adapter!r} is not estimated sharded; estimate it on one GPU (gpus=1), where adapters "
            "usually fit, or shard the full model (adapter='none')"
        )
    if plan.loss != "full":
        raise MemlabError("loss='chunked' is not estimated sharded; write loss='full' (the estimate then leans high)")
    if plan.optimizer_in_backward:
        raise MemlabError(
            "optimizer_in_backward is not estimated sharded (FSDP2 and ZeRO step after the gradients' reduction); "
            "write optimizer_in_backward=False, or estimate it on one GPU (gpus=1)"
        )
