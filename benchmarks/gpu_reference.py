"""What the GPU sections measure beside memlab (see :mod:`benchmarks.gpu_acceptance`): a hand-made training step
and its ``max_memory_allocated``, the levers stacked one on the other, a plan re-measured in a fresh process, and the
large allocations of a CUDA memory snapshot. Below every section module: it imports none of them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks import common
from benchmarks.gpu_common import (
    Llama,
    build_llama,
    card_figures,
    in_fresh_process,
    is_cuda,
    plan_fields,
    release,
    token_batch,
    unique_cuda_bytes,
)


@contextmanager
def reference_training(model: nn.Module, plan: Any, lr: float = 1e-5) -> Iterator[Callable[[dict[str, Any]], None]]:
    """A training step for ``plan`` written the way a user writes one, with no memlab code in it.

    Yields ``step(batch)``. Checkpointing is switched on with transformers' own call and off again afterwards; the
    optimizer is built inside and dropped on exit. Offload of the optimizer has no reference here.
    """
    device = next(model.parameters()).device
    parameters = [p for p in model.parameters() if p.requires_grad]
    if plan.optimizer == "adamw8bit":
        import bitsandbytes

        optimizer: Any = bitsandbytes.optim.AdamW8bit(parameters, lr=lr)
    else:
        optimizer = torch.optim.AdamW(parameters, lr=lr, fused=True)  # the Trainer's default, as memlab's "adamw"
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(plan.precision)
    scaler = torch.amp.GradScaler(device.type) if plan.precision == "fp16" else None
    if plan.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()

    def step(batch: dict[str, Any]) -> None:
        rows = batch["input_ids"].shape[0]
        size = plan.micro_batch or rows
        for index in range(plan.accumulation):
            part = {key: value[index * size:(index + 1) * size] for key, value in batch.items()}
            offload = (
                torch.autograd.graph.save_on_cpu(pin_memory=True)
                if plan.offload in ("activations", "all") else _nothing()
            )
            with torch.autocast(device.type, dtype=half, enabled=half is not None), offload:
                loss = model(**part).loss
            loss = loss.float() / plan.accumulation
            (scaler.scale(loss) if scaler is not None else loss).backward()
            del loss
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    try:
        step.optimizer = optimizer  # type: ignore[attr-defined]
        yield step
    finally:
        if plan.checkpointing:
            model.gradient_checkpointing_disable()
        model.zero_grad(set_to_none=True)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def reference_peak(model: nn.Module, batch: dict[str, Any], plan: Any, steps: int = 2) -> dict[str, Any]:
    """``max_memory_allocated`` over one steady-state reference step (after ``steps`` warm ones), and the bytes of
    the optimizer state the reference optimizer keeps on the device."""
    device = next(model.parameters()).device
    with reference_training(model, plan) as step:
        for _ in range(steps):
            step(batch)
        common.synchronize(device)
        if is_cuda(device):
            torch.cuda.reset_peak_memory_stats(device)
        step(batch)
        common.synchronize(device)
        peak = int(torch.cuda.max_memory_allocated(device)) if is_cuda(device) else None
        state = [v for s in step.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]  # type: ignore[attr-defined]
        optimizer_bytes = unique_cuda_bytes(state) if is_cuda(device) else None
    del step, state
    release(device)
    return {"peak_bytes": peak, "optimizer_bytes": optimizer_bytes}


def hand_made_peak(model: nn.Module, batch: Any, plan: Any) -> int | None:
    """A hand-made step's ``max_memory_allocated`` for ``plan`` (:func:`reference_peak`);
    pure bf16 weights as users make them, the model cast to bf16 for the step and back to fp32 after (its values
    are random: only the memory is compared). None on the CPU."""
    cast = getattr(plan, "weights", "fp32") == "bf16"
    if cast:
        model.to(torch.bfloat16)
    try:
        peak: int | None = reference_peak(model, batch, plan)["peak_bytes"]
    finally:
        if cast:
            model.to(torch.float32)
    return peak


def cumulative_plans() -> list[tuple[str, Any]]:
    """Levers added one on top of the other (the first six), then other full fine-tunes and adapters."""
    from memlab import Plan

    stacked = {"precision": "bf16", "checkpointing": True, "optimizer": "adamw8bit"}
    return [
        ("fp32 AdamW (baseline)", Plan()),
        ("+ bf16 autocast", Plan(precision="bf16")),
        ("+ activation checkpointing", Plan(precision="bf16", checkpointing=True)),
        ("+ 8-bit AdamW", Plan(**stacked)),
        ("+ chunked loss", Plan(**stacked, loss="chunked")),
        ("+ optimizer in backward", Plan(**stacked, loss="chunked", optimizer_in_backward=True)),
        ("bf16 + checkpointing + 8-bit AdamW, micro-batch 1 x accumulation 2",
         Plan(**stacked, micro_batch=1, accumulation=2)),
        ("bf16 + checkpointing + paged 8-bit AdamW", Plan(precision="bf16", checkpointing=True,
                                                          optimizer="paged_adamw8bit")),
        ("bf16 + checkpointing + Adafactor", Plan(precision="bf16", checkpointing=True, optimizer="adafactor")),
        ("bf16 + checkpointing + offloaded AdamW", Plan(precision="bf16", checkpointing=True, offload="optimizer")),
        ("pure bf16 + checkpointing + 8-bit AdamW", Plan(weights="bf16", checkpointing=True, optimizer="adamw8bit")),
        ("pure bf16 + checkpointing + 8-bit AdamW + chunked loss + optimizer in backward",
         Plan(weights="bf16", checkpointing=True, optimizer="adamw8bit", loss="chunked", optimizer_in_backward=True)),
        ("LoRA r16 + bf16 + checkpointing", Plan(adapter="lora", precision="bf16", checkpointing=True)),
        ("LoRA r16 on attention + bf16 + checkpointing", Plan(adapter="lora", lora_targets="attention",
                                                              precision="bf16", checkpointing=True)),
        ("QLoRA r16 + bf16 + checkpointing", Plan(adapter="qlora", precision="bf16", checkpointing=True)),
    ]


def remeasure_in_fresh_process(shape: Llama, plan: Any, device: torch.device, steps: int, *,
                               noise: float | None = None, segments: bool = False) -> dict[str, Any]:
    """Measure ``plan`` on the same model and batch in a new Python process; its trial as a dict (peak, breakdown,
    reserved, CUDA context). ``noise``: memlab's noise target (its default where None). ``segments``: on CUDA, also
    the segments the allocator took and the allocations of 100 MB or more from the trial's start to the end of its
    tracked step, with their frames (:func:`large_allocations`)."""
    request = {"shape": dataclasses.asdict(shape), "plan": dataclasses.asdict(plan), "device": str(device),
               "steps": steps, "noise": noise, "segments": segments}
    return in_fresh_process("benchmarks.gpu_reference:remeasure", request)


def remeasure(request: str) -> None:
    """The fresh process's side: build, measure, print the trial as one JSON line."""
    import memlab
    from memlab.events import StepFinished

    common.quiet()
    asked = json.loads(request)
    device = torch.device(asked["device"])
    shape = Llama(**asked["shape"])
    model = build_llama(shape, device)
    batch = token_batch(shape.vocab, shape.rows, shape.length, device)
    keywords: dict[str, Any] = {} if asked.get("noise") is None else {"noise": asked["noise"]}
    history = bool(asked.get("segments")) and is_cuda(device)
    record = torch.cuda.memory._record_memory_history
    snapshot: dict[str, Any] = {}

    def callback(event: Any) -> None:
        if history and isinstance(event, StepFinished) and event.kind == "tracked" and not snapshot:
            snapshot.update(torch.cuda.memory._snapshot(device))
            record(enabled=None, device=device)

    if history:
        record(enabled="all", context="alloc", stacks="python", max_entries=200_000, device=device)
    try:
        trial = memlab.measure(model, batch, memlab.Plan(**asked["plan"]), steps=asked["steps"], warmup=1,
                               progress=False, callback=callback, **keywords)
    finally:
        if history and not snapshot:
            record(enabled=None, device=device)
    answer = {"plan": trial.plan.label(), "plan_fields": plan_fields(trial.plan), "status": trial.status,
              "peak_bytes": trial.peak_bytes, "error": trial.error, "samples_per_s": trial.samples_per_s,
              "breakdown": dict(trial.breakdown), **card_figures(trial)}
    if history:
        found = large_allocations(snapshot, device, limit=120) if snapshot else []
        answer["segments_taken"] = [event for event in found if event["action"] == "segment_alloc"]
        answer["large_allocations"] = [event for event in found if event["action"] == "alloc"]
    print(json.dumps(answer))


