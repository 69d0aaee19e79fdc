"""The training sections of the GPU acceptance run (see :mod:`benchmarks.gpu_acceptance`), and :data:`SECTIONS`,
every section by name: probe, cap, restore, levers, cumulative and fit here; estimate and heldout in
:mod:`benchmarks.gpu_sections_estimate`, cast_reserve in :mod:`benchmarks.gpu_sections_cast`, fp8 in
:mod:`benchmarks.gpu_sections_fp8`, compile and compile_families in :mod:`benchmarks.gpu_sections_compile`, loads in
:mod:`benchmarks.gpu_sections_loads`, inference in :mod:`benchmarks.gpu_sections_inference`, ties and reserve in
:mod:`benchmarks.gpu_sections_runs`, trainer in :mod:`benchmarks.gpu_sections_trainer`, rl (TRL's DPO and GRPO
trainers), grpo_1024 and grpo_8b in :mod:`benchmarks.gpu_sections_rl`; what they share (sizes, checks, models, CUDA
figures) in :mod:`benchmarks.gpu_common`.

Each section builds its models from configs on the device, runs memlab and an independent reference next to it,
and returns a dict with its figures and a list of ``checks``: ``{"check": what, "passed": True/False/None,
...figures}``, where None means "cannot be judged here" (a CUDA-only figure on the CPU, or a library missing). Every
section also runs on the CPU with ``--smoke`` sizes, so that its code is exercised without a GPU.

References are written by hand on purpose: a training step with ``torch.optim.AdamW`` (or bitsandbytes' 8-bit
AdamW), ``torch.autocast`` and ``GradScaler`` as a user would write it, read with ``max_memory_allocated``. They
share no code with memlab's step, so that a bug in memlab's step cannot hide in both.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from benchmarks.gpu_common import (  # noqa: F401 - ROOT, TINY, Llama and SIZES are this module's names for others too
    LLAMA_1B,
    ROOT,
    SIZES,
    TINY,
    Checks,
    Llama,
    allocated,
    build_llama,
    in_fresh_process,
    is_cuda,
    missing,
    parameter_count,
    ratio,
    release,
    timing,
    token_batch,
    trial_row,
    unique_cuda_bytes,
    within,
)
from benchmarks.gpu_reference import cumulative_plans, reference_peak, remeasure_in_fresh_process

# --- the hand-made reference step -------------------------------------------------------------------------------


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


def plan_needs(plan: Any) -> str | None:
    """Why ``plan`` cannot run here (bitsandbytes or peft missing), or None."""
    needs = []
    if plan.optimizer in ("adamw8bit", "paged_adamw8bit") or plan.adapter == "qlora":
        needs.append("bitsandbytes")
    if plan.adapter != "none":
        needs.append("peft")
    return missing(*needs)


def optimizer_choices() -> tuple[str, ...]:
    """The optimizers this memlab's Plan takes (``adamw_foreach`` is newer than the first GPU run)."""
    from memlab.techniques.core.registry import REGISTRY

    return tuple(REGISTRY["optimizer"].choices)


def compare_named(model: nn.Module, batch: Any, named: list[tuple[str, Any]], **options: Any) -> dict[str, Any]:
    """``memlab.compare`` over the plans of ``named`` that can run here (the others skipped, with why): rows for
    the JSON (saving and speed-up against the first) and the trials by name."""
    import memlab

    runnable = [(name, plan) for name, plan in named if plan_needs(plan) is None]
    options.setdefault("callback", trial_progress(time.perf_counter()))
    report = memlab.compare(model, batch, [plan for _, plan in runnable], **options)
    by_name = {name: trial for (name, _), trial in zip(runnable, report.trials, strict=True)}
    base = by_name.get(named[0][0])
    rows = []
    for name, plan in named:
        if name in by_name:
            rows.append({"step": name, **trial_row(by_name[name], base)})
        else:
            rows.append({"step": name, "plan": plan.label(), "status": "skipped", "error": plan_needs(plan),
                         "peak_bytes": None, "breakdown": {}, "samples_per_s": None})
    return {"rows": rows, "trials": by_name}


