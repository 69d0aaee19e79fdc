"""The ``fp8`` part of the GPU acceptance run (issue 86; see :mod:`benchmarks.gpu_acceptance`): pure bf16 training
with torchao's float8 linear layers, the card figure of ``memlab.estimate`` made as on a laptop against a user's own
loop.

On Llama-3.2-1B's shape (2 x 2,048 tokens at ``--full``; the tiny Llama at the CPU sizes), three rows: pure bf16
weights (``Plan(weights="bf16")``), the same with ``fp8=True``, and with checkpointing too. Each row's reference is
the loop a user writes, in a process of its own: the model made in bf16 directly (``from_config(..., dtype=...)``),
torchao's ``convert_to_float8_training`` on the linear layers accelerate's filter takes (dimensions divisible by 16,
neither the first nor the last linear layer), transformers' checkpointing where the row has it, fused AdamW, three
steps; read over the whole program: ``max_memory_allocated``, ``max_memory_reserved`` and the CUDA context (what the
driver says is used, less what the allocator reserves). Beside it, ``memlab.estimate`` of the same config and plan for
this GPU kind, made in a process that sees no GPU and no Triton, and ``memlab.measure`` of the float8 row in a fresh
process. Checks (GPU only): the estimate's card figure within 5% of the loop's reserved peak + context (issue 86's
bar), its allocated peak within 5% of the loop's; memlab's measured peak within 2% of the loop's.

On the CPU (the suite's smoke run) the loop runs without float8 (torchao's float8 matmuls run on CUDA GPUs of compute
capability 8.9 or newer), ``measure`` of the float8 row must be an error trial that says so, and the estimates are
made where torchao is installed (else not judged, with why).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import time
from typing import Any

import torch
from torch import nn

from benchmarks import common
from benchmarks.gpu_common import (
    LLAMA_1B,
    TINY,
    Checks,
    Llama,
    adamw_steps,
    card_reading,
    gpu_kind_name,
    in_fresh_process,
    is_cuda,
    missing,
    ratio,
    token_batch,
    within,
)

SHAPES = {"smoke": TINY, "small": TINY, "full": LLAMA_1B.replace(rows=2, length=2048)}
ROWS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("pure bf16", {"weights": "bf16"}),
    ("pure bf16 + fp8", {"weights": "bf16", "fp8": True}),
    ("pure bf16 + fp8 + checkpointing", {"weights": "bf16", "fp8": True, "checkpointing": True}),
)
MEASURED_ROW = "pure bf16 + fp8"
"""The row ``memlab.measure`` runs too (a live float8 trial)."""
CARD_TOLERANCE = 0.05
ALLOCATED_TOLERANCE = 0.05
MEASURED_TOLERANCE = 0.02
STEPS = 3
CPU_GPU = "H100-80GB"
"""The GPU kind estimated for on the CPU (no GPU to name)."""
FLOAT8_CAPABILITY = (8, 9)


def float8_here(device: torch.device) -> str | None:
    """Why torchao's float8 training cannot run on ``device`` (None where it can)."""
    if not is_cuda(device):
        return "torchao's float8 matmuls run on CUDA GPUs of compute capability 8.9 or newer, not on the CPU"
    if torch.cuda.get_device_capability(device) < FLOAT8_CAPABILITY:
        return f"{torch.cuda.get_device_name(device)} is older than compute capability 8.9"
    return missing("torchao")