LARGE = 100 * 10**6
"""Allocations at least this large are listed by the diagnostic."""


def large_allocations(snapshot: dict[str, Any], device: torch.device, limit: int = 60) -> list[dict[str, Any]]:
    """The allocations (and new segments) of :data:`LARGE` bytes or more in ``snapshot``'s trace, in order: size,
    whether an optimizer frame made it, whether it was freed before the trace ended, and its innermost frames."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    traces = snapshot.get("device_traces") or []
    events = traces[index] if index < len(traces) else []
    freed = {event["addr"] for event in events if event.get("action") in ("free_requested", "free_completed")}
    found = []
    for event in events:
        if event.get("action") not in ("alloc", "segment_alloc") or event.get("size", 0) < LARGE:
            continue
        frames = [f for f in event.get("frames", []) if "site-packages/torch/utils" not in str(f.get("filename"))]
        in_optimizer = any("/optim" in str(f.get("filename")) or "optimizer" in str(f.get("filename"))
                           or "step" == f.get("name") for f in frames)
        found.append({
            "action": event["action"], "size": int(event["size"]), "mib": common.mib(event["size"]),
            "in_optimizer": in_optimizer, "freed_in_step": event.get("addr") in freed,
            "frames": [_frame(f) for f in frames[:10]],
        })
    return found[:limit]


def _frame(frame: dict[str, Any]) -> str:
    return f"{Path(str(frame.get('filename', '?'))).name}:{frame.get('line')}:{frame.get('name')}"