def trial_progress(started: float) -> Callable[[Any], None]:
    """A compare callback that prints each trial's steps and end with the seconds since ``started``: a part cut at
    its limit still shows where its time went (the H100 of 2026-11-27 cut ``cumulative`` and ``levers`` with
    nothing printed)."""
    from memlab.events import StepFinished, TrialFinished

    def show(event: Any) -> None:
        at = time.perf_counter() - started
        if isinstance(event, StepFinished) and event.kind != "timed":
            print(f"      [{at:6.1f} s] trial {event.index + 1} {event.plan.label()}: {event.kind} step "
                  f"{event.seconds:.2f} s", flush=True)
        elif isinstance(event, TrialFinished):
            print(f"      [{at:6.1f} s] trial {event.index + 1}/{event.total} {event.trial.plan.label()}: "
                  f"{event.trial.status}", flush=True)

    return show


class Judge:
    """Checks on trials found by name: None with the reason where a trial was skipped or the device is no GPU."""

    def __init__(self, checks: Checks, trials: dict[str, Any], named: list[tuple[str, Any]], gpu: bool) -> None:
        self.checks, self.trials, self.plans, self.gpu = checks, trials, dict(named), gpu

    def __call__(self, check: str, names: tuple[str, ...], test: Callable[..., bool], **figures: Any) -> None:
        absent = [name for name in names if name not in self.trials]
        if absent:
            self.checks.add(check, None, why=f"{absent[0]!r} did not run: {plan_needs(self.plans[absent[0]])}")
            return
        trials = [self.trials[name] for name in names]
        if not all(t.status == "ok" for t in trials):
            self.checks.add(check, False, statuses=[t.status for t in trials])
            return
        shown = {name: {"peak": t.peak_bytes, "optimizer": t.breakdown.get("optimizer"),
                        "activations": t.breakdown.get("activations"), "samples_per_s": t.samples_per_s}
                 for name, t in zip(names, trials, strict=True)}
        self.checks.add(check, test(*trials) if self.gpu else None, **shown, **figures)


def lever_plans() -> list[tuple[str, Any]]:
    """Each lever alone (the first is the plain plan)."""
    from memlab import Plan

    named = [
        ("fp32 AdamW (plain)", Plan()),
        ("bf16 autocast", Plan(precision="bf16")),
        ("fp16 autocast", Plan(precision="fp16")),
        ("checkpointing", Plan(checkpointing=True)),
        ("bf16 + checkpointing", Plan(precision="bf16", checkpointing=True)),
        ("pure bf16 weights", Plan(weights="bf16")),
        ("8-bit AdamW", Plan(optimizer="adamw8bit")),
        ("paged 8-bit AdamW", Plan(optimizer="paged_adamw8bit")),
        ("Adafactor", Plan(optimizer="adafactor")),
        ("chunked loss", Plan(loss="chunked")),
        ("optimizer in backward", Plan(optimizer_in_backward=True)),
        ("offloaded optimizer", Plan(offload="optimizer")),
        ("offloaded activations", Plan(offload="activations")),
        ("LoRA r16, all linear layers", Plan(adapter="lora")),
        ("LoRA r16, attention only", Plan(adapter="lora", lora_targets="attention")),
    ]
    if "adamw_foreach" in optimizer_choices():
        named.insert(9, ("foreach AdamW", Plan(optimizer="adamw_foreach")))
    return named


