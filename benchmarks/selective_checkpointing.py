"""Selective checkpointing: at a budget between "no checkpointing" and "every block", fit's plan with some blocks
checkpointed against checkpointing every block, on the CPU.

A small Llama (8 layers) is measured without checkpointing and with every block checkpointed; the budget is set
between the two peaks (``SHARE`` of the way from the full-checkpointing peak to the plain one). ``memlab.fit``
searches checkpointing off and on, then bisects the number of blocks (``checkpointing=k``). The fewest blocks that
fit (``fit_plan``; ``fit_best`` is what fit reported best, full checkpointing where the two tie within its short
runs' noise) and full
checkpointing are then timed in turn, ``ROUNDS`` rounds of ``memlab.compare`` (each plan's median step over its
steps, the two plans in alternating order), and the result records each round's speed ratio (samples/s of fit's
plan over full checkpointing's), their spread, whether every round ranks fit's plan faster beyond the noise
(``report.best`` is it and full checkpointing is not among the ties), and that fit's plan fits.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Sequence
from typing import Any

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
from benchmarks import common

NAME = "selective_checkpointing"
SHARE = 0.6
SETTINGS = {  # hidden, layers, rows, tokens, rounds, steps
    "smoke": (64, 4, 2, 32, 1, 1),
    "small": (256, 8, 4, 256, 4, 3),
    "full": (1024, 16, 4, 1024, 5, 5),
}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Measure both ends, fit at a budget between them, time fit's plan against full checkpointing in turn."""
    import memlab

    parser = common.build_parser((__doc__ or NAME).splitlines()[0])
    args = parser.parse_args(argv)
    common.quiet()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = common.resolve_device(args, parser)
    hidden, layers, rows, tokens, rounds, steps = SETTINGS[args.size]
    model = common.llama_model(hidden=hidden, layers=layers, heads=4, vocab=512, positions=tokens).to(device)
    batch = common.to_device(common.lm_batch(vocab=512, rows=rows, length=tokens), device)
    quick = {"steps": 1, "warmup": 0, "noise": 0, "progress": False}
    plain = memlab.measure(model, batch, memlab.Plan(), **quick)
    full = memlab.measure(model, batch, memlab.Plan(checkpointing=True), **quick)
    budget = int(full.peak_bytes + SHARE * (plain.peak_bytes - full.peak_bytes))
    space = {"micro_batch": [rows], "precision": ["fp32"], "optimizer": ["adamw"], "offload": ["none"]}
    report = memlab.fit(model, batch, budget=budget, space=space, progress=False, steps=steps)
    best = report.best.plan if report.best is not None else memlab.Plan(checkpointing=True)
    # The fewest blocks that fit, as fit's bisection found them (fit's best may be full checkpointing when the two
    # tie within the noise of its short runs: then the lower peak wins).
    selective = [trial for trial in report.trials if trial.fits and trial.plan.checkpointing not in (True, False)]
    chosen = min(selective, key=lambda trial: trial.plan.checkpointing).plan if selective else best
    runs = []
    for number in range(rounds):
        order = [chosen, memlab.Plan(checkpointing=True)]
        timed = memlab.compare(model, batch, order if number % 2 == 0 else order[::-1], budget=budget,
                               steps=steps, progress=False)
        by_plan = {trial.plan: trial for trial in timed.trials}
        mine, every = by_plan[chosen], by_plan[memlab.Plan(checkpointing=True)]
        runs.append({
            "ratio": common.rounded((mine.samples_per_s or 0) / (every.samples_per_s or 1), 3),
            "selective_samples_per_s": common.rounded(mine.samples_per_s),
            "full_samples_per_s": common.rounded(every.samples_per_s),
            "faster_beyond_noise": chosen != every.plan and timed.best is not None and timed.best.plan == chosen
            and all(tie.plan != every.plan for tie in timed.ties),
        })
        print(f"round {number + 1}: {runs[-1]}", flush=True)
    ratios = [run["ratio"] for run in runs]
    result = common.metadata_for(NAME, device, args.size)
    result.update({
        "model": {"hidden": hidden, "layers": layers, "rows": rows, "tokens": tokens},
        "plain_peak_mib": common.mib(plain.peak_bytes),
        "full_checkpointing_peak_mib": common.mib(full.peak_bytes),
        "budget_mib": common.mib(budget),
        "fit_best": best.label(),
        "fit_plan": chosen.label(),
        "fit_plan_blocks": chosen.checkpointing,
        "fit_plan_peak_mib": common.mib(next(t.peak_bytes for t in report.trials if t.plan == chosen)),
        "fit_plan_fits": any(t.plan == chosen and t.fits for t in report.trials),
        "fit_trials": [[trial.label, trial.status, common.mib(trial.peak_bytes)] for trial in report.trials],
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "rounds_faster_beyond_noise": sum(run["faster_beyond_noise"] for run in runs),
        "rounds": runs,
    })
    path = common.write_json(result, args.out / f"{common.result_stem(NAME, device, args.size)}.json")
    print(json.dumps({key: result[key] for key in ("fit_plan", "ratio_median", "ratio_min", "ratio_max",
                                                    "rounds_faster_beyond_noise", "fit_plan_fits")}))
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
