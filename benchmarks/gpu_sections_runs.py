"""Two sections of the GPU acceptance run about whole runs (see :mod:`benchmarks.gpu_acceptance`); the trainer
section is :mod:`benchmarks.gpu_sections_trainer`.

- ``ties``: :mod:`benchmarks.ties` on the GPU: the same plan compared with itself (every run must report a tie), and
  a plan truly 30% slower (every run must rank it slower). The slow plan's extra work is calibrated with memlab's
  own timing (synchronised with the GPU), not with ``ties.interleaved_slowdown``'s wall clock, which on CUDA would
  time kernel launches.
- ``reserve``: checkpointed bf16 steps of the cumulative section, each alone in a fresh process: the reserved peak a
  dry run (which replays a fresh process) is compared with, and the segments the allocator took.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from benchmarks.gpu_common import (
    SIZES,
    Checks,
    Llama,
    build_llama,
    is_cuda,
    token_batch,
)

TARGET_SLOWDOWN = 0.30
MAX_EXTRA_BATCHES = 10


def step_seconds(model: Any, batch: Any, loss_fn: Any, steps: int) -> float:
    """Median seconds of a plain step with ``loss_fn``, timed by memlab (noise 0: exactly ``steps`` steps)."""
    import memlab

    trial = memlab.measure(model, batch, memlab.Plan(), loss_fn=loss_fn, steps=steps, warmup=1, progress=False,
                           noise=0)
    if trial.status != "ok" or not trial.step_time_s:
        raise RuntimeError(f"timing a step failed: {trial.error}")
    return float(trial.step_time_s)


def section_ties(size: str, device: torch.device) -> dict[str, Any]:
    """10. The same plan compared with itself (all ties) and a plan 30% slower (all ranked slower), with memlab's
    default timing rule (noise 5%, at most 10 s a trial)."""
    from benchmarks import ties

    spec = SIZES[size]["ties"]
    shape: Llama = spec["shape"]
    model = build_llama(shape, device)
    batch = token_batch(shape.vocab, shape.rows, shape.length, device)
    steps = spec["calibration_steps"]
    plain = step_seconds(model, batch, ties.default_loss, steps)
    whole = step_seconds(model, batch, ties.extra_forward_loss(shape.rows), steps) / plain - 1
    # A busy CPU can time the whole-batch extra forward as no slower at all: the rows it asks for are capped (a GPU
    # needs about the batch's rows), so that the calibration cannot ask for a billion rows and never end.
    extra = min(MAX_EXTRA_BATCHES * shape.rows, max(1, math.ceil(shape.rows * TARGET_SLOWDOWN / max(whole, 1e-9))))
    slow_loss = ties.extra_forward_loss(extra)
    calibrated = step_seconds(model, batch, slow_loss, steps) / plain - 1
    same_runs, slower_runs = spec["runs"]
    same = [ties.same_plan_twice(model, batch, number) for number in range(same_runs)]
    slower = [ties.truly_slower(model, batch, slow_loss, number) for number in range(slower_runs)]
    checks = Checks()
    gpu = is_cuda(device)
    checks.add(f"the same plan twice: a tie in all {same_runs} runs",
               all(run["tie"] for run in same) if gpu else None, ties=sum(run["tie"] for run in same))
    checks.add(f"a plan {TARGET_SLOWDOWN:.0%} slower: ranked slower in all {slower_runs} runs",
               all(run["ranked_slower"] for run in slower) if gpu else None,
               ranked_slower=sum(run["ranked_slower"] for run in slower),
               slowdowns=[run["slowdown"] for run in slower])
    checks.add(f"the slow plan is at least {TARGET_SLOWDOWN:.0%} slower by memlab's timing",
               calibrated >= TARGET_SLOWDOWN * 0.95 if gpu else None, slowdown=round(calibrated, 3))
    return {
        "model": dataclasses.asdict(shape), "plain_step_s": round(plain, 5),
        "whole_batch_extra_forward_slowdown": round(whole, 3), "extra_forward_rows": extra,
        "slowdown_calibrated": round(calibrated, 3),
        "same_plan_twice": {"runs": same, "ties": sum(run["tie"] for run in same), "of": len(same)},
        "truly_slower": {"runs": slower, "ranked_slower": sum(run["ranked_slower"] for run in slower),
                         "of": len(slower)},
        "checks": checks.items,
    }


# --- reserve ------------------------------------------------------------------------------------------------------

RESERVE_PLANS = ("+ activation checkpointing", "+ 8-bit AdamW", "LoRA r16 + bf16 + checkpointing")
"""The cumulative section's steps whose reserved peak is measured again alone: the control (its reserve is what the
CPU replay gives), and the two the replay gave 10% and 14% too little for in the first run (test_cuda_truth's
KNOWN_OFF_RESERVED)."""


def section_reserve(size: str, device: torch.device) -> dict[str, Any]:
    """12. The reserved peak of checkpointed bf16 steps on Llama-3.2-1B's shape at 2 x 2048, each measured alone in
    a fresh process (one warm-up step, one tracked step), with the allocator's segments of 100 MB or more and their
    frames. In the cumulative section the same steps run one after the other in one process, where what an earlier
    trial left in the allocator's segments can move the reserve; a dry run replays a fresh process."""
    from benchmarks.gpu_reference import cumulative_plans, remeasure_in_fresh_process

    shape: Llama = SIZES[size]["cumulative"]
    named = dict(cumulative_plans())
    # The smoke size checks the code only: one plan, one fresh process.
    names = RESERVE_PLANS if size == "full" else RESERVE_PLANS[:1]
    checks, rows = Checks(), []
    for name in names:
        alone = remeasure_in_fresh_process(shape, named[name], device, steps=1, noise=0, segments=True)
        rows.append({"step": name, **alone})
        checks.add(f"{name}: measured alone in a fresh process", alone.get("status") == "ok",
                   error=alone.get("error"), reserved=alone.get("reserved_bytes"))
    return {"model": dataclasses.asdict(shape), "rows": rows, "checks": checks.items}
