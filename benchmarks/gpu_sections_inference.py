"""The inference section of the GPU acceptance run (see :mod:`benchmarks.gpu_acceptance`).

A Llama-shaped model (Llama-3.2-1B's shape with ``--full``) held in bf16, int8 and NF4 (bitsandbytes' CUDA kernels;
skipped with the reason where bitsandbytes is missing), generating at a short and a long prompt: the peak and its
breakdown, the KV cache read from the cache's own tensors against :func:`memlab.kv_cache_bytes` and against a count
made here by hand, prefill and decode tokens/s; then ``fit_inference``'s largest batch within a budget, measured
again in a fresh process.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import torch
from torch import nn

from benchmarks import common
from benchmarks.gpu_common import (
    SIZES,
    Checks,
    Llama,
    build_llama,
    card_figures,
    in_fresh_process,
    is_cuda,
    missing,
    parameter_count,
    release,
    timing,
    within,
)

WEIGHTS = (("bf16", "none"), ("int8", "int8"), ("nf4", "nf4"))
"""The forms of the weights: (name, ``InferencePlan.quantize``); every one computes in bf16."""


def bf16_llama(shape: Llama, device: torch.device) -> nn.Module:
    """The Llama of ``shape`` held in bf16 from the start (so that a bf16 plan casts nothing)."""
    return build_llama(shape, device).to(torch.bfloat16)


def prompt(shape: Llama, rows: int, length: int, device: torch.device) -> dict[str, torch.Tensor]:
    """``rows`` prompts of ``length`` random tokens (no labels: nothing is trained)."""
    ids = torch.randint(0, shape.vocab, (rows, length), generator=torch.Generator().manual_seed(3))
    return {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device)}


def kv_by_hand(shape: Llama, tokens: int, rows: int) -> int:
    """Keys and values of every layer, kv-head, head dimension, token and row, in bf16 (2 bytes)."""
    return 2 * shape.layers * shape.kv_heads * (shape.hidden // shape.heads) * tokens * rows * 2


def inference_row(trial: Any, shape: Llama, length: int) -> dict[str, Any]:
    from memlab import kv_cache_bytes

    rows = trial.rows_per_step or shape.rows
    tokens = trial.context_tokens
    return {
        "plan": trial.label, "weights": trial.plan.quantize if trial.plan.quantize != "none" else "bf16",
        "prompt_tokens": length, "rows": rows, "status": trial.status, "error": trial.error,
        "peak_bytes": trial.peak_bytes, "breakdown": dict(trial.breakdown), **card_figures(trial),
        "kv_cache_end_bytes": trial.kv_cache_end_bytes, "context_tokens": tokens,
        "kv_cache_bytes_formula": kv_cache_bytes(shape.config(), tokens=tokens, batch=rows, dtype="bf16")
        if tokens else None,
        "kv_cache_bytes_by_hand": kv_by_hand(shape, tokens, rows) if tokens else None,
        "prefill_tokens_per_s": common.rounded(trial.prefill_tokens_per_s, 1),
        "decode_tokens_per_s": common.rounded(trial.decode_tokens_per_s, 1),
        "step_time_s": common.rounded(trial.step_time_s, 5), "notes": list(trial.notes),
    }


def section_inference(size: str, device: torch.device) -> dict[str, Any]:
    """9. Inference in bf16, int8 and NF4 at two prompt lengths: KV cache against the formula, prefill and decode
    speeds; ``fit_inference``'s largest batch re-checked in a fresh process."""
    import memlab
    from memlab import InferencePlan

    spec = SIZES[size]["inference"]
    shape: Llama = spec["shape"]
    model = bf16_llama(shape, device)
    checks, rows = Checks(), []
    quantized = missing("bitsandbytes")
    forms = [(name, quantize) for name, quantize in WEIGHTS if quantize == "none" or quantized is None]
    for name, quantize in WEIGHTS:
        if (name, quantize) not in forms:
            checks.add(f"{name} weights ran", None, why=quantized)
    by_form: dict[tuple[str, int], dict[str, Any]] = {}
    for length in spec["contexts"]:
        batch = prompt(shape, shape.rows, length, device)
        plans = [InferencePlan(weights="bf16", quantize=quantize, new_tokens=spec["new_tokens"])
                 for _, quantize in forms]
        report = memlab.compare(model, batch, plans, steps=SIZES[size]["timed_steps"], warmup=1, **timing(size))
        for (name, _), trial in zip(forms, report.trials, strict=True):
            row = inference_row(trial, shape, length)
            rows.append(row)
            by_form[(name, length)] = row
            label = f"{name}, prompt {length}"
            checks.add(f"{label}: ran", trial.status == "ok", error=trial.error)
            checks.add(
                f"{label}: the KV cache's tensors hold exactly kv_cache_bytes(config, tokens, rows)",
                trial.status == "ok" and row["kv_cache_end_bytes"] == row["kv_cache_bytes_formula"],
                measured=row["kv_cache_end_bytes"], formula=row["kv_cache_bytes_formula"],
            )
            checks.add(
                f"{label}: kv_cache_bytes equals a count by hand (2 x layers x kv-heads x head-dim x tokens x rows "
                "x 2 bytes)",
                row["kv_cache_bytes_formula"] == row["kv_cache_bytes_by_hand"],
                formula=row["kv_cache_bytes_formula"], by_hand=row["kv_cache_bytes_by_hand"],
            )
            checks.add(
                f"{label}: prefill and decode speeds measured",
                bool(trial.prefill_tokens_per_s) and bool(trial.decode_tokens_per_s),
                prefill=row["prefill_tokens_per_s"], decode=row["decode_tokens_per_s"],
            )
        del batch
        release(device)
    short = spec["contexts"][0]
    if quantized is None:
        params = {name: (by_form[(name, short)]["breakdown"].get("params") or 0) for name, _ in forms}
        checks.add("int8 weights hold fewer bytes than bf16, and NF4 fewer than int8 (the head stays bf16)",
                   params["nf4"] < params["int8"] < params["bf16"], **params)
    fitted = fit_largest_batch(model, shape, spec, size, device, by_form[("bf16", short)])
    checks.items += fitted.pop("checks")
    return {"model": {**dataclasses.asdict(shape), "parameters": parameter_count(model), "dtype": "bf16"},
            "new_tokens": spec["new_tokens"], "rows": rows, "fit_inference": fitted, "checks": checks.items}


