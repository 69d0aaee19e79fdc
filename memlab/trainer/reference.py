"""The reference model a preference trainer holds beside its policy (TRL's ``DPOTrainer`` with a ``ref_model``),
added to an estimate of the policy's step as each GPU holds it.

On one GPU the reference sits whole on the device through the step. Sharded, TRL prepares it as the engine says
(``trl.models.utils.prepare_fsdp`` / ``prepare_deepspeed``, TRL 1.16): FSDP2 shards it with one ``fully_shard`` on
the whole model, so each GPU holds its share and gathers all of it, in the mixed-precision policy's parameter dtype,
for the reference's forward; ZeRO-3 shards it as stage 3 (gathered a module at a time); ZeRO-1 and ZeRO-2 load it
with ZeRO off, whole on every GPU.

Example:
    >>> import torch
    >>> reference_bytes(torch.nn.Linear(4, 4))
    80
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import weakref
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import torch

from memlab.live.sharding import whole_shape
from memlab.sizes import format_bytes
from memlab.techniques.precompute_ref import reference_unloaded

__all__ = ["gathered_in_forward", "held_while_running", "reference_bytes", "sharded_as", "with_reference"]

_STRATEGY: ContextVar[tuple[str, str | None]] = ContextVar("memlab_reference_strategy", default=("none", None))
"""The strategy and precision the trainer's estimate is made for (:func:`sharded_as`)."""
_HOLDING: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
"""The copies :func:`held_while_running` has hooked (a dry run's copy is made once per fake mode)."""
_MIXED = {"bf16": 2, "fp16": 2}  # a mixed-precision plan's parameter dtype (FSDP2's MixedPrecisionPolicy), in bytes


def reference_bytes(reference: Any, element_bytes: int | None = None) -> int:
    """The bytes of ``reference``'s parameters and buffers (each storage once; a tensor on the meta device, of a model
    built to be estimated, at the bytes it will hold); with ``element_bytes``, its floating-point parameters counted
    at that size per element (as gathered in another dtype).

    Example:
        >>> import torch
        >>> reference_bytes(torch.nn.Linear(4, 4), element_bytes=2)
        40
    """
    storages: dict[Any, int] = {}
    for tensor in (*reference.parameters(), *reference.buffers()):
        # ZeRO-3's partition (its data empty outside a gather) or FSDP2's DTensor (its shape the whole, its data a
        # shard): neither has a storage of the whole
        partitioned = getattr(tensor, "ds_shape", None) is not None or hasattr(tensor, "to_local")
        size = math.prod(whole_shape(tensor)) * tensor.element_size() if partitioned else (
            tensor.untyped_storage().nbytes())
        if element_bytes is not None and tensor.is_floating_point() and isinstance(tensor, torch.nn.Parameter):
            size = size // tensor.element_size() * element_bytes
        # a meta tensor (or a partition) has no address of its own: a tied weight is the same tensor
        meta = tensor.device.type == "meta" or partitioned
        storages[id(tensor) if meta else tensor.untyped_storage().data_ptr()] = size
    return sum(storages.values())


@contextlib.contextmanager
def sharded_as(strategy: str, precision: str | None = None) -> Iterator[None]:
    """Within the block, a trainer's estimate is made for ``strategy`` (memlab's name, ``"none"`` for one GPU) and
    the plan's ``precision`` (None: the trainer's own): what its dry run holds of the reference
    (:func:`gathered_in_forward`) follows them.

    Example:
        >>> with sharded_as("fsdp2", "bf16"):
        ...     pass
    """
    token = _STRATEGY.set((strategy, precision))
    try:
        yield
    finally:
        _STRATEGY.reset(token)


def gathered_in_forward(trainer: Any) -> int:
    """The bytes each rank gathers for the forward of ``trainer``'s reference where the estimate is made for FSDP2
    (:func:`sharded_as`): TRL's ``prepare_fsdp`` puts one ``fully_shard`` on the whole reference, so all of it is
    gathered, in the mixed-precision parameter dtype (the plan's, else the trainer's ``bf16`` / ``fp16``). A dry
    run of a loss that runs the reference holds them while its forward runs (:func:`held_while_running`); 0 for any
    other estimate.

    Example:
        >>> from types import SimpleNamespace
        >>> gathered_in_forward(SimpleNamespace(ref_model=None))
        0
    """
    strategy, precision = _STRATEGY.get()
    reference = getattr(trainer, "ref_model", None)
    if strategy != "fsdp2" or reference is None or reference is getattr(trainer, "model", None) \
            or not hasattr(reference, "parameters"):
        return 0
    if precision is None:
        args = getattr(trainer, "args", None)
        precision = "bf16" if getattr(args, "bf16", False) or getattr(args, "fp16", False) else "fp32"
    return reference_bytes(reference, _MIXED.get(precision))


