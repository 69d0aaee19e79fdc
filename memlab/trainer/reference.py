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

import dataclasses
import math
from typing import Any

import torch

from memlab.live.sharding import whole_shape
from memlab.sizes import format_bytes
from memlab.techniques.precompute_ref import reference_unloaded

__all__ = ["reference_bytes", "with_reference"]

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
        partitioned = getattr(tensor, "ds_shape", None) is not None  # ZeRO-3's: its data empty outside a gather
        size = math.prod(whole_shape(tensor)) * tensor.element_size() if partitioned else (
            tensor.untyped_storage().nbytes())
        if element_bytes is not None and tensor.is_floating_point() and isinstance(tensor, torch.nn.Parameter):
            size = size // tensor.element_size() * element_bytes
        # a meta tensor (or a partition) has no address of its own: a tied weight is the same tensor
        meta = tensor.device.type == "meta" or partitioned
        storages[id(tensor) if meta else tensor.untyped_storage().data_ptr()] = size
    return sum(storages.values())


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
        if strategy == "fsdp2":
            gathered = reference_bytes(reference, _MIXED.get(trial.plan.precision))
        how = (f"a reference model's {format_bytes(held)} share under other (of {format_bytes(whole)}, sharded over "
               f"{gpus} GPUs as TRL prepares it for {strategy})")
        if gathered:
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
