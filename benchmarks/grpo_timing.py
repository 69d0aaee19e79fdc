"""How long memlab takes to answer a GRPO user's questions on this machine's CPU (issue 68's targets beside each).

Each question runs in a fresh process, as a user asks it: the trainer is built on the meta device from a config
(Qwen2.5-0.5B's shape, or Qwen3-8B's) by the command line's own builder (``memlab estimate MODEL --trainer grpo``'s
options, parsed by its parser), then ``memlab.estimate(trainer, gpu=...)`` or ``memlab.limits(trainer, ...)`` answers
it; the 8B question is asked from the command line too. Written per question: the wall time of the whole process,
its CPU time, the answer's own seconds (build and imports left out), the load average (1 minute) before and after,
the answer (peak and card figure, or the size found), and the issue's target. The machine may be shared with other
work: the load says how busy it was, and CPU seconds change less with it.

Results: ``benchmarks/results/grpo_timing-cpu.json``.

Usage:
    python -m benchmarks.grpo_timing               # every question
    python -m benchmarks.grpo_timing --only 0.5b   # the questions whose name contains "0.5b"
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.cli_timing import time_question

ROOT = Path(__file__).resolve().parent.parent
GPU = "RTX4090-24GB"

QWEN25_05B = dict(model_type="qwen2", vocab_size=151_936, hidden_size=896, intermediate_size=4864,
                  num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32_768,
                  rms_norm_eps=1e-6, tie_word_embeddings=True)
QWEN3_8B = dict(model_type="qwen3", vocab_size=151_936, hidden_size=4096, intermediate_size=12_288,
                num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                max_position_embeddings=40_960, rms_norm_eps=1e-6, tie_word_embeddings=False)
SMALL = ["--num-generations", "8", "--prompt-length", "60", "--per-device-train-batch-size", "8", "--beta", "0"]
"""The issue's 0.5B setup: 8 generations of 60-token prompts, beta 0, no vLLM."""
BIG = ["--num-generations", "8", "--max-completion-length", "1024", "--prompt-length", "64",
       "--per-device-train-batch-size", "8", "--gradient-accumulation-steps", "4", "--beta", "0", "--lora", "16",
       "--gradient-checkpointing", "on"]
"""The 8B question: LoRA r16 on every projection, 8 generations of 1,024 tokens, 8 x 4, checkpointing."""

QUESTIONS: dict[str, dict[str, Any]] = {
    "0.5b estimate, 64 tokens": dict(config="0.5b", options=[*SMALL, "--max-completion-length", "64"],
                                     ask="estimate", target_s=None),
    "0.5b estimate, 512 tokens": dict(config="0.5b", options=[*SMALL, "--max-completion-length", "512"],
                                      ask="estimate", target_s=60, within_x_of="0.5b estimate, 64 tokens"),
    "0.5b estimate, 4096 tokens": dict(config="0.5b", options=[*SMALL, "--max-completion-length", "4096"],
                                       ask="estimate", target_s=90),
    "0.5b limits, tokens": dict(config="0.5b", options=[*SMALL, "--max-completion-length", "512"],
                                ask="limits", vary="tokens", multiple=128, budget="16GiB", target_s=180),
    "0.5b limits, rows": dict(config="0.5b", options=[*SMALL, "--max-completion-length", "512"],
                              ask="limits", vary="rows", multiple=None, budget="16GiB", target_s=180),
    "8b LoRA estimate, 1024 tokens": dict(config="8b", options=BIG, ask="estimate", target_s=60),
    "8b LoRA from the CLI, 1024 tokens": dict(config="8b", options=BIG, ask="cli", target_s=30),
}


def _config_folder(which: str, folder: Path) -> Path:
    from transformers import AutoConfig

    shape = dict(QWEN25_05B if which == "0.5b" else QWEN3_8B)
    config = AutoConfig.for_model(shape.pop("model_type"), **shape)
    target = folder / which
    config.save_pretrained(target)
    return target