def build(shape: Llama, device: torch.device) -> Any:
    """The Llama of ``shape`` made in bf16 directly on ``device``, as a user loads a bf16 checkpoint."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(shape.config(), dtype=torch.bfloat16)


def to_float8(model: nn.Module) -> int:
    """torchao's float8 training on the linear layers accelerate's default filter takes (both dimensions divisible
    by 16, neither the first nor the last linear layer), written here as a user writes it: the layers converted."""
    from torchao.float8 import convert_to_float8_training

    linears = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    kept = {linears[0], linears[-1]}

    def take(module: nn.Module, name: str) -> bool:
        return (name not in kept and isinstance(module, nn.Linear) and module.in_features % 16 == 0
                and module.out_features % 16 == 0)

    taken = sum(take(module, name) for name, module in model.named_modules())
    convert_to_float8_training(model, module_filter_fn=take)
    return taken


def user_loop(shape: Llama, fields: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """The row's loop, no memlab in it: its peaks over the whole program (None on the CPU) and the layers made
    float8."""
    model = build(shape, device)
    converted = to_float8(model) if fields.get("fp8") else 0
    if fields.get("checkpointing"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    batch = token_batch(shape.vocab, shape.rows, shape.length, device)
    figures: dict[str, Any] = {"converted_layers": converted, "seconds": adamw_steps(model, batch, STEPS, device)}
    if is_cuda(device):
        figures["allocated_bytes"] = int(torch.cuda.max_memory_allocated(device))
        figures.update(card_reading(device))
    return figures


def user_loop_here(request: str) -> None:
    """:func:`user_loop` in a process of its own (``in_fresh_process``): prints its answer as one JSON line."""
    asked = json.loads(request)
    common.quiet()
    answer = user_loop(SHAPES[asked["size"]], asked["fields"], torch.device(asked["device"]))
    print(json.dumps({"status": "ok", **answer}), flush=True)


def measure_row(shape: Llama, fields: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """``memlab.measure`` of the row on the model made as the loop makes it (its figures as memlab reports them)."""
    import memlab

    model = build(shape, device)
    batch = token_batch(shape.vocab, shape.rows, shape.length, device)
    trial = memlab.measure(model, batch, memlab.Plan(**fields), steps=1, warmup=1, noise=0, progress=False)
    return {"status": trial.status, "error": trial.error, "peak_bytes": trial.peak_bytes,
            "reserved_bytes": trial.reserved_bytes, "card_bytes": trial.card_bytes}


def measure_row_here(request: str) -> None:
    """:func:`measure_row` in a process of its own: prints its answer as one JSON line."""
    asked = json.loads(request)
    common.quiet()
    answer = measure_row(SHAPES[asked["size"]], asked["fields"], torch.device(asked["device"]))
    print(json.dumps({"answered": "ok", **answer}), flush=True)


def estimates(size: str, gpu: str) -> dict[str, Any]:
    """``memlab.estimate`` of every row for ``gpu`` from the config (fake tensors), by row."""
    import memlab

    shape = SHAPES[size]
    shapes = {"input_ids": (shape.rows, shape.length), "labels": (shape.rows, shape.length)}
    made: dict[str, Any] = {}
    for name, fields in ROWS:
        started = time.perf_counter()
        try:
            trial = memlab.estimate(shape.config(), shapes, memlab.Plan(**fields), device="cuda", gpu=gpu)
        except Exception as error:  # noqa: BLE001 - reported as that row's failed estimate
            made[name] = {"status": "error", "error": f"{type(error).__name__}: {str(error)[:400]}"}
            continue
        ok = trial.status == "ok"  # an error trial's figures are no estimate
        made[name] = {"status": trial.status, "error": trial.error, "peak_bytes": trial.peak_bytes if ok else None,
                      "reserved_bytes": trial.reserved_bytes if ok else None,
                      "context_bytes": trial.context_bytes if ok else None,
                      "card_bytes": trial.card_bytes if ok else None,
                      "notes": [n for n in trial.notes if n.startswith("fp8")],
                      "seconds": round(time.perf_counter() - started, 1)}
    return made


def laptop_estimates(request: str) -> None:
    """:func:`estimates` in a process that sees no GPU and no Triton: prints one JSON line."""
    asked = json.loads(request)
    common.quiet()
    answer = {"status": "ok", "cuda_available": torch.cuda.is_available(), "rows": estimates(asked["size"],
                                                                                             asked["gpu"])}
    print(json.dumps(answer, default=common._jsonable), flush=True)


def section_fp8(size: str, device: torch.device) -> dict[str, Any]:
    """Each row's loop beside its laptop-made estimate and, for the float8 row, ``memlab.measure``."""
    checks = Checks()
    shape = SHAPES[size]
    gpu = (gpu_kind_name(torch.cuda.get_device_name(device)) if is_cuda(device) else CPU_GPU) or CPU_GPU
    cannot = float8_here(device)
    loops: dict[str, Any] = {}
    if is_cuda(device):
        threads = "8"  # half a 16-core GPU machine: the loops beside it launch their kernels from the CPU
        env = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            laptop = pool.submit(in_fresh_process, "benchmarks.gpu_sections_fp8:laptop_estimates",
                                 {"size": size, "gpu": gpu}, 150, env=env, hide=("triton",))
            for name, fields in ROWS:
                if fields.get("fp8") and cannot:
                    loops[name] = {"status": "skipped", "why": cannot}
                    continue
                loops[name] = in_fresh_process("benchmarks.gpu_sections_fp8:user_loop_here",
                                               {"size": size, "fields": fields, "device": str(device)}, 90)
            measured = in_fresh_process("benchmarks.gpu_sections_fp8:measure_row_here",
                                        {"size": size, "fields": dict(ROWS)[MEASURED_ROW], "device": str(device)}, 90)
            made = laptop.result()
    else:
        for name, fields in ROWS:
            loops[name] = ({"status": "skipped", "why": cannot} if fields.get("fp8") and cannot
                           else {"status": "ok", **user_loop(shape, fields, device)})
        measured = {"answered": "ok", **measure_row(shape, dict(ROWS)[MEASURED_ROW], device)}
        made = {"status": "ok", "cuda_available": False, "rows": estimates(size, gpu)}
    if made.get("status") != "ok":
        checks.add("the laptop's estimates were made", False, error=made.get("error"))
    no_torchao = missing("torchao")
    rows = []
    for name, fields in ROWS:
        loop, estimate = loops[name], (made.get("rows") or {}).get(name) or {}
        row = {"row": name, "plan_fields": fields, "loop": loop, "estimate": estimate,
               "card_estimate_over_measured": ratio(estimate.get("card_bytes"), loop.get("card_bytes")),
               "estimate_over_allocated": ratio(estimate.get("peak_bytes"), loop.get("allocated_bytes"))}
        rows.append(row)
        if loop.get("status") == "error":
            checks.add(f"{name}: the user's loop ran", False, error=loop.get("error"))
        elif loop.get("status") == "skipped":
            checks.add(f"{name}: the user's loop ran", None, why=loop["why"])
        unjudged = no_torchao if fields.get("fp8") else None
        checks.add(f"{name}: memlab.estimate made as on a laptop",
                   None if unjudged else estimate.get("status") == "ok", error=estimate.get("error"), why=unjudged)
        judged = is_cuda(device) and loop.get("status") == "ok" and estimate.get("status") == "ok"
        checks.add(f"{name}: the estimate's card figure within {CARD_TOLERANCE:.0%} of the loop's max_memory_reserved "
                   "+ CUDA context", within(estimate.get("card_bytes"), loop.get("card_bytes"), CARD_TOLERANCE)
                   if judged else None, memlab=estimate.get("card_bytes"), reference=loop.get("card_bytes"),
                   ratio=row["card_estimate_over_measured"])
        checks.add(f"{name}: the estimate's peak within {ALLOCATED_TOLERANCE:.0%} of the loop's max_memory_allocated",
                   within(estimate.get("peak_bytes"), loop.get("allocated_bytes"), ALLOCATED_TOLERANCE)
                   if judged else None, memlab=estimate.get("peak_bytes"), reference=loop.get("allocated_bytes"),
                   ratio=row["estimate_over_allocated"])
    loop = loops[MEASURED_ROW]
    if cannot:  # a live float8 trial where float8 cannot run is an error trial that says why
        checks.add(f"{MEASURED_ROW}: memlab.measure where float8 cannot run is an error trial that says so",
                   measured.get("status") == "error" and "fp8" in (measured.get("error") or ""),
                   status=measured.get("status"), error=measured.get("error"))
    else:
        checks.add(f"{MEASURED_ROW}: memlab.measure's peak within {MEASURED_TOLERANCE:.0%} of the loop's "
                   "max_memory_allocated", within(measured.get("peak_bytes"), loop.get("allocated_bytes"),
                                                  MEASURED_TOLERANCE) if measured.get("status") == "ok" else False,
                   memlab=measured.get("peak_bytes"), reference=loop.get("allocated_bytes"),
                   ratio=ratio(measured.get("peak_bytes"), loop.get("allocated_bytes")), error=measured.get("error"))
    return {"model": {"family": "llama", **dataclasses.asdict(shape)}, "estimated_for": gpu, "steps": STEPS,
            "float8": cannot or "runs here", "rows": rows, "measured": measured,
            "laptop": {key: made.get(key) for key in ("status", "error", "cuda_available")}, "checks": checks.items}
