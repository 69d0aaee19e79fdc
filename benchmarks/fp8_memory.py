"""FP8 training as a lever (issue 60): memlab's estimate of a Llama-3-8B step with and without torchao's float8, next
to the float8 memory figures torchao publishes for the same model.

memlab estimates, on fake tensors on this machine (no GPU: "cpu, estimate only"), one training step of Llama-3-8B at
one row of 8,192 tokens for an H100-80GB, with ``fp8=False`` and ``fp8=True`` (torchao's ``Float8Linear``, tensorwise
dynamic scaling, on every linear layer but the first and the last), in four settings: pure bf16 weights (what FSDP2's
bf16 ``param_dtype`` computes with) or fp32 weights under bf16 autocast, each with and without activation
checkpointing. Each row records the allocated peak, the allocator's reserved peak, the breakdown at the peak, and
fp8 minus bf16.

The published figures (``PUBLISHED``) are torchao's "e2e training benchmarks" table for NVIDIA H100
(``docs/source/workflows/training.md`` of pytorch/ao; before that ``torchao/float8/README.md``): torchtitan on 8 H100s,
batch size 1, sequence length 8,192, 100 steps, ``torch.compile``, FSDP2, per-op selective activation checkpointing;
pytorch 2.7.0a0+gitb98af95, torchao 0.10.0+git890e0ac8, torchtitan 0.0.2. Its "Peak Memory (GB)" is the largest
``memory:`` figure of torchtitan's step log (``benchmarks/float8/training/parse_torchtitan_logs.py``), which is
torchtitan's ``max_reserved_gib``: the CUDA caching allocator's reserved peak of the logging rank, in GiB. What is
compared is the difference fp8 makes, not the absolute figure: memlab's rows are one GPU holding the whole model, its
gradients and AdamW state (FSDP2 shards those over 8), where the activations of one rank's row of 8,192 tokens are
the same; the published run compiles (inductor fuses the float8 casts, eager torchao makes them as separate
tensors), uses per-op SAC rather than checkpointing every block, and all-gathers the weights in float8 (tensorwise).

Needs torchao (``pip install torchao``; it is not in memlab's test extra). Run from the repository root (no GPU
needed; about 3 minutes on 2 cores)::

    python -m benchmarks.fp8_memory
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Sequence
from typing import Any

from benchmarks import common

NAME = "fp8_memory"
GIB = 2**30
SETTINGS = {  # model (a known shape, or a tiny config), tokens
    "smoke": ("tiny", 64),
    "small": ("llama-3-8b", 8192),
    "full": ("llama-3-8b", 8192),
}
PUBLISHED = {
    "source": "pytorch/ao docs/source/workflows/training.md, 'e2e training benchmarks', NVIDIA H100 table",
    "settings": "torchtitan, Llama3-8b, 8xH100, batch size 1, sequence length 8192, 100 steps, torch.compile, FSDP2, "
                "per-op SAC; pytorch 2.7.0a0+gitb98af95, torchao 0.10.0+git890e0ac8, torchtitan 0.0.2",
    "measures": "the largest 'memory:' figure of torchtitan's step log (parse_torchtitan_logs.py), torchtitan's "
                "max_reserved_gib: the CUDA caching allocator's reserved peak on the logging rank, in GiB (the "
                "table heads it GB)",
    "rows": [
        {"scaling": "none (bfloat16)", "peak_gib": 47.65},
        {"scaling": "tensorwise with float8 all-gather", "peak_gib": 47.77},
        {"scaling": "rowwise with bfloat16 all-gather", "peak_gib": 47.79},
    ],
}
DIFFERS = (
    "memlab: one GPU holding the whole model, gradients and AdamW state (FSDP2 shards them over 8 GPUs, the same with "
    "and without fp8), so only the differences compare; eager torchao (the published run compiles: inductor fuses "
    "the float8 casts that eager makes as tensors in each matmul's backward); checkpointing every block (the "
    "published run uses per-op selective checkpointing); no float8 all-gather (one GPU)"
)
VARIANTS = (  # name, plan fields
    ("bf16 weights, checkpointing", {"weights": "bf16", "checkpointing": True}),
    ("bf16 autocast, fp32 weights, checkpointing", {"precision": "bf16", "checkpointing": True}),
    ("bf16 weights", {"weights": "bf16"}),
    ("bf16 autocast, fp32 weights", {"precision": "bf16"}),
)


def _model(name: str) -> Any:
    if name != "tiny":
        return name
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)


def _figures(trial: Any) -> dict[str, Any]:
    return {
        "status": trial.status,
        "error": trial.error,
        "peak_gib": common.rounded(trial.peak_bytes / GIB, 3),
        "reserved_gib": common.rounded((trial.reserved_bytes or 0) / GIB, 3),
        "breakdown_gib": {key: common.rounded(value / GIB, 3) for key, value in trial.breakdown.items()},
    }


def estimate_rows(model: Any, tokens: int) -> list[dict[str, Any]]:
    """Each variant estimated with and without fp8, and fp8 minus bf16."""
    import memlab

    shape = {"input_ids": (1, tokens), "labels": (1, tokens)}
    rows = []
    for name, fields in VARIANTS:
        row: dict[str, Any] = {"variant": name}
        for key, fp8 in (("bf16", False), ("fp8", True)):
            started = time.perf_counter()
            trial = memlab.estimate(model, shape, memlab.Plan(fp8=fp8, **fields), gpu="H100-80GB")
            row[key] = {**_figures(trial), "seconds": round(time.perf_counter() - started, 1)}
            if fp8:
                row["fp8_note"] = next((note for note in trial.notes if note.startswith("fp8: torchao's")), None)
        if row["bf16"]["status"] == row["fp8"]["status"] == "ok":
            for figure in ("peak_gib", "reserved_gib"):
                row[f"fp8_minus_bf16_{figure}"] = common.rounded(row["fp8"][figure] - row["bf16"][figure], 3)
            row["fp8_minus_bf16_activations_gib"] = common.rounded(
                row["fp8"]["breakdown_gib"]["activations"] - row["bf16"]["breakdown_gib"]["activations"], 3)
        rows.append(row)
        print(json.dumps({key: row.get(key) for key in ("variant", "fp8_minus_bf16_peak_gib",
                                                        "fp8_minus_bf16_reserved_gib")}), flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Estimate every variant with and without fp8; write the JSON beside the published figures."""
    parser = common.build_parser((__doc__ or NAME).splitlines()[0])
    args = parser.parse_args(argv)
    if importlib.util.find_spec("torchao") is None:
        parser.error("needs torchao: pip install torchao (it is not in memlab's test extra)")
    common.quiet()
    device = common.resolve_device(args, parser)
    model, tokens = SETTINGS[args.size]
    started = time.perf_counter()
    rows = estimate_rows(_model(model), tokens)
    published = PUBLISHED["rows"]
    result = common.metadata_for(NAME, device, args.size)
    result["device"]["estimate"] = "cpu, estimate only"
    from importlib import metadata

    result["versions"]["torchao"] = metadata.version("torchao")
    result.update({
        "model": {"name": model, "rows": 1, "tokens": tokens, "gpu": "H100-80GB"},
        "seconds": round(time.perf_counter() - started, 1),
        "published": {**PUBLISHED, "tensorwise_minus_bf16_gib": round(
            published[1]["peak_gib"] - published[0]["peak_gib"], 2)},
        "differs": DIFFERS,
        "rows": rows,
    })
    result["markdown"] = markdown(result)
    path = common.write_json(result, args.out / f"{common.result_stem(NAME, device, args.size)}.json")
    print(result["markdown"])
    print(f"wrote {path}")
    return result


def markdown(result: dict[str, Any]) -> str:
    """The rows as a table, the published difference as its last row."""
    rows = [[row["variant"], row["bf16"]["peak_gib"], row["fp8"]["peak_gib"], row.get("fp8_minus_bf16_peak_gib"),
             row["bf16"]["reserved_gib"], row["fp8"]["reserved_gib"], row.get("fp8_minus_bf16_reserved_gib")]
            for row in result["rows"]]
    published = result["published"]["rows"]
    rows.append(["published: torchtitan, 8xH100, compile, FSDP2, per-op SAC (reserved)", None, None, None,
                 published[0]["peak_gib"], published[1]["peak_gib"], result["published"]["tensorwise_minus_bf16_gib"]])
    return common.markdown_table(
        ["setting", "bf16 allocated GiB", "fp8 allocated GiB", "fp8 - bf16", "bf16 reserved GiB", "fp8 reserved GiB",
         "fp8 - bf16 reserved"], rows)


if __name__ == "__main__":
    main()
