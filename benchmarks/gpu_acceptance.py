"""The GPU acceptance run: every CUDA path of memlab on a real GPU, as ONE command that ends within 9 minutes and
spends its first minutes on what matters most: the parts whose newest run failed or whose code changed since.

The command (on a lent GPU: the ``run`` tool of the device README, /work/.library/device/README.md)
-------------------------------------------------------------------------------------------------
Here, once before a call, in the checkout the ``run`` tool sends (``.gpu/`` is ignored by git)::

    python -m benchmarks.gpu_acceptance --prepare

It downloads the wheels the GPU image lacks into ``.gpu/wheels/`` (:data:`benchmarks.gpu_queue.WHEELS`: peft,
bitsandbytes slimmed to its CUDA 13 libraries, TRL, ``datasets``, dill, multiprocess, torchao, liger-kernel; about
13 MiB, the working tree about 12 MiB), writes ``.gpu/checkout.json`` (the commit, and for each part whether its code
changed since its newest run, as git says here: the GPU machine gets no ``.git``), and prints the queue and the call.
The call, with ``carry=[".gpu"]`` and ``timeout_s=600`` (:data:`DEVICE_COMMAND`, one line)::

    nvidia-smi; set -o pipefail; PYTHONUNBUFFERED=1 python3 -m benchmarks.gpu_acceptance --full --out $OUT 2>&1 |
    tee $OUT/log

The run puts the parts in the queue of :mod:`benchmarks.gpu_queue` (stale first: a failed part whose code changed
since, then the parts never judged on a GPU, then those whose code changed since they passed, then failed ones whose
code did not change, last the current ones; :data:`PARTS`' order within each tier), installs the carried wheels with
``pip install --no-index --no-deps --target`` (peft and bitsandbytes before the first part, the others before the
first part that needs them, each said in the output), and runs each part in its own Python process (so that one
part's CUDA error, broken CUDA context or cached memory cannot touch the next) within its own limit
(``Part.limit_s``), writing ``gpu_acceptance-<gpu>.json`` after every part, so that whatever happens the JSON holds
what finished. No part starts after the run's deadline (:data:`DEADLINE`, 490 s: with the wheels' install and the
imports the command ends within 9 minutes, under the 10 a command may take and inside the 15 minutes of device time a
session has, the machine's start included) or with less than :data:`START_SHARE` of its limit left; a part cut at its
limit keeps the checks it printed; the parts not reached are named as not started, and the next call takes them first
once this one's results are committed. Each part's result records the commit it ran at, the digest of the code it
checks and its date, which the next call's queue reads.

What comes back (at most 8 files): ``gpu_acceptance-<gpu>.json``, the log (and ``hf_table-<gpu>.json`` where that
part ran). Commit the result under ``benchmarks/results/`` (a suffix naming the call), add its ``{benchmark}`` block
to docs/benchmarks.md (``--markdown FILE`` prints its tables), and write the bar again (``--bar``: every part's newest
result, :data:`BAR`), then ``python -m benchmarks.cuda_truth`` and ``python -m benchmarks.cuda_truth_estimates`` where
the truth's parts ran.

The parts and what each checks
------------------------------
:data:`PARTS` declares each: its limit in seconds on an H100 or H200 (what the runs took, and a third more; for the
parts of issue 86 a guess from their sizes), the paths whose change makes its newest run stale, and the wheels it
needs beyond peft and bitsandbytes. The order within a tier is issue 86's: the limits boundary, the held-out families
and the cast-after-load reserve, float8, GRPO at 1,024 tokens and on Qwen3-8B's shape, the loads and the estimates,
compile on two more families, the published trainers (issue 83's part: skipped with its reason until its module is on
the branch), then the parts the latest runs passed, the seeds' table last. A check passes (True), fails (False) or
cannot be judged on this device (None: a CUDA figure on the CPU, or a library that is not installed, with the reason).
While the GPU runs the first parts, side processes that see no GPU (``CUDA_VISIBLE_DEVICES=""``, niced) make the
estimates the estimated parts compare (CPU-made, as CI makes them), one process for each (on a GPU machine only).

Run from the repository root::

    python -m benchmarks.gpu_acceptance --queue                 # the order a run would take, and why
    python -m benchmarks.gpu_acceptance                         # everything, --full sizes, on a CUDA machine
    python -m benchmarks.gpu_acceptance --sections encdec,vlm --keep FILE
    python -m benchmarks.gpu_acceptance --bar                   # benchmarks/results/gpu_acceptance_bar.json
    python -m benchmarks.gpu_acceptance --smoke --device cpu    # the same command at tiny sizes on the CPU: the
                                                                # queue until its 60 s deadline (the suite)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks import common
from benchmarks.gpu_acceptance_tables import bar_markdown, markdown  # the results as the docs show them
from benchmarks.gpu_common import estimates_variable, gpu_kind_name, start_side_estimates
from benchmarks.gpu_queue import (
    BASE,
    CARRIED,
    SITE,
    TIERS,
    TRL,
    WHEEL_FOLDER,
    CodeState,
    Queued,
    code_digest,
    fetch,
    head,
    history,
    history_folders,
    install,
    newest,
    queue,
    tree_bytes,
    write_checkout,
)
from benchmarks.gpu_sections import ROOT, SECTIONS

NAME = "gpu_acceptance"
BAR = "gpu_acceptance_bar"
"""The committed summary (``benchmarks/results/gpu_acceptance_bar.json``): every part's newest result."""
DEVICE_COMMAND = ("nvidia-smi; set -o pipefail; PYTHONUNBUFFERED=1 python3 -m benchmarks.gpu_acceptance --full "
                  "--out $OUT 2>&1 | tee $OUT/log")
