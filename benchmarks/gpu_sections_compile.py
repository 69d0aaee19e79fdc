"""Issue 69's compiled step on a GPU (the ``compile`` part of :mod:`benchmarks.gpu_acceptance`): a user's own loop on
a Qwen2-0.5B shape (fp32 weights, bf16 autocast, fused AdamW, 2 x 1,024 tokens at ``--full``), eager and with
``model = torch.compile(model)``, each in a process of its own, its steady-state ``max_memory_allocated`` and
``max_memory_reserved`` against ``memlab.estimate`` of the same step made as on a laptop (a process that sees no GPU
and no Triton) for this GPU kind.

On an H100 (2026-11-26) the compiled loop held 10.6 GiB where memlab, estimating it as the eager step, said 13.1
(1.235 allocated, 1.374 reserved). The estimate now runs the compiled step's AOTAutograd partition on fake tensors
(:mod:`memlab.techniques.compile`), with the pointwise values inductor computes inside the kernels that read them
left uncounted: for that step on this project's CPU for an H100, 12.95 GB against the eager 14.09 GB, 1.14 of the
10.6 GiB measured (13.50 GB, 1.19, with the partition's operators run one by one). What it still leaves out (the
buffers inductor reuses, the kernels it picks) is not found; until it is, this part's compiled checks are expected to
fail, and it says by how much. float8 (torchao) is not measured here (the ``fp8`` part measures it eagerly).

``compile_families`` (issue 86) runs the same comparison on two more families, each its own user's loop, eager and
compiled: Llama-3.2-1B's shape (grouped-query attention, a tied head; 2 x 1,024) and GPT-2 (124M: learned positions,
fused qkv, GELU; 4 x 1,024), the estimates of both made in one laptop's process.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import gc
import json
import sys
import time
from typing import Any

import torch

from benchmarks import common
from benchmarks.gpu_common import (
    LLAMA_1B,
    QWEN2_05B,
    SIZES,
    TINY,
    Checks,
    Llama,
    build_llama,
    gpu_kind_name,
    in_fresh_process,
    is_cuda,
    ratio,
    token_batch,
    within,
)

SHAPES = {"smoke": SIZES["smoke"]["rl"]["shape"], "small": SIZES["small"]["rl"]["shape"],
          "full": QWEN2_05B.replace(rows=2, length=1024)}
"""The Qwen2 model and batch of each size: at ``--full`` the shape and batch of the H100 run the issue quotes."""
FAMILY_SHAPES: dict[str, dict[str, Llama]] = {
    "qwen2": SHAPES,
    "llama": {"smoke": TINY.replace(rows=2), "small": TINY, "full": LLAMA_1B.replace(rows=2, length=1024)},
    # GPT-2's fields in Llama's names: 12 layers of 768, 12 heads, 3072 in the MLP, 50257 tokens, 1024 positions.
    "gpt2": {"smoke": TINY.replace(rows=2), "small": TINY,
             "full": Llama(hidden=768, layers=12, heads=12, kv_heads=12, intermediate=3072, vocab=50257, rows=4,
                           length=1024, tie=True)},
}
"""Each family's model and batch by size (``compile`` runs Qwen2, ``compile_families`` Llama and GPT-2)."""
FAMILIES = ("llama", "gpt2")
"""The families of ``compile_families``."""
VARIANTS = ("eager", "compiled")
TOLERANCE = 0.05
"""Issue 69: the compiled step's estimate within 5% of the compiled loop, allocated and reserved."""
STEPS = 3
"""Steps of the user's loop; the peaks are read over those after the first (compiling and warming the reserve)."""
CPU_GPU = "H100-80GB"
"""The GPU kind estimated for on the CPU (no GPU to name)."""


def family_model(family: str, shape: Llama, device: torch.device) -> Any:
    """``family``'s causal LM of ``shape`` in fp32 with random weights, made on ``device``."""
    from benchmarks.gpu_sections_rl import qwen2

    if family == "qwen2":
        return qwen2(shape, cpu=not is_cuda(device))
    if family == "llama":
        return build_llama(shape, device)
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_embd=shape.hidden, n_layer=shape.layers, n_head=shape.heads, n_inner=shape.intermediate,
                        vocab_size=shape.vocab, n_positions=max(1024, shape.length))
    torch.manual_seed(0)
    with torch.device(device):
        return GPT2LMHeadModel(config)


