"""memlab's dry-run estimate, accelerate's estimate-memory formula and the measured peak, across sequence lengths.

For one small Llama (built from its config, random weights) and several sequence lengths, three answers to "how
much memory does a training step with AdamW take?":

- measured: ``memlab.measure(model, batch, plan)`` on the real model and a real batch (the peak of a steady-state
  step, from memlab's tensor tracking on the CPU, the CUDA allocator on a GPU);
- memlab's estimate: ``memlab.estimate(config, shapes, plan)``, from the config and the batch's shapes alone, on fake
  tensors (no weights, no data);
- accelerate's: the rule of ``accelerate estimate-memory`` (``accelerate.commands.estimate.estimate_training_usage``
  applied to ``accelerate.utils.calculate_maximum_sizes`` of the same model, fp32): the largest of model, gradients,
  optimizer and "step" sizes, i.e. 4 x the fp32 model for ``float32`` (16 bytes per parameter) and 2 x for
  ``bfloat16``. It has no batch or sequence length in it: activations and temporaries are left out. (The
  command itself builds ``AutoModel``, without the LM head, from the Hub; here the formula gets the full causal LM
  so that the comparison is fair to it.)

Two plans: fp32 (accelerate's ``float32`` row) and bf16 with checkpointing (its ``bfloat16`` row). Errors are
``answer / measured - 1``.

Run from the repository root::

    python -m benchmarks.estimate_vs_accelerate            # --small: CPU, a few minutes on 2 cores
    python -m benchmarks.estimate_vs_accelerate --full     # CUDA GPU, a bigger Llama, longer sequences
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from benchmarks import common
from memlab.plan import Plan

NAME = "estimate_vs_accelerate"


@dataclass(frozen=True)
class Size:
    """The model (a Llama from its config), rows per batch and the sequence lengths to compare."""

    hidden: int
    layers: int
    heads: int
    vocab: int
    rows: int
    lengths: tuple[int, ...]


SIZES = {
    "smoke": Size(hidden=32, layers=2, heads=2, vocab=128, rows=2, lengths=(16, 32)),
    "small": Size(hidden=256, layers=4, heads=4, vocab=32000, rows=2, lengths=(64, 128, 256, 512)),
    "full": Size(hidden=1024, layers=12, heads=16, vocab=32000, rows=4, lengths=(256, 512, 1024, 2048)),
}

PLANS = {"float32": Plan(), "bfloat16": Plan(precision="bf16", checkpointing=True)}
"""accelerate's dtype row -> the memlab plan it is compared on."""


def accelerate_answer(model: torch.nn.Module, dtype: str) -> dict[str, Any]:
    """What ``accelerate estimate-memory`` says for training with Adam: its parts and their maximum."""
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes

    total, _largest = calculate_maximum_sizes(model)
    parts = estimate_training_usage(total, dtype)
    return {
        "model_bytes": int(total),
        "parts": {key: int(value) for key, value in parts.items()},
        "bytes": int(max(parts.values())),
    }


def run(size: Size, device: torch.device, lr: float = 1e-5) -> dict[str, Any]:
    """Measure, estimate and apply accelerate's rule for every plan and sequence length."""
    import memlab
    from memlab.estimation.estimate import estimate, meta_model

    model = common.llama_model(
        hidden=size.hidden, layers=size.layers, heads=size.heads, vocab=size.vocab, positions=max(size.lengths)
    ).to(device)
    config = model.config
    parameters = sum(p.numel() for p in model.parameters())
    accelerate = {dtype: accelerate_answer(meta_model(config), dtype) for dtype in PLANS}
    rows: list[dict[str, Any]] = []
    for length in size.lengths:
        batch = common.to_device(common.lm_batch(vocab=size.vocab, rows=size.rows, length=length), device)
        shapes = {name: tuple(tensor.shape) for name, tensor in batch.items()}
        for dtype, plan in PLANS.items():
            started = time.perf_counter()
            estimated = estimate(config, shapes, plan, lr=lr, device=device.type)
            estimate_seconds = time.perf_counter() - started
            started = time.perf_counter()
            measured = memlab.measure(model, batch, plan, steps=1, warmup=1, lr=lr)
            measure_seconds = time.perf_counter() - started
            common.release(device)
            for trial in (estimated, measured):
                if trial.status != "ok":
                    raise RuntimeError(f"{plan.label()} at length {length}: {trial.error}")
            answer = accelerate[dtype]["bytes"]
            rows.append(
                {
                    "length": length,
                    "rows": size.rows,
                    "plan": plan.label(),
                    "accelerate_dtype": dtype,
                    "measured_bytes": measured.peak_bytes,
                    "measured_breakdown": measured.breakdown,
                    "estimate_bytes": estimated.peak_bytes,
                    "estimate_breakdown": estimated.breakdown,
                    "accelerate_bytes": answer,
                    "estimate_error": estimated.peak_bytes / measured.peak_bytes - 1,
                    "accelerate_error": answer / measured.peak_bytes - 1,
                    "estimate_seconds": round(estimate_seconds, 3),
                    "measure_seconds": round(measure_seconds, 3),
                }
            )
            print(
                f"length {length:5d} {plan.label():10s} measured {common.mib(measured.peak_bytes):9.1f} MiB  "
                f"memlab {common.mib(estimated.peak_bytes):9.1f} MiB ({rows[-1]['estimate_error']:+.1%})  "
                f"accelerate {common.mib(answer):9.1f} MiB ({rows[-1]['accelerate_error']:+.1%})",
                flush=True,
            )
    return {
        "model": {
            "class": type(model).__name__,
            "parameters": parameters,
            **{k: v for k, v in asdict(size).items() if k in ("hidden", "layers", "heads", "vocab")},
        },
        "rows_per_batch": size.rows,
        "lengths": list(size.lengths),
        "plans": {dtype: plan.label() for dtype, plan in PLANS.items()},
        "accelerate": accelerate,
        "results": rows,
        "summary": {
            "estimate_max_abs_error": max(abs(r["estimate_error"]) for r in rows),
            "accelerate_max_abs_error": max(abs(r["accelerate_error"]) for r in rows),
        },
        "method": (
            "measured = memlab.measure(model, batch, plan, steps=1) on the real model and batch; "
            "memlab = memlab.estimate(config, batch shapes, plan) on fake tensors; "
            "accelerate = max(estimate_training_usage(calculate_maximum_sizes(model)[0], dtype).values()), "
            "the 'Training using Adam' column of accelerate estimate-memory, for the same causal LM in fp32; "
            "error = answer / measured - 1"
        ),
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the comparison, print a table, write ``estimate_vs_accelerate-<device>.json``; return the result."""
    parser = common.build_parser((__doc__ or NAME).splitlines()[0])
    args = parser.parse_args(argv)
    common.quiet()
    device = common.resolve_device(args, parser)
    result = common.metadata_for(NAME, device, args.size)
    result.update(run(SIZES[args.size], device))
    path = common.write_json(result, args.out / f"{common.result_stem(NAME, device, args.size)}.json")
    table = [
        [
            r["length"],
            r["plan"],
            common.mib(r["measured_bytes"]),
            common.mib(r["estimate_bytes"]),
            f"{r['estimate_error']:+.1%}",
            common.mib(r["accelerate_bytes"]),
            f"{r['accelerate_error']:+.1%}",
        ]
        for r in result["results"]
    ]
    headers = ["length", "plan", "measured MiB", "memlab MiB", "memlab error", "accelerate MiB", "accelerate error"]
    print(common.markdown_table(headers, table))
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