"""The device tool's command, with ``carry=[".gpu"]`` and ``timeout_s=600`` (``--prepare`` first, here)."""

STEP = ("memlab/runner", "memlab/measure", "memlab/techniques")
"""What a measured trial runs through."""
DRY_RUN = ("memlab/estimation",)
TRAINERS = ("memlab/trainer", "memlab/kinds")
ESTIMATE_SECTIONS = ("benchmarks/gpu_sections_estimate.py", "benchmarks/gpu_reference.py")
COMPILE = ("benchmarks/gpu_sections_compile.py", "memlab/techniques/compile.py", "memlab/measure/compiled.py",
           *DRY_RUN)
RL = ("benchmarks/gpu_sections_rl.py", "benchmarks/gpu_sections_peft.py", *TRAINERS, *DRY_RUN)
LEVERS = ("benchmarks/gpu_sections.py", "benchmarks/gpu_reference.py", *STEP)


@dataclasses.dataclass(frozen=True)
class Part:
    """One part of the run: what it is called, how long it may take, what it checks and needs."""

    name: str
    limit_s: float
    """Seconds at most on an H100 or H200."""
    checks: tuple[str, ...]
    """The paths (files or folders, from the repository root) whose change makes its newest run stale."""
    needs: tuple[str, ...] = ()
    """The carried wheels it needs beyond :data:`benchmarks.gpu_queue.BASE` (names of ``WHEELS`` there)."""
    estimated: bool = False
    """Its CPU-made estimates are made by a side process while the GPU runs the parts before it."""
    provided_by: str | None = None
    """``"module:function"`` of a section another issue provides; the part is skipped, with why, until it exists."""