def user_loop(shape: Llama, variant: str, device: torch.device, family: str = "qwen2") -> dict[str, Any]:
    """The loop a user writes, no memlab in it: its peaks over the steps after the first (None on the CPU)."""
    model: Any = family_model(family, shape, device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=is_cuda(device))
    if variant == "compiled":
        model = torch.compile(model)
    batch = token_batch(shape.vocab, shape.rows, shape.length, device)
    started = time.perf_counter()
    for step in range(STEPS):
        if step == 1 and is_cuda(device):
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if not is_cuda(device):
        return {"allocated_bytes": None, "reserved_bytes": None, "seconds": round(time.perf_counter() - started, 1)}
    torch.cuda.synchronize(device)
    return {"allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
            "reserved_bytes": int(torch.cuda.max_memory_reserved(device)),
            "seconds": round(time.perf_counter() - started, 1)}


def user_loop_here(request: str) -> None:
    """:func:`user_loop` in a process of its own (``in_fresh_process``): prints its answer as one JSON line."""
    asked = json.loads(request)
    common.quiet()
    family = asked.get("family", "qwen2")
    answer = user_loop(FAMILY_SHAPES[family][asked["size"]], asked["variant"], torch.device(asked["device"]), family)
    print(json.dumps({"status": "ok", **answer}), flush=True)


def estimates(size: str, gpu: str, family: str = "qwen2") -> dict[str, Any]:
    """``memlab.estimate`` of both variants' step for ``gpu``, the model built on the CPU."""
    import memlab

    shape = FAMILY_SHAPES[family][size]
    model = family_model(family, shape, torch.device("cpu"))
    batch = token_batch(shape.vocab, shape.rows, shape.length, torch.device("cpu"))
    made: dict[str, Any] = {}
    for variant in VARIANTS:
        plan = memlab.Plan(precision="bf16", compile=variant == "compiled")
        started = time.perf_counter()
        try:
            trial = memlab.estimate(model, batch, plan, device="cuda", gpu=gpu)
        except Exception as error:  # noqa: BLE001 - reported as that variant's failed estimate
            made[variant] = {"status": "error", "error": f"{type(error).__name__}: {str(error)[:400]}"}
            continue
        made[variant] = {"status": trial.status, "error": trial.error, "peak_bytes": trial.peak_bytes,
                         "reserved_bytes": getattr(trial, "reserved_bytes", None),
                         "note": next((note for note in trial.notes if note.startswith("compile:")), None),
                         "seconds": round(time.perf_counter() - started, 1)}
    del model
    gc.collect()
    return made


def laptop_estimates(request: str) -> None:
    """:func:`estimates` in a process that sees no GPU and no Triton: prints one JSON line."""
    asked = json.loads(request)
    common.quiet()
    families = asked.get("families")
    if families is None:
        answer = {"status": "ok", "cuda_available": torch.cuda.is_available(), **estimates(asked["size"], asked["gpu"])}
    else:
        answer = {"status": "ok", "cuda_available": torch.cuda.is_available(),
                  "families": {family: estimates(asked["size"], asked["gpu"], family) for family in families}}
    print(json.dumps(answer, default=common._jsonable), flush=True)


def section_compile(size: str, device: torch.device) -> dict[str, Any]:
    """Both variants measured in a user's loop and estimated as on a laptop; on the CPU (the suite's run) the loop
    and the estimates run here and only the estimates are judged (made, and the compiled one partitioned)."""
    checks = Checks()
    gpu = (gpu_kind_name(torch.cuda.get_device_name(device)) if is_cuda(device) else CPU_GPU) or CPU_GPU
    shape = SHAPES[size]
    measured: dict[str, Any] = {}
    if is_cuda(device):
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            laptop = pool.submit(in_fresh_process, "benchmarks.gpu_sections_compile:laptop_estimates",
                                 {"size": size, "gpu": gpu}, 120, env=LAPTOP_ENV, hide=("triton",))
            for variant in VARIANTS:
                measured[variant] = in_fresh_process("benchmarks.gpu_sections_compile:user_loop_here",
                                                     {"size": size, "variant": variant, "device": str(device)}, 120)
            made = laptop.result()
    else:
        for variant in VARIANTS:
            measured[variant] = {"status": "ok", **user_loop(shape, variant, device)}
        made = {"status": "ok", "cuda_available": False, **estimates(size, gpu)}
    if made.get("status") == "error":
        checks.add("the laptop's estimates were made", False, error=made.get("error"))
    judge_family(checks, "", measured, made, device)
    return {"model": {"family": "qwen2", **dataclasses.asdict(shape)}, "estimated_for": gpu, "steps": STEPS,
            "measured": measured, "estimates": made, "checks": checks.items}