def held_while_running(module: torch.nn.Module, size: int) -> None:
    """Make ``module`` (a dry run's copy of a reference) allocate ``size`` bytes as its forward starts and free them
    as it ends, as FSDP2's gather and reshard of the whole reference do, so that the step's tracker holds them at the
    moment they are held; hooked once. Where the loss does not run the reference (a GRPOTrainer computes its
    reference's log-probs as it generates), nothing is held: :func:`with_reference` counts them at the peak then.

    Example:
        >>> copy = torch.nn.Linear(2, 2)
        >>> held_while_running(copy, 64)
        >>> copy(torch.zeros(1, 2)).shape
        torch.Size([1, 2])
    """
    if size <= 0 or module in _HOLDING:
        return
    _HOLDING.add(module)
    held: list[torch.Tensor] = []

    def gather(running: torch.nn.Module, *_: Any) -> None:
        held.append(torch.empty(size, dtype=torch.uint8, device=next(running.parameters()).device))

    def reshard(*_: Any) -> None:
        held.clear()

    module.register_forward_pre_hook(gather)
    module.register_forward_hook(reshard)


def _held_in_dry_run(trial: Any, trainer: Any) -> int:
    """The gathered reference the dry run of ``trial`` held while the reference's forward ran
    (:func:`held_while_running`): an FSDP2 dry run (not one composed from one GPU's step) of a loss that runs the
    reference (not a GRPOTrainer's); 0 otherwise. Decided from the trial and the trainer, so that an estimate made in
    a forked child (a launched rank's) says the same."""
    from memlab.live.trainer_kinds import generates

    if getattr(trial, "strategy", "none") != "fsdp2" or getattr(trial, "composed", False) or generates(trainer):
        return 0
    return gathered_in_forward(trainer)


def with_reference(trial: Any, trainer: Any) -> Any:
    """An estimate of a trainer's step with the reference model it holds apart from the policy (TRL's DPOTrainer
    with a ``ref_model``) added under ``other`` at every point, as each GPU holds it (the module docstring): the
    step estimated ran the policy alone. Under FSDP2 the whole reference, gathered for its forward, is counted at the
    step's peak too (TRL runs it after the policy's forward, whose activations are then held: at most the backward's
    rise above the end of the forward too high, which a note says). Unchanged without one (a peft reference is the
    policy, adapters off), and for a plan that precomputes the reference log-probs where the trainer does not
    (``precompute_ref=True``: the DPOTrainer built for it without ``ref_model`` loads none; a note says so).

    Example:
        >>> from memlab.plan import Plan
        >>> from memlab.report import Trial
        >>> trial = Trial(Plan(), "ok", 10, {"other": 0}, None, None, None, "cpu")
        >>> with_reference(trial, object()) is trial
        True
    """
    reference = getattr(trainer, "ref_model", None)
    if reference is None or reference is getattr(trainer, "model", None) or trial.status != "ok":
        return trial
    unloaded = reference_unloaded(trial.plan, trainer)
    if unloaded:
        return dataclasses.replace(trial, notes=(*trial.notes, unloaded))
    whole = reference_bytes(reference)
    if not whole:
        return trial
    gpus, strategy = int(getattr(trial, "gpus", 1) or 1), str(getattr(trial, "strategy", "none"))
    gathered = 0
    if gpus > 1 and strategy in ("fsdp2", "zero3"):
        held = -(-whole // gpus)
        in_forward = _held_in_dry_run(trial, trainer)
        if strategy == "fsdp2" and not in_forward:
            gathered = reference_bytes(reference, _MIXED.get(trial.plan.precision))
        how = (f"a reference model's {format_bytes(held)} share under other (of {format_bytes(whole)}, sharded over "
               f"{gpus} GPUs as TRL prepares it for {strategy})")
        if in_forward:
            how += (f", and all of it gathered for its forward ({format_bytes(in_forward)}), held in the step while "
                    "that forward runs (under activations)")
        elif gathered:
            how += (f", and all of it gathered for its forward ({format_bytes(gathered)}), counted at the step's peak: "
                    "TRL runs it after the policy's forward, so this is at most the backward's rise above the end of "
                    "the forward too high")
        else:
            how += ", gathered a module at a time for its forward (not counted)"
    else:
        held = whole
        how = f"a reference model's {format_bytes(held)} under other" + (
            f" (whole on each GPU: TRL loads it with ZeRO off under {strategy})" if gpus > 1 else "")
    return _added(trial, held, gathered, how)


def _added(trial: Any, held: int, gathered: int, note: str) -> Any:
    """``trial`` with ``held`` bytes added at every point and ``gathered`` more at the peak, under ``other`` (and
    in a sharded trial's ``detail``: the share with the sharded parameters, the gathered copy with the unsharded)."""
    extra = held + gathered
    breakdown = {**trial.breakdown, "other": trial.breakdown.get("other", 0) + extra}
    timeline = trial.timeline
    if timeline is not None:
        series = {name: [value + held for value in values] if name == "other" else list(values)
                  for name, values in timeline.series.items()}
        by_category = {**timeline.peak.by_category, "other": timeline.peak.by_category.get("other", 0) + extra}
        peak = dataclasses.replace(timeline.peak, bytes=timeline.peak.bytes + extra, by_category=by_category)
        timeline = dataclasses.replace(timeline, series=series, peak=peak)
    changes: dict[str, Any] = {}
    detail = getattr(trial, "detail", None)
    if detail:
        changes["detail"] = {**detail, "sharded_params": detail.get("sharded_params", 0) + held,
                             "unsharded_params": detail.get("unsharded_params", 0) + gathered}
    reserved = None if trial.reserved_bytes is None else trial.reserved_bytes + extra
    return dataclasses.replace(trial, peak_bytes=trial.peak_bytes + extra, breakdown=breakdown, timeline=timeline,
                               reserved_bytes=reserved, notes=(*trial.notes, note), **changes)
