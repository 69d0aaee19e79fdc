"""The GPU acceptance run: every CUDA path of memlab on a real GPU, in one command of at most 10 minutes.

It runs ``tests/gpu`` with pytest, then each section of :mod:`benchmarks.gpu_sections` in its own Python process
(so that one section's failure, CUDA error or cached memory cannot touch the next), then the seeds' table through
:mod:`benchmarks.hf_table`, and writes everything into ``benchmarks/results/gpu_acceptance-<device>.json`` (and the
table's own ``hf_table-<device>.json``), naming the GPU, driver and library versions. Sections:

1. ``probe``: each plan's peak against a hand-made step's ``max_memory_allocated`` (within 2%); the params and
   optimizer categories against independent byte counts (exact).
2. ``cap``: under a budget of 60% of the plain peak, plans that do not fit report "oom"; after 20 such trials
   ``memory_allocated`` is where it started, to the byte.
3. ``restore``: a CUDA model and the user's CUDA optimizer come back bit-exact after compare, fit and interrupted
   trials.
4. ``estimate``: ``memlab.estimate`` from the config against the measured peak for GPT-2 small, a Llama-1B and
   BERT-large (within 5%).
5. ``levers``: fp16/bf16 speed-ups, 8-bit Adam's state, offload of the optimizer and of activations.
6. ``cumulative``: the landed levers one on top of the other on a Llama-3.2-1B-sized model at sequence 2048.
7. ``fit``: fit on a real budget; the chosen plan, re-measured in a fresh process, fits.
8. ``hf_table``: the seeds' table at full size (bert-large, sequence 512, batch 4; fp16 rows in fp16), memlab and
   ``transformers.Trainer`` side by side.

A check passes (True), fails (False) or cannot be judged on this device (None: a CUDA figure on the CPU). The run
stops starting sections when its deadline (``--deadline``, default 560 s) is near; sections not run say so.

Run from the repository root on a CUDA machine::

    python -m benchmarks.gpu_acceptance                 # everything, --full sizes
    python -m benchmarks.gpu_acceptance --sections probe,cap
    python -m benchmarks.gpu_acceptance --smoke --device cpu   # seconds, on the CPU: exercises the code only
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks import common
from benchmarks.gpu_sections import ROOT, SECTIONS

NAME = "gpu_acceptance"
ORDER = ("pytest", "probe", "cap", "restore", "estimate", "levers", "fit", "cumulative", "hf_table")
# Seconds each part may take at most (the run's deadline may cut it shorter).
LIMITS = {"pytest": 180, "hf_table": 240, "cumulative": 150, "fit": 150}
DEFAULT_LIMIT = 120
HF_TABLE_REPEATS = 1


def run_section_here(name: str, size: str, device: torch.device) -> dict[str, Any]:
    """One section in this process; an exception becomes a failed check with its traceback."""
    common.quiet()
    started = time.perf_counter()
    try:
        result = SECTIONS[name](size, device)
    except Exception as error:  # noqa: BLE001 - reported as a failed section, with the traceback
        failed = {"check": f"{name} ran to the end", "passed": False, "error": f"{type(error).__name__}: {error}"}
        result = {
            "checks": [failed],
            "traceback": traceback.format_exc()[-4000:],
        }
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


def _child(command: list[str], limit: float, env: dict[str, str] | None = None) -> tuple[int | None, str, float]:
    """Run ``command`` from the repository root; its exit code (None on time-out), its output and its seconds."""
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=limit, env=env)
        code: int | None = done.returncode
        output = done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        code = None
        output = _text(expired.stdout) + _text(expired.stderr) + f"\n[stopped after {limit:.0f} s]"
    seconds = time.perf_counter() - started
    print(output[-3000:], flush=True)
    return code, output, seconds


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def run_pytest(limit: float, device: torch.device) -> dict[str, Any]:
    """``pytest tests/gpu``: its summary line, counts and output."""
    code, output, seconds = _child([sys.executable, "-m", "pytest", "tests/gpu", "-v", "-p", "no:cacheprovider"], limit)
    summary = next((line for line in reversed(output.splitlines()) if re.search(r"\d+ (passed|failed|error)", line)),
                   "")
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary)}
    return {
        "exit_code": code, "summary": summary.strip("= "), "counts": counts, "seconds": round(seconds, 1),
        "output_tail": output[-6000:],
        "checks": [{
            "check": "every test under tests/gpu passes",
            "passed": None if device.type != "cuda" else code == 0 and counts.get("passed", 0) > 0,
            "summary": summary.strip("= "),
        }],
    }


def run_section_process(name: str, size: str, device: torch.device, limit: float) -> dict[str, Any]:
    """One section in a fresh Python process."""
    with tempfile.TemporaryDirectory(prefix="memlab-gpu-") as folder:
        part = Path(folder) / "part.json"
        command = [sys.executable, "-m", "benchmarks.gpu_acceptance", "--section", name, f"--{size}",
                   "--device", device.type, "--part", str(part)]
        code, output, seconds = _child(command, limit, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if part.exists():
            result: dict[str, Any] = json.loads(part.read_text())
        else:
            why = "timed out" if code is None else f"exited with {code}"
            result = {"checks": [{"check": f"{name} ran to the end", "passed": False, "error": why}],
                      "output_tail": output[-4000:]}
    result["process_seconds"] = round(seconds, 1)
    return result


def run_hf_table(size: str, device: torch.device, out: Path, limit: float) -> dict[str, Any]:
    """The seeds' table through memlab and the Trainer, written as its own result; its summary here."""
    command = [sys.executable, "-m", "benchmarks.hf_table", f"--{size}", "--device", device.type, "--out", str(out),
               "--repeats", str(HF_TABLE_REPEATS if size == "full" else 1)]
    code, output, seconds = _child(command, limit, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    path = out / f"{common.result_stem('hf_table', device, size)}.json"
    if code != 0 or not path.exists():
        return {"checks": [{"check": "hf_table ran", "passed": False, "error": output[-2000:]}],
                "seconds": round(seconds, 1)}
    table = json.loads(path.read_text())
    ratio = table.get("throughput_ratio_min_same_work")
    return {
        "file": path.name, "markdown": table["markdown"], "seconds": round(seconds, 1),
        "throughput_ratio_median": table["throughput_ratio_median"],
        "throughput_ratio_min": table["throughput_ratio_min"],
        "throughput_ratio_min_same_work": ratio,
        "checks": [
            {"check": "every row ran on both sides",
             "passed": all(r["memlab"]["status"] in ("ok", "not supported by memlab") and r["trainer"]["status"] == "ok"
                           for r in table["rows"])},
            {"check": "memlab/Trainer throughput >= 0.95 in every row doing the same work",
             "passed": None if device.type != "cuda" else bool(ratio is not None and ratio >= 0.95), "min": ratio},
        ],
    }


def summarize(parts: dict[str, Any]) -> dict[str, Any]:
    """Counts of passed, failed and not-judged checks, and the names of the failed ones."""
    passed = failed = unjudged = 0
    failures = []
    for name, part in parts.items():
        for check in part.get("checks", []):
            if check["passed"] is True:
                passed += 1
            elif check["passed"] is False:
                failed += 1
                failures.append(f"{name}: {check['check']}")
            else:
                unjudged += 1
    return {"passed": passed, "failed": failed, "not_judged": unjudged, "failures": failures}


def _gib(num_bytes: float | None) -> float | None:
    return None if num_bytes is None else round(num_bytes / 2**30, 2)


def markdown(result: dict[str, Any]) -> str:
    """The README's GPU tables, made from a result of this run (``--markdown FILE`` prints them)."""
    parts = result["parts"]
    device = result["device"]
    versions = result["versions"]
    lines = [
        f"Device: {device.get('gpu', device['cpu'])}, driver {device.get('driver')}, CUDA {device.get('cuda')}; "
        f"torch {versions['torch']}, transformers {versions['transformers']}, bitsandbytes {versions['bitsandbytes']}"
        f". {result['summary']['passed']} checks passed, {result['summary']['failed']} failed, in "
        f"{result['seconds']:.0f} s ({result['date']}).",
        "",
    ]
    if "probe" in parts:
        lines += ["**Probe against a hand-made step** (Llama, " + _shape(parts["probe"]["model"]) + "):", ""]
        lines.append(common.markdown_table(
            ["plan", "memlab peak GiB", "hand-made GiB", "ratio", "optimizer state: memlab = counted"],
            [[r["plan"], _gib(r["peak_bytes"]), _gib(r["reference_peak_bytes"]), r["peak_over_reference"],
              "yes" if r["breakdown"].get("optimizer") == r["reference_optimizer_bytes"] else "no"]
             for r in parts["probe"]["rows"]],
        ))
        lines.append("")
    if "estimate" in parts:
        lines += ["**Dry-run estimate (fake tensors, from the config) against the measured peak:**", ""]
        lines.append(common.markdown_table(
            ["model", "plan", "batch", "estimate GiB", "measured GiB", "estimate / measured"],
            [[r["model"], r["plan"], f"{r['rows']} x {r['length']}", _gib(r["estimate_bytes"]),
              _gib(r["measured_bytes"]), r["estimate_over_measured"]] for r in parts["estimate"]["rows"]],
        ))
        lines.append("")
    for name, title in (("levers", "Each lever alone"), ("cumulative", "Levers added one by one")):
        if name not in parts:
            continue
        part = parts[name]
        lines += [f"**{title}** (Llama, {_shape(part['model'])}):", ""]
        lines.append(common.markdown_table(
            ["plan", "peak GiB", "saving", "optimizer GiB", "activations GiB", "samples/s", "speed-up"],
            [[r.get("step", r["plan"]), _gib(r["peak_bytes"]), _percent(r.get("memory_saving")),
              _gib(r["breakdown"].get("optimizer")), _gib(r["breakdown"].get("activations")), r["samples_per_s"],
              r.get("speedup")] for r in part["rows"]],
        ))
        lines.append("")
    if "fit" in parts:
        fit = parts["fit"]
        fresh = fit["fresh_process"]
        lines.append(
            f"**fit** on a budget of {_gib(fit['budget_bytes'])} GiB (45% of the plain peak, Llama "
            f"{_shape(fit['model'])}): chose `{fit['best']['plan']}` ({_gib(fit['best']['peak_bytes'])} GiB) after "
            f"{len(fit['trials'])} trials in {fit['fit_seconds']} s, {len(fit['skipped'])} plans skipped; re-measured "
            f"in a fresh process: {_gib(fresh.get('peak_bytes'))} GiB."
        )
        lines.append("")
    if "cap" in parts:
        cap = parts["cap"]
        drift = next(c for c in cap["checks"] if "to the byte" in c["check"])
        lines.append(
            f"**Budget cap**: {len(cap['capped'])} trials of plans over a budget of {_gib(cap['budget_bytes'])} GiB "
            f"(60% of the plain peak) all reported oom; memory_allocated moved by {drift.get('drift')} bytes."
        )
        lines.append("")
    return "\n".join(lines)


def _shape(model: dict[str, Any]) -> str:
    size = f"{model['parameters'] / 1e9:.2f}B parameters, " if "parameters" in model else ""
    return f"{size}hidden {model['hidden']} x {model['layers']} layers, batch {model['rows']} x {model['length']}"


def _percent(value: float | None) -> str | None:
    return None if value is None else f"{100 * value:.0f}%"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the acceptance parts, write ``gpu_acceptance-<device>.json``, print the summary; return the result."""
    parser = common.build_parser((__doc__ or NAME).splitlines()[0])
    parser.set_defaults(size=None)
    parser.add_argument("--sections", help=f"comma-separated parts to run, from: {', '.join(ORDER)} (default: all)")
    parser.add_argument("--deadline", type=float, default=560.0,
                        help="seconds after which no further part starts (default 560)")
    parser.add_argument("--markdown", type=Path, metavar="FILE",
                        help="print the README tables of a result written by this run, and run nothing")
    parser.add_argument("--section", help=argparse.SUPPRESS)
    parser.add_argument("--part", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.markdown:
        result = json.loads(args.markdown.read_text())
        print(markdown(result))
        return result
    if args.size is None:
        args.size = "full" if torch.cuda.is_available() and args.device != "cpu" else "small"
    device = common.resolve_device(args, parser)
    if args.section:  # a child: one section, its result into --part
        result = run_section_here(args.section, args.size, device)
        args.part.write_text(json.dumps(result, default=common._jsonable, allow_nan=False))
        return result
    chosen = ORDER if not args.sections else tuple(s.strip() for s in args.sections.split(","))
    unknown = [s for s in chosen if s not in ORDER]
    if unknown:
        parser.error(f"--sections: {unknown[0]!r} is not a part; write some of {', '.join(ORDER)}")
    common.quiet()
    started = time.perf_counter()
    result = common.metadata_for(NAME, device, args.size)
    stem = common.result_stem(NAME, device, args.size)
    path = args.out / f"{stem}.json"
    parts: dict[str, Any] = {}
    for name in chosen:
        left = args.deadline - (time.perf_counter() - started)
        if left < 20:
            parts[name] = {"checks": [{"check": f"{name} ran", "passed": False,
                                       "error": f"not started: the run's {args.deadline:.0f} s deadline was near"}]}
            continue
        limit = min(LIMITS.get(name, DEFAULT_LIMIT), left)
        print(f"== {name} (at most {limit:.0f} s)", flush=True)
        if name == "pytest":
            parts[name] = run_pytest(limit, device)
        elif name == "hf_table":
            parts[name] = run_hf_table(args.size, device, args.out, limit)
        else:
            parts[name] = run_section_process(name, args.size, device, limit)
        result.update(parts=parts, summary=summarize(parts), seconds=round(time.perf_counter() - started, 1))
        common.write_json(result, path)  # after every part, so that a run cut short keeps what it measured
    summary = summarize(parts)
    print(f"gpu acceptance: {summary['passed']} checks passed, {summary['failed']} failed, "
          f"{summary['not_judged']} not judged here, in {result['seconds']} s; wrote {path}")
    for failure in summary["failures"]:
        print(f"  FAILED {failure}")
    return result


if __name__ == "__main__":
    main()
