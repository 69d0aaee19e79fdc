"""A trainer launched on several GPUs, asked as the source ran it, against the per-GPU memory the source printed.

Each row is a published multi-GPU run of a transformers/TRL trainer under DeepSpeed or FSDP, asked with the command
line's trainer question (``memlab estimate MODEL --trainer ... --gpus N --strategy ...``: the trainer built around
the model on the meta device, with the source's load, as :func:`memlab.estimate` answers ``memlab.estimate(trainer,
gpus=N)``), in a fresh process. The card figure (what a GPU-memory chart or nvidia-smi shows) is compared with the
published figure, read as decimal GB where the source says "GB". The results, with the machine and the time each
took, go to ``benchmarks/results/trainer_sharded_vs_published-<device>.json``.

The same runs asked as a model, a batch shape and a plan are rows of :mod:`benchmarks.sharded_vs_published`.

Usage:
    python -m benchmarks.trainer_sharded_vs_published
    python -m benchmarks.trainer_sharded_vs_published --smoke --out /tmp/smoke   # a tiny config, for the tests
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

PEFT_DS = "https://huggingface.co/docs/peft/accelerate/deepspeed"


@dataclass(frozen=True)
class Row:
    """One published run: what it trained, how memlab asks it, and what the source printed per GPU."""

    name: str
    source: str
    quote: str
    measures: str
    published_gb: float
    question: tuple[str, ...]
    settings: str


ROWS = (
    Row(
        name="peft Llama 2 70B LoRA SFTTrainer, ZeRO-3, 8 x H100",
        source=f"{PEFT_DS} (huggingface/peft aa2ca83ca, 2024-02-26; examples/sft/run_peft_deepspeed.sh)",
        quote="the memory consumed per GPU is 64 GB (80%)",
        measures="a GPU-memory chart's level during training (tool and counter not named)",
        published_gb=64.0,
        question=("llama-70b", "--trainer", "sft", "--max-length", "2048", "--packing",
                  "--per-device-train-batch-size", "8", "--gradient-accumulation-steps", "4", "--lora", "8",
                  "--dtype", "float32", "--bf16", "on", "--gpus", "8", "--strategy", "zero3", "--gpu", "H100-80GB"),
        settings="LoRA r8 all linear, loaded with no dtype (fp32; DeepSpeed's bf16 mode casts it), bf16, batch 8 x "
                 "2048 packed, 4 accumulation steps, gradient checkpointing, flash attention 2 (sdpa here: neither "
                 "holds the attention matrix), TrainingArguments' default AdamW, no offload",
    ),
)


def ask(row: Row) -> dict[str, object]:
    """``row``'s question in a fresh process: the card and allocated figures per GPU, the ratio, the seconds."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "memlab", "estimate", *row.question, "--json", "--no-cache"],
                          capture_output=True, text=True, check=False)
    seconds = round(time.perf_counter() - started, 1)
    if done.returncode not in (0, 1):
        return {**asdict(row), "error": done.stderr[-2000:], "seconds": seconds}
    trial = json.loads(done.stdout)["trials"][0]
    card = trial["card_bytes"] or trial["peak_bytes"]
    return {**asdict(row), "label": trial["label"], "card_gb": round(card / 1e9, 2),
            "allocated_gb": round(trial["peak_bytes"] / 1e9, 2), "ratio": round(card / 1e9 / row.published_gb, 3),
            "seconds": seconds}


def smoke_row(folder: Path) -> Row:
    """A row of the same shape on a tiny Llama config written to ``folder``: what the tests run (its "published"
    figure is made up, and says so)."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 256, "max_position_embeddings": 128, "pad_token_id": 0}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return Row(name="smoke: a tiny Llama, SFT LoRA, ZeRO-3 over 2", source="none (the smoke row)", quote="none",
               measures="made up", published_gb=1.0, settings="LoRA r4, batch 2 x 32",
               question=(str(folder), "--trainer", "sft", "--max-length", "32", "--per-device-train-batch-size", "2",
                         "--lora", "4", "--gpus", "2", "--strategy", "zero3", "--gpu", "H100-80GB"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    rows = [ask(row) for row in ((smoke_row(Path(args.out) / "smoke-config"),) if args.smoke else ROWS)]
    for row in rows:
        print(f"{row['name']}: published {row['published_gb']} GB, memlab card {row.get('card_gb')} GB, ratio "
              f"{row.get('ratio')} ({row['seconds']} s)")
    import torch

    from benchmarks.common import metadata_for, write_json

    size = "smoke" if args.smoke else "small"
    record = {**metadata_for("trainer_sharded_vs_published", torch.device("cpu"), size), "rows": rows}
    stem = "trainer_sharded_vs_published-cpu" + ("-smoke" if args.smoke else "")
    out = write_json(record, Path(args.out) / f"{stem}.json")
    print(f"written to {out}")
    return 0 if all("error" not in row for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
