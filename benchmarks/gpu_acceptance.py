"""The GPU acceptance run: every CUDA path of memlab on a real GPU, as ONE command that ends within 9 minutes.

The command (on a lent GPU: the ``run`` tool of the device README, /work/.library/device/README.md)
-------------------------------------------------------------------------------------------------
The GPU image has torch 2.11, transformers, accelerate and peft, but not plotly (no part needs it: figures are
drawn only where plotly imports), TRL or ``datasets`` (the SFTTrainer), and one of the H200 run's calls found no
bitsandbytes (8-bit and paged AdamW, QLoRA, int8/NF4 inference, the 4-bit load). Carry these wheels, 45.8 MB in all
(measured with ``pip download --no-deps``; their other needs are in the image). Here, once, in the checkout the
``run`` tool sends (``.whl/`` is in .gitignore already)::

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl bitsandbytes==0.50.2 peft==0.21.2 trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19

bitsandbytes 43.1 MB, trl 0.95, peft 0.84, datasets 0.61, multiprocess 0.15, dill 0.12: with the working tree
(about 5 MB) and the results (under 1 MB) that fits the 64 MiB one call may carry. Then one call, with
``carry=[".whl"]`` and ``timeout_s=600``::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; nvidia-smi; \
    PYTHONUNBUFFERED=1 python3 -m benchmarks.gpu_acceptance --out $OUT 2>&1 | tee $OUT/log

It runs the parts in :data:`ORDER`, least verified first, each in its own Python process (so that one part's
CUDA error, broken CUDA context or cached memory cannot touch the next) within its own limit (:data:`LIMITS`), and
writes ``gpu_acceptance-<gpu>.json`` after every part, so that whatever happens the JSON holds what finished. No part
starts after the run's deadline (:data:`DEADLINE`, 490 s: with the wheels' install, about 15 s, and the imports,
the command ends within 9 minutes) or with less than :data:`START_SHARE` of its limit left; a part cut at its limit
keeps the checks it printed. The parts it did not reach are named in the JSON as not started: they are the ones
already verified on an H100 or the H200 (run them later with ``--sections`` and ``--keep FILE``, which joins a
new call's parts to an earlier result). On an H100 (2026-11-26) the first eight parts of the order then took 479 s
and the rest waited for a later call: about four or five parts fit one call (:data:`LIMITS`).

What comes back (at most 8 files): ``gpu_acceptance-<gpu>.json`` and the log (and ``hf_table-<gpu>.json`` where
that part ran). Commit the results under ``benchmarks/results/``, then ``python -m benchmarks.cuda_truth`` (the
table of truth), ``python -m benchmarks.cuda_truth_estimates`` (the CPU-made estimates against it) and add the
result's ``{benchmark}`` block to docs/benchmarks.md (``--markdown FILE`` prints its tables).

The parts, in order
-------------------
1. ``pytest`` (``tests/gpu``): on the H100 of 2026-11-27, 33 passed and 2 failed (the chunked loss's
   ``SystemError`` under the allocator's history, a baseline read before earlier tests' garbage was collected); both
   fixed, 35 passed on the H100 later that day (90 s) and on the H200 of 2026-11-28 (73 s).
2. ``compile`` (issue 69): a user's own loop on a Qwen2-0.5B shape, eager and under ``torch.compile``, each in a
   process of its own, against ``memlab.estimate`` made as on a laptop (:mod:`benchmarks.gpu_sections_compile`):
   the compiled estimate 1.129 of the loop's allocated peak on the H100 of 2026-11-28, 1.020 on that day's H200 once
   the dry run ran inductor's joint-graph passes before its partitioner.
3. What that run cut at its limit with nothing printed: ``cumulative`` (90 s), ``levers`` (80 s) and ``restore``
   (53 s left), which took 35, 44 and 45 s on the H100 of 2026-11-22, before the CUDA tracked step recorded the
   allocator's history. Their trials now print as they end (:func:`benchmarks.gpu_sections.trial_progress`).
4. What the H100 verified long before: ``inference``, ``reserve``, ``cap``, ``fit``, ``ties``
   (:mod:`benchmarks.gpu_sections` and the modules it names).
5. What the H200 verified: ``loads`` (the user's bf16 and 4-bit loads), ``estimate`` (GPT-2, BERT, Llama, Mixtral
   in four precisions), ``probe`` (peaks against a hand-made step), ``heldout`` (Qwen2, Mistral, Gemma-2, Phi-3,
   GPT-NeoX, T5).
6. What the H100 verified on 2026-11-26: ``peft_model`` (the user's own ``get_peft_model`` model: a hand-made step
   beside ``measure`` and ``estimate``, then ``fit``; the adapters bit-identical), ``encdec`` (item 2: T5-base and
   BART-base at 2 x 512 and 2 x 1024 in fp32, bf16 and pure bf16, :mod:`benchmarks.gpu_sections_estimate`), ``vlm``
   (a LLaVA of a real shape, :mod:`benchmarks.gpu_sections_vlm`), ``heldout_off`` (item 3: Mistral and Phi-3 in
   pure bf16), ``timeline`` (item 5: three plans of the 1B Llama against the allocator), ``trainer`` (``fit`` on a
   plain ``Trainer``, ``train()`` under ``watch`` and its overhead per step).
7. What the H200 verified on 2026-11-27: ``boundary`` (issue 69: ``memlab.limits`` at a boundary under a real cap,
   in a process that holds nothing but its model: the answer and the next size in memlab's step and a user's own
   loop, and the measured route; :func:`benchmarks.gpu_sections_fill.section_boundary`), ``sft_peft`` (TRL's
   ``SFTTrainer`` with packing and a LoRA ``peft_config``: ``measure``, ``estimate``, ``fit`` and ``watch`` against its
   own ``train()``, :mod:`benchmarks.gpu_sections_peft`) and ``fill`` (selective checkpointing and the attention lever,
   :mod:`benchmarks.gpu_sections_fill`); and what the H100 passed on 2026-11-27: ``rl``, TRL's ``DPOTrainer`` (a
   reference model held apart; a LoRA ``peft_config``) and ``GRPOTrainer`` (beta 0.04; LoRA) on a Qwen2-0.5B shape,
   each in a process of its own: the trainer's own ``train()`` against ``memlab.estimate`` made on the GPU (0.987 to
   1.046), and the estimate made as on a laptop (no GPU, no Triton) equal to the GPU-made one
   (:mod:`benchmarks.gpu_sections_rl`).
8. ``hf_table``: the seeds' table at full size.

While the GPU runs the first parts, side processes that see no GPU (``CUDA_VISIBLE_DEVICES=""``, niced) make the
estimates the estimated parts compare (CPU-made, as CI makes them), one process for each (on a GPU machine only: on
the CPU each part makes its own). A check passes (True), fails (False) or cannot be judged on this device (None: a
CUDA figure on the CPU, or a library that is not installed, with the reason).

Run from the repository root::

    python -m benchmarks.gpu_acceptance                  # everything, --full sizes, on a CUDA machine
    python -m benchmarks.gpu_acceptance --sections encdec,vlm --keep FILE
    python -m benchmarks.gpu_acceptance --smoke --device cpu   # the same command at tiny sizes on the CPU: the
                                                               # parts in order until its 60 s deadline (the suite)
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
from benchmarks.gpu_acceptance_tables import markdown  # noqa: E402  (the results as the docs show them)
from benchmarks.gpu_common import estimates_variable, gpu_kind_name, start_side_estimates
from benchmarks.gpu_sections import ROOT, SECTIONS

NAME = "gpu_acceptance"
ORDER = ("pytest", "compile", "cumulative", "levers", "restore", "inference", "reserve", "cap", "fit", "ties",
         "loads", "estimate", "probe", "heldout", "peft_model", "encdec", "vlm", "heldout_off", "timeline", "trainer",
         "boundary", "sft_peft", "fill", "rl", "hf_table")
"""The parts, least verified first: ``pytest`` (every test passed on the H100 and H200 since two failures of
2026-11-27 were fixed), the compiled step's estimate against a user's compiled loop (issue 69), then the three
parts that run cut with nothing printed (``cumulative``, ``levers``, ``restore``), then what the H100 verified long
before, what the H200 verified, what the H100 run of 2026-11-26 verified (a live peft model, T5 and BART, a VLM, the
held-out rows, the timeline, the Trainer), and what the H200 and H100 of 2026-11-27 passed (the limits boundary, the
SFTTrainer with peft, the levers of ``fill``, TRL's DPO and GRPO trainers); the seeds' table last."""
LIMITS = {"compile": 180, "rl": 210, "sft_peft": 170, "peft_model": 90, "encdec": 120, "vlm": 90, "heldout_off": 60,
          "timeline": 60,
          "boundary": 70, "fill": 110, "trainer": 100,
          "loads": 120, "estimate": 90, "probe": 60, "heldout": 170,
          "pytest": 100, "cumulative": 150, "levers": 180, "inference": 100, "reserve": 100, "restore": 100, "cap": 60,
          "fit": 90, "ties": 100, "hf_table": 130}
"""Seconds each part may take at most on an H100 or H200: what the H200 (2026-11-26) and H100 runs took, and a
third more (timeline 33 s, fill 114, trainer 41 with its SFT half moved out, loads 89, estimate 66, probe 37,
heldout 129; pytest 44, cumulative 63, levers 53, restore 51, cap 43, fit 64, hf_table 96); for the new parts a guess
from their sizes against those (rl: four 0.5B trainers built, estimated and trained, their laptop-made estimates in
a process beside); the H100 run of 2026-11-26 took sft_peft 70.5 s whole (22.5 where it broke),
peft_model 69.5, encdec 37.2, vlm 41.2, heldout_off 33.0, timeline 37.9, fill 114.6, trainer 61.5). On the H200 of
2026-11-27 ``pytest`` was cut at 80 s, before its last files (its tests grew); on the H100 of 2026-11-27 it took
64.5 s (100 s now), and ``cumulative``, ``levers`` and ``restore`` were cut at 90, 80 and 53 s. On the H100 of
2026-11-28 ``levers`` took 134.5 s whole (16 trials in 94 s, then three timed again), ``restore`` finished within
100 s, and ``sft_peft`` was cut at 120 s in its last measurement (the watch's overhead), every check before it
passed."""
ESTIMATED = ("encdec", "vlm", "heldout_off", "loads", "estimate", "heldout")
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


def run_section_here(name: str, size: str, device: torch.device) -> dict[str, Any]:
    """One section in this process; an exception becomes a failed check with its traceback, after the checks the
    section made before it raised."""
    from benchmarks.gpu_common import Checks

    common.quiet()
    started = time.perf_counter()
    made = len(Checks.made)
    try:
        result = SECTIONS[name](size, device)
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
    return {"passed": passed, "failed": failed, "not_judged": unjudged, "failures": failures,
            "not_started": [name for name, part in parts.items() if part.get("not_started")]}


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
    """The versions of the libraries only some parts need (TRL and what ``datasets`` reads), None where absent."""
    from importlib import metadata

    found: dict[str, str | None] = {}
    for package in ("trl", "datasets", "pyarrow"):
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


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the acceptance parts, write ``gpu_acceptance-<device>.json``, print the summary; return the result."""
    parser = common.build_parser((__doc__ or NAME).splitlines()[0])
    parser.set_defaults(size=None)
    parser.add_argument("--sections", help=f"comma-separated parts to run, from: {', '.join(ORDER)} (default: all)")
    parser.add_argument("--deadline", type=float,
                        help=f"seconds after which no further part starts (default {DEADLINE:.0f} at the full size, "
                             f"{SMOKE['deadline']:.0f} at the smoke size; at the small size {CPU_SLACK} times the "
                             "full size's, and the parts' limits too, for slow shared CPUs)")
    parser.add_argument("--keep", type=Path, metavar="FILE",
                        help="a result of an earlier run: its parts are kept, those run now replace theirs")
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
    result["versions"].update(extra_versions())
    parts: dict[str, Any] = {}
    if args.keep:
        earlier = json.loads(args.keep.read_text())
        parts.update({name: part for name, part in earlier["parts"].items() if name not in chosen})
        result["kept_from"] = {"date": earlier["date"], "command": earlier["command"], "seconds": earlier["seconds"],
                               "parts": list(parts)}
    path = args.out / f"{common.result_stem(NAME, device, args.size)}.json"
    slack = 1 if args.size == "full" else CPU_SLACK
    default = SMOKE["deadline"] if args.size == "smoke" else DEADLINE * slack
    deadline = args.deadline if args.deadline is not None else default
    result["deadline_s"] = deadline
    with tempfile.TemporaryDirectory(prefix="memlab-estimates-") as folder:
        # Side processes only beside a GPU: on the CPU they would take the cores the parts themselves need.
        sides = {name: start_estimates(args.size, device, Path(folder), name) for name in chosen
                 if name in ESTIMATED and device.type == "cuda"}
        try:
            for name in chosen:
                left = deadline - (time.perf_counter() - started)
                most, least = part_limits(name, args.size, slack)
                limit = min(most, left)
                if left < least:
                    parts[name] = not_started(name, f"{left:.0f} s of the run's {deadline:.0f} s were left, "
                                                    f"{least:.0f} s needed")
                    continue
                print(f"== {name} (at most {limit:.0f} s)", flush=True)
                if name == "pytest":
                    parts[name] = run_pytest(limit, device)
                elif name == "hf_table":
                    parts[name] = run_hf_table(args.size, device, args.out, limit)
                else:
                    env = estimates_ready(*sides[name], limit / 3, name) if name in sides else None
                    # A wait for the side process is the part's time: the run's deadline holds.
                    limit = min(limit, deadline - (time.perf_counter() - started))
                    parts[name] = run_section_process(name, args.size, device, limit, env)
                result.update(parts={n: parts[n] for n in ORDER if n in parts}, summary=summarize(parts),
                              seconds=round(time.perf_counter() - started, 1))
                common.write_json(result, path)  # after every part, so that a run cut short keeps what it measured
        finally:
            for side, _ in sides.values():
                if side.poll() is None:
                    side.kill()
                    side.wait()
    result.update(parts={n: parts[n] for n in ORDER if n in parts}, summary=summarize(parts),
                  seconds=round(time.perf_counter() - started, 1))
    common.write_json(result, path)
    summary = result["summary"]
    print(f"gpu acceptance: {summary['passed']} checks passed, {summary['failed']} failed, "
          f"{summary['not_judged']} not judged here, in {result['seconds']} s; wrote {path}")
    for failure in summary["failures"]:
        print(f"  FAILED {failure}")
    if summary["not_started"]:
        print(f"  not started (run them with --sections {','.join(summary['not_started'])} --keep {path}): "
              f"{', '.join(summary['not_started'])}")
    return result


if __name__ == "__main__":
    main()
