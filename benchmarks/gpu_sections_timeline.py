"""A section for the GPU acceptance run (see :mod:`benchmarks.gpu_acceptance`): a step's timeline against the
allocator. Not yet among the run's parts (its three calls' time limits are full): run it alone with
``python -m benchmarks.gpu_sections_timeline [--smoke]``; the suite runs it at the smoke size on the CPU.

For three plans of Llama-3.2-1B's shape (2 x 1024 tokens; the tiny Llama at the smoke and small sizes): bf16 autocast,
the same checkpointed, the same as two accumulated micro-batches. Each trial's ``timeline.peak.bytes`` against
its ``peak_bytes`` (equal: on CUDA the tracked step's ``max_memory_allocated``), against a hand-made step's
``max_memory_allocated`` (2%), and against the peak of the snapshot the timeline saves (on CUDA the allocator's own,
recorded with ``torch.cuda.memory._record_memory_history`` around the tracked step; 1%), replayed from its trace;
checkpointing must hold fewer activations at its peak than the plain step. On the CPU the allocator figures are None
and the rest must hold.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from benchmarks.gpu_common import LLAMA_1B, TINY, Checks, build_llama, is_cuda, ratio, release, timing, within


def snapshot_peak(snapshot: dict[str, Any]) -> int:
    """The highest allocated bytes a memory snapshot's trace reaches: the blocks allocated at its end, its trace
    undone to its start, then replayed.

    Example:
        >>> block = {"state": "active_allocated", "size": 8}
        >>> trace = [{"action": "alloc", "size": 4}, {"action": "free_completed", "size": 4}]
        >>> snapshot_peak({"segments": [{"blocks": [block]}], "device_traces": [trace]})
        12
    """
    trace = [entry for device in snapshot.get("device_traces", []) for entry in device]
    end = sum(block["size"] for segment in snapshot.get("segments", []) for block in segment.get("blocks", [])
              if block.get("state") == "active_allocated")
    change = {"alloc": 1, "free_completed": -1}
    live = end - sum(change.get(entry["action"], 0) * entry["size"] for entry in trace)
    highest = live
    for entry in trace:
        live += change.get(entry["action"], 0) * entry["size"]
        highest = max(highest, live)
    return highest


def timeline_plans() -> list[tuple[str, Any]]:
    from memlab import Plan

    bf16 = Plan(precision="bf16")
    return [("bf16", bf16), ("bf16 ckpt", bf16.replace(checkpointing=True)),
            ("bf16 2 micro-batches", bf16.replace(micro_batch=1, accumulation=2))]


def section_timeline(size: str, device: torch.device) -> dict[str, Any]:
    """The timeline's peak against the trial's, the allocator's and the saved snapshot's, for three plans."""
    import memlab
    from benchmarks.gpu_reference import reference_peak

    shape = LLAMA_1B.replace(length=1024) if size == "full" else TINY
    model = build_llama(shape, device)
    ids = torch.randint(0, shape.vocab, (shape.rows, shape.length), device=device,
                        generator=torch.Generator(device=device).manual_seed(1))
    batch = {"input_ids": ids, "labels": ids}
    checks, rows = Checks(), []
    activations: dict[str, int] = {}
    for name, plan in timeline_plans():
        trial = memlab.measure(model, batch, plan, steps=1, warmup=1, **timing(size))
        release(device)
        checks.add(f"{name}: trial ran", trial.status == "ok", error=trial.error)
        timeline = trial.timeline
        if trial.status != "ok" or timeline is None:
            checks.add(f"{name}: the trial has a timeline", False)
            continue
        reference = reference_peak(model, batch, plan)["peak_bytes"]
        snapshot = timeline.snapshot()
        from_allocator = timeline.from_allocator
        saved_peak = snapshot_peak(snapshot)
        row = {"plan": name, "peak_bytes": trial.peak_bytes, "timeline_peak_bytes": timeline.peak.bytes,
               "max_memory_allocated": reference, "snapshot_peak_bytes": saved_peak,
               "snapshot_from_allocator": from_allocator,
               "timeline_over_allocated": ratio(timeline.peak.bytes, reference),
               "timeline_over_snapshot": ratio(timeline.peak.bytes, saved_peak),
               "peak": timeline.peak.description, "phases": len(timeline.phases), "events": timeline.events,
               "points": len(timeline.x), "timeline_pickled_bytes": timeline.nbytes}
        rows.append(row)
        activations[name] = timeline.peak.by_category.get("activations", 0)
        checks.add(f"{name}: timeline peak equals the trial's peak_bytes", timeline.peak.bytes == trial.peak_bytes,
                   timeline=timeline.peak.bytes, trial=trial.peak_bytes)
        checks.add(f"{name}: timeline categories at the peak equal the breakdown",
                   timeline.peak.by_category == trial.breakdown)
        checks.add(f"{name}: timeline peak within 2% of a hand-made step's max_memory_allocated",
                   within(timeline.peak.bytes, reference, 0.02) if reference is not None else None,
                   timeline=timeline.peak.bytes, allocated=reference)
        checks.add(f"{name}: on CUDA the saved snapshot is the allocator's own",
                   from_allocator if is_cuda(device) else None)
        checks.add(f"{name}: timeline peak within 1% of the saved snapshot's own peak",
                   within(timeline.peak.bytes, saved_peak, 0.01), timeline=timeline.peak.bytes, snapshot=saved_peak,
                   from_allocator=from_allocator)
    if "bf16" in activations and "bf16 ckpt" in activations:
        checks.add("checkpointing holds fewer activations at its peak", activations["bf16 ckpt"] < activations["bf16"],
                   plain=activations["bf16"], checkpointed=activations["bf16 ckpt"])
    return {"model": dataclasses.asdict(shape), "rows": rows, "checks": checks.items}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the section on the GPU (the CPU with ``--smoke``) and print its JSON."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the tiny Llama on the CPU")
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    result = section_timeline("smoke" if args.smoke else "full", device)
    print(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
