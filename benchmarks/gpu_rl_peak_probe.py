"""What TRL's own ``train()`` holds at its peak on a GPU: the ``rl`` part's trainers (DPO with LoRA, GRPO with and
without LoRA), each trained with no memlab under the CUDA allocator's history, and the blocks alive at the
allocated peak grouped by where in Python they were made.

The H200 acceptance run of 2026-11-27 (benchmarks/results/gpu_acceptance-cuda-nvidia-h200-rl-first.json) found
memlab's estimates of three of these trainers under their ``train()``'s ``max_memory_allocated`` (DPO + LoRA 0.55,
GRPO 0.87, GRPO + LoRA 0.40); this probe says what the difference is made of.

Run from the repository root on a GPU (the wheels of :mod:`benchmarks.gpu_acceptance`)::

    python -m benchmarks.gpu_rl_peak_probe --out DIR [--trainers grpo_lora,dpo_lora,grpo]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

TOP_HOLDERS = 25
"""How many groups of live blocks at the peak each trainer's answer lists (largest first)."""
OWN_FRAMES = 4
"""How many of an allocation's innermost frames outside torch's own files name its group."""


def frames_key(frames: list[dict[str, Any]]) -> str:
    """The innermost :data:`OWN_FRAMES` frames of an allocation outside torch's own Python files, as one line.

    >>> frames_key([{"filename": "/x/torch/nn/modules/module.py", "line": 1, "name": "_call_impl"},
    ...             {"filename": "/x/trl/trainer/utils.py", "line": 9, "name": "selective_log_softmax"}])
    'trl/trainer/utils.py:9 selective_log_softmax'
    """
    own = [frame for frame in frames
           if "/torch/" not in frame.get("filename", "") and frame.get("filename", "").endswith(".py")]
    named = []
    for frame in own[:OWN_FRAMES]:
        parts = frame["filename"].split("/")
        short = "/".join(parts[-3:])
        named.append(f"{short}:{frame.get('line')} {frame.get('name')}")
    return " < ".join(named) or "(no Python frame)"


def live_at_peak(trace: list[dict[str, Any]], baseline: int = 0) -> dict[str, Any]:
    """Replays the allocator's events: the allocated peak (``baseline`` plus what the trace allocated and kept) and
    the blocks alive at it, grouped by :func:`frames_key`, largest first.

    >>> trace = [{"action": "alloc", "addr": 1, "size": 10, "frames": []},
    ...          {"action": "alloc", "addr": 2, "size": 5, "frames": []},
    ...          {"action": "free_completed", "addr": 1, "size": 10, "frames": []}]
    >>> live_at_peak(trace)["peak_in_trace_bytes"]
    15
    """
    live: dict[int, int] = {}
    now = peak = 0
    peak_index = -1
    for index, event in enumerate(trace):
        action = event.get("action")
        if action == "alloc":
            live[event["addr"]] = index
            now += event["size"]
            if now > peak:
                peak, peak_index = now, index
        elif action == "free_completed" and event["addr"] in live:
            del live[event["addr"]]
            now -= event["size"]
    alive: dict[int, int] = {}
    for index, event in enumerate(trace[:peak_index + 1]):
        if event.get("action") == "alloc":
            alive[event["addr"]] = index
        elif event.get("action") == "free_completed":
            alive.pop(event["addr"], None)
    groups: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for index in alive.values():
        event = trace[index]
        group = groups[frames_key(event.get("frames", []))]
        group[0] += event["size"]
        group[1] += 1
    holders = sorted(({"where": key, "bytes": size, "blocks": count} for key, (size, count) in groups.items()),
                     key=lambda row: -row["bytes"])
    peak_frames = trace[peak_index].get("frames", []) if peak_index >= 0 else []
    return {"peak_in_trace_bytes": peak, "baseline_bytes": baseline, "peak_event": peak_index,
            "events": len(trace), "peak_at": frames_key(peak_frames), "holders": holders[:TOP_HOLDERS]}


def probe(kind: str, folder: str, device: torch.device) -> dict[str, Any]:
    """One trainer of the ``rl`` part at the full size: ``train()`` under the allocator's history."""
    from benchmarks.gpu_sections_rl import make_rl_trainer

    torch.cuda.empty_cache()
    trainer = make_rl_trainer(kind, "full", False, folder)
    torch.cuda.synchronize(device)
    before = int(torch.cuda.memory_allocated(device))
    torch.cuda.reset_peak_memory_stats(device)
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    started = time.perf_counter()
    trainer.train()
    torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    peak = int(torch.cuda.max_memory_allocated(device))
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    trace = snapshot["device_traces"][device.index or 0]
    answer = {"kind": kind, "allocated_before_train_bytes": before, "max_memory_allocated_bytes": peak,
              "train_seconds": round(seconds, 1), **live_at_peak(trace, before)}
    del trainer
    torch.cuda.empty_cache()
    return answer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--trainers", default="grpo_lora,dpo_lora,grpo")
    parser.add_argument("--deadline", type=float, default=150.0, help="no trainer starts after these seconds")
    args = parser.parse_args(argv)
    from benchmarks import common

    common.quiet()
    device = torch.device("cuda", torch.cuda.current_device())
    started = time.perf_counter()
    results: dict[str, Any] = {"probe": "gpu_rl_peak_probe", "gpu": torch.cuda.get_device_name(device),
                               "torch": torch.__version__, "trainers": {}}
    out = Path(args.out) / "gpu_rl_peak_probe.json"
    with tempfile.TemporaryDirectory(prefix="memlab-rl-probe-") as folder:
        for kind in args.trainers.split(","):
            if time.perf_counter() - started > args.deadline:
                results["trainers"][kind] = {"status": "not started: past the deadline"}
                continue
            try:
                results["trainers"][kind] = probe(kind, folder, device)
            except Exception as error:  # noqa: BLE001 - reported, the next trainer still runs
                results["trainers"][kind] = {"status": "error", "error": f"{type(error).__name__}: {error}"[:600]}
            out.write_text(json.dumps(results, indent=1))
            row = results["trainers"][kind]
            print(kind, {key: row.get(key) for key in ("allocated_before_train_bytes", "max_memory_allocated_bytes",
                                                       "peak_in_trace_bytes", "peak_at", "error")}, flush=True)
            for holder in row.get("holders", [])[:12]:
                print(f"    {holder['bytes'] / 2**20:10.1f} MiB {holder['blocks']:6d}  {holder['where']}", flush=True)


if __name__ == "__main__":
    main()
