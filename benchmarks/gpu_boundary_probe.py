"""Where ``limits``' boundary run went out of memory on an H100: the step of the Qwen2-like boundary model measured
uncapped at the lengths around the answer, against the CPU-made estimate of the same step.

The H100 acceptance run (benchmarks/results/gpu_acceptance-cuda-nvidia-h100-80gb-hbm3.json, part ``fill``) found the
answer of ``memlab.limits`` at an 8 GiB card (1,792 tokens, estimated card 7.94 GB) out of memory under the cap in
memlab's step and a user's own loop. This probe runs the same model and plan (bf16 + checkpointing, one row, fused
AdamW's user loop beside memlab's step) without a cap and writes, per length, memlab's measured peak, reserved peak,
card figure, breakdown and the timeline's peak (phase, module, the largest holders), and the user loop's
``max_memory_allocated`` and ``max_memory_reserved``; the estimates beside them are made on the CPU
(``--estimates``), where CI makes them.

Run from the repository root on a GPU::

    python -m benchmarks.gpu_boundary_probe --out DIR
    python -m benchmarks.gpu_boundary_probe --estimates   # on the CPU: the estimates of the same lengths
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import torch

LENGTHS = (1024, 1536, 1792, 2048)


def _model(device: torch.device) -> tuple[Any, Any]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from benchmarks.gpu_sections_fill import BOUNDARY_MODEL

    config = Qwen2Config(**BOUNDARY_MODEL["full"])
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    return config, model


def measured(device: torch.device, lengths: tuple[int, ...] = LENGTHS) -> list[dict[str, Any]]:
    """Each length's uncapped step: memlab's measure and a user's own loop (which runs on CUDA only)."""
    import memlab
    from benchmarks.gpu_sections_fill import own_loop

    config, model = _model(device)
    plan = memlab.Plan(precision="bf16", checkpointing=True)
    rows: list[dict[str, Any]] = []
    for length in lengths:
        ids = torch.randint(0, config.vocab_size, (1, length), device=device)
        batch = {"input_ids": ids, "labels": ids}
        started = time.perf_counter()
        trial = memlab.measure(model, batch, plan, steps=1, warmup=1, noise=0, progress=False)
        peak = trial.timeline.peak if trial.timeline is not None else None
        cuda = device.type == "cuda"
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        own = own_loop(model, batch, 80 * 2**30, device)
        if cuda:
            torch.cuda.empty_cache()
        rows.append({"tokens": length, "status": trial.status, "error": trial.error, "peak_bytes": trial.peak_bytes,
                     "reserved_bytes": trial.reserved_bytes, "card_bytes": trial.card_bytes,
                     "breakdown": trial.breakdown,
                     "peak": None if peak is None else {key: value for key, value in dataclasses.asdict(peak).items()},
                     "own_loop": own, "seconds": round(time.perf_counter() - started, 1)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def capped(device: torch.device, length: int = 1792) -> dict[str, Any]:
    """The answer's step under the real 8 GiB cap, in a fresh process: a user's loop first, then memlab's step, each
    with the whole out-of-memory message and the allocator's statistics when it ran out."""
    import memlab
    from benchmarks.gpu_sections_fill import BOUNDARY_BUDGET, own_loop
    from memlab.measure.cuda import cuda_context_bytes

    config, model = _model(device)
    ids = torch.randint(0, config.vocab_size, (1, length), device=device)
    batch = {"input_ids": ids, "labels": ids}
    result: dict[str, Any] = {"tokens": length, "context_bytes": cuda_context_bytes(device),
                              "own_loop": own_loop(model, batch, BOUNDARY_BUDGET, device)}
    torch.cuda.empty_cache()
    trial = memlab.measure(model, batch, memlab.Plan(precision="bf16", checkpointing=True), budget=BOUNDARY_BUDGET,
                           steps=1, warmup=1, noise=0, progress=False)
    result["memlab"] = {"status": trial.status, "error": trial.error, "peak_bytes": trial.peak_bytes,
                        "reserved_bytes": trial.reserved_bytes, "card_bytes": trial.card_bytes,
                        "context_bytes": trial.context_bytes, "breakdown": trial.breakdown}
    return result


def estimated() -> list[dict[str, Any]]:
    """Each length's CPU-made estimate for an H100, with its timeline's peak."""
    from transformers import Qwen2Config

    import memlab
    from benchmarks.gpu_sections_fill import BOUNDARY_MODEL

    plan = memlab.Plan(precision="bf16", checkpointing=True)
    config = Qwen2Config(**BOUNDARY_MODEL["full"])
    rows = []
    for length in LENGTHS:
        trial = memlab.estimate(config, {"input_ids": (1, length), "labels": (1, length)}, plan, device="cuda",
                                gpu="H100-80GB")
        peak = trial.timeline.peak if trial.timeline is not None else None
        rows.append({"tokens": length, "status": trial.status, "peak_bytes": trial.peak_bytes,
                     "reserved_bytes": trial.reserved_bytes, "card_bytes": trial.card_bytes,
                     "breakdown": trial.breakdown, "peak": None if peak is None else dataclasses.asdict(peak)})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--estimates", action="store_true", help="the CPU-made estimates instead")
    parser.add_argument("--capped", action="store_true", help="the answer under the real cap, its OOM in full")
    args = parser.parse_args(argv)
    if args.capped:
        found = capped(torch.device("cuda", 0))
        print(json.dumps(found, indent=1))
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "boundary_capped.json").write_text(json.dumps(found, indent=1))
        return
    if args.estimates:
        print(json.dumps(estimated(), indent=1))
        return
    device = torch.device("cuda")
    result = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__, "rows": measured(device)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "boundary_probe.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
