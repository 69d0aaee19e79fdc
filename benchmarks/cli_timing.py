"""How long `memlab estimate` takes to answer the common questions, with the machine's load beside each time.

Each question runs as a fresh process (imports included, as a user runs it); its wall time, its CPU time (user and
system, which another process on the machine changes less), the load average (1 minute) before and after it, and
its exit status are written to ``benchmarks/results/cli_timing-<device>.json``. Each is then asked again at once, in
a second fresh process (``<question>, asked again``): the answers the first kept (``memlab estimate``'s cache, an
empty folder of the benchmark's own per question, in ``MEMLAB_CACHE_DIR``) make it, and whether its output is the
first's byte for byte is written beside (``same_output``).
The command line's start is timed the same way (``STARTS``: ``memlab --help``, and ``import memlab`` alone), each
in a fresh process, with no question asked.
The machine this runs on may be shared with other work: the load average says how busy it was.

Usage:
    python -m benchmarks.cli_timing                 # every question
    python -m benchmarks.cli_timing --only 7b       # the questions whose name contains "7b"
    python -m benchmarks.cli_timing --source /work/main --tag before   # another checkout's memlab
    python -m benchmarks.cli_timing --only 7b --repeats 5   # the median of five fresh asks, each run's time beside
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import trl_published_runs

QUESTIONS: dict[str, list[str]] = {
    "7b one GPU at 24GiB, with suggestions": ["llama-7b", "--budget", "24GiB"],
    "13b LoRA at 24GiB": ["llama-13b", "--budget", "24GiB", "--try", "adapter=lora", "precision=bf16"],
    "70b --gpus auto at 80GiB": ["llama-70b", "--budget", "80GiB", "--gpus", "auto"],
    "13b LoRA on an A100-40GB": ["llama-13b", "--gpu", "A100-40GB", "--try", "adapter=lora", "precision=bf16"],
}
# Issue 83's trainer questions, each with TRL's own flags: TRL's T4 QLoRA GRPO notebook as written (its model's config
# written to a folder of the run's own: QWEN2_7B_INSTRUCT below stands for its path), a QLoRA DPO question and an SFT
# question with Liger and activation offloading. Target: 30 s each on this 2-core CPU at a load of 2 or less.
QWEN2_7B_INSTRUCT = "{qwen2-7b-instruct}"
TRAINER_QUESTIONS: dict[str, list[str]] = {
    "T4 QLoRA GRPO notebook": [
        QWEN2_7B_INSTRUCT, "--trainer", "grpo", "--num-generations", "8", "--max-completion-length", "256",
        "--per-device-train-batch-size", "8", "--lora", "32", "--load-in-4bit", "--bnb-4bit-quant-type", "nf4",
        "--bnb-4bit-use-double-quant", "--bnb-4bit-compute-dtype", "float16", "--dtype", "float16", "--optim",
        "paged_adamw_8bit", "--use-liger-kernel", "--gpu", "T4-16GB"],
    "8b QLoRA DPO on a 24GB card": [
        "llama-3-8b", "--trainer", "dpo", "--lora", "16", "--load-in-4bit", "--bnb-4bit-quant-type", "nf4",
        "--bnb-4bit-compute-dtype", "bfloat16", "--dtype", "bfloat16", "--gpu", "RTX4090-24GB"],
    "8b SFT LoRA, Liger and activation offloading": [
        "llama-3-8b", "--trainer", "sft", "--lora", "16", "--use-liger-kernel", "--activation-offloading", "--gpu",
        "A100-40GB"],
}
# Issue 85's trainer questions beyond one GPU: TRL's and open-r1's layout, 7 GPUs training a 7B GRPO policy under
# ZeRO-3 and one serving vLLM; a 70B DPO LoRA question answered at the fewest GPUs that fit. Target: 30 s each.
SHARDED_TRAINER_QUESTIONS: dict[str, list[str]] = {
    "7b GRPO on 7 + 1 H100s, ZeRO-3 and a vLLM server": [
        QWEN2_7B_INSTRUCT, "--trainer", "grpo", "--gpus", "7", "--strategy", "zero3", "--vllm-mode", "server",
        "--per-device-train-batch-size", "8", "--num-generations", "8", "--max-completion-length", "1024",
        "--prompt-length", "256", "--gpu", "H100-80GB"],
    "70b DPO LoRA --gpus auto on H100s": [
        "llama-70b", "--trainer", "dpo", "--lora", "16", "--gpus", "auto", "--max-length", "1024",
        "--per-device-train-batch-size", "1", "--dtype", "bfloat16", "--gpu", "H100-80GB"],
}
TRAINER_QUESTIONS.update(SHARDED_TRAINER_QUESTIONS)
QUESTIONS.update(TRAINER_QUESTIONS)
STARTS: dict[str, list[str]] = {
    "memlab --help": ["-m", "memlab", "--help"],
    "import memlab": ["-c", "import memlab"],
}
AGAIN = ", asked again"
# Issue 70's targets at a load of 2 or less (a question asked again: 1 s; the command line's start and import: 2 s).
TARGETS_S = {"7b one GPU at 24GiB, with suggestions": 5, "13b LoRA on an A100-40GB": 8, "70b --gpus auto at 80GiB": 15,
             "memlab --help": 2, "import memlab": 2, **dict.fromkeys(TRAINER_QUESTIONS, 30)}
AGAIN_TARGET_S = 1


def time_question(arguments: list[str], source: Path, timeout_s: float, cache: Path | None = None, *,
                  python: list[str] | None = None) -> dict[str, object]:
    """One question in a fresh process: its wall time, load before and after, exit status and last lines (and the
    whole output, ``stdout``, which :func:`main` drops once compared). ``cache``: the ``MEMLAB_CACHE_DIR`` it runs
    with; ``python``: Python's arguments instead of ``-m memlab estimate ARGUMENTS`` (the command line's start)."""
    env = {**os.environ, "PYTHONPATH": str(source), **({"MEMLAB_CACHE_DIR": str(cache)} if cache else {})}
    arguments = [_qwen2_7b_instruct_folder() if argument == QWEN2_7B_INSTRUCT else argument for argument in arguments]
    load_before = os.getloadavg()[0]
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    try:
        # run from the checkout: ``python -m`` puts the working directory first on the path, before PYTHONPATH
        done = subprocess.run([sys.executable, *(python or ["-m", "memlab", "estimate", *arguments])], env=env,
                              cwd=source, capture_output=True, text=True, timeout=timeout_s)
        status, out = done.returncode, done.stdout
    except subprocess.TimeoutExpired:
        status, out = None, ""
    return {
        "command": "python " + " ".join(python) if python else "memlab estimate " + " ".join(arguments),
        "wall_s": round(time.perf_counter() - started, 2),
        "cpu_s": round(_cpu_seconds(resource.getrusage(resource.RUSAGE_CHILDREN))
                       - _cpu_seconds(children_before), 2),
        "load_1min_before": round(load_before, 2),
        "load_1min_after": round(os.getloadavg()[0], 2),
        "exit_status": status,
        "output_tail": out.splitlines()[-6:],
        "stdout": out,
    }


@functools.cache
def _qwen2_7b_instruct_folder() -> str:
    """A folder holding Qwen/Qwen2-7B-Instruct's config.json, written once a run (a question asked again names the same
    folder, so its cached answers are found), removed when the run ends."""
    folder = tempfile.TemporaryDirectory(prefix="memlab-config-")
    atexit.register(folder.cleanup)
    trl_published_runs.qwen2_7b_instruct().save_pretrained(folder.name)
    return folder.name


def _cpu_seconds(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="run only the questions whose name contains this")
    parser.add_argument("--source", default=str(Path(__file__).resolve().parents[1]), help="the memlab checkout")
    parser.add_argument("--tag", default="after", help="the key these times are stored under")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--repeats", type=int, default=1,
                        help="ask each question this many times, each in a fresh process with an empty cache: its "
                             "wall and CPU times are then the medians, every run's kept beside (wall_s_runs)")
    args = parser.parse_args(argv)
    path = Path(__file__).parent / "results" / "cli_timing-cpu.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    results["device"] = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores (CPU only)"
    results.setdefault("note", "the machine is shared with other sessions: compare times only with their load "
                                "averages; targets (s): " + json.dumps(TARGETS_S))
    runs = results.setdefault(args.tag, {})
    for name, python in STARTS.items():
        if args.only in name:
            with tempfile.TemporaryDirectory(prefix="memlab-cache-") as cache:
                run = time_question([], Path(args.source), args.timeout, Path(cache), python=python)
            del run["stdout"]
            run["target_s"] = TARGETS_S.get(name)
            runs[name] = run
            print(name, run["wall_s"], "s wall,", run["cpu_s"], "s CPU at load", run["load_1min_before"], flush=True)
    for name, arguments in QUESTIONS.items():
        if args.only not in name:
            continue
        asks = []
        for _ in range(max(1, args.repeats)):
            with tempfile.TemporaryDirectory(prefix="memlab-cache-") as cache:
                asks.append((time_question(arguments, Path(args.source), args.timeout, Path(cache)),
                             time_question(arguments, Path(args.source), args.timeout, Path(cache))))
        first, again = asks[0]
        if len(asks) > 1:
            for key, run in ((0, first), (1, again)):
                for figure in ("wall_s", "cpu_s"):
                    values = [ask[key][figure] for ask in asks]
                    run[f"{figure}_runs"], run[figure] = values, round(statistics.median(values), 2)
        again["same_output"] = all(ask[1]["stdout"] == ask[0]["stdout"] == first["stdout"] for ask in asks)
        first["target_s"], again["target_s"] = TARGETS_S.get(name), AGAIN_TARGET_S
        for key, run in ((name, first), (name + AGAIN, again)):
            del run["stdout"]
            runs[key] = run
            print(key, run["wall_s"], "s wall,", run["cpu_s"], "s CPU at load", run["load_1min_before"], flush=True)
        path.write_text(json.dumps(results, indent=2) + "\n")
    return 0


_SHOWN = ("7b one GPU at 24GiB, with suggestions", "13b LoRA on an A100-40GB", "13b LoRA at 24GiB",
          "70b --gpus auto at 80GiB", *TRAINER_QUESTIONS)


def markdown(result: dict[str, Any]) -> str:
    """Every run kept in the result, in the order it was made, as a table: each question's wall time (seconds)
    and the 1-minute load before the 7B question (what the machine was doing): the history the docs link to.

    Example:
        >>> run = {"7b one GPU at 24GiB, with suggestions": {"wall_s": 4.8, "load_1min_before": 1.0}}
        >>> print(markdown({"device": "cpu", "s81": run}).splitlines()[-1])
        | s81 | 4.8 | - | - | - | - | - | - | - | - | 1.0 |
    """
    from benchmarks import common

    rows = []
    for tag, run in result.items():
        if not isinstance(run, dict) or not any(name in run for name in _SHOWN):
            continue
        seven = run.get(_SHOWN[0], {})
        rows.append([tag, *(run[name].get("wall_s") if isinstance(run.get(name), dict) else None for name in _SHOWN),
                     seven.get("load_1min_before") if isinstance(seven, dict) else None])
    return common.markdown_table(["run", *_SHOWN, "load before the 7b"], rows)


if __name__ == "__main__":
    raise SystemExit(main())