def section_levers(size: str, device: torch.device) -> dict[str, Any]:
    """5. Each lever alone on Llama-3.2-1B's shape (2 x 1024 with --full): peak, breakdown, reserved, samples/s;
    the precisions' speed-ups, the optimizers' state, offload, the chunked loss, the optimizer in backward and
    LoRA's targets."""
    shape: Llama = SIZES[size]["levers"]
    model = build_llama(shape, device)
    batch = token_batch(shape.vocab, shape.rows, shape.length, device)
    named = lever_plans()
    compared = compare_named(model, batch, named, steps=SIZES[size]["timed_steps"], warmup=1, **timing(size))
    checks = Checks()
    for row in compared["rows"]:
        checks.add(f"{row['step']}: ran", row["status"] == "ok" if row["status"] != "skipped" else None,
                   error=row["error"])
    judge = Judge(checks, compared["trials"], named, is_cuda(device))
    plain = "fp32 AdamW (plain)"

    def state(trial: Any) -> int:
        return int(trial.breakdown.get("optimizer", 0))

    judge("8-bit AdamW keeps at most 30% of AdamW's optimizer state", (plain, "8-bit AdamW"),
          lambda base, t: state(t) <= 0.3 * state(base))
    judge("paged 8-bit AdamW's peak is at most 8-bit AdamW's (its state pages to the host)",
          ("8-bit AdamW", "paged 8-bit AdamW"), lambda eight, paged: paged.peak_bytes <= 1.01 * eight.peak_bytes)
    judge("Adafactor keeps at most 10% of AdamW's optimizer state (factored second moments, no first moment)",
          (plain, "Adafactor"), lambda base, t: state(t) <= 0.1 * state(base))
    if "foreach AdamW" in dict(named):
        trained = [p for p in model.parameters() if p.requires_grad]
        # Fused AdamW keeps each parameter's step count as a 4-byte tensor on the device, foreach AdamW on the host
        # (torch.optim.AdamW's _init_group): the H100 of 2026-11-28 showed 584 bytes, 146 tensors' counts, apart.
        judge("foreach AdamW keeps fused AdamW's optimizer state but its on-device step counts",
              (plain, "foreach AdamW"), lambda base, t: 0 <= state(base) - state(t) <= 4 * len(trained),
              parameter_tensors=len(trained))
        # The fused update works in place; foreach's holds temporaries as large as the weights (the first GPU run's
        # optimizer step, memlab's default then, held one of torch._foreach_sqrt): never a lower peak than fused.
        judge("foreach AdamW's peak is at least fused AdamW's (the plain plan's)", (plain, "foreach AdamW"),
              lambda base, t: t.peak_bytes >= 0.999 * base.peak_bytes)
    judge("the chunked loss does not raise the peak", (plain, "chunked loss"),
          lambda base, t: t.peak_bytes <= 1.001 * base.peak_bytes)

    def in_backward(base: Any, t: Any) -> bool:
        # Its saving is the gradients the plain peak holds: none where that peak is the forward's end (the H100 of
        # 2026-11-28, fp32 at 2 x 1024: parameters, optimizer state and activations only), where it can only not raise
        # the peak; the cumulative part, whose peak holds gradients, shows the saving (13.6 -> 11.2 GB there).
        held = int(base.breakdown.get("grads", 0))
        return t.peak_bytes < base.peak_bytes if held else t.peak_bytes <= 1.001 * base.peak_bytes

    judge("the optimizer in backward lowers the peak where the plain peak holds gradients, and never raises it",
          (plain, "optimizer in backward"), in_backward)
    judge("pure bf16 weights hold at most 55% of fp32's parameter bytes", (plain, "pure bf16 weights"),
          lambda base, t: t.breakdown.get("params", 0) <= 0.55 * base.breakdown.get("params", 1))
    judge("offloading the optimizer leaves no optimizer state on the device and lowers the peak",
          (plain, "offloaded optimizer"), lambda base, t: state(t) == 0 and t.peak_bytes < base.peak_bytes)
    judge("offloading activations lowers activation memory", (plain, "offloaded activations"),
          lambda base, t: t.breakdown.get("activations", 0) < base.breakdown.get("activations", 0))
    judge("LoRA on attention only keeps less optimizer state than on every linear layer, and no higher a peak",
          ("LoRA r16, all linear layers", "LoRA r16, attention only"),
          lambda every, attention: state(attention) < state(every) and attention.peak_bytes <= every.peak_bytes)
    for name in ("bf16 autocast", "fp16 autocast"):
        judge(f"{name} is faster than fp32", (plain, name),
              lambda base, t: (t.samples_per_s or 0) > (base.samples_per_s or 0))
    return {
        "model": {**dataclasses.asdict(shape), "parameters": parameter_count(model)},
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "rows": compared["rows"], "checks": checks.items,
    }