def section_compile_families(size: str, device: torch.device) -> dict[str, Any]:
    """:func:`section_compile` on each of :data:`FAMILIES`: its loops, eager and compiled, and the estimates of all
    of them made in one laptop's process."""
    checks = Checks()
    gpu = (gpu_kind_name(torch.cuda.get_device_name(device)) if is_cuda(device) else CPU_GPU) or CPU_GPU
    measured: dict[str, dict[str, Any]] = {family: {} for family in FAMILIES}
    if is_cuda(device):
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            laptop = pool.submit(in_fresh_process, "benchmarks.gpu_sections_compile:laptop_estimates",
                                 {"size": size, "gpu": gpu, "families": list(FAMILIES)}, 200, env=LAPTOP_ENV,
                                 hide=("triton",))
            for family in FAMILIES:
                for variant in VARIANTS:
                    measured[family][variant] = in_fresh_process(
                        "benchmarks.gpu_sections_compile:user_loop_here",
                        {"size": size, "variant": variant, "device": str(device), "family": family}, 120)
            made = laptop.result()
    else:
        for family in FAMILIES:
            measured[family]["eager"] = {"status": "ok", **user_loop(FAMILY_SHAPES[family][size], "eager", device,
                                                                     family)}
            # Inductor's CPU build of the compiled loop took minutes on a 2-core CPU, for peaks that are CUDA figures:
            # on the CPU only the compiled step's estimate runs (the code this part exercises there).
            measured[family]["compiled"] = {"status": "skipped", "why": "a compiled loop's peaks are CUDA figures"}
        made = {"status": "ok", "cuda_available": False,
                "families": {family: estimates(size, gpu, family) for family in FAMILIES}}
    if made.get("status") == "error":
        checks.add("the laptop's estimates were made", False, error=made.get("error"))
    families = {}
    for family in FAMILIES:
        estimated = (made.get("families") or {}).get(family) or {}
        judge_family(checks, f"{family} ", measured[family], estimated, device)
        families[family] = {"model": dataclasses.asdict(FAMILY_SHAPES[family][size]), "measured": measured[family],
                            "estimates": estimated}
    return {"estimated_for": gpu, "steps": STEPS, "families": families, "cuda_available": made.get("cuda_available"),
            "checks": checks.items}


LAPTOP_ENV = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "8", "MKL_NUM_THREADS": "8"}
"""The laptop's process: no GPU, half a 16-core GPU machine's threads (the loops beside it launch their kernels from
the CPU)."""


def judge_family(checks: Checks, prefix: str, measured: dict[str, Any], made: dict[str, Any],
                 device: torch.device) -> None:
    """The checks of one family's two variants (their labels after ``prefix``): each estimate made, the compiled one
    partitioned, its peaks against the loop's on a GPU."""
    from memlab.techniques.compile import ESTIMATED_PARTITIONED

    for variant in VARIANTS:
        loop, estimate = measured.get(variant) or {}, made.get(variant) or {}
        if loop.get("status") == "error":
            checks.add(f"{prefix}{variant}: the user's loop ran", False, error=loop.get("error"))
        checks.add(f"{prefix}{variant}: memlab.estimate made as on a laptop", estimate.get("status") == "ok",
                   error=estimate.get("error"), note=estimate.get("note"))
        if variant == "compiled":
            checks.add(f"{prefix}compiled: the estimate ran the compiled step's partition, not the eager step",
                       estimate.get("note") == ESTIMATED_PARTITIONED, note=estimate.get("note"))
        for figure, against in (("peak_bytes", "allocated_bytes"), ("reserved_bytes", "reserved_bytes")):
            ours, theirs = estimate.get(figure), loop.get(against)
            checks.add(f"{prefix}{variant}: the estimate's {figure} within {TOLERANCE:.0%} of the user's loop's "
                       f"max_memory_{against.removesuffix('_bytes')}",
                       within(ours, theirs, TOLERANCE) if is_cuda(device) else None,
                       memlab=ours, reference=theirs, ratio=ratio(ours, theirs))


if __name__ == "__main__":
    print(json.dumps(section_compile(sys.argv[1] if len(sys.argv) > 1 else "smoke", torch.device("cpu")),
                     default=common._jsonable)[:2000])
