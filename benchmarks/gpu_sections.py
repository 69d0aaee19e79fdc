"""The measurements of the GPU acceptance run, one function per section (see :mod:`benchmarks.gpu_acceptance`).

Each section builds its models from configs on the device, runs memlab and an independent reference next to it,
and returns a dict with its figures and a list of ``checks``: ``{"check": what, "passed": True/False/None,
...figures}``, where None means "cannot be judged here" (a CUDA-only figure on the CPU). Every section also runs
on the CPU with ``--smoke`` sizes, so that its code is exercised by the test suite without a GPU.

References are written by hand on purpose: a training step with ``torch.optim.AdamW`` (or bitsandbytes' 8-bit
AdamW), ``torch.autocast`` and ``GradScaler`` as a user would write it, read with ``max_memory_allocated``. They
share no code with memlab's step, so that a bug in memlab's step cannot hide in both.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks import common

ROOT = Path(__file__).resolve().parent.parent

# --- sizes ------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Llama:
    """A Llama causal LM's shape (built from its config with random weights) and a batch of random tokens."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    rows: int
    length: int
    tie: bool = False

    def config(self) -> Any:
        from transformers import LlamaConfig

        return LlamaConfig(
            hidden_size=self.hidden, intermediate_size=self.intermediate, num_hidden_layers=self.layers,
            num_attention_heads=self.heads, num_key_value_heads=self.kv_heads, vocab_size=self.vocab,
            max_position_embeddings=max(2048, self.length), tie_word_embeddings=self.tie,
        )


TINY = Llama(hidden=64, layers=2, heads=2, kv_heads=2, intermediate=128, vocab=256, rows=4, length=32)

SIZES: dict[str, dict[str, Any]] = {
    "smoke": {
        "probe": TINY, "cap": TINY, "restore": TINY, "levers": TINY, "fit": TINY, "cumulative": TINY,
        "estimate": {"gpt2": (2, 32), "llama": (2, 32), "bert": (2, 32)}, "estimate_scale": "tiny",
        "steps": 1, "timed_steps": 2, "fit_budget_share": 0.8,
        "noise": 0,  # the smoke size exercises the code only: exactly its steps, no noise target
    },
    "small": {
        "probe": TINY, "cap": TINY, "restore": TINY, "levers": TINY, "fit": TINY, "cumulative": TINY,
        "estimate": {"gpt2": (2, 64), "llama": (2, 64), "bert": (2, 64)}, "estimate_scale": "tiny",
        "steps": 1, "timed_steps": 3, "fit_budget_share": 0.8, "noise": 0.05,
    },
    "full": {
        "probe": Llama(hidden=1024, layers=8, heads=16, kv_heads=16, intermediate=2816, vocab=32000, rows=8,
                       length=512),
        "cap": Llama(hidden=1024, layers=8, heads=16, kv_heads=16, intermediate=2816, vocab=32000, rows=8,
                     length=512),
        "restore": Llama(hidden=512, layers=4, heads=8, kv_heads=8, intermediate=1408, vocab=32000, rows=8,
                         length=256),
        "levers": Llama(hidden=1024, layers=16, heads=16, kv_heads=16, intermediate=2816, vocab=32000, rows=8,
                        length=1024),
        "fit": Llama(hidden=768, layers=12, heads=12, kv_heads=12, intermediate=2048, vocab=32000, rows=16,
                     length=512),
        # Llama-3.2-1B's shape: 16 layers of 2048, grouped-query attention (8 KV heads), 128256 tokens, tied head.
        "cumulative": Llama(hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192, vocab=128256, rows=2,
                            length=2048, tie=True),
        "estimate": {"gpt2": (4, 1024), "llama": (2, 1024), "bert": (4, 512)}, "estimate_scale": "full",
        "steps": 2, "timed_steps": 4, "fit_budget_share": 0.45, "noise": 0.05,
    },
}

# --- helpers ----------------------------------------------------------------------------------------------------


