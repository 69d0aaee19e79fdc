"""The GPU acceptance run: every CUDA path of memlab on a real GPU, in four back-to-back calls of at most 10 minutes.

How to run on a lent GPU (the ``run`` tool of the device README, /work/.library/device/README.md)
--------------------------------------------------------------------------------------------------
The GPU image has torch 2.11, transformers, accelerate and peft, but not bitsandbytes (8-bit and paged AdamW, QLoRA,
int8/NF4 inference, the 4-bit load), TRL or ``datasets`` (the SFTTrainer). Carry them as wheels, with peft (the
first run carried it) and ``datasets``' own needs that the image lacks (dill, multiprocess). Here, once, in the
checkout the ``run`` tool sends (``.whl/`` is in .gitignore already)::

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl bitsandbytes==0.50.2 peft==0.21.0 trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19

That is 45.8 MB (bitsandbytes 43.1 MB, trl 0.9, peft 0.8, datasets 0.6, multiprocess 0.15, dill 0.12; their other
needs are in the image), which with the working tree (about 5 MB) and a result JSON (under 1 MB) fits the 64 MiB
that one call may carry: carry nothing else big. (``datasets`` 5.2 asks for pyarrow >= 24 and fsspec <= 2026.9.0;
the first call prints the image's, and where ``datasets`` or TRL does not import, the SFTTrainer's checks say why
and the rest runs.)

Then four calls, back to back (a machine left idle is given back and the next call starts a fresh one, minutes),
each with ``carry=[".whl"]`` and ``timeout_s=600``, each beginning with::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; nvidia-smi;

1. issue 40's parts first (the user's loads, the Trainer and the SFTTrainer under ``watch``, the held-out
   families), and the tests under ``tests/gpu``::

    ... python3 -c "import pyarrow, fsspec; print('pyarrow', pyarrow.__version__, 'fsspec', fsspec.__version__)"; \
    PYTHONUNBUFFERED=1 python3 -m benchmarks.gpu_acceptance --out $OUT \
        --sections pytest,loads,trainer,heldout 2>&1 | tee $OUT/log

2. copy the result JSON the first call brought back (``gpu_acceptance-cuda-nvidia-h100-80gb-hbm3.json`` on an H100;
   on an H200 the name says so) into ``.whl/`` here, then::

    ... PYTHONUNBUFFERED=1 python3 -m benchmarks.gpu_acceptance --out $OUT \
        --sections estimate,levers,inference,cumulative,probe \
        --keep .whl/gpu_acceptance-cuda-nvidia-h100-80gb-hbm3.json 2>&1 | tee $OUT/log

3. the second call's JSON into ``.whl/`` likewise (it holds the first's parts too), then::

    ... PYTHONUNBUFFERED=1 python3 -m benchmarks.gpu_acceptance --out $OUT \
        --sections hf_table,ties,reserve,cap,restore,fit \
        --keep .whl/gpu_acceptance-cuda-nvidia-h100-80gb-hbm3.json 2>&1 | tee $OUT/log

4. the third call's JSON into ``.whl/`` likewise, then ``--sections timeline,fill`` (issue 45: the timeline's peak
   against ``max_memory_allocated`` and the peak of the snapshot ``_record_memory_history`` records, for three plans
   of the 1B Llama; issue 46: selective checkpointing, the attention lever at two lengths and ``memlab.limits``
   measured against the estimate, :mod:`benchmarks.gpu_sections_fill`), with the same ``--keep``. If device time
   runs short, this call is the one to leave for later.

What comes back (at most 8 files): ``gpu_acceptance-<gpu>.json`` (every part so far), the log, and from the third
call ``hf_table-<gpu>.json`` and ``.html``. The JSON is written after every part, so a call cut short keeps what
finished, and the summary names the parts it did not start: run those with ``--sections`` and ``--keep`` the same
way. Each call's parts have limits (:data:`LIMITS`) that add up to the deadline (560 s) at most (:data:`CALLS`).
The first run's parts took a quarter to two thirds of their limits then, so a call should take 4 to 7 minutes,
the three some 20 minutes of the session's 30 with the machine's start; were every part to take its whole limit,
the third call would run short of device time, which is why the calls go in the order of importance.

Commit the results under ``benchmarks/results/``, then ``python -m benchmarks.cuda_truth`` (the table of truth),
``python -m benchmarks.cuda_truth_estimates`` (the CPU-made estimates against it, for the README) and
``python -m benchmarks.gpu_acceptance --markdown benchmarks/results/gpu_acceptance-<gpu>.json`` for the README.

What it runs
------------
``tests/gpu`` with pytest, then each section of :mod:`benchmarks.gpu_sections` in its own Python process (so that
one section's failure, CUDA error or cached memory cannot touch the next), with the seeds' table
(:mod:`benchmarks.hf_table`) among them, each within its time limit (:data:`LIMITS`), and writes everything into
``benchmarks/results/gpu_acceptance-<device>.json`` naming the GPU, driver and library versions. While the GPU runs
the first parts of a call, side processes that see no GPU make the estimates the ``loads``, ``heldout`` and
``estimate`` sections compare (CPU-made, as CI makes them), one process for each. Sections:

1. ``loads`` (issue 40): Llama-3.2-1B's shape (1.24B parameters) saved in bf16 with ``save_pretrained`` and loaded as
   users load it, ``from_pretrained(folder, torch_dtype=torch.bfloat16)`` and in 4-bit through ``BitsAndBytesConfig``
   (NF4, double quantization, bf16 compute), each in a fresh process trained with LoRA (dropout 0.05, bf16,
   checkpointing; 4 x 1024) and run for inference (4 prompts of 512 tokens, 32 new): allocated and reserved peaks
   and the CUDA context beside ``memlab.estimate(config, shapes, plan, load={...})`` made without a GPU (5%, 10%,
   card 5%).
2. ``trainer``: ``memlab.fit(trainer, budget=...)``, then ``trainer.train()`` under ``memlab.watch``, for a plain
   ``Trainer`` and TRL's ``SFTTrainer`` with ``packing=True`` and ``peft_config=LoraConfig(..., lora_dropout=0.05)``
   (issue 40); ``watch``'s overhead per step on each (goal under 3%).
3. ``heldout`` (issue 40): the CPU-made estimate against the measured peak for families the table of truth does not
   hold yet: Qwen2, Mistral, Gemma-2, Phi-3, GPT-NeoX and T5, each at two sequence lengths, in fp32, bf16 autocast
   and pure bf16 (allocated 5%, reserved 10%).
4. ``estimate``: ``memlab.estimate`` (CPU-made) against the measured peak for GPT-2, BERT, Llama and a Mixtral in
   fp32, bf16, pure bf16 and fp16 (5%), with reserved peak and CUDA context beside; and the CUDA allocations of
   100 MB or more in one tracked step (the 1B Llama's ``ckpt bf16``).
5. ``levers``: each lever alone on Llama-3.2-1B's shape (2 x 1024): precisions, pure bf16 weights, 8-bit, paged
   8-bit, Adafactor, fused (the default) and foreach AdamW, the chunked loss, the optimizer in backward, offload,
   LoRA on every linear layer and on attention only: peak, breakdown, reserved, samples/s.
6. ``inference``: a Llama-3.2-1B-shaped model in bf16, int8 and NF4 at prompts of 512 and 4096 tokens, generating
   with the KV cache: the cache against ``kv_cache_bytes``, prefill and decode tokens/s; ``fit_inference``'s largest
   batch re-checked in a fresh process.
7. ``cumulative``: the levers one on top of the other on Llama-3.2-1B's shape at 2 x 2048.
8. ``probe``: each plan's peak against a hand-made step's ``max_memory_allocated`` (within 2%); the params and
   optimizer categories against independent byte counts (exact).
9. ``hf_table``: the seeds' table at full size (bert-large, sequence 512, batch 4; fp16 rows in fp16), memlab and
   ``transformers.Trainer`` side by side, with its Adafactor rows (memlab / Trainer >= 0.95 doing the same work).
10. ``ties``: the same plan compared with itself 10 times (all ties), a plan 30% slower 10 times (all slower).
11. ``reserve``: the cumulative section's checkpointed bf16 step with AdamW, with 8-bit AdamW and with LoRA, each
    alone in a fresh process: reserved peak and the allocator's segments of 100 MB or more (the CPU replay of the
    reserve is compared with a fresh process; the first run's 8-bit and LoRA rows were 10% and 14% above it).
12. ``cap``: under a budget of 60% of the plain peak, plans that do not fit report "oom"; after 20 such trials
    ``memory_allocated`` is where it started, to the byte.
13. ``restore``: a CUDA model and the user's CUDA optimizer come back bit-exact after compare, fit and interrupted
    trials.
14. ``fit``: fit on a real budget; the chosen plan, re-measured in a fresh process, fits.

A check passes (True), fails (False) or cannot be judged on this device (None: a CUDA figure on the CPU, or a
library that is not installed, with the reason). The run starts no part when its deadline (``--deadline``, default
560 s) would cut it (less than 60% of its limit left); parts not run say so.

Run from the repository root::

    python -m benchmarks.gpu_acceptance                 # everything, --full sizes, on a CUDA machine
    python -m benchmarks.gpu_acceptance --sections levers,inference
    python -m benchmarks.gpu_acceptance --smoke --device cpu   # every part at tiny sizes, on the CPU: the code only
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
from benchmarks.gpu_sections import ROOT, SECTIONS
from benchmarks.gpu_sections_estimate import estimates_variable, gpu_kind_name, start_side_estimates

NAME = "gpu_acceptance"
ORDER = ("pytest", "loads", "trainer", "heldout", "estimate", "levers", "inference", "cumulative", "probe",
         "hf_table", "ties", "reserve", "cap", "restore", "fit", "timeline", "fill")
"""The parts, most important first: issue 40's (the user's loads, the trainers, the held-out families), then the
rest in the order of the calls (:data:`CALLS`)."""
LIMITS = {"pytest": 80, "loads": 150, "trainer": 130, "heldout": 200,
          "estimate": 130, "levers": 120, "inference": 100, "cumulative": 140, "probe": 60,
          "hf_table": 130, "ties": 100, "reserve": 100, "cap": 70, "restore": 70, "fit": 90,
          "timeline": 240, "fill": 300}
"""Seconds each part may take at most on an H100 (the first run's figures and a margin of at least a third, or for
the parts it did not have, a guess from their sizes; its deadline may cut a part shorter). A part is not started with
less than :data:`START_SHARE` of its limit left. The limits of each of :data:`CALLS` add up to the deadline at most,
so that every part of a call starts even where the parts before it take their whole limits."""
CALLS = (("pytest", "loads", "trainer", "heldout"),
         ("estimate", "levers", "inference", "cumulative", "probe"),
         ("hf_table", "ties", "reserve", "cap", "restore", "fit"),
         ("timeline", "fill"))
"""The back-to-back calls of a lent GPU that run every part (``--sections``, joined with ``--keep``); the fourth is
issue 45's timeline against CUDA's own history (benchmarks/gpu_sections_timeline.py) and issue 46's levers and
limits (benchmarks/gpu_sections_fill.py)."""
ESTIMATED = ("loads", "heldout", "estimate")
"""The parts whose CPU-made estimates a side process that sees no GPU makes while the GPU runs the parts before."""
START_SHARE = 0.6
DEFAULT_LIMIT = 120
DEADLINE = 560.0
"""Seconds of the whole run at the full size: the device's ten minutes less the start and the transfers."""
CPU_SLACK = 5
"""The smoke and small sizes run on CPUs, often shared: their limits and deadline are this many times longer."""
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
    # In this process, one test at a time on the one GPU: no xdist workers (pyproject's -n auto), which the device
    # machine does not install.
    code, output, seconds = _child([sys.executable, "-m", "pytest", "tests/gpu", "-v", "-p", "no:cacheprovider",
                                    "-o", "addopts=-rfEs"], limit)
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
    return {"not_started": True, "checks": [{"check": f"{name} ran", "passed": False, "error": f"not started: {why}"}]}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the acceptance parts, write ``gpu_acceptance-<device>.json``, print the summary; return the result."""
    parser = common.build_parser((__doc__ or NAME).splitlines()[0])
    parser.set_defaults(size=None)
    parser.add_argument("--sections", help=f"comma-separated parts to run, from: {', '.join(ORDER)} (default: all)")
    parser.add_argument("--deadline", type=float,
                        help=f"seconds after which no further part starts (default {DEADLINE:.0f} at the full size; "
                             f"{CPU_SLACK} times that and the parts' limits at the others, for slow shared CPUs)")
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
    deadline = args.deadline if args.deadline is not None else DEADLINE * slack
    with tempfile.TemporaryDirectory(prefix="memlab-estimates-") as folder:
        sides = {name: start_estimates(args.size, device, Path(folder), name) for name in chosen if name in ESTIMATED}
        try:
            for name in chosen:
                left = deadline - (time.perf_counter() - started)
                limit = min(LIMITS.get(name, DEFAULT_LIMIT) * slack, left)
                if left < START_SHARE * LIMITS.get(name, DEFAULT_LIMIT) * slack:
                    parts[name] = not_started(name, f"{left:.0f} s of the run's {deadline:.0f} s were left")
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
