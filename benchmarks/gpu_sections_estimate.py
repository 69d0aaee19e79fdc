"""The estimate section of the GPU acceptance run (see :mod:`benchmarks.gpu_acceptance`): ``memlab.estimate`` made
on fake tensors, in a process that sees no GPU (as a laptop or CI makes it), against the peak measured on the GPU.

Families: GPT-2, BERT, Llama (Llama-3.2-1B's shape), Qwen2 (Qwen2-0.5B's shape) and a small Mixtral (a mixture of
experts); precisions: fp32, bf16 autocast, pure bf16 weights and fp16 (with GradScaler). Each row records, beside the
allocated peak (``max_memory_allocated``, what the estimate predicts), the allocator's reserved peak
(``max_memory_reserved``) and the CUDA context (what the driver says is used, less what the allocator reserves), and
the estimate's own figures for them where this memlab has them (``reserved_bytes``, ``context_bytes``,
``card_bytes``).

The estimates are made first, all at once, by :func:`estimate_all` (the acceptance run starts it in a side process
with ``CUDA_VISIBLE_DEVICES=""`` while the GPU runs other sections, and passes its file in ``MEMLAB_GPU_ESTIMATES``);
without that file the section makes them itself.

One row, the 1B Llama's ``ckpt bf16`` at 2 x 1024, also records the CUDA allocations of 100 MB or more made during
memlab's tracked step (``torch.cuda.memory._record_memory_history``): the first GPU run saw about 5 GB, the size of
the parameters, in the "other" category at the optimizer step, which the CPU-made estimate misses.
"""

from __future__ import annotations

import inspect
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks import common
from benchmarks.gpu_common import (
    LLAMA_1B,
    SIZES,
    TINY,
    Checks,
    Llama,
    card_figures,
    card_reading,
    fresh_peaks,
    is_cuda,
    plan_fields,
    ratio,
    release,
    token_batch,
    within,
)

ESTIMATES_ENV = "MEMLAB_GPU_ESTIMATES"
DIAGNOSED = ("llama", "ckpt bf16")
"""The row whose tracked step's large allocations are recorded."""
LARGE = 100 * 10**6
"""Allocations at least this large are listed by the diagnostic."""

FP32, BF16, PURE_BF16, FP16 = {}, {"precision": "bf16"}, {"weights": "bf16"}, {"precision": "fp16"}
CKPT_BF16 = {"precision": "bf16", "checkpointing": True}


def llama_config(shape: Llama) -> dict[str, Any]:
    """A Llama shape's config as ``model_type`` and keyword arguments (what ``benchmarks.cuda_truth`` stores)."""
    return {
        "model_type": "llama", "hidden_size": shape.hidden, "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads, "vocab_size": shape.vocab,
        "max_position_embeddings": max(2048, shape.length), "tie_word_embeddings": shape.tie,
    }


