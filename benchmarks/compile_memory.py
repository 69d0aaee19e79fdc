"""torch.compile as a lever (issue 60): each family's step measured with and without ``compile=True``, and estimated.

Three causal-LM and encoder families built from configs (Llama, GPT-2, BERT with a classification head), random
weights and token ids, are measured on this device with ``memlab.compare`` (``Plan()`` and ``Plan(compile=True)``):
the peak (and the peak less the memory the process held before, which is no plan's), samples/s of the timed steps,
and the compiled trial's ``compile_seconds`` (its first warm-up step: compiling and one step), never in the speed.
Each plan is also estimated on fake tensors (``memlab.estimate``): the compiled plan's estimate runs the compiled
step's AOTAutograd partition (inductor's decompositions, joint-graph passes and min-cut partitioner) or, where
dynamo cannot trace it on fake tensors, the eager step; its note says which. The estimate's error is against the
measured peak less the memory held before. The machine's load average is recorded at the start and the end (the
timings depend on it).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

if __package__ in (None, ""):
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))
from benchmarks import common

NAME = "compile_memory"
SETTINGS = {  # hidden, layers, rows, tokens, timed steps
    "smoke": (32, 1, 2, 16, 1),
    "small": (128, 2, 4, 128, 5),
    "full": (1024, 8, 4, 1024, 10),
}
VOCAB = 1024


def _gpt2(hidden: int, layers: int, tokens: int) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=hidden, n_head=4, vocab_size=VOCAB, n_positions=tokens,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def families(hidden: int, layers: int, tokens: int) -> dict[str, Callable[[], nn.Module]]:
    """The three families' models, built when called (one at a time in memory)."""
    return {
        "llama": lambda: common.llama_model(hidden=hidden, layers=layers, heads=4, vocab=VOCAB, positions=tokens),
        "gpt2": lambda: _gpt2(hidden, layers, tokens),
        "bert": lambda: common.bert_classifier(hidden=hidden, layers=layers, heads=4, intermediate=4 * hidden,
                                               vocab=VOCAB, positions=tokens),
    }


def _batch(family: str, rows: int, tokens: int) -> dict[str, torch.Tensor]:
    if family == "bert":
        return common.classification_batch(vocab=VOCAB, rows=rows, length=tokens)
    return common.lm_batch(vocab=VOCAB, rows=rows, length=tokens)


def _error(estimate: int, measured: int) -> float | None:
    return common.rounded((estimate - measured) / measured, 4) if measured else None


def measure_family(family: str, model: nn.Module, batch: Any, steps: int) -> dict[str, Any]:
    """One family measured and estimated with and without compile."""
    import memlab

    plans = [memlab.Plan(), memlab.Plan(compile=True)]
    report = memlab.compare(model, batch, plans, steps=steps, noise=0, progress=False)
    row: dict[str, Any] = {"family": family, "parameters": sum(p.numel() for p in model.parameters())}
    for trial in report.trials:
        key = "compiled" if trial.plan.compile else "eager"
        estimate = memlab.estimate(model, batch, trial.plan)
        net = trial.peak_bytes - trial.preexisting_bytes
        row[key] = {
            "status": trial.status,
            "error": trial.error,
            "peak_bytes": trial.peak_bytes,
            "held_before_bytes": trial.preexisting_bytes,
            "peak_less_held_bytes": net,
            "samples_per_s": common.rounded(trial.samples_per_s),
            "step_time_s": common.rounded(trial.step_time_s, 5),
            "compile_seconds": common.rounded(trial.compile_seconds),
            "estimate_bytes": estimate.peak_bytes,
            "estimate_error": _error(estimate.peak_bytes, net) if trial.status == "ok" else None,
            "estimate_compile_note": next((note for note in estimate.notes if note.startswith("compile:")), None),
        }
    eager, compiled = row["eager"], row["compiled"]
    if eager["status"] == compiled["status"] == "ok":
        peaks = compiled["peak_less_held_bytes"] / eager["peak_less_held_bytes"]
        speeds = (compiled["samples_per_s"] or 0) / (eager["samples_per_s"] or 1)
        row["compiled_over_eager_peak"] = common.rounded(peaks, 4)
        row["compiled_over_eager_speed"] = common.rounded(speeds, 3)
    return row


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Measure and estimate each family with and without compile; write the JSON."""
    parser = common.build_parser((__doc__ or NAME).splitlines()[0])
    args = parser.parse_args(argv)
    common.quiet()
    device = common.resolve_device(args, parser)
    hidden, layers, rows, tokens, steps = SETTINGS[args.size]
    load_before = os.getloadavg()
    started = time.perf_counter()
    rows_out = []
    for family, build in families(hidden, layers, tokens).items():
        model = build().to(device)
        row = measure_family(family, model, common.to_device(_batch(family, rows, tokens), device), steps)
        rows_out.append(row)
        print(json.dumps({k: row.get(k) for k in ("family", "compiled_over_eager_peak", "compiled_over_eager_speed")}),
              flush=True)
        del model
        common.release(device)
    result = common.metadata_for(NAME, device, args.size)
    result.update({
        "model": {"hidden": hidden, "layers": layers, "rows": rows, "tokens": tokens, "vocab": VOCAB,
                  "timed_steps": steps, "threads": torch.get_num_threads()},
        "load_average_before": [round(value, 2) for value in load_before],
        "load_average_after": [round(value, 2) for value in os.getloadavg()],
        "seconds": round(time.perf_counter() - started, 1),
        "families": rows_out,
    })
    result["markdown"] = markdown(result)  # the docs' table (docs/_ext/memlab_docs.py)
    path = common.write_json(result, args.out / f"{common.result_stem(NAME, device, args.size)}.json")
    print(result["markdown"])
    print(f"wrote {path}")
    return result


def markdown(result: dict[str, Any]) -> str:
    """The result as a table: per family, both peaks, both speeds, the compile time, the estimates' errors."""
    rows = []
    for row in result["families"]:
        eager, compiled = row["eager"], row["compiled"]
        rows.append([
            row["family"], common.mib(eager["peak_less_held_bytes"]), common.mib(compiled["peak_less_held_bytes"]),
            eager["samples_per_s"], compiled["samples_per_s"], compiled["compile_seconds"],
            eager["estimate_error"], compiled["estimate_error"],
            "partition" if (compiled["estimate_compile_note"] or "").startswith("compile: estimated with") else "eager",
        ])
    return common.markdown_table(
        ["family", "eager MiB", "compiled MiB", "eager samples/s", "compiled samples/s", "compile s",
         "eager estimate error", "compiled estimate error", "compiled estimate"], rows)


if __name__ == "__main__":
    main()