class Checks:
    """The pass/fail lines of one section."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def add(self, check: str, passed: bool | None, **figures: Any) -> bool | None:
        self.items.append({"check": check, "passed": None if passed is None else bool(passed), **figures})
        mark = {True: "PASS", False: "FAIL", None: "n/a "}[None if passed is None else bool(passed)]
        print(f"    [{mark}] {check} {json.dumps(figures, default=str)[:300]}", flush=True)
        return passed


def build_llama(shape: Llama, device: torch.device, seed: int = 0) -> nn.Module:
    """The Llama of ``shape``, its weights created directly on ``device``."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        return LlamaForCausalLM(shape.config())


def token_batch(vocab: int, rows: int, length: int, device: torch.device, seed: int = 1) -> dict[str, torch.Tensor]:
    """Random tokens as a causal-LM batch (labels are the ids), on ``device``."""
    return common.to_device(common.lm_batch(vocab=vocab, rows=rows, length=length, seed=seed), device)


def is_cuda(device: torch.device) -> bool:
    return device.type == "cuda"


def allocated(device: torch.device) -> int | None:
    """``memory_allocated`` on CUDA after collecting garbage; None on the CPU."""
    gc.collect()
    if not is_cuda(device):
        return None
    torch.cuda.synchronize(device)
    return int(torch.cuda.memory_allocated(device))


def release(device: torch.device) -> None:
    common.release(device)


def within(value: float | None, reference: float | None, tolerance: float) -> bool | None:
    """|value / reference - 1| <= tolerance, or None where either is unknown."""
    if value is None or reference is None or reference == 0:
        return None
    return abs(value / reference - 1) <= tolerance


def ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or reference is None or reference == 0:
        return None
    return round(value / reference, 4)


def unique_cuda_bytes(tensors: Iterator[torch.Tensor] | list[torch.Tensor]) -> int:
    """Bytes of the distinct storages among ``tensors`` that live on a non-CPU device (shared maps count once)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        if tensor.device.type == "cpu":
            continue
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def trial_row(trial: Any, baseline: Any | None = None) -> dict[str, Any]:
    """A trial's figures for the JSON, with saving and speed-up against ``baseline`` where given."""
    row: dict[str, Any] = {
        "plan": trial.plan.label(),
        "status": trial.status,
        "error": trial.error,
        "peak_bytes": trial.peak_bytes,
        "peak_mib": common.mib(trial.peak_bytes),
        "breakdown": dict(trial.breakdown),
        "reserved_bytes": trial.reserved_bytes,
        "step_time_s": common.rounded(trial.step_time_s, 5),
        "step_times_s": [round(s, 5) for s in trial.step_times],
        "samples_per_s": common.rounded(trial.samples_per_s, 3),
        "tokens_per_s": common.rounded(trial.tokens_per_s, 1),
        "notes": list(trial.notes),
    }
    if baseline is not None and trial.status == "ok" and baseline.status == "ok":
        row["memory_saving"] = round(1 - trial.peak_bytes / baseline.peak_bytes, 4)
        if trial.samples_per_s and baseline.samples_per_s:
            row["speedup"] = round(trial.samples_per_s / baseline.samples_per_s, 3)
    return row


# --- the hand-made reference step -------------------------------------------------------------------------------


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


# --- sections ---------------------------------------------------------------------------------------------------