PARTS: tuple[Part, ...] = (
    Part("boundary", 100, ("benchmarks/gpu_sections_fill.py", "memlab/search", *DRY_RUN, "memlab/measure")),
    Part("heldout", 170, (*ESTIMATE_SECTIONS, *DRY_RUN, *STEP), estimated=True),
    Part("cast_reserve", 180, ("benchmarks/gpu_sections_cast.py", *ESTIMATE_SECTIONS, *DRY_RUN)),
    Part("fp8", 120, ("benchmarks/gpu_sections_fp8.py", *DRY_RUN, *STEP), needs=("torchao",)),
    Part("grpo_1024", 240, RL, needs=TRL),
    Part("grpo_8b", 240, RL, needs=TRL),
    Part("loads", 120, ("benchmarks/gpu_sections_loads.py", *DRY_RUN, *STEP, "memlab/inference"), estimated=True),
    Part("estimate", 90, (*ESTIMATE_SECTIONS, *DRY_RUN, *STEP), estimated=True),
    Part("compile_families", 240, COMPILE),
    Part("published", 240, ("benchmarks/gpu_sections_published.py", *TRAINERS, *DRY_RUN),
         needs=(*TRL, "liger-kernel"), provided_by="benchmarks.gpu_sections_published:section_published"),
    Part("levers", 180, LEVERS),
    Part("pytest", 100, ("tests/gpu", "tests/models.py", *STEP), needs=(*TRL, "torchao")),
    Part("compile", 180, COMPILE),
    Part("rl", 210, RL, needs=TRL),
    Part("sft_peft", 170, ("benchmarks/gpu_sections_peft.py", "benchmarks/gpu_sections_trainer.py", *TRAINERS,
                           *DRY_RUN, "memlab/search"), needs=TRL),
    Part("fill", 110, ("benchmarks/gpu_sections_fill.py", *DRY_RUN, *STEP)),
    Part("cumulative", 150, LEVERS),
    Part("restore", 100, ("benchmarks/gpu_sections_restore.py", *STEP, "memlab/live")),
    Part("encdec", 120, (*ESTIMATE_SECTIONS, *DRY_RUN, *STEP), estimated=True),
    Part("heldout_off", 60, (*ESTIMATE_SECTIONS, *DRY_RUN, *STEP), estimated=True),
    Part("vlm", 90, ("benchmarks/gpu_sections_vlm.py", *DRY_RUN, *STEP), estimated=True),
    Part("peft_model", 90, ("benchmarks/gpu_sections_peft.py", *DRY_RUN, *STEP, "memlab/search")),
    Part("timeline", 60, ("benchmarks/gpu_sections_timeline.py", *STEP)),
    Part("trainer", 100, ("benchmarks/gpu_sections_trainer.py", *TRAINERS, "memlab/search", *STEP)),
    Part("probe", 60, LEVERS),
    Part("inference", 100, ("benchmarks/gpu_sections_inference.py", "memlab/inference", "memlab/measure")),
    Part("reserve", 100, ("benchmarks/gpu_sections_runs.py", *STEP, "memlab/estimation/cuda")),
    Part("cap", 60, ("benchmarks/gpu_sections.py", *STEP)),
    Part("fit", 90, (*LEVERS, "memlab/search")),
    Part("ties", 100, ("benchmarks/gpu_sections_runs.py", "benchmarks/ties.py", "memlab/report", *STEP)),
    Part("hf_table", 130, ("benchmarks/hf_table.py", *STEP, "memlab/export")),
)
"""Every part in issue 86's order (the order within a tier of the queue). The limits: what the H200 and H100 runs
took and a third more (pytest 80 s, compile 121, levers 135, sft_peft 110, rl 196, heldout 129, loads 89, estimate 66,
boundary 48 before its user's loops ran in fresh processes, fill 114); for the parts of issue 86 a guess from their
sizes: ``cast_reserve`` twelve programs three at
a time and twelve laptop-made estimates beside them, ``fp8`` four processes on Llama-3.2-1B's shape, ``grpo_1024``
two 0.5B trainers generating 8 x 1,024 tokens, ``grpo_8b`` one 8B trainer doing the same, ``compile_families`` four
compiled or eager loops."""
BY_NAME = {part.name: part for part in PARTS}
ORDER = tuple(part.name for part in PARTS)
LIMITS = {part.name: part.limit_s for part in PARTS}
ESTIMATED = tuple(part.name for part in PARTS if part.estimated)
"""The parts whose CPU-made estimates a side process that sees no GPU makes while the GPU runs the parts before."""
START_SHARE = 0.75
"""A part starts only with this share of its limit left before the deadline: a part cut short keeps only the checks
it printed, so one that would not finish is better left for a later call."""
DEFAULT_LIMIT = 120
DEADLINE = 490.0
"""Seconds of the whole run at the full size, from its start: with the wheels' install (about 15 s) and the
imports, the command ends within 9 minutes, inside the device's 10 minutes a command."""
SMOKE = {"deadline": 60.0, "limit": 60.0, "least": 25.0}
"""The smoke size (the suite's run of this very command on the CPU): the run's deadline, a part's limit, and the
least time left in which a part still starts. The parts after the deadline are named as not started."""
CPU_SLACK = 5
"""The small size runs on CPUs, often shared: its limits and deadline are this many times longer."""
HF_TABLE_REPEATS = 1


def unavailable(name: str) -> str | None:
    """Why part ``name`` cannot run on this checkout (its section is another issue's, not here yet), or None."""
    provided = BY_NAME[name].provided_by if name in BY_NAME else None
    if provided is None:
        return None
    module = provided.split(":")[0]
    if importlib.util.find_spec(module) is None:
        return (f"{module.replace('.', '/')}.py is not on this branch yet (issue 83 provides "
                f"{provided.replace(':', '.')}(size, device), with its own checks)")
    return None


