"""memlab's estimate against GPU runs that other projects published: would memlab have said "fits" where it ran?

Each row is a run someone else measured on a named GPU, with the settings they published. memlab estimates the same
step from the model's config alone (on fake tensors, on a machine without a GPU), with the load, adapters and GPU of
that run, and the result records:

- ``allocated_ratio``: memlab's allocated peak over the published peak (both ``max_memory_allocated``);
- ``reserved_over_allocated``: memlab's modelled reserve over its allocated peak;
- ``card``: memlab's card figure (reserve + the CUDA context of that GPU kind), and ``fits``: whether memlab's
  verdict on that GPU's whole memory is "fits", the fact being that the run did fit there.

Sources (every number below is quoted from them, nothing else is):

- litgpt's resource tables, ``tutorials/resource-tables.md`` in Lightning-AI/litgpt (last updated 2023-10-20,
  litgpt commit 8641822, NVIDIA A100-SXM4-40GB, PyTorch 2.1.0+cu121, bitsandbytes 0.41.1). All runs there are
  ``--precision bf16-true`` (pure bf16 weights), LoRA through ``finetune/lora.py`` on the Alpaca data set with its
  longest example (1,304 tokens for Llama 2); "Max GPU RAM" is what the script prints, ``max_memory_allocated`` in
  GB (1e9 bytes). litgpt's LoRA defaults then: rank 8, alpha 16, dropout 0.05, on the query and value projections.
  ``bnb.nf4-dq`` is NF4 with double quantization; litgpt quantizes every linear layer, its LM head included, where
  memlab's load keeps the head in bf16 as transformers' ``from_pretrained`` does (a 0.2 GB difference for Llama 2
  7B, on memlab's side). Inference rows are ``generate/base.py``: bf16 weights, a short prompt, 50 new tokens.

Run from the repository root (no GPU needed; a few minutes on 2 cores)::

    python -m benchmarks.estimate_vs_published
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks import common
from memlab.plan import Plan

NAME = "estimate_vs_published"
GB = 1e9
GIB = 2**30
LITGPT = ("Lightning-AI/litgpt tutorials/resource-tables.md (2023-10-20, commit 8641822): NVIDIA A100-SXM4-40GB, "
          "PyTorch 2.1.0, bitsandbytes 0.41.1, --precision bf16-true")
NF4_DQ = {"torch_dtype": torch.bfloat16,
          "quantization_config": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                  "bnb_4bit_compute_dtype": torch.bfloat16, "bnb_4bit_use_double_quant": True}}
NF4 = {"torch_dtype": torch.bfloat16,
       "quantization_config": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                               "bnb_4bit_compute_dtype": torch.bfloat16, "bnb_4bit_use_double_quant": False}}
BF16 = {"torch_dtype": torch.bfloat16}


@dataclass(frozen=True)
class Run:
    """One published run: what ran, where, the peak its authors measured, and where they said so."""

    name: str
    model: str
    gpu: str
    published_gb: float
    source: str
    rows: int = 1
    tokens: int = 1304
    adapter: str = "lora"
    load: dict[str, Any] = field(default_factory=lambda: dict(BF16))
    inference: bool = False
    four_bit: bool = False

    def plan(self) -> Any:
        if self.inference:
            from memlab.inference.plan import InferencePlan

            quantize = "nf4" if self.four_bit else "none"
            return InferencePlan(weights="bf16", quantize=quantize, new_tokens=50)
        # litgpt's finetune/lora.py: LoRA r=8, alpha=16, dropout 0.05 on query and value, bf16-true.
        return Plan(weights="bf16", adapter=self.adapter, lora_rank=8, lora_alpha=16, lora_dropout=0.05,
                    lora_targets=["q_proj", "v_proj"])

    def batch(self) -> dict[str, tuple[int, int]]:
        if self.inference:
            return {"input_ids": (self.rows, self.tokens)}
        return {"input_ids": (self.rows, self.tokens), "labels": (self.rows, self.tokens)}


_TABLE = f"{LITGPT}, 'Finetuning with LoRA on 1 GPU'"
_INFERENCE = f"{LITGPT}, 'Single-GPU Inference'"
RUNS = (
    Run("Llama 2 7B LoRA, bf16, micro-batch 1", "llama-7b", "A100-40GB", 21.30, _TABLE),
    Run("Llama 2 7B LoRA, bf16, micro-batch 2", "llama-7b", "A100-40GB", 29.07, _TABLE, rows=2),
    Run("Llama 2 7B QLoRA (bnb.nf4), micro-batch 1", "llama-7b", "A100-40GB", 14.14, _TABLE, load=NF4,
        four_bit=True),
    Run("Llama 2 7B QLoRA (bnb.nf4-dq), micro-batch 1", "llama-7b", "A100-40GB", 13.84, _TABLE, load=NF4_DQ,
        four_bit=True),
    Run("Llama 2 13B LoRA, bf16, micro-batch 1", "llama-13b", "A100-40GB", 38.12, _TABLE),
    Run("Llama 2 13B QLoRA (bnb.nf4-dq), micro-batch 1", "llama-13b", "A100-40GB", 22.55, _TABLE, load=NF4_DQ,
        four_bit=True),
    Run("Llama 2 7B inference, bf16", "llama-7b", "A100-40GB", 13.52, _INFERENCE, tokens=6, inference=True),
    Run("Llama 2 13B inference, bf16", "llama-13b", "A100-40GB", 26.21, _INFERENCE, tokens=6, inference=True),
    Run("Llama 2 7B inference, bnb.nf4-dq", "llama-7b", "A100-40GB", 4.26, _INFERENCE, tokens=6, inference=True,
        four_bit=True),
    Run("Llama 2 13B inference, bnb.nf4-dq", "llama-13b", "A100-40GB", 7.72, _INFERENCE, tokens=6, inference=True,
        four_bit=True),
)
"""The published runs, each with its source."""


def estimate_run(run: Run) -> dict[str, Any]:
    """memlab's estimate of one published run, on its GPU kind, judged against that GPU's whole memory."""
    import memlab
    from memlab.estimation.gpus import gpu_kind

    kind = gpu_kind(run.gpu)
    capacity = _capacity(run.gpu)
    started = time.perf_counter()
    load = None if run.inference else run.load
    trial = memlab.estimate(run.model, run.batch(), run.plan(), gpu=kind.name, budget=capacity, load=load)
    seconds = time.perf_counter() - started
    published = run.published_gb * GB
    return {
        "run": run.name,
        "model": run.model,
        "gpu": run.gpu,
        "batch": f"{run.rows}x{run.tokens}",
        "plan": run.plan().label(),
        "load": trial_load(trial),
        "published_gb": run.published_gb,
        "source": run.source,
        "status": trial.status,
        "allocated_gb": common.rounded(trial.peak_bytes / GB, 3),
        "allocated_ratio": common.rounded(trial.peak_bytes / published, 3),
        "reserved_gb": common.rounded((trial.reserved_bytes or 0) / GB, 3),
        "reserved_over_allocated": common.rounded((trial.reserved_bytes or 0) / trial.peak_bytes, 3),
        "card_gb": common.rounded((trial.card_bytes or 0) / GB, 3),
        "capacity_gb": common.rounded(capacity / GB, 3),
        "fits": bool(trial.fits),
        "ran_on_that_gpu": True,
        "verdict_matches": bool(trial.fits),
        "within": 0.15 if run.four_bit else 0.08,
        "seconds": common.rounded(seconds, 1),
        "notes": list(trial.notes),
    }


def trial_load(trial: Any) -> str | None:
    """The load the estimate's notes name."""
    return next((note for note in trial.notes if note.startswith("weights materialised as")), None)


