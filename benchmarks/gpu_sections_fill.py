"""A section for the GPU acceptance run (see :mod:`benchmarks.gpu_acceptance`): issue 46's levers on CUDA, each
measured beside memlab's CPU-made-style estimate (``memlab.estimate(..., device="cuda")``, fake tensors).

On Llama-3.2-1B's shape (the tiny Llama at the smoke size), bf16 autocast:
- selective checkpointing: ``checkpointing`` = 0, half the blocks, every block: the measured peak (on CUDA the
  tracked step's ``max_memory_allocated``) against the estimate (5%), and the activations falling as k grows;
- the attention lever: eager, sdpa and flash_attention_2 (where flash-attn is installed; else an error trial that
  says what to install) at two sequence lengths: measured against the estimate (5%), eager above sdpa;
- ``memlab.limits``: the longest sequences the checkpointed plan fits in a budget, measured (steps capped at the
  budget, each out-of-memory recovered) against the dry-run answer: within one step (64 tokens) of each other.
Run it alone with ``python -m benchmarks.gpu_sections_fill [--smoke]``; the suite runs it at the smoke size on the CPU.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from benchmarks.gpu_common import LLAMA_1B, TINY, Checks, build_llama, is_cuda, ratio, release, timing, within


def section_fill(size: str, device: torch.device) -> dict[str, Any]:
    """Selective checkpointing, the attention lever and limits: measured against the estimate."""
    import memlab

    shape = LLAMA_1B.replace(rows=2, length=1024) if size == "full" else TINY
    model = build_llama(shape, device)
    config = shape.config()
    checks, rows = Checks(), []

    def batch(length: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, shape.vocab, (shape.rows, length), device=device,
                            generator=torch.Generator(device=device).manual_seed(1))
        return {"input_ids": ids, "labels": ids}

    def shapes(length: int) -> dict[str, tuple[int, int]]:
        return {"input_ids": (shape.rows, length), "labels": (shape.rows, length)}

    def row(kind: str, name: str, plan: Any, length: int) -> dict[str, Any]:
        trial = memlab.measure(model, batch(length), plan, steps=1, warmup=1, **timing(size))
        release(device)
        estimate = memlab.estimate(config, shapes(length), plan, device="cuda")
        entry = {"kind": kind, "plan": name, "tokens": length, "status": trial.status, "error": trial.error,
                 "measured_bytes": trial.peak_bytes, "estimated_bytes": estimate.peak_bytes,
                 "estimate_over_measured": ratio(estimate.peak_bytes, trial.peak_bytes),
                 "measured_activations": trial.breakdown.get("activations"),
                 "estimated_activations": estimate.breakdown.get("activations")}
        rows.append(entry)
        return entry

    bf16 = memlab.Plan(precision="bf16")
    half = max(1, shape.layers // 2)
    activations = []
    for k in (False, half, True):
        entry = row("checkpointing", f"bf16 checkpointing={k}", bf16.replace(checkpointing=k), shape.length)
        checks.add(f"checkpointing={k}: measured", entry["status"] == "ok", error=entry["error"])
        checks.add(f"checkpointing={k}: estimate within 5% of the measured peak on CUDA",
                   within(entry["estimated_bytes"], entry["measured_bytes"], 0.05) if is_cuda(device) else None,
                   ratio=entry["estimate_over_measured"])
        activations.append(entry["measured_activations"] or 0)
    checks.add("activations fall as more blocks are checkpointed", activations[0] > activations[1] > activations[2],
               activations=activations)

    flash = importlib_spec("flash_attn") and is_cuda(device)
    for length in (shape.length // 2, shape.length):
        peaks = {}
        for kernel in ("eager", "sdpa", "flash_attention_2"):
            entry = row("attention", f"bf16 attention={kernel}", bf16.replace(attention=kernel), length)
            if kernel == "flash_attention_2" and not flash:
                checks.add(f"{kernel} at {length} tokens without flash-attn on CUDA: an error trial saying what to "
                           "install", entry["status"] == "error" and "flash-attn" in (entry["error"] or ""))
                continue
            checks.add(f"{kernel} at {length} tokens: measured", entry["status"] == "ok", error=entry["error"])
            checks.add(f"{kernel} at {length} tokens: estimate within 5% of the measured peak on CUDA",
                       within(entry["estimated_bytes"], entry["measured_bytes"], 0.05) if is_cuda(device) else None,
                       ratio=entry["estimate_over_measured"])
            peaks[kernel] = entry["measured_bytes"]
        checks.add(f"eager holds more than sdpa at {length} tokens", peaks.get("eager", 0) > peaks.get("sdpa", 0),
                   **peaks)

    plan = bf16.replace(checkpointing=True)
    short = memlab.measure(model, batch(shape.length), plan, steps=1, warmup=0, noise=0, progress=False)
    release(device)
    budget = int(short.peak_bytes * 1.5)  # room for longer sequences than the batch's
    measured = memlab.limits(model, plan, budget=budget, batch=batch(shape.length))
    release(device)
    estimated = memlab.limits(config, plan, budget=budget, batch=shapes(shape.length), device="cuda")
    limits = {"budget_bytes": budget, "measured_value": measured.value, "measured_next": measured.next,
              "estimated_value": estimated.value, "estimated_next": estimated.next,
              "measured_tries": len(measured.tried), "estimated_tries": len(estimated.tried)}
    checks.add("limits: measured and estimated answers within one step (64 tokens)",
               abs(measured.value - estimated.value) <= 64 if is_cuda(device) else None, **limits)
    checks.add("limits: each within 8 tries", len(measured.tried) <= 8 and len(estimated.tried) <= 8, **limits)
    return {"model": dataclasses.asdict(shape), "rows": rows, "limits": limits, "checks": checks.items}


def importlib_spec(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the section on the GPU (the CPU with ``--smoke``) and print its JSON."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the tiny Llama on the CPU")
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    result = section_fill("smoke" if args.smoke else "full", device)
    print(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