def probe_plans(rows: int) -> list[Any]:
    from memlab import Plan

    return [
        Plan(),
        Plan(micro_batch=rows // 2, accumulation=2),
        Plan(checkpointing=True),
        Plan(precision="bf16"),
        Plan(precision="fp16"),
        Plan(optimizer="adamw8bit"),
        Plan(precision="bf16", checkpointing=True, optimizer="adamw8bit"),
        Plan(offload="activations"),
    ]


def timing(size: str) -> dict[str, Any]:
    """The run options every measurement of a section takes: no progress bar, and the size's noise target (none at
    the smoke size, which only exercises the code)."""
    return {"progress": False, "noise": SIZES[size]["noise"]}


def section_probe(size: str, device: torch.device) -> dict[str, Any]:
    """1. Each plan's peak against a hand-made step's ``max_memory_allocated`` (2%); params and optimizer state
    bytes against independent counts (exact)."""
    import memlab

    shape: Llama = SIZES[size]["probe"]
    model = build_llama(shape, device)
    batch = token_batch(shape.vocab, shape.rows, shape.length, device)
    checks, rows = Checks(), []
    parameter_bytes = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    for plan in probe_plans(shape.rows):
        trial = memlab.measure(model, batch, plan, steps=SIZES[size]["steps"], warmup=1, **timing(size))
        release(device)
        reference = reference_peak(model, batch, plan)
        row = trial_row(trial)
        row["reference_peak_bytes"] = reference["peak_bytes"]
        row["peak_over_reference"] = ratio(trial.peak_bytes, reference["peak_bytes"])
        row["reference_optimizer_bytes"] = reference["optimizer_bytes"]
        rows.append(row)
        label = plan.label()
        checks.add(f"{label}: trial ran", trial.status == "ok", error=trial.error)
        checks.add(
            f"{label}: peak within 2% of the hand-made step's max_memory_allocated",
            within(trial.peak_bytes, reference["peak_bytes"], 0.02),
            memlab=trial.peak_bytes, reference=reference["peak_bytes"], ratio=row["peak_over_reference"],
        )
        checks.add(
            f"{label}: params category equals parameter and buffer bytes",
            trial.breakdown.get("params") == parameter_bytes,
            memlab=trial.breakdown.get("params"), counted=parameter_bytes,
        )
        if reference["optimizer_bytes"] is not None:
            checks.add(
                f"{label}: optimizer category equals the reference optimizer's state bytes",
                trial.breakdown.get("optimizer") == reference["optimizer_bytes"],
                memlab=trial.breakdown.get("optimizer"), counted=reference["optimizer_bytes"],
            )
    return {"model": dataclasses.asdict(shape), "parameter_bytes": parameter_bytes, "rows": rows,
            "checks": checks.items}


def section_cap(size: str, device: torch.device) -> dict[str, Any]:
    """2. Under a budget of 60% of the plain peak, the plans that do not fit report "oom"; after 20 such trials
    ``memory_allocated`` is where it started, to the byte."""
    import memlab
    from memlab import Plan

    shape: Llama = SIZES[size]["cap"]
    model = build_llama(shape, device)
    batch = token_batch(shape.vocab, shape.rows, shape.length, device)
    checks = Checks()
    plans = [Plan(), Plan(precision="bf16"), Plan(precision="fp16"), Plan(checkpointing=True),
             Plan(optimizer="adamw8bit"), Plan(precision="bf16", checkpointing=True, optimizer="adamw8bit"),
             Plan(micro_batch=max(1, shape.rows // 4), accumulation=4, checkpointing=True, precision="bf16")]
    free = {plan: memlab.measure(model, batch, plan, steps=1, warmup=1, **timing(size)) for plan in plans}
    plain_peak = free[plans[0]].peak_bytes
    budget = int(0.6 * plain_peak)
    over = [p for p, t in free.items() if t.status == "ok" and t.peak_bytes > 1.02 * budget]
    # The cap holds the caching allocator's reserved memory, which is more than the allocated peak (fragmentation):
    # a plan is sure to fit under the cap only where its uncapped reserved peak does.
    under = [p for p, t in free.items() if t.status == "ok" and (t.reserved_bytes or t.peak_bytes) < budget]
    fraction_before = torch.cuda.get_per_process_memory_fraction(device) if is_cuda(device) else None
    start = allocated(device)
    capped: list[dict[str, Any]] = []
    for number in range(20 if over else 0):
        plan = over[number % len(over)]
        trial = memlab.measure(model, batch, plan, budget=budget, steps=1, warmup=1, **timing(size))
        capped.append({"plan": plan.label(), "status": trial.status, "peak_bytes": trial.peak_bytes,
                       "allocated_after": allocated(device), "error": (trial.error or "")[:200]})
    end = allocated(device)
    checks.add("some plans do not fit 60% of the plain peak", bool(over), over=[p.label() for p in over])
    checks.add(
        "every capped trial of a plan that does not fit reports oom",
        bool(capped) and all(c["status"] == "oom" for c in capped),
        statuses=sorted({c["status"] for c in capped}),
    )
    checks.add(
        "after 20 capped trials memory_allocated is back where it started, to the byte",
        None if start is None else end == start and all(c["allocated_after"] == start for c in capped),
        start=start, end=end, drift=None if start is None or end is None else end - start,
    )
    fits = [memlab.measure(model, batch, plan, budget=budget, steps=1, warmup=1, **timing(size)) for plan in under]
    checks.add(
        "plans whose uncapped reserved peak is under the budget run under the cap",
        all(t.status == "ok" for t in fits) if fits else None,
        fitting=[(t.plan.label(), t.status, t.peak_bytes) for t in fits],
    )
    if fraction_before is not None:
        checks.add(
            "the per-process memory fraction is what it was",
            torch.cuda.get_per_process_memory_fraction(device) == fraction_before,
            before=fraction_before, after=torch.cuda.get_per_process_memory_fraction(device),
        )
    return {
        "model": dataclasses.asdict(shape), "budget_bytes": budget, "plain_peak_bytes": plain_peak,
        "uncapped": [trial_row(t) for t in free.values()], "capped": capped, "checks": checks.items,
    }


def _estimate_models(scale: str) -> dict[str, Any]:
    """GPT-2 small, a Llama-1B (Llama-3.2-1B's shape) and BERT-large, as configs (tiny versions for ``tiny``)."""
    from transformers import BertConfig, GPT2Config

    if scale == "full":
        return {
            "gpt2": GPT2Config(),
            "llama": SIZES["full"]["cumulative"].config(),
            "bert": BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
        }
    return {
        "gpt2": GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=128),
        "llama": TINY.config(),
        "bert": BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                           vocab_size=256),
    }


def _model_from(config: Any, device: torch.device) -> nn.Module:
    from transformers import AutoModelForCausalLM, BertForMaskedLM

    torch.manual_seed(0)
    with torch.device(device):
        if config.model_type == "bert":
            return BertForMaskedLM(config)
        return AutoModelForCausalLM.from_config(config)


def section_estimate(size: str, device: torch.device) -> dict[str, Any]:
    """3. ``estimate`` (fake tensors, from the config) against the measured peak: GPT-2 small, Llama-1B, BERT-large,
    each within 5%."""
    import memlab
    from memlab import Plan

    checks, rows = Checks(), []
    shapes = SIZES[size]["estimate"]
    for name, config in _estimate_models(SIZES[size]["estimate_scale"]).items():
        rows_, length = shapes[name]
        plans = (Plan(), Plan(precision="bf16", checkpointing=True)) if name == "llama" else (Plan(),)
        for plan in plans:
            started = time.perf_counter()
            estimate = memlab.estimate(config, {"input_ids": (rows_, length), "labels": (rows_, length)}, plan,
                                       device=device.type)
            estimate_s = time.perf_counter() - started
            model = _model_from(config, device)
            batch = token_batch(config.vocab_size, rows_, length, device)
            trial = memlab.measure(model, batch, plan, steps=1, warmup=1, **timing(size))
            del model, batch
            release(device)
            row = {
                "model": name, "config": type(config).__name__, "plan": plan.label(), "rows": rows_,
                "length": length, "estimate_bytes": estimate.peak_bytes, "estimate_status": estimate.status,
                "estimate_breakdown": dict(estimate.breakdown), "estimate_s": round(estimate_s, 2),
                "measured_bytes": trial.peak_bytes, "measured_status": trial.status,
                "measured_breakdown": dict(trial.breakdown),
                "estimate_over_measured": ratio(estimate.peak_bytes, trial.peak_bytes),
            }
            rows.append(row)
            checks.add(
                f"{name} {plan.label()}: estimate within 5% of the measured peak",
                within(estimate.peak_bytes, trial.peak_bytes, 0.05) if trial.status == "ok" else False,
                estimate=estimate.peak_bytes, measured=trial.peak_bytes, ratio=row["estimate_over_measured"],
                error=trial.error or estimate.error,
            )
    return {"rows": rows, "checks": checks.items}


def lever_plans() -> list[Any]:
    from memlab import Plan

    return [
        Plan(),
        Plan(precision="bf16"),
        Plan(precision="fp16"),
        Plan(optimizer="adamw8bit"),
        Plan(offload="optimizer"),
        Plan(offload="activations"),
        Plan(checkpointing=True),
        Plan(precision="bf16", checkpointing=True),
    ]


def section_levers(size: str, device: torch.device) -> dict[str, Any]:
    """5. fp16 and bf16 speed-ups, 8-bit Adam's state, offload of optimizer state and of activations: how much
    device memory each saves and at what speed."""
    import memlab

    shape: Llama = SIZES[size]["levers"]
    model = build_llama(shape, device)
    batch = token_batch(shape.vocab, shape.rows, shape.length, device)
    report = memlab.compare(model, batch, lever_plans(), steps=SIZES[size]["timed_steps"], warmup=1, **timing(size))
    base = report.trials[0]
    rows = [trial_row(t, base) for t in report.trials]
    by_label = {t.plan.label(): t for t in report.trials}
    checks = Checks()
    for trial in report.trials:
        checks.add(f"{trial.plan.label()}: ran", trial.status == "ok", error=trial.error)
    gpu = is_cuda(device)
    adam8 = by_label[memlab.Plan(optimizer="adamw8bit").label()]
    checks.add(
        "8-bit Adam keeps at most 30% of AdamW's optimizer state",
        adam8.breakdown.get("optimizer", 0) <= 0.3 * base.breakdown.get("optimizer", 1) if gpu else None,
        adamw=base.breakdown.get("optimizer"), adamw8bit=adam8.breakdown.get("optimizer"),
    )
    offload_opt = by_label[memlab.Plan(offload="optimizer").label()]
    checks.add(
        "offloading the optimizer leaves no optimizer state on the device and lowers the peak",
        offload_opt.breakdown.get("optimizer") == 0 and offload_opt.peak_bytes < base.peak_bytes if gpu else None,
        peak=offload_opt.peak_bytes, base=base.peak_bytes,
    )
    offload_act = by_label[memlab.Plan(offload="activations").label()]
    checks.add(
        "offloading activations lowers activation memory",
        offload_act.breakdown.get("activations", 0) < base.breakdown.get("activations", 0) if gpu else None,
        offloaded=offload_act.breakdown.get("activations"), base=base.breakdown.get("activations"),
    )
    for precision in ("bf16", "fp16"):
        trial = by_label[memlab.Plan(precision=precision).label()]
        checks.add(
            f"{precision} is faster than fp32",
            (trial.samples_per_s or 0) > (base.samples_per_s or 0) if gpu else None,
            speedup=ratio(trial.samples_per_s, base.samples_per_s),
        )
    return {
        "model": dataclasses.asdict(shape),
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "rows": rows, "checks": checks.items,
    }


def cumulative_plans() -> list[tuple[str, Any]]:
    from memlab import Plan

    return [
        ("fp32 AdamW (baseline)", Plan()),
        ("+ bf16 autocast", Plan(precision="bf16")),
        ("+ activation checkpointing", Plan(precision="bf16", checkpointing=True)),
        ("+ 8-bit AdamW", Plan(precision="bf16", checkpointing=True, optimizer="adamw8bit")),
        ("+ micro-batch 1 x accumulation 2", Plan(precision="bf16", checkpointing=True, optimizer="adamw8bit",
                                                  micro_batch=1, accumulation=2)),
        ("bf16 + checkpointing + offloaded AdamW", Plan(precision="bf16", checkpointing=True, offload="optimizer")),
        ("pure bf16 + checkpointing + 8-bit AdamW", Plan(weights="bf16", checkpointing=True, optimizer="adamw8bit")),
        ("LoRA r16 + bf16 + checkpointing", Plan(adapter="lora", precision="bf16", checkpointing=True)),
        ("QLoRA r16 + bf16 + checkpointing", Plan(adapter="qlora", precision="bf16", checkpointing=True)),
    ]


def section_cumulative(size: str, device: torch.device) -> dict[str, Any]:
    """6. The levers that have landed, one on top of the other, on a Llama-3.2-1B-sized model at sequence 2048."""
    return cumulative(SIZES[size]["cumulative"], device, steps=max(2, SIZES[size]["timed_steps"] - 2),
                      noise=SIZES[size]["noise"])


def cumulative(shape: Llama, device: torch.device, *, steps: int, noise: float = 0.05) -> dict[str, Any]:
    """The rows of :func:`cumulative_plans` on a Llama of ``shape``, with their checks."""
    import memlab

    model = build_llama(shape, device)
    batch = token_batch(shape.vocab, shape.rows, shape.length, device)
    named = cumulative_plans()
    report = memlab.compare(model, batch, [plan for _, plan in named], steps=steps, warmup=1, progress=False,
                            noise=noise)
    base = report.trials[0]
    rows = [{"step": name, **trial_row(trial, base)} for (name, _), trial in zip(named, report.trials, strict=True)]
    checks = Checks()
    for row in rows:
        checks.add(f"{row['step']}: ran", row["status"] == "ok", error=row["error"])
    # Accumulation is left out: its gradients stay alive across micro-batches, which can cost more than the
    # activations of the rows it takes out (a finding of the first GPU run, kept in the table).
    peaks = [t.peak_bytes for t in report.trials[:4]]
    checks.add(
        "bf16, checkpointing and 8-bit AdamW, added one by one, each lower the peak",
        all(b < a for a, b in zip(peaks, peaks[1:], strict=False)) if is_cuda(device) else None,
        peaks_mib=[common.mib(p) for p in peaks],
    )
    by_step = {name: trial for (name, _), trial in zip(named, report.trials, strict=True)}
    full, lora, qlora = (by_step[name].peak_bytes for name in (
        "+ activation checkpointing", "LoRA r16 + bf16 + checkpointing", "QLoRA r16 + bf16 + checkpointing"))
    checks.add(
        "with bf16 and checkpointing, LoRA's peak is below the full fine-tune's, and QLoRA's below LoRA's",
        qlora < lora < full if is_cuda(device) else None,
        full_mib=common.mib(full), lora_mib=common.mib(lora), qlora_mib=common.mib(qlora),
    )
    parameters = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    return {"model": {**dataclasses.asdict(shape), "parameters": parameters}, "rows": rows, "checks": checks.items}


def section_fit(size: str, device: torch.device) -> dict[str, Any]:
    """7. fit on a real budget (45% of the plain peak with --full); the chosen plan, re-measured in a fresh process,
    fits."""
    import memlab

    shape: Llama = SIZES[size]["fit"]
    model = build_llama(shape, device)
    batch = token_batch(shape.vocab, shape.rows, shape.length, device)
    plain = memlab.measure(model, batch, memlab.Plan(), steps=1, warmup=1, **timing(size))
    budget = int(SIZES[size]["fit_budget_share"] * plain.peak_bytes)
    started = time.perf_counter()
    report = memlab.fit(model, batch, budget=budget, steps=SIZES[size]["timed_steps"], warmup=1, **timing(size))
    fit_s = time.perf_counter() - started
    best = report.best
    checks = Checks()
    checks.add("fit found a plan", best is not None, measured=len(report.trials), skipped=len(report.skipped))
    again: dict[str, Any] = {}
    if best is not None:
        again = remeasure_in_fresh_process(shape, best.plan, device, steps=SIZES[size]["timed_steps"])
        checks.add(
            "the chosen plan, re-measured in a fresh process, fits the budget",
            again.get("status") == "ok" and again["peak_bytes"] <= budget,
            peak=again.get("peak_bytes"), budget=budget, error=again.get("error"),
        )
        checks.add(
            "the fresh process's peak is within 2% of fit's",
            within(again.get("peak_bytes"), best.peak_bytes, 0.02),
            fresh=again.get("peak_bytes"), fit=best.peak_bytes,
        )
    return {
        "model": dataclasses.asdict(shape), "plain_peak_bytes": plain.peak_bytes, "budget_bytes": budget,
        "fit_seconds": round(fit_s, 1), "best": None if best is None else trial_row(best),
        "trials": [trial_row(t) for t in report.trials],
        "skipped": [[plan.label(), reason] for plan, reason in report.skipped],
        "fresh_process": again, "checks": checks.items,
    }


def remeasure_in_fresh_process(shape: Llama, plan: Any, device: torch.device, steps: int) -> dict[str, Any]:
    """Measure ``plan`` on the same model and batch in a new Python process; its trial as a dict."""
    request = json.dumps({"shape": dataclasses.asdict(shape), "plan": dataclasses.asdict(plan),
                          "device": str(device), "steps": steps})
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from benchmarks.gpu_sections import remeasure; remeasure(sys.argv[1])",
         request],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"status": "error", "error": (done.stderr or done.stdout)[-2000:]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def remeasure(request: str) -> None:
    """The fresh process's side: build, measure, print the trial as one JSON line."""
    import memlab

    common.quiet()
    asked = json.loads(request)
    device = torch.device(asked["device"])
    shape = Llama(**asked["shape"])
    model = build_llama(shape, device)
    batch = token_batch(shape.vocab, shape.rows, shape.length, device)
    trial = memlab.measure(model, batch, memlab.Plan(**asked["plan"]), steps=asked["steps"], warmup=1,
                           progress=False)
    print(json.dumps({"status": trial.status, "peak_bytes": trial.peak_bytes, "error": trial.error,
                      "samples_per_s": trial.samples_per_s}))


def _optimizer_fingerprint(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return {
        "state": {
            id(p): {k: (id(v), v.clone()) if isinstance(v, torch.Tensor) else v for k, v in s.items()}
            for p, s in optimizer.state.items()
        },
        "groups": [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups],
        "params": [[id(p) for p in g["params"]] for g in optimizer.param_groups],
    }


def _same_optimizer(before: dict[str, Any], after: dict[str, Any]) -> str | None:
    """None when equal, else what differs."""
    if before["groups"] != after["groups"] or before["params"] != after["params"]:
        return "param_groups differ"
    if before["state"].keys() != after["state"].keys():
        return "state keys differ"
    for key, state in before["state"].items():
        for name, value in state.items():
            other = after["state"][key].get(name)
            if isinstance(value, tuple):
                if not isinstance(other, tuple) or other[0] != value[0] or not torch.equal(other[1], value[1]):
                    return f"state {name} changed"
            elif other != value:
                return f"state {name} changed"
    return None


def section_restore(size: str, device: torch.device) -> dict[str, Any]:
    """8. A CUDA model and the user's CUDA optimizer come back bit-exact after compare, fit and interrupted
    trials; memory_allocated comes back too."""
    sys.path.insert(0, str(ROOT / "tests"))
    from models import assert_same, fingerprint  # the test suite's fingerprint: every attribute of every module

    import memlab
    from memlab import Plan
    from memlab.events import StepFinished
    from memlab.measure.device import cuda_capacity

    shape: Llama = SIZES[size]["restore"]
    model = build_llama(shape, device)
    batch = token_batch(shape.vocab, shape.rows, shape.length, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(2):  # the user's optimizer has state, and the user left gradients behind
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model(**batch).loss.backward()
    model.eval()  # and left the model in eval mode
    checks = Checks()
    model_before, optimizer_before = fingerprint(model), _optimizer_fingerprint(optimizer)
    start = allocated(device)
    plans = [Plan(), Plan(precision="bf16", checkpointing=True), Plan(precision="fp16"),
             Plan(optimizer="adamw8bit"), Plan(offload="all"), Plan(micro_batch=max(1, shape.rows // 4),
                                                                     accumulation=4)]

    def interrupted(plan: Any) -> Callable[[], Any]:
        def run() -> Any:
            def stop(event: Any) -> None:
                if isinstance(event, StepFinished) and event.kind == "tracked":
                    raise KeyboardInterrupt
            try:
                memlab.measure(model, batch, plan, steps=2, warmup=1, **timing(size), callback=stop)
            except KeyboardInterrupt:
                return "interrupted"
            return "not interrupted"
        return run

    plain_peak: list[int] = []

    def compare() -> Any:
        report = memlab.compare(model, batch, plans, steps=1, warmup=1, **timing(size))
        plain_peak.append(report.trials[0].peak_bytes)
        return [t.status for t in report.trials]

    def fit() -> Any:
        report = memlab.fit(model, batch, budget=int(0.7 * plain_peak[0]), steps=1, warmup=1, **timing(size))
        return None if report.best is None else report.best.plan.label()

    def fit_default_budget() -> Any:
        # Only the budget is under test here; two plans keep it short.
        report = memlab.fit(model, batch, steps=1, warmup=1, **timing(size),
                            space={"precision": ["bf16"], "optimizer": ["adamw"], "checkpointing": [False, True],
                                   "offload": ["none"], "micro_batch": [shape.rows]})
        best = None if report.best is None else report.best.plan.label()
        return {"budget": report.budget, "capacity": cuda_capacity(device), "best": best}

    operations: list[tuple[str, Callable[[], Any]]] = [
        ("compare over 6 plans", compare),
        ("fit on a budget of 70% of the plain peak", fit),
        *([("fit with the default CUDA budget", fit_default_budget)] if is_cuda(device) else []),
        ("a plain trial interrupted after its tracked step", interrupted(Plan())),
        ("an fp16 trial interrupted after its tracked step", interrupted(Plan(precision="fp16"))),
        ("an offload-all trial interrupted", interrupted(Plan(offload="all"))),
        ("an 8-bit trial interrupted", interrupted(Plan(optimizer="adamw8bit"))),
    ]
    outcomes = {}
    for name, operation in operations:
        try:
            outcome: Any = operation()
            error = None
        except Exception as exc:  # noqa: BLE001 - a failure is a check that failed, not the end of the run
            outcome, error = None, f"{type(exc).__name__}: {exc}"[:500]
        outcomes[name] = outcome
        try:
            assert_same(model_before, fingerprint(model))
            model_problem = None
        except AssertionError as exc:
            model_problem = str(exc)[:300] or "differs"
        optimizer_problem = _same_optimizer(optimizer_before, _optimizer_fingerprint(optimizer))
        now = allocated(device)
        checks.add(
            f"after {name}: model and optimizer bit-exact, memory_allocated as before",
            error is None and model_problem is None and optimizer_problem is None
            and (start is None or now == start),
            outcome=outcome, error=error, model=model_problem, optimizer=optimizer_problem,
            allocated_drift=None if start is None or now is None else now - start,
        )
    model.train()
    optimizer.step()  # the user's optimizer still works on the user's parameters
    checks.add("the user's optimizer steps afterwards", all(torch.isfinite(p).all() for p in model.parameters()))
    return {"model": dataclasses.asdict(shape), "outcomes": outcomes, "checks": checks.items}


SECTIONS: dict[str, Callable[[str, torch.device], dict[str, Any]]] = {
    "probe": section_probe,
    "cap": section_cap,
    "restore": section_restore,
    "estimate": section_estimate,
    "levers": section_levers,
    "cumulative": section_cumulative,
    "fit": section_fit,
}