def families(scale: str) -> list[dict[str, Any]]:
    """The models of the section: config (``model_type`` and keywords), class, batch (rows, length) and plans."""
    if scale == "full":
        return [
            {"name": "gpt2", "config": {"model_type": "gpt2"}, "architecture": "GPT2LMHeadModel", "batch": (4, 1024),
             "plans": [FP32, BF16, PURE_BF16, FP16]},
            {"name": "llama", "config": llama_config(LLAMA_1B), "architecture": "LlamaForCausalLM",
             "batch": (2, 1024), "plans": [FP32, BF16, PURE_BF16, FP16, CKPT_BF16]},
            {"name": "bert", "config": {"model_type": "bert", "hidden_size": 1024, "num_hidden_layers": 24,
                                        "num_attention_heads": 16, "intermediate_size": 4096},
             "architecture": "BertForMaskedLM", "batch": (4, 512), "plans": [FP32, BF16, FP16]},
            # Qwen2-0.5B's shape: 24 layers of 896, 14 heads over 2 KV heads, 151936 tokens, tied head.
            {"name": "qwen2", "config": {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
                                         "num_hidden_layers": 24, "num_attention_heads": 14,
                                         "num_key_value_heads": 2, "vocab_size": 151936,
                                         "max_position_embeddings": 2048, "tie_word_embeddings": True},
             "architecture": "Qwen2ForCausalLM", "batch": (4, 1024), "plans": [FP32, BF16, PURE_BF16]},
            # A small Mixtral: 8 layers of 1024, 8 experts of 2048, 2 per token (about 0.45B parameters).
            {"name": "mixtral", "config": {"model_type": "mixtral", "hidden_size": 1024, "intermediate_size": 2048,
                                           "num_hidden_layers": 8, "num_attention_heads": 16,
                                           "num_key_value_heads": 8, "num_local_experts": 8,
                                           "num_experts_per_tok": 2, "vocab_size": 32000,
                                           "max_position_embeddings": 2048},
             "architecture": "MixtralForCausalLM", "batch": (2, 1024), "plans": [FP32, BF16]},
        ]
    small = {"vocab_size": 256, "max_position_embeddings": 128}
    # The tiny sizes exercise the code: every family, a precision or two each (the precisions are memlab's tests').
    return [
        {"name": "gpt2", "config": {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 256,
                                    "n_positions": 128},
         "architecture": "GPT2LMHeadModel", "batch": (2, 32), "plans": [FP32, FP16]},
        {"name": "llama", "config": llama_config(TINY), "architecture": "LlamaForCausalLM", "batch": (2, 32),
         "plans": [FP32, CKPT_BF16]},
        {"name": "bert", "config": {"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2,
                                    "num_attention_heads": 2, "intermediate_size": 128, **small},
         "architecture": "BertForMaskedLM", "batch": (2, 32), "plans": [FP32]},
        {"name": "qwen2", "config": {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
                                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                     "tie_word_embeddings": True, **small},
         "architecture": "Qwen2ForCausalLM", "batch": (2, 32), "plans": [PURE_BF16]},
        {"name": "mixtral", "config": {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128,
                                       "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                       "num_local_experts": 4, "num_experts_per_tok": 2, **small},
         "architecture": "MixtralForCausalLM", "batch": (2, 32), "plans": [BF16]},
    ]


def make_config(family: dict[str, Any]) -> Any:
    """The transformers config of a family, its class named in ``architectures`` (as ``cuda_truth``'s test)."""
    from transformers import AutoConfig

    fields = dict(family["config"])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    config.architectures = [family["architecture"]]
    return config


def make_model(family: dict[str, Any], device: torch.device) -> nn.Module:
    import transformers

    torch.manual_seed(0)
    with torch.device(device):
        model: nn.Module = getattr(transformers, family["architecture"])(make_config(family))
    return model


def batch_shapes(family: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """The shapes of the batch measured (:func:`benchmarks.gpu_common.token_batch`): ids, mask and labels."""
    rows, length = family["batch"]
    return {"input_ids": (rows, length), "attention_mask": (rows, length), "labels": (rows, length)}


def row_id(family: dict[str, Any], plan: Any) -> str:
    return f"{family['name']} {plan.label()}"


def gpu_kind_name(device_name: str | None) -> str | None:
    """memlab's name of the GPU kind torch calls ``device_name`` (for ``estimate(gpu=...)``), where this memlab
    knows that kind; else None."""
    from memlab.estimation.gpus import GPUS

    return next((name for name, kind in GPUS.items() if device_name and kind.device_name == device_name), None)


def estimate_one(family: dict[str, Any], plan: Any, device: str, gpu: str | None) -> dict[str, Any]:
    """One estimate's figures (and how long it took)."""
    import memlab

    keywords: dict[str, Any] = {"device": device}
    if gpu is not None and "gpu" in inspect.signature(memlab.estimate).parameters:
        keywords["gpu"] = gpu
    started = time.perf_counter()
    try:
        trial = memlab.estimate(make_config(family), batch_shapes(family), plan, **keywords)
    except Exception as error:  # noqa: BLE001 - a failed estimate is a row that says why
        return {"status": "error", "error": f"{type(error).__name__}: {error}"[:500], "peak_bytes": None}
    return {
        "status": trial.status, "error": trial.error, "peak_bytes": trial.peak_bytes,
        "breakdown": dict(trial.breakdown), **card_figures(trial), "notes": list(trial.notes),
        "seconds": round(time.perf_counter() - started, 2), "gpu": keywords.get("gpu"),
    }


def estimate_all(request: str) -> None:
    """Every estimate of the section, into the file ``request["out"]`` (``{row id: figures}``): run in a process
    that sees no GPU, so that the estimates are the CPU-made ones."""
    from memlab import Plan

    common.quiet()
    asked = json.loads(request)
    made = {
        row_id(family, Plan(**fields)): estimate_one(family, Plan(**fields), asked["device"], asked.get("gpu"))
        for family in families(asked["scale"]) for fields in family["plans"]
    }
    made["_made_on"] = {"cuda_visible": torch.cuda.is_available(),  # type: ignore[dict-item]
                        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}
    Path(asked["out"]).write_text(json.dumps(made, default=common._jsonable))


def _made_estimates(device: torch.device) -> tuple[dict[str, Any], str]:
    path = os.environ.get(ESTIMATES_ENV)
    if path and Path(path).exists():
        return json.loads(Path(path).read_text()), "a side process that saw no GPU (CUDA_VISIBLE_DEVICES='')"
    return {}, f"this process ({device.type})"


def section_estimate(size: str, device: torch.device) -> dict[str, Any]:
    """4. ``estimate`` (fake tensors, from the config, made without the GPU) against the measured peak, for five
    families and four precisions: the allocated peak within 5%, and the card figure (reserved + CUDA context)
    within 5% where the estimate gives one."""
    import memlab
    from memlab import Plan

    made, made_on = _made_estimates(device)
    gpu = gpu_kind_name(torch.cuda.get_device_name(device) if is_cuda(device) else None)
    checks, rows = Checks(), []
    diagnostic: dict[str, Any] | None = None
    for family in families(SIZES[size]["estimate_scale"]):
        rows_, length = family["batch"]
        model = make_model(family, device)
        batch = token_batch(make_config(family).vocab_size, rows_, length, device)
        for fields in family["plans"]:
            plan = Plan(**fields)
            name = row_id(family, plan)
            estimate = made.get(name) or estimate_one(family, plan, device.type, gpu)
            fresh_peaks(device)
            if (family["name"], plan.label()) == DIAGNOSED and is_cuda(device):
                trial, diagnostic = traced_trial(model, batch, plan, device)
            else:
                trial = memlab.measure(model, batch, plan, steps=1, warmup=1, progress=False, noise=0)
            card = card_reading(device)
            release(device)
            row = {
                "model": family["name"], "config": family["config"], "architecture": family["architecture"],
                "batch_shapes": batch_shapes(family), "plan": plan.label(), "plan_fields": plan_fields(plan),
                "rows": rows_, "length": length,
                "estimate_bytes": estimate["peak_bytes"], "estimate_status": estimate["status"],
                "estimate_error": estimate.get("error"), "estimate_breakdown": estimate.get("breakdown"),
                "estimate_reserved_bytes": estimate.get("reserved_bytes"),
                "estimate_context_bytes": estimate.get("context_bytes"),
                "estimate_card_bytes": estimate.get("card_bytes"), "estimate_s": estimate.get("seconds"),
                "measured_bytes": trial.peak_bytes, "measured_status": trial.status, "measured_error": trial.error,
                "measured_breakdown": dict(trial.breakdown), "trial": card_figures(trial), **card,
                "estimate_over_measured": ratio(estimate["peak_bytes"], trial.peak_bytes),
                "card_estimate_over_measured": ratio(estimate.get("card_bytes"), card["card_bytes"]),
            }
            rows.append(row)
            ran = trial.status == "ok" and estimate["status"] == "ok"
            checks.add(
                f"{name}: estimate within 5% of the measured allocated peak",
                within(estimate["peak_bytes"], trial.peak_bytes, 0.05) if ran else False,
                estimate=estimate["peak_bytes"], measured=trial.peak_bytes, ratio=row["estimate_over_measured"],
                error=trial.error or estimate.get("error"),
            )
            checks.add(
                f"{name}: card estimate within 5% of the measured reserved peak + CUDA context",
                within(estimate.get("card_bytes"), card["card_bytes"], 0.05) if ran else None,
                estimate=estimate.get("card_bytes"), measured=card["card_bytes"],
                why=None if estimate.get("card_bytes") is not None else "this memlab's estimate has no card figure",
            )
        del model, batch
        release(device)
    return {"estimates_made_in": made_on, "estimate_gpu": gpu, "rows": rows, "diagnostic": diagnostic,
            "checks": checks.items}


# --- the diagnostic -----------------------------------------------------------------------------------------------


def traced_trial(model: nn.Module, batch: Any, plan: Any, device: torch.device) -> tuple[Any, dict[str, Any]]:
    """``measure`` with the CUDA allocator's history recorded over the tracked step only (from the end of the
    warm-up to the end of the tracked step): the trial, and the allocations of :data:`LARGE` bytes or more."""
    import memlab
    from memlab.events import StepFinished

    record = torch.cuda.memory._record_memory_history
    state: dict[str, Any] = {"on": False, "snapshot": None}

    def callback(event: Any) -> None:
        if not isinstance(event, StepFinished):
            return
        if event.kind == "warmup" and not state["on"]:
            record(enabled="all", context="alloc", stacks="python", max_entries=200_000, device=device)
            state["on"] = True
        elif event.kind == "tracked" and state["on"]:
            state["snapshot"] = torch.cuda.memory._snapshot(device)
            record(enabled=None, device=device)
            state["on"] = False

    try:
        trial = memlab.measure(model, batch, plan, steps=1, warmup=1, progress=False, noise=0, callback=callback)
    finally:
        if state["on"]:
            record(enabled=None, device=device)
    snapshot = state["snapshot"]
    allocations = large_allocations(snapshot, device) if snapshot is not None else []
    return trial, {
        "row": " ".join(DIAGNOSED), "threshold_bytes": LARGE, "breakdown": dict(trial.breakdown),
        "peak_bytes": trial.peak_bytes, "recorded": snapshot is not None,
        "allocations": allocations,
        "in_optimizer_bytes": sum(a["size"] for a in allocations if a["in_optimizer"] and a["action"] == "alloc"),
    }


def _frame(frame: dict[str, Any]) -> str:
    return f"{Path(str(frame.get('filename', '?'))).name}:{frame.get('line')}:{frame.get('name')}"


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
