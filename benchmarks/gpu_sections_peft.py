"""The GPU acceptance run's parts on the path that broke the CUDA context on the H200 (issue 57, item 1; see
:mod:`benchmarks.gpu_acceptance`), run first:

- ``sft_peft``: TRL's ``SFTTrainer`` with ``packing=True`` and ``peft_config=LoraConfig(r=16, lora_alpha=32,
  lora_dropout=0.05, target_modules="all-linear")``, bf16 on a GPU. The reference is the user's own loop: the
  trainer's ``train()`` with no memlab, read with ``max_memory_allocated`` over its steps. Then
  ``memlab.measure(trainer)`` (the dataset's worst batch), ``memlab.estimate(trainer)`` (a dry run of the live
  trainer's model) and ``memlab.fit(trainer, budget=...)`` followed by ``trainer.train()`` of the chosen plan under
  ``memlab.watch``, each judged against that peak, and after each call whether the process's CUDA context still
  runs a kernel (on the H200 the fit raised ``an illegal memory access`` inside its dry run, and every CUDA call
  after it failed); last, ``watch``'s overhead per step on this trainer (``--full`` only).
- ``peft_model``: the user's own ``get_peft_model`` model (the same LoRA settings on a Llama), two plans (bf16
  autocast, and with checkpointing): a hand-made step's ``max_memory_allocated`` beside ``memlab.measure`` (2%) and
  ``memlab.estimate`` of the live peft model (5%), the CUDA context checked after each; then ``memlab.fit`` on a
  budget between the two, its choice re-run by hand within the budget, and the adapters' weights bit-identical after.

Each memlab call is guarded: an exception becomes a failed check with its error, and once the CUDA context is
broken the calls after it are not made (their checks say so), so that the part still returns what it measured.
"""

from __future__ import annotations

import dataclasses
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from benchmarks import common
from benchmarks.gpu_common import SIZES, Checks, Llama, build_llama, is_cuda, ratio, token_batch, within

MEASURED_TOLERANCE = 0.02
"""memlab's measured peak against a hand-made step's (as the probe section)."""
TRAINER_TOLERANCE = 0.05
"""memlab's figures against a Trainer's own ``train()``, whose batches and loss are the trainer's."""
ESTIMATE_TOLERANCE = 0.05


class Guarded:
    """memlab calls made one by one on a device whose CUDA context may break: each call's error becomes a failed
    check; after each, whether the device still runs a kernel; once it does not, later calls are skipped."""

    def __init__(self, checks: Checks, device: torch.device) -> None:
        self.checks, self.device = checks, device
        self.broken: str | None = None
        self.errors: dict[str, str] = {}

    def __call__(self, label: str, call: Callable[[], Any]) -> Any:
        """``call()``, or None where it raised or the context was already broken."""
        if self.broken is not None:
            self.checks.add(f"{label}: ran", False, error=f"not made: the CUDA context broke at {self.broken}")
            return None
        try:
            result = call()
        except Exception as error:  # noqa: BLE001 - a failed call is a failed check, with its traceback
            self.errors[label] = traceback.format_exc()[-3000:]
            self.checks.add(f"{label}: ran", False, error=f"{type(error).__name__}: {str(error)[:400]}")
            result = None
        self.alive(label)
        return result

    def alive(self, label: str) -> None:
        """The check that a kernel still runs on the device after ``label`` (None on the CPU)."""
        if not is_cuda(self.device):
            return
        try:
            value = float(torch.ones(16, device=self.device).mul(2).sum().item())
            torch.cuda.synchronize(self.device)
            works = value == 32.0
            error = None
        except Exception as failure:  # noqa: BLE001 - the very thing checked
            works, error = False, f"{type(failure).__name__}: {str(failure)[:300]}"
        self.checks.add(f"after {label}: the process's CUDA context still runs a kernel", works, error=error)
        if not works and self.broken is None:
            self.broken = label


def gpu_kind(device: torch.device) -> dict[str, Any]:
    """``estimate``'s keywords for ``device``: the GPU kind memlab knows it as (the default kind where none)."""
    from benchmarks.gpu_common import gpu_kind_name

    if not is_cuda(device):
        return {"device": "cpu"}
    name = gpu_kind_name(torch.cuda.get_device_name(device))
    return {"device": "cuda", **({"gpu": name} if name else {})}


def figures(trial: Any) -> dict[str, Any] | None:
    """A trial's figures for the JSON (measured or estimated)."""
    if trial is None:
        return None
    return {"plan": trial.plan.label(), "status": trial.status, "error": trial.error, "peak_bytes": trial.peak_bytes,
            "breakdown": dict(trial.breakdown), "reserved_bytes": getattr(trial, "reserved_bytes", None),
            "card_bytes": getattr(trial, "card_bytes", None)}