def fit_largest_batch(model: nn.Module, shape: Llama, spec: dict[str, Any], size: str, device: torch.device,
                      known: dict[str, Any]) -> dict[str, Any]:
    """``fit_inference`` on a budget of twice the peak of ``shape.rows`` rows in bf16 at the short prompt; the
    largest batch it found, measured again in a fresh process under the same budget."""
    from memlab import InferencePlan, fit_inference

    length = spec["contexts"][0]
    budget = int(2 * known["peak_bytes"])
    base = InferencePlan(weights="bf16", new_tokens=spec["new_tokens"])
    report = fit_inference(model, prompt(shape, 1, length, device), base, budget=budget, max_batch=256,
                           steps=SIZES[size]["timed_steps"], warmup=1, **timing(size))
    best = report.best
    checks = Checks()
    checks.add("fit_inference found a batch that fits", best is not None, budget=budget, measured=len(report.trials))
    again: dict[str, Any] = {}
    if best is not None:
        request = {"shape": dataclasses.asdict(shape), "plan": dataclasses.asdict(best.plan), "length": length,
                   "device": str(device), "budget": budget, "steps": SIZES[size]["timed_steps"]}
        again = in_fresh_process("benchmarks.gpu_sections_inference:remeasure_inference", request)
        checks.add(f"the largest batch ({best.rows_per_step}), measured in a fresh process, fits the budget",
                   again.get("status") == "ok" and again.get("fits") is True, fresh=again, budget=budget)
        checks.add("the fresh process's peak is within 2% of fit_inference's",
                   within(again.get("peak_bytes"), best.peak_bytes, 0.02),
                   fresh=again.get("peak_bytes"), fit=best.peak_bytes)
    return {
        "budget_bytes": budget, "prompt_tokens": length, "plan": base.label(),
        "largest_batch": None if best is None else best.rows_per_step,
        "trials": [{"rows": t.rows_per_step, "status": t.status, "peak_bytes": t.peak_bytes, "fits": t.fits,
                    **card_figures(t)} for t in report.trials],
        "fresh_process": again, "checks": checks.items,
    }


def remeasure_inference(request: str) -> None:
    """The fresh process's side: build the same bf16 model and prompt, measure the plan under the budget, print
    the trial's figures as one JSON line."""
    import memlab
    from memlab import InferencePlan

    common.quiet()
    asked = json.loads(request)
    device = torch.device(asked["device"])
    shape = Llama(**asked["shape"])
    model = bf16_llama(shape, device)
    trial = memlab.measure(model, prompt(shape, 1, asked["length"], device), InferencePlan(**asked["plan"]),
                           budget=asked["budget"], steps=asked["steps"], warmup=1, progress=False)
    print(json.dumps({"status": trial.status, "fits": trial.fits, "peak_bytes": trial.peak_bytes,
                      "rows": trial.rows_per_step, "error": trial.error, **card_figures(trial),
                      "on_cuda": is_cuda(device)}))