def section_function(name: str) -> Callable[[str, torch.device], dict[str, Any]]:
    """Part ``name``'s section: :data:`benchmarks.gpu_sections.SECTIONS`' or the one its ``provided_by`` names."""
    provided = BY_NAME[name].provided_by if name in BY_NAME else None
    if provided is None:
        return SECTIONS[name]
    module, function = provided.split(":")
    found: Callable[[str, torch.device], dict[str, Any]] = getattr(importlib.import_module(module), function)
    return found


def run_section_here(name: str, size: str, device: torch.device) -> dict[str, Any]:
    """One section in this process; an exception becomes a failed check with its traceback, after the checks the
    section made before it raised; a part this checkout cannot run (:func:`unavailable`) is skipped with why."""
    from benchmarks.gpu_common import Checks

    common.quiet()
    why = unavailable(name)
    if why is not None:
        return skipped(name, why)
    started = time.perf_counter()
    made = len(Checks.made)
    try:
        result = section_function(name)(size, device)
    except Exception as error:  # noqa: BLE001 - reported as a failed section, with the traceback
        failed = {"check": f"{name} ran to the end", "passed": False, "error": f"{type(error).__name__}: {error}"}
        result = {
            "checks": [*Checks.made[made:], failed],  # what it checked before it raised, then why it stopped
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
    # In this process, one test at a time on the one GPU: no xdist workers (pyproject's -n auto), which the device
    # machine does not install.
    # Short tracebacks: the part keeps the output's last 6,000 characters, which long ones overflowed.
    code, output, seconds = _child([sys.executable, "-m", "pytest", "tests/gpu", "-v", "-p", "no:cacheprovider",
                                    "--tb=short", "-o", "addopts=-rfEs"], limit)
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


def run_section_process(name: str, size: str, device: torch.device, limit: float,
                        env: dict[str, str] | None = None) -> dict[str, Any]:
    """One section in a fresh Python process (``env``: variables added to its environment)."""
    with tempfile.TemporaryDirectory(prefix="memlab-gpu-") as folder:
        part = Path(folder) / "part.json"
        command = [sys.executable, "-m", "benchmarks.gpu_acceptance", "--section", name, f"--{size}",
                   "--device", device.type, "--part", str(part)]
        code, output, seconds = _child(command, limit, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        if part.exists():
            result: dict[str, Any] = json.loads(part.read_text())
        else:
            why = f"stopped at its limit of {limit:.0f} s" if code is None else f"exited with {code}"
            # What it checked before it stopped (each check prints a line): kept, with the failure that it stopped.
            result = {"checks": [*printed_checks(output),
                                 {"check": f"{name} ran to the end", "passed": False, "error": why}],
                      "output_tail": output[-4000:], "cut": why}
    result["process_seconds"] = round(seconds, 1)
    return result


def printed_checks(output: str) -> list[dict[str, Any]]:
    """The checks a section printed (:class:`benchmarks.gpu_common.Checks`), read back from its output: what a part
    cut at its limit, or killed by a broken CUDA context, had judged.

    Example:
        >>> printed_checks('    [PASS] a: ran {"error": null}\\n    [FAIL] b: fits {"peak": 3}\\n    [n/a ] c {}')
        [{'check': 'a: ran', 'passed': True, 'printed': '{"error": null}'}, \
{'check': 'b: fits', 'passed': False, 'printed': '{"peak": 3}'}, {'check': 'c', 'passed': None, 'printed': '{}'}]
    """
    marks = {"PASS": True, "FAIL": False, "n/a ": None}
    found = []
    for line in output.splitlines():
        matched = re.match(r"\s*\[(PASS|FAIL|n/a )\] (.*?) (\{.*)$", line)
        if matched:
            found.append({"check": matched[2], "passed": marks[matched[1]], "printed": matched[3]})
    return found


def run_hf_table(size: str, device: torch.device, out: Path, limit: float) -> dict[str, Any]:
    """The seeds' table through memlab and the Trainer, written as its own result; its summary here."""
    command = [sys.executable, "-m", "benchmarks.hf_table", f"--{size}", "--device", device.type, "--out", str(out),
               "--repeats", str(HF_TABLE_REPEATS if size == "full" else 1)]
    code, output, seconds = _child(command, limit, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    path = out / f"{common.result_stem('hf_table', device, size)}.json"
    # The table's JSON is written before its figure; the GPU image has no plotly, which only the figure needs.
    no_figure = code != 0 and "No module named 'plotly'" in output
    if (code != 0 and not no_figure) or not path.exists() or path.stat().st_mtime < time.time() - seconds - 5:
        return {"checks": [{"check": "hf_table ran", "passed": False, "error": output[-2000:]}],
                "seconds": round(seconds, 1)}
    table = json.loads(path.read_text())
    ratio = table.get("throughput_ratio_min_same_work")
    adafactor = [row for row in table["rows"] if "Adafactor" in row["row"]]
    adafactor_ratios = [row.get("throughput_ratio") for row in adafactor]
    return {
        "file": path.name, "markdown": table["markdown"], "seconds": round(seconds, 1),
        "figure": None if no_figure else f"{path.stem}.html",
        "throughput_ratio_median": table["throughput_ratio_median"],
        "throughput_ratio_min": table["throughput_ratio_min"],
        "throughput_ratio_min_same_work": ratio,
        "checks": [
            {"check": "every row ran on both sides",
             "passed": all(r["memlab"]["status"] in ("ok", "not supported by memlab") and r["trainer"]["status"] == "ok"
                           for r in table["rows"])},
            {"check": "memlab/Trainer throughput >= 0.95 in every row doing the same work",
             "passed": None if device.type != "cuda" else bool(ratio is not None and ratio >= 0.95), "min": ratio},
            {"check": "the Adafactor rows ran on both sides",
             "passed": bool(adafactor) and all(r["memlab"]["status"] == "ok" and r["trainer"]["status"] == "ok"
                                               for r in adafactor),
             "rows": [r["row"] for r in adafactor]},
            {"check": "memlab/Trainer throughput >= 0.95 in the Adafactor rows",
             "passed": None if device.type != "cuda" else bool(adafactor_ratios) and all(
                 r is not None and r >= 0.95 for r in adafactor_ratios),
             "ratios": adafactor_ratios},
        ],
    }


def summarize(parts: dict[str, Any]) -> dict[str, Any]:
    """Counts of passed, failed and not-judged checks, the names of the failed ones, and the parts not started (the
    deadline) or not run (another issue's, not on this checkout)."""
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
    return {"passed": passed, "failed": failed, "not_judged": unjudged, "failures": failures,
            "not_started": [name for name, part in parts.items() if part.get("not_started")],
            "unavailable": [name for name, part in parts.items() if part.get("unavailable")]}


def start_estimates(size: str, device: torch.device, folder: Path,
                    section: str) -> tuple[subprocess.Popen[bytes], Path]:
    """``section``'s estimates, made in a side process that sees no GPU (``CUDA_VISIBLE_DEVICES=""``, four threads
    on a GPU machine) while the GPU runs the parts before it: the process and the file it writes."""
    gpu = gpu_kind_name(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    return start_side_estimates(section, size, device.type, gpu, folder, threads=4 if device.type == "cuda" else 1)


def estimates_ready(process: subprocess.Popen[bytes] | None, out: Path | None, wait: float,
                    section: str = "estimate") -> dict[str, str]:
    """The environment that points ``section`` at the side process's file, once it is written (waiting at most
    ``wait`` seconds); none where it failed or is late (the section then makes its estimates itself)."""
    if process is None or out is None:
        return {}
    try:
        process.wait(timeout=max(wait, 1))
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        print(f"  the side process's {section} estimates were late; the section makes its own", flush=True)
        return {}
    if process.returncode != 0 or not out.exists():
        print(f"  the side process's {section} estimates failed (exit {process.returncode}): {_read_log(out)}",
              flush=True)
        return {}
    return {estimates_variable(section): str(out)}


def _read_log(out: Path) -> str:
    log = out.with_suffix(".log")
    return log.read_text(errors="replace")[-2000:] if log.exists() else ""


def extra_versions() -> dict[str, str | None]:
    """The versions of the libraries only some parts need (TRL and what ``datasets`` reads, torchao, Liger), None where
    absent."""
    from importlib import metadata

    found: dict[str, str | None] = {}
    for package in ("trl", "datasets", "pyarrow", "torchao", "liger-kernel"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found


def not_started(name: str, why: str) -> dict[str, Any]:
    """A part the run did not reach: not judged (None), with why; the summary names it."""
    return {"not_started": True, "checks": [{"check": f"{name} ran", "passed": None, "why": f"not started: {why}"}]}


def part_limits(name: str, size: str, slack: float) -> tuple[float, float]:
    """A part's limit in seconds, and the least time left in which it still starts (:data:`START_SHARE` of its
    limit; at the smoke size :data:`SMOKE`'s)."""
    if size == "smoke":
        return SMOKE["limit"], SMOKE["least"]
    limit = LIMITS.get(name, DEFAULT_LIMIT) * slack
    return limit, START_SHARE * limit


def skipped(name: str, why: str) -> dict[str, Any]:
    """A part that cannot run on this checkout: not judged (None), with why; the summary names it."""
    return {"unavailable": why, "checks": [{"check": f"{name} ran", "passed": None, "why": f"skipped: {why}"}]}


def stamp(part: Part, commit: str | None) -> dict[str, Any]:
    """What a part's result records of the code it ran: its date, the commit and the digest of its paths (what the
    next run's queue compares)."""
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit,
            "code_digest": code_digest(part.checks, ROOT)}


def plan_queue(folders: Sequence[Path], listed: Sequence[str] | None = None,
               state: CodeState | None = None) -> list[Queued]:
    """The parts in the order this run takes them: stale first (:func:`benchmarks.gpu_queue.queue`) over the runs in
    ``folders``; ``listed``: those parts only, in that order (each with its tier and why)."""
    state = state or CodeState(ROOT)
    latest = newest(history(folders))
    queued = queue(ORDER, latest, lambda name, run: state.changed(name, BY_NAME[name].checks, run))
    if listed is None:
        return queued
    by_part = {place.part: place for place in queued}
    return [by_part[name] for name in listed]


def bar(folders: Sequence[Path] = (common.RESULTS_DIR,), state: CodeState | None = None) -> dict[str, Any]:
    """Every part's newest result in the committed runs of ``folders`` (and each declared part never run): its
    verdict, checks, device, commit and date, with its limit; the rows and their markdown (:data:`BAR`)."""
    state = state or CodeState(ROOT)
    latest = newest(history(folders))
    rows = []
    for name in [*ORDER, *sorted(set(latest) - set(ORDER))]:
        run = latest.get(name)
        part = BY_NAME.get(name)
        row: dict[str, Any] = {"part": name, "limit_s": part.limit_s if part else None}
        if run is not None:
            inferred = None if run.commit else state.commit_before(run.date)
            row.update(verdict=run.verdict, passed=run.passed, failed=run.failed, device=run.device,
                       commit=run.commit[:7] if run.commit else None,
                       commit_before=inferred[:7] if inferred else None, date=run.date, source=run.source)
        rows.append(row)
    return {"benchmark": BAR, "rows": rows, "markdown": bar_markdown(rows)}


def write_bar(out: Path) -> dict[str, Any]:
    """:func:`bar` of the committed results, written as ``out/gpu_acceptance_bar.json``."""
    made = bar()
    common.write_json(made, out / f"{BAR}.json")
    return made


def prepare() -> list[Queued]:
    """``--prepare``: the wheels downloaded into ``.gpu/wheels``, ``.gpu/checkout.json`` written, what a call
    carries said; the queue."""
    wheels = fetch()
    write_checkout(ORDER, {part.name: part.checks for part in PARTS})
    carried = sum(path.stat().st_size for path in CARRIED.rglob("*") if path.is_file())
    tree = tree_bytes() or 0
    print(f"{CARRIED.relative_to(ROOT)}/: {len(wheels)} wheels and checkout.json, {carried / 2**20:.1f} MiB; with the "
          f"working tree ({tree / 2**20:.1f} MiB) a call carries {(carried + tree) / 2**20:.1f} MiB of 64")
    for wheel in wheels:
        print(f"  {wheel.name} {wheel.stat().st_size / 2**20:.2f} MiB")
    return plan_queue(history_folders(ROOT), state=CodeState(ROOT))


def print_queue(queued: Sequence[Queued]) -> None:
    for place in queued:
        said = unavailable(place.part)
        print(f"  {TIERS[place.tier]:<24} {place.part:<17} {LIMITS[place.part]:>4.0f} s  "
              f"{'skipped: ' + said if said else place.why}")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the acceptance parts, write ``gpu_acceptance-<device>.json``, print the summary; return the result."""
    parser = common.build_parser((__doc__ or NAME).splitlines()[0])
    parser.set_defaults(size=None)
    parser.add_argument("--sections", help=f"comma-separated parts to run in this order, from: {', '.join(ORDER)} "
                                           "(default: every part, stale first)")
    parser.add_argument("--order", choices=("stale", "listed"), default="stale",
                        help="stale: the queue of benchmarks/gpu_queue.py (default); listed: the parts as declared")
    parser.add_argument("--history", type=Path, action="append", metavar="DIR",
                        help="a folder of earlier results the queue reads (repeatable; default: benchmarks/results "
                             "and /work/shared/gpu-runs where it exists)")
    parser.add_argument("--deadline", type=float,
                        help=f"seconds after which no further part starts (default {DEADLINE:.0f} at the full size, "
                             f"{SMOKE['deadline']:.0f} at the smoke size; at the small size {CPU_SLACK} times the "
                             "full size's, and the parts' limits too, for slow shared CPUs)")
    parser.add_argument("--keep", type=Path, metavar="FILE",
                        help="a result of an earlier run: its parts are kept, those run now replace theirs")
    parser.add_argument("--wheels", type=Path, default=WHEEL_FOLDER,
                        help="the carried wheels (default .gpu/wheels: --prepare downloads them)")
    parser.add_argument("--site", type=Path, default=SITE,
                        help=f"where the wheels are installed (default {SITE})")
    parser.add_argument("--no-install", action="store_true",
                        help="install no carried wheel (the smoke size never does)")
    parser.add_argument("--markdown", type=Path, metavar="FILE",
                        help="print the README tables of a result written by this run, and run nothing")
    parser.add_argument("--queue", action="store_true", help="print the order a run would take, and why; run nothing")
    parser.add_argument("--prepare", action="store_true",
                        help="download the wheels into .gpu/wheels and write .gpu/checkout.json (here, before a call "
                             "to the GPU machine), then print the queue and the call; run nothing")
    parser.add_argument("--bar", action="store_true",
                        help=f"write {BAR}.json into --out from the committed results (every part's newest); run "
                             "nothing")
    parser.add_argument("--section", help=argparse.SUPPRESS)
    parser.add_argument("--part", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.markdown:
        result = json.loads(args.markdown.read_text())
        print(markdown(result))
        return result
    if args.bar:
        made = write_bar(args.out)
        print(made["markdown"])
        return made
    folders = args.history or history_folders(ROOT)
    if args.prepare or args.queue:
        queued = prepare() if args.prepare else plan_queue(folders)
        print_queue(queued)
        if args.prepare:
            print(f"\nthe call (carry=[\".gpu\"], timeout_s=600):\n{DEVICE_COMMAND}")
        return {"queue": [place.as_json() for place in queued]}
    if args.size is None:
        args.size = "full" if torch.cuda.is_available() and args.device != "cpu" else "small"
    device = common.resolve_device(args, parser)
    if args.section:  # a child: one section, its result into --part
        result = run_section_here(args.section, args.size, device)
        args.part.write_text(json.dumps(result, default=common._jsonable, allow_nan=False))
        return result
    listed = None if not args.sections else [s.strip() for s in args.sections.split(",")]
    unknown = [s for s in listed or () if s not in ORDER]
    if unknown:
        parser.error(f"--sections: {unknown[0]!r} is not a part; write some of {', '.join(ORDER)}")
    if listed is None and args.order == "listed":
        listed = list(ORDER)
    common.quiet()
    started = time.perf_counter()
    wheels = Wheels(args.wheels, args.site, args.size != "smoke" and not args.no_install)
    wheels.need(BASE, "every part (memlab itself)")  # before anything here imports memlab
    queued = plan_queue(folders, listed)
    print("the queue:", flush=True)
    print_queue(queued)
    result = common.metadata_for(NAME, device, args.size)
    result["versions"].update(extra_versions())
    checkout = head(ROOT)
    result.update(checkout, queue=[place.as_json() for place in queued])
    parts: dict[str, Any] = {}
    if args.keep:
        earlier = json.loads(args.keep.read_text())
        parts.update({name: part for name, part in earlier["parts"].items()
                      if name not in {place.part for place in queued}})
        result["kept_from"] = {"date": earlier["date"], "command": earlier["command"], "seconds": earlier["seconds"],
                               "parts": list(parts)}
    path = args.out / f"{common.result_stem(NAME, device, args.size)}.json"
    slack = 1 if args.size == "full" else CPU_SLACK
    default = SMOKE["deadline"] if args.size == "smoke" else DEADLINE * slack
    deadline = args.deadline if args.deadline is not None else default
    result["deadline_s"] = deadline
    order = [place.part for place in queued]
    with tempfile.TemporaryDirectory(prefix="memlab-estimates-") as folder:
        # Side processes only beside a GPU: on the CPU they would take the cores the parts themselves need.
        sides = {name: start_estimates(args.size, device, Path(folder), name) for name in order
                 if name in ESTIMATED and device.type == "cuda"}
        try:
            for place in queued:
                name = place.part
                why = unavailable(name)
                if why is not None:
                    parts[name] = skipped(name, why)
                    print(f"== {name}: skipped ({why})", flush=True)
                    continue
                left = deadline - (time.perf_counter() - started)
                most, least = part_limits(name, args.size, slack)
                if left < least:
                    parts[name] = not_started(name, f"{left:.0f} s of the run's {deadline:.0f} s were left, "
                                                    f"{least:.0f} s needed")
                    continue
                said = wheels.need(BY_NAME[name].needs, name)
                limit = min(most, deadline - (time.perf_counter() - started))
                print(f"== {name} (at most {limit:.0f} s; {TIERS[place.tier]})", flush=True)
                at = stamp(BY_NAME[name], checkout["commit"])
                if name == "pytest":
                    parts[name] = run_pytest(limit, device)
                elif name == "hf_table":
                    parts[name] = run_hf_table(args.size, device, args.out, limit)
                else:
                    env = estimates_ready(*sides[name], limit / 3, name) if name in sides else None
                    # A wait for the side process is the part's time: the run's deadline holds.
                    limit = min(limit, deadline - (time.perf_counter() - started))
                    parts[name] = run_section_process(name, args.size, device, limit, env)
                parts[name].update(at, queued=place.as_json(), **({"wheels": said} if said else {}))
                if parts[name].get("cut") and limit < most:  # the run's deadline cut it, not its own limit
                    parts[name]["cut_by_deadline"] = True
                result["versions"].update(extra_versions())  # with what the wheels installed so far
                result.update(parts=dict(parts), summary=summarize(parts), wheels=wheels.said,
                              seconds=round(time.perf_counter() - started, 1))
                common.write_json(result, path)  # after every part, so that a run cut short keeps what it measured
        finally:
            for side, _ in sides.values():
                if side.poll() is None:
                    side.kill()
                    side.wait()
    result.update(parts=dict(parts), summary=summarize(parts), wheels=wheels.said,
                  seconds=round(time.perf_counter() - started, 1))
    common.write_json(result, path)
    summary = result["summary"]
    print(f"gpu acceptance: {summary['passed']} checks passed, {summary['failed']} failed, "
          f"{summary['not_judged']} not judged here, in {result['seconds']} s; wrote {path}")
    for failure in summary["failures"]:
        print(f"  FAILED {failure}")
    if summary["not_started"]:
        print(f"  not started (the next call takes them first once this result is committed; or now: --sections "
              f"{','.join(summary['not_started'])} --keep {path}): {', '.join(summary['not_started'])}")
    return result



class Wheels:
    """The carried wheels installed as the run needs them (:func:`benchmarks.gpu_queue.install`), each said once in
    the output and kept in :attr:`said` for the result; nothing where installing is off."""

    def __init__(self, folder: Path, site: Path, on: bool) -> None:
        self.folder, self.site, self.on = folder, site, on
        self.done: set[str] = set()
        self.said: list[str] = []

    def need(self, dists: Sequence[str], by: str) -> list[str]:
        """Install those of ``dists`` not installed by this run yet, for ``by``: the lines said."""
        wanted = [dist for dist in dists if dist not in self.done]
        self.done |= set(wanted)
        if not self.on or not wanted:
            return []
        lines = [f"for {by}: {line}" for line in install(wanted, self.folder, self.site)]
        for line in lines:
            print(f"  wheels {line}", flush=True)
        self.said += lines
        return lines


if __name__ == "__main__":
    main()