def judge(checks: Checks, label: str, trial: Any, reference: int | None, tolerance: float, against: str) -> None:
    """``trial``'s peak within ``tolerance`` of ``reference`` (None where either is unknown: the CPU, a failed
    call)."""
    peak = trial.peak_bytes if trial is not None and trial.status == "ok" else None
    failed = trial is not None and trial.status != "ok"
    checks.add(f"{label}: peak within {tolerance:.0%} of {against}",
               False if failed else within(peak, reference, tolerance),
               memlab=peak, reference=reference, ratio=ratio(peak, reference),
               error=trial.error if failed else None)


# --- the SFTTrainer ----------------------------------------------------------------------------------------------


def train_peak(trainer: Any, device: torch.device) -> int | None:
    """``trainer.train()`` with no memlab: ``max_memory_allocated`` over its steps (None on the CPU)."""
    common.release(device)
    if is_cuda(device):
        torch.cuda.reset_peak_memory_stats(device)
    trainer.train()
    if not is_cuda(device):
        return None
    torch.cuda.synchronize(device)
    return int(torch.cuda.max_memory_allocated(device))


def section_sft_peft(size: str, device: torch.device) -> dict[str, Any]:
    """TRL's SFTTrainer with a LoRA ``peft_config``: its own ``train()`` as the reference, then memlab's measure,
    estimate and fit on it, the CUDA context checked after each call, and ``watch``'s overhead."""
    import memlab
    from benchmarks.gpu_sections_trainer import (
        LORA,
        fit_then_train,
        make_sft_trainer,
        overhead_check,
        sft_missing,
        trainer_dropout,
        watch_overhead,
    )
    from memlab.trainer.source import TrainerSource

    spec = SIZES[size]["trainer"]
    shape: Llama = spec["shape"]
    checks = Checks()
    result: dict[str, Any] = {"model": dataclasses.asdict(shape), "missing": sft_missing(),
                              "settings": {"packing": True, "max_length": spec["sft"]["max_length"], "lora": LORA,
                                           "bf16": is_cuda(device), "examples": spec["sft"]["examples"],
                                           "longest": spec["sft"]["longest"], "steps": spec["sft"]["steps"]}}
    if result["missing"] is not None:
        checks.add("SFTTrainer (packing, peft LoRA with dropout 0.05) ran", None, why=result["missing"])
        return {**result, "checks": checks.items}
    guard = Guarded(checks, device)
    fast: dict[str, Any] = {"steps": 1, "warmup": 1, "noise": 0, "progress": False}
    with tempfile.TemporaryDirectory(prefix="memlab-sft-") as folder:
        trainer = make_sft_trainer(shape, spec, device, folder)
        own = TrainerSource.from_trainer(trainer).plan
        result["own_plan"] = own.label()
        checks.add("memlab read LoRA with dropout 0.05 from the trainer",
                   "lora" in own.label() and trainer_dropout(trainer) == LORA["lora_dropout"],
                   own=own.label(), dropout=trainer_dropout(trainer))
        reference = guard("the trainer's own train() (no memlab)", lambda: train_peak(trainer, device))
        result["train_peak_bytes"] = reference
        measured = guard("memlab.measure(trainer)", lambda: memlab.measure(trainer, plan=own, **fast))
        judge(checks, "memlab.measure(trainer)", measured, reference, TRAINER_TOLERANCE,
              "the trainer's own train()'s max_memory_allocated")
        estimated = guard("memlab.estimate(trainer)", lambda: memlab.estimate(trainer, plan=own, **gpu_kind(device)))
        judge(checks, "memlab.estimate(trainer)", estimated, reference, ESTIMATE_TOLERANCE,
              "the trainer's own train()'s max_memory_allocated")
        result.update(measured=figures(measured), estimated=figures(estimated))
        fitted = guard("memlab.fit(trainer) and train() under watch",
                       lambda: fit_then_train(trainer, shape.rows, spec["sft"]["steps"], checks, "SFTTrainer",
                                              narrow=size != "full", max_trials=None if size == "full" else 2))
        if fitted is not None:
            result.update(fitted)
        # watch's overhead is judged on a GPU only; the CPU sizes exercise the code, which the trainer part's has.
        if guard.broken is None and fitted is not None and size == "full":
            result["overhead"] = watch_overhead(trainer, fitted["budget_bytes"], spec["overhead"], device)
            overhead_check(checks, "SFTTrainer", result["overhead"], device)
    return {**result, "broken_at": guard.broken, "tracebacks": guard.errors, "checks": checks.items}


# --- the user's own peft model -----------------------------------------------------------------------------------


