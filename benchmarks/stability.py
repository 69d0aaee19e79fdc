"""Does ``memlab demo`` give the same answer twice? Its search, run again and again in fresh processes.

Before timing became statistics, six runs of ``memlab demo`` on a busy machine crowned four different winners. Here
the demo's search (the built-in Llama, its batch, its CPU space, a budget of 60% of the plain plan's peak) runs
six times, each in a fresh Python process (so each first trial meets a cold process, as a user's does), first on
a quiet machine and then beside spinning processes on all cores but one (a busy shared machine), and every run's
answer is recorded: the best plan and the plans it named as tied within noise. Two runs *agree* when
each one's best is among the other's best and ties: the runs then differ only inside the noise they reported.

Run from the repository root::

    python -m benchmarks.stability --threads 1    # CPU: six runs quiet, six busy; a few minutes
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from benchmarks import common

NAME = "stability"
RUNS = {"smoke": 2, "small": 6, "full": 6}


def one_run(threads: int | None, noise: float | None = None) -> dict[str, Any]:
    """The demo's search, once, in this process: the answer, the trials it took and how long. ``noise``: the
    search's noise target (default: the demo's; 0 times exactly one step per plan, for a smoke test of the code)."""
    import torch

    from memlab.frontends.cli.main import DEMO_BUDGET_FRACTION, demo_space
    from memlab.frontends.demo import default_batch, default_model
    from memlab.plan import Plan
    from memlab.runner.trial import measure
    from memlab.search import fit

    if threads is not None:
        torch.set_num_threads(threads)
    started = time.perf_counter()
    model, batch = default_model(), default_batch()
    rows = int(batch["input_ids"].shape[0])
    # Memory is exact and the same in every run, so the budget is too; the plain plan's speed is not used.
    plain = measure(model, batch, Plan(), steps=1, noise=0)
    budget = int(plain.peak_bytes * DEMO_BUDGET_FRACTION)
    timing = {} if noise is None else {"noise": noise, "steps": 1}
    report = fit(model, batch, budget=budget, batch_size=rows, warmup=1, progress=False, space=demo_space(rows),
                 **timing)
    best = report.best
    return {
        "best": None if best is None else best.label,
        "ties": [trial.label for trial in report.ties],
        "samples_per_s": None if best is None else common.rounded(best.samples_per_s, 3),
        "trials": len(report.trials),
        "timed_steps": sum(len(trial.step_times) for trial in report.trials),
        "ran": sum(trial.status == "ok" for trial in report.trials),  # an out-of-memory trial times no step
        "remeasured": [trial.label for trial in report.trials if any("in turn" in note for note in trial.notes)],
        "budget_bytes": budget,
        "seconds": common.rounded(time.perf_counter() - started, 1),
    }


def agree(first: dict[str, Any], second: dict[str, Any]) -> bool:
    """Whether each run's best is among the other's best and ties.

    Example:
        >>> agree({"best": "a", "ties": ["b"]}, {"best": "b", "ties": ["a"]}), agree({"best": "a", "ties": []},
        ...                                                                    {"best": "b", "ties": []})
        (True, False)
    """
    return first["best"] in [second["best"], *second["ties"]] and second["best"] in [first["best"], *first["ties"]]


def contradict(first: dict[str, Any], second: dict[str, Any]) -> bool:
    """Whether two runs crowned different winners, each beyond the other's noise: neither best is among the other
    run's best and ties (what the issue saw: four winners in six runs, without a word about noise).

    Example:
        >>> contradict({"best": "a", "ties": []}, {"best": "b", "ties": ["a"]})
        False
    """
    return first["best"] not in [second["best"], *second["ties"]] and second["best"] not in [
        first["best"], *first["ties"]
    ]


def summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Distinct winners, how many pairs of runs agree and contradict each other, and the spread of the wall time."""
    pairs = list(itertools.combinations(runs, 2))
    seconds = [run["seconds"] for run in runs]
    return {
        "winners": dict(Counter(str(run["best"]) for run in runs)),
        "distinct_winners": len({run["best"] for run in runs}),
        "agreeing_pairs": sum(agree(a, b) for a, b in pairs),
        "contradicting_pairs": sum(contradict(a, b) for a, b in pairs),
        "pairs": len(pairs),
        "seconds_median": common.median(seconds),
        "seconds_min": min(seconds),
        "seconds_max": max(seconds),
    }


def busy_neighbours(count: int) -> list[subprocess.Popen[bytes]]:
    """``count`` processes that spin on a CPU each, as other tenants of a shared machine do."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def run_condition(command: list[str], runs: int, busy: int) -> dict[str, Any]:
    """``runs`` searches in fresh processes, with ``busy`` spinning neighbours alive the whole time."""
    neighbours = busy_neighbours(busy)
    answers = []
    try:
        for number in range(runs):
            finished = subprocess.run(command, check=True, capture_output=True, text=True)
            answers.append(json.loads(finished.stdout.strip().splitlines()[-1]))
            print(f"busy={busy} run {number + 1}: {answers[-1]}", flush=True)
    finally:
        for neighbour in neighbours:
            neighbour.kill()
            neighbour.wait()
    return {"busy_neighbours": busy, "runs": answers, "summary": summary(answers)}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the search ``RUNS`` times on a quiet machine and again beside spinning neighbours, write
    ``stability-<device>.json``; return the result."""
    parser = common.build_parser((__doc__ or NAME).splitlines()[0])
    parser.add_argument("--one-run", action="store_true", help="(internal) one search, its answer as JSON")
    args = parser.parse_args(argv)
    common.quiet()
    if args.one_run:
        print(json.dumps(one_run(args.threads)))
        return {}
    device = common.resolve_device(args, parser)
    result = common.metadata_for(NAME, device, args.size)
    command = [sys.executable, "-m", "benchmarks.stability", "--one-run"]
    if args.threads is not None:
        command += ["--threads", str(args.threads)]
    cores = os.cpu_count() or 1
    result["conditions"] = [run_condition(command, RUNS[args.size], busy) for busy in (0, max(cores - 1, 1))]
    path = common.write_json(result, args.out / f"{common.result_stem(NAME, device, args.size)}.json")
    print(json.dumps([condition["summary"] for condition in result["conditions"]], indent=1))
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
