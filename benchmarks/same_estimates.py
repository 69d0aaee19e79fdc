"""Whether two memlab checkouts print the same estimates: each `memlab estimate` question below runs in a fresh
process on each checkout, and their standard outputs (the estimates, plain and ``--json``) are compared byte for
byte. Standard error (the progress lines, which say each dry run as it starts) is not compared: a faster search
says fewer of them.

Usage:
    python -m benchmarks.same_estimates --reference /work/main --candidate . --outputs /tmp/same
    python -m benchmarks.same_estimates --only gpt2 ...     # the questions whose name contains "gpt2"

Each checkout's outputs are kept under ``--outputs`` (``reference/`` and ``candidate/``, one file a question); a
reference output already there is reused (``--fresh`` runs it again). The exit status is 0 when every question
printed the same bytes and exited alike, 1 otherwise (the differing questions are named).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

QUESTIONS: dict[str, list[str]] = {
    "70b auto": ["llama-70b", "--budget", "80GiB", "--gpus", "auto"],
    "70b auto json": ["llama-70b", "--budget", "80GiB", "--gpus", "auto", "--json"],
    "gpt2 auto": ["gpt2", "--budget", "6GiB", "--gpus", "auto"],
    "gpt2 auto json": ["gpt2", "--budget", "6GiB", "--gpus", "auto", "--json"],
    "gpt2 auto bf16 ckpt": ["gpt2", "--budget", "3GiB", "--gpus", "auto", "--batch", "4x512", "--try",
                            "precision=bf16", "checkpointing=on"],
    "gpt2 auto fsdp1": ["gpt2", "--budget", "6GiB", "--gpus", "auto", "--strategy", "fsdp1"],
    "gpt2 auto fsdp1 json": ["gpt2", "--budget", "6GiB", "--gpus", "auto", "--strategy", "fsdp1", "--json"],
    "gpt2 auto zero3": ["gpt2", "--budget", "3GiB", "--gpus", "auto", "--strategy", "zero3"],
    "gpt2 auto lora": ["gpt2", "--budget", "3GiB", "--gpus", "auto", "--try", "adapter=lora", "precision=bf16"],
    "gpt2 auto cpu": ["gpt2", "--budget", "1500MiB", "--gpus", "auto", "--device", "cpu"],
    "gpt2 auto none fits": ["gpt2", "--budget", "1GiB", "--gpus", "auto", "--batch", "8x1024"],
    "gpt2 auto fsdp1 bf16 ckpt": ["gpt2", "--budget", "3GiB", "--gpus", "auto", "--strategy", "fsdp1", "--batch",
                                  "4x512", "--try", "precision=bf16", "checkpointing=on"],
    "gpt2 auto 3GiB": ["gpt2", "--budget", "3GiB", "--gpus", "auto"],
    "gpt2 gpus 4": ["gpt2", "--budget", "6GiB", "--gpus", "4"],
    "gpt2 gpus 4 json": ["gpt2", "--budget", "6GiB", "--gpus", "4", "--json"],
    "gpt2 one gpu lora": ["gpt2", "--budget", "2GiB", "--try", "adapter=lora", "precision=bf16"],
    "gpt2 one gpu qlora json": ["gpt2", "--budget", "2GiB", "--try", "adapter=qlora,lora", "precision=bf16",
                                "--json"],
    "7b with suggestions": ["llama-7b", "--budget", "24GiB"],
    "13b lora": ["llama-13b", "--budget", "24GiB", "--try", "adapter=lora", "precision=bf16"],
    "7b gpus 8 bf16 ckpt": ["llama-7b", "--budget", "24GiB", "--gpus", "8", "--try", "precision=bf16",
                            "checkpointing=on"],
    # a search over sequence lengths and a sharded adapter plan, both given memlab's meta model of the config
    "7b lora max tokens": ["llama-7b", "--budget", "24GiB", "--try", "adapter=lora", "precision=bf16",
                           "--max-tokens"],
    "gpt2 fsdp2 x2 lora": ["gpt2", "--budget", "3GiB", "--gpus", "2", "--strategy", "fsdp2", "--try", "adapter=lora",
                           "precision=bf16"],
    "8b qlora json": ["llama-3-8b", "--budget", "16GiB", "--try", "adapter=qlora", "precision=bf16", "--json"],
    # the most common plan, whose autocast frees every layer's cast weights together in its cache's order
    "7b bf16 ckpt": ["llama-7b", "--budget", "24GiB", "--try", "precision=bf16", "checkpointing=on"],
    "70b bf16 ckpt json": ["llama-70b", "--budget", "80GiB", "--try", "precision=bf16", "checkpointing=on", "--json"],
    "8b bf16 ckpt 4k": ["llama-3-8b", "--budget", "80GiB", "--batch", "1x4096", "--try", "precision=bf16",
                        "checkpointing=on", "weights=bf16"],
}


def run(checkout: Path, arguments: list[str]) -> str:
    """One question's exit status and standard output, on ``checkout``'s memlab, in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    # run from the checkout: ``python -m`` puts the working directory first on the path, before PYTHONPATH
    done = subprocess.run([sys.executable, "-m", "memlab", "estimate", *arguments], env=env, cwd=checkout,
                          capture_output=True, text=True, timeout=1800)
    return f"exit status {done.returncode}\n{done.stdout}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", type=Path, required=True, help="the checkout the estimates must equal")
    parser.add_argument("--candidate", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--outputs", type=Path, required=True, help="where each checkout's outputs are kept")
    parser.add_argument("--only", default="", help="run only the questions whose name contains this")
    parser.add_argument("--fresh", action="store_true", help="run the reference again even where kept")
    parser.add_argument("--reference-only", action="store_true", help="keep the reference's outputs, compare none")
    args = parser.parse_args(argv)
    differ = []
    for name, arguments in QUESTIONS.items():
        if args.only not in name:
            continue
        file = name.replace(" ", "_") + ".txt"
        outputs = {}
        sides = [("reference", args.reference)] + ([] if args.reference_only else [("candidate", args.candidate)])
        for side, checkout in sides:
            path = args.outputs / side / file
            if side == "candidate" or args.fresh or not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(run(checkout.resolve(), arguments))
            outputs[side] = path.read_bytes()
        if args.reference_only:
            continue
        same = outputs["reference"] == outputs["candidate"]
        print(f"{'same' if same else 'DIFFERENT'}: memlab estimate {' '.join(arguments)}", flush=True)
        if not same:
            differ.append(name)
    print("every output byte-identical" if not differ else f"different: {', '.join(differ)}")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
