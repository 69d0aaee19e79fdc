"""What a step's timeline costs a big estimate: the wall time of ``memlab.estimate`` with the timeline recorded (as
memlab ships) and without, and what the timeline weighs where it is kept (the saved notebook's static record, and
the Timeline object pickled).

memlab has no switch for recording: every tracked step, a dry run's fake one included, records its timeline. For this
measurement only, the "off" side swaps the runner's :class:`~memlab.measure.timeline.StepRecorder` for one that records
nothing (as ``tests/integration/test_timeline.py`` does to check that recording changes no peak), so the trial has no
timeline to build either. Each estimate runs in a fresh Python process (its imports not timed), the sides alternating
round by round (on, off, off, on, ...), so that the machine's load, which drifts, hits both alike; the load average
is kept beside each time. The goal (issue 45): recording makes the estimate at most 10% slower, and the record a
notebook keeps is under 1 MB.

Run from the repository root::

    python -m benchmarks.timeline_cost                  # llama-70b, bf16, 1x1024, two rounds (a few minutes here)
    python -m benchmarks.timeline_cost --model llama-13b --rounds 3
    python -m benchmarks.timeline_cost --smoke          # gpt2, 1x64: seconds
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import common

NAME = "timeline_cost"
GOAL_RATIO = 1.10
GOAL_SAVED_BYTES = 1_000_000
SIDES = ("on", "off")

_CHILD = r"""
import contextlib, json, os, resource, sys, time
import memlab, memlab.runner.core as core
from memlab.measure.timeline import StepRecorder
from memlab.report import timeline as timeline_module
from memlab.report.static import timeline_bundle

name, side, rows, length = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])


class NotRecording(StepRecorder):
    def recording(self, tracker):
        return contextlib.nullcontext(self.result)


if side == "off":
    core.StepRecorder = NotRecording
built = [0.0]
original = timeline_module.Timeline.from_recording.__func__


def timed(cls, *args, **kwargs):
    start = time.perf_counter()
    try:
        return original(cls, *args, **kwargs)
    finally:
        built[0] += time.perf_counter() - start


timeline_module.Timeline.from_recording = classmethod(timed)
shapes = {"input_ids": (rows, length), "labels": (rows, length)}
load = os.getloadavg()[0]
start = time.perf_counter()
trial = memlab.estimate(name, shapes, memlab.Plan(precision="bf16"), device="cuda")
seconds = time.perf_counter() - start
timeline = trial.timeline
row = {"seconds": seconds, "load_1min_before": load, "load_1min_after": os.getloadavg()[0],
       "status": trial.status, "peak_bytes": trial.peak_bytes,
       "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
       "timeline_build_s": built[0]}
if timeline is not None:
    bundle = timeline_bundle([timeline])
    row.update(events=timeline.events, phases=len(timeline.phases), points=len(timeline.x),
               timeline_peak_bytes=timeline.peak.bytes, peak=timeline.peak.description,
               saved_record_bytes=len(json.dumps(bundle)), svg_bytes=len(bundle["image/svg+xml"]),
               timeline_pickled_bytes=timeline.nbytes)
print(json.dumps(row))
"""


def one(model: str, side: str, rows: int, length: int, timeout_s: float) -> dict[str, Any]:
    """One estimate of ``model`` in a fresh process with the timeline recorded (``side="on"``) or not."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", _CHILD, model, side, str(rows), str(length)], capture_output=True,
                         text=True, timeout=timeout_s, check=True, env=env)
    row: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    row["side"] = side
    return row


def run(model: str, rounds: int, rows: int, length: int, timeout_s: float) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for number in range(rounds):
        for side in SIDES if number % 2 == 0 else SIDES[::-1]:
            row = one(model, side, rows, length, timeout_s)
            runs.append(row)
            print(f"round {number + 1} {side}: {row['seconds']:.1f} s (load {row['load_1min_before']:.1f}), "
                  f"events {row.get('events')}, record {row.get('saved_record_bytes')} B", flush=True)
    medians = {side: common.median([r["seconds"] for r in runs if r["side"] == side]) for side in SIDES}
    ratio = None if not medians["off"] or medians["on"] is None else medians["on"] / medians["off"]
    recorded = [r for r in runs if r["side"] == "on"]
    saved = max((r.get("saved_record_bytes") or 0 for r in recorded), default=0)
    build = common.median([r["timeline_build_s"] for r in recorded])
    return {
        "model": model, "shapes": {"input_ids": [rows, length], "labels": [rows, length]},
        "plan": "Plan(precision='bf16')", "estimate_device": "cuda (a dry run on fake tensors, on this CPU)",
        "rounds": rounds, "runs": runs,
        "seconds_median": {side: common.rounded(value, 2) for side, value in medians.items()},
        "ratio_on_over_off": common.rounded(ratio, 4),
        "timeline_build_s_median": common.rounded(build, 3),
        "saved_record_bytes": saved,
        "timeline_pickled_bytes": max((r.get("timeline_pickled_bytes") or 0 for r in recorded), default=0),
        "events": max((r.get("events") or 0 for r in recorded), default=0),
        "goal": {"ratio_below": GOAL_RATIO, "saved_record_below_bytes": GOAL_SAVED_BYTES},
        "meets_goal": {"ratio": ratio is not None and ratio <= GOAL_RATIO,
                       "saved_record": 0 < saved < GOAL_SAVED_BYTES},
        "method": (
            "memlab.estimate(model, shapes, Plan(precision='bf16'), device='cuda'), each in a fresh process, its wall "
            "time only (imports not timed); side 'off' swaps memlab.runner.core.StepRecorder for one that records "
            "nothing (a switch for this measurement only), so no timeline is recorded or built; sides alternate "
            "round by round; ratio = median on / median off; saved_record_bytes = the JSON of "
            "memlab.report.static.timeline_bundle([trial.timeline]), what a notebook keeps of the timeline "
            "(the magic's pick, the panel's drawing); timeline_pickled_bytes = Timeline.nbytes (the object, with its "
            "compressed events for save(); not in a notebook)"
        ),
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the estimates, write ``timeline_cost-<device>.json``; return the result."""
    parser = common.build_parser((__doc__ or NAME).splitlines()[0])
    parser.add_argument("--model", default=None, help="a config name of memlab.estimate (default: llama-70b)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of on and off (default: 2; smoke: 1)")
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--length", type=int, default=None, help="tokens per row (default 1024; smoke 64)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one estimate may take")
    parser.add_argument("--note", default="", help="a line kept in the JSON (why this model, what else ran)")
    args = parser.parse_args(argv)
    common.quiet()
    device = common.resolve_device(args, parser)
    smoke = args.size == "smoke"
    model = args.model or ("gpt2" if smoke else "llama-70b")
    result = common.metadata_for(NAME, device, args.size)
    result.update(run(model, args.rounds or (1 if smoke else 2), args.rows, args.length or (64 if smoke else 1024),
                      args.timeout))
    if args.note:
        result["note"] = args.note
    path = common.write_json(result, args.out / f"{common.result_stem(NAME, device, args.size)}.json")
    print(f"median on {result['seconds_median']['on']} s, off {result['seconds_median']['off']} s: "
          f"x{result['ratio_on_over_off']}; saved record {result['saved_record_bytes']} B")
    print(f"wrote {path}")
    return result



if __name__ == "__main__":
    main()