def peft_model(shape: Llama, device: torch.device) -> nn.Module:
    """A Llama of ``shape`` wrapped by ``get_peft_model`` with the SFT part's LoRA settings, as users wrap theirs."""
    from peft import LoraConfig, get_peft_model

    from benchmarks.gpu_sections_trainer import LORA

    model: nn.Module = get_peft_model(build_llama(shape, device), LoraConfig(task_type="CAUSAL_LM", **LORA))
    return model


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the trainable (adapter) weights, to compare after memlab's calls."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def section_peft_model(size: str, device: torch.device) -> dict[str, Any]:
    """The user's own ``get_peft_model`` model: measured and estimated against a hand-made step, then fitted; the
    CUDA context checked after each call and the adapters' weights bit-identical after them all."""
    import memlab
    from benchmarks.gpu_common import missing
    from benchmarks.gpu_reference import reference_peak

    shape: Llama = SIZES[size]["peft_model"]
    checks = Checks()
    why = missing("peft")
    if why is not None:
        checks.add("a peft model ran", None, why=why)
        return {"missing": why, "checks": checks.items}
    guard = Guarded(checks, device)
    model = peft_model(shape, device)
    batch = token_batch(shape.vocab, shape.rows, shape.length, device)
    fast: dict[str, Any] = {"steps": 1, "warmup": 1, "noise": 0, "progress": False}
    plans = [memlab.Plan(precision="bf16"), memlab.Plan(precision="bf16", checkpointing=True)]
    if size != "full":  # the CPU sizes exercise the code: one plan, a fit of two trials
        plans = plans[:1]
    rows: list[dict[str, Any]] = []
    changed: list[str] = []  # the memlab calls after which the adapters' weights differed (hand-made steps train them)
    for plan in plans:
        label = plan.label()
        hand = guard(f"{label}: the hand-made step", lambda plan=plan: reference_peak(model, batch, plan)["peak_bytes"])
        common.release(device)
        before = adapter_state(model)
        measured = guard(f"{label}: memlab.measure(peft model)",
                         lambda plan=plan: memlab.measure(model, batch, plan, **fast))
        judge(checks, f"{label}: memlab.measure(peft model)", measured, hand, MEASURED_TOLERANCE,
              "the hand-made step's max_memory_allocated")
        estimated = guard(f"{label}: memlab.estimate(peft model)",
                          lambda plan=plan: memlab.estimate(model, batch, plan, **gpu_kind(device)))
        judge(checks, f"{label}: memlab.estimate(peft model)", estimated, hand, ESTIMATE_TOLERANCE,
              "the hand-made step's max_memory_allocated")
        changed += [] if same_weights(before, model) else [f"{label}: measure, estimate"]
        rows.append({"plan": label, "hand_made_bytes": hand, "measured": figures(measured),
                     "estimated": figures(estimated),
                     "measured_over_hand_made": ratio(getattr(measured, "peak_bytes", None), hand),
                     "estimate_over_hand_made": ratio(getattr(estimated, "peak_bytes", None), hand)})
    fit: dict[str, Any] = {}
    peaks = [row["measured"]["peak_bytes"] for row in rows if row["measured"] and row["measured"]["status"] == "ok"]
    if peaks and guard.broken is None:
        # Between the plain and the checkpointed plan's peaks with --full; at the CPU sizes above the one measured.
        budget = (peaks[0] + peaks[-1]) // 2 if len(peaks) > 1 else 2 * peaks[0]
        search: dict[str, Any] = (
            {"space": {"checkpointing": [False, True], "micro_batch": sorted({shape.rows, max(1, shape.rows // 2)})}}
            if size == "full" else {"space": {"checkpointing": [False, True]}, "max_trials": 2})
        before = adapter_state(model)
        report = guard("memlab.fit(peft model)", lambda: memlab.fit(model, batch, budget=budget, **search, **fast))
        changed += [] if same_weights(before, model) else ["fit"]
        best = None if report is None else report.best
        checks.add("memlab.fit(peft model) found a plan within the budget", best is not None and best.fits,
                   budget=budget, best=None if best is None else best.plan.label())
        again = None
        if best is not None and guard.broken is None:
            again = guard("fit's choice, re-run by hand",
                          lambda: reference_peak(model, batch, best.plan)["peak_bytes"])
            checks.add("fit's choice, re-run by hand, stays within the budget (allocated)",
                       None if again is None else again <= budget, hand_made=again, budget=budget)
        fit = {"budget_bytes": budget, "best": figures(best), "hand_made_bytes": again,
               "trials": [figures(t) for t in (report.trials if report is not None else [])]}
    checks.add("the adapters' weights are bit-identical after each of memlab's calls",
               not changed if guard.broken is None else None, changed=changed)
    return {"model": dataclasses.asdict(shape), "lora": _lora(), "rows": rows, "fit": fit,
            "broken_at": guard.broken, "tracebacks": guard.errors, "checks": checks.items}


def same_weights(before: dict[str, torch.Tensor], model: nn.Module) -> bool:
    """Whether ``model``'s adapters hold exactly the weights ``before`` copied (:func:`adapter_state`)."""
    after = adapter_state(model)
    return before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def _lora() -> dict[str, Any]:
    from benchmarks.gpu_sections_trainer import LORA

    return dict(LORA)