def section_cumulative(size: str, device: torch.device) -> dict[str, Any]:
    """6. The levers that have landed, one on top of the other, on a Llama-3.2-1B-sized model at sequence 2048."""
    return cumulative(SIZES[size]["cumulative"], device, steps=max(2, SIZES[size]["timed_steps"] - 1),
                      noise=SIZES[size]["noise"], time_limit=SIZES[size]["time_limit"])


def cumulative(shape: Llama, device: torch.device, *, steps: int, noise: float = 0.05,
               time_limit: float = 10.0) -> dict[str, Any]:
    """The rows of :func:`cumulative_plans` on a Llama of ``shape``, with their checks."""
    model = build_llama(shape, device)
    batch = token_batch(shape.vocab, shape.rows, shape.length, device)
    named = cumulative_plans()
    compared = compare_named(model, batch, named, steps=steps, warmup=1, progress=False, noise=noise,
                             time_limit=time_limit)
    checks = Checks()
    for row in compared["rows"]:
        checks.add(f"{row['step']}: ran", row["status"] == "ok" if row["status"] != "skipped" else None,
                   error=row["error"])
    judge = Judge(checks, compared["trials"], named, is_cuda(device))
    # Accumulation is left out of the chain: its gradients stay alive across micro-batches, which can cost more
    # than the activations of the rows it takes out (a finding of the first GPU run, kept in the table).
    chain = tuple(name for name, _ in named[:6])
    judge("bf16, checkpointing, 8-bit AdamW, the chunked loss and the optimizer in backward, added one by one, "
          "each lower the peak", chain,
          lambda *trials: all(b.peak_bytes < a.peak_bytes for a, b in zip(trials, trials[1:], strict=False)))
    judge("with bf16 and checkpointing, LoRA's peak is below the full fine-tune's, and QLoRA's below LoRA's",
          ("+ activation checkpointing", "LoRA r16 + bf16 + checkpointing", "QLoRA r16 + bf16 + checkpointing"),
          lambda full, lora, qlora: qlora.peak_bytes < lora.peak_bytes < full.peak_bytes)
    return {"model": {**dataclasses.asdict(shape), "parameters": parameter_count(model)}, "rows": compared["rows"],
            "checks": checks.items}


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


def _sections() -> dict[str, Callable[[str, torch.device], dict[str, Any]]]:
    from benchmarks.gpu_sections_cast import section_cast_reserve
    from benchmarks.gpu_sections_compile import section_compile, section_compile_families
    from benchmarks.gpu_sections_estimate import section_encdec, section_estimate, section_heldout, section_heldout_off
    from benchmarks.gpu_sections_fill import section_boundary, section_fill
    from benchmarks.gpu_sections_fp8 import section_fp8
    from benchmarks.gpu_sections_inference import section_inference
    from benchmarks.gpu_sections_loads import section_loads
    from benchmarks.gpu_sections_peft import section_peft_model, section_sft_peft
    from benchmarks.gpu_sections_restore import section_restore
    from benchmarks.gpu_sections_rl import section_grpo_8b, section_grpo_1024, section_rl
    from benchmarks.gpu_sections_runs import section_reserve, section_ties
    from benchmarks.gpu_sections_timeline import section_timeline
    from benchmarks.gpu_sections_trainer import section_trainer
    from benchmarks.gpu_sections_vlm import section_vlm

    return {
        "compile": section_compile,
        "rl": section_rl,
        "sft_peft": section_sft_peft,
        "peft_model": section_peft_model,
        "encdec": section_encdec,
        "vlm": section_vlm,
        "heldout_off": section_heldout_off,
        "probe": section_probe,
        "cap": section_cap,
        "restore": section_restore,
        "estimate": section_estimate,
        "heldout": section_heldout,
        "loads": section_loads,
        "levers": section_levers,
        "cumulative": section_cumulative,
        "fit": section_fit,
        "inference": section_inference,
        "ties": section_ties,
        "trainer": section_trainer,
        "reserve": section_reserve,
        "timeline": section_timeline,
        "fill": section_fill,
        "boundary": section_boundary,
        "cast_reserve": section_cast_reserve,
        "fp8": section_fp8,
        "grpo_1024": section_grpo_1024,
        "grpo_8b": section_grpo_8b,
        "compile_families": section_compile_families,
    }


SECTIONS = _sections()
