"""GPU acceptance run, part 8: a CUDA model and the user's CUDA optimizer come back bit-exact after compare, fit and
interrupted trials (moved out of gpu_sections.py, which keeps the section table)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.gpu_common import ROOT, SIZES, Checks, Llama, allocated, build_llama, is_cuda, timing, token_batch


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
    from memlab.live.device import cuda_capacity

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
        # At the smoke size (the code only, on the CPU) a few plans show the same restores in a fraction of the time.
        report = memlab.fit(model, batch, budget=int(0.7 * plain_peak[0]), steps=1, warmup=1, **timing(size),
                            **({"max_trials": 3} if size == "smoke" else {}))
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