_CAPACITY_BYTES = {"A100-40GB": 40 * GIB, "A100-80GB": 80 * GIB, "H100-80GB": 85_017_493_504}
"""Each GPU kind's whole memory: an A100-SXM4-40GB has 40 GiB (nvidia-smi: 40960 MiB)."""


def _capacity(gpu: str) -> int:
    return _CAPACITY_BYTES[gpu]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="run the rows whose name contains this text")
    parser.add_argument("--out", default=None, help="where to write the JSON (default: benchmarks/results/)")
    args = parser.parse_args(argv)
    common.quiet()
    device = torch.device("cpu")
    rows = [estimate_run(run) for run in RUNS if args.only is None or args.only in run.name]
    for row in rows:
        print(f"{row['run']}: allocated {row['allocated_gb']} GB ({row['allocated_ratio']} of "
              f"{row['published_gb']}), reserved {row['reserved_gb']} GB, card {row['card_gb']} GB, "
              f"fits {row['fits']} ({row['seconds']} s)")
    payload = {
        **common.metadata_for(NAME, device, "published"),
        "what": "memlab.estimate of runs other projects published, made on this CPU for the GPU each ran on",
        "rows": rows,
        "all_within": all(abs(r["allocated_ratio"] - 1) <= r["within"] for r in rows),
        "all_reserved_within_1_25": all(r["reserved_over_allocated"] <= 1.25 for r in rows),
        "all_verdicts_match": all(r["verdict_matches"] for r in rows),
    }
    print(common.markdown_table(
        ["run", "GPU", "published GB", "memlab allocated GB", "ratio", "reserved GB", "card GB", "fits"],
        [[r["run"], r["gpu"], r["published_gb"], r["allocated_gb"], r["allocated_ratio"], r["reserved_gb"],
          r["card_gb"], "yes" if r["fits"] else "NO"] for r in rows],
    ))
    if args.only is None:
        path = Path(args.out) if args.out else common.RESULTS_DIR / f"{NAME}-cpu.json"
        common.write_json(payload, path)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