def answer_one(name: str) -> dict[str, Any]:
    """One question asked in this process: the trainer built as the command line builds it, then answered."""
    question = QUESTIONS[name]
    with tempfile.TemporaryDirectory(prefix="grpo-timing-") as work:
        source = str(_config_folder(question["config"], Path(work)))
        if question["ask"] == "cli":
            raise ValueError("a command-line question runs as its own process")
        import memlab
        from memlab.estimation.estimate import load_config
        from memlab.frontends.cli.main import build_parser
        from memlab.frontends.cli.trainer import build_trainer

        args = build_parser().parse_args(["estimate", source, "--trainer", "grpo", *question["options"],
                                          "--gpu", GPU])
        trainer, _ = build_trainer(args, load_config(source), source, str(Path(work) / "trl"))
        started = time.perf_counter()
        if question["ask"] == "estimate":
            trial = memlab.estimate(trainer, gpu=GPU)
            result: dict[str, Any] = {"peak_bytes": trial.peak_bytes, "card_bytes": trial.card_bytes,
                                      "status": trial.status}
        else:
            found = memlab.limits(trainer, budget=question["budget"], vary=question["vary"],
                                  multiple=question["multiple"], gpu=GPU)
            result = {"value": found.value, "next": found.next, "sizes_tried": len(found.tried),
                      "budget": question["budget"]}
        result["answer_s"] = round(time.perf_counter() - started, 2)
    return result


def markdown(questions: dict[str, Any]) -> str:
    """The table of the docs: each question's wall and CPU seconds beside the issue's target, and its answer."""
    from benchmarks.common import markdown_table

    rows = []
    for name, row in questions.items():
        answer = row.get("answer") or {}
        if "value" in answer:
            said = f"{answer['value']} (next {answer['next']}, {answer['sizes_tried']} sizes, {answer['budget']})"
        elif "card_bytes" in answer:
            said = f"card {answer['card_bytes'] / 2**30:.2f} GiB"
        else:
            said = "the table, as the command prints it" if row.get("exit_status") in (0, 1) else "failed"
        rows.append([name, row["wall_s"], row["cpu_s"], row["load_1min_before"], row["target_s"], said])
    return markdown_table(["question", "wall s", "CPU s", "load", "target s", "answer"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="ask only the questions whose name contains this")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a question asked in this (fresh) process
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "grpo_timing-cpu.json")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(answer_one(args.one)))
        return 0
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="grpo-timing-") as work:
        for name, question in QUESTIONS.items():
            if args.only not in name:
                continue
            if question["ask"] == "cli":
                source = _config_folder(question["config"], Path(work))
                cache = Path(work) / "cache" / name.replace(" ", "-")
                row = time_question([str(source), "--trainer", "grpo", *question["options"], "--gpu", GPU], ROOT,
                                    args.timeout, cache)
                row.pop("stdout")
            else:
                row = time_question([], ROOT, args.timeout, python=["-m", "benchmarks.grpo_timing", "--one", name])
                out = row.pop("stdout")
                lines = [line for line in str(out).splitlines() if line.startswith("{")]
                row["answer"] = json.loads(lines[-1]) if lines else None
            row["target_s"] = question["target_s"]
            if question.get("within_x_of") in results:
                row["times_the_wall_of"] = {question["within_x_of"]: round(
                    row["wall_s"] / results[question["within_x_of"]]["wall_s"], 2)}
            results[name] = row
            print(f"{name}: {row['wall_s']} s wall, {row['cpu_s']} s CPU (load {row['load_1min_before']}), "
                  f"{row.get('answer') or row['output_tail'][-1:]}", file=sys.stderr)
    import platform
    import subprocess

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "memlab"], cwd=ROOT, capture_output=True, text=True).stdout
    payload = {"benchmark": "grpo_timing", "date": time.strftime("%Y-%m-%d"), "commit": commit.strip(),
               "memlab_changed_since_commit": bool(dirty.strip()), "device": "cpu",
               "machine": platform.processor() or platform.machine(),
               "cores": os.cpu_count(), "gpu_asked": GPU, "questions": results, "markdown": markdown(results)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
