"""The levers one on top of the other, torchtune-style: peak memory and tokens/s per row, on a Llama from its config.

Rows (see :func:`benchmarks.gpu_sections.cumulative_plans`): fp32 AdamW; + bf16 autocast; + checkpointing;
+ 8-bit AdamW; + micro-batch 1 x accumulation 2; bf16 + checkpointing + offloaded AdamW; pure bf16 + checkpointing
+ 8-bit AdamW; LoRA r16 and QLoRA r16 (each with bf16 autocast and checkpointing). ``--small`` is a scaled-down
Llama on the CPU; ``--full`` is Llama-3.2-1B's shape at sequence 2048 on a CUDA GPU (the same rows the GPU
acceptance run measures).

Run from the repository root::

    python -m benchmarks.cumulative            # --small: CPU, a few minutes on 2 cores
    python -m benchmarks.cumulative --full     # Llama-3.2-1B's shape, 2 x 2048 tokens, on a CUDA GPU
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks import common, gpu_sections

NAME = "cumulative"

SIZES = {
    "smoke": gpu_sections.TINY,
    "small": gpu_sections.Llama(hidden=256, layers=4, heads=4, kv_heads=4, intermediate=704, vocab=8192, rows=4,
                                length=256),
    "full": gpu_sections.SIZES["full"]["cumulative"],
}


def markdown(result: dict[str, Any]) -> str:
    """The table: peak (MiB), saving against the first row, tokens/s and speed-up."""
    rows = [
        [row["step"], row["peak_mib"], None if row.get("memory_saving") is None else f"{row['memory_saving']:.0%}",
         row["tokens_per_s"], row.get("speedup")]
        for row in result["rows"]
    ]
    return common.markdown_table(["row", "peak MiB", "saving", "tokens/s", "speed-up"], rows)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the rows, print the table, write ``cumulative-<device>.json``; return the result."""
    parser = common.build_parser((__doc__ or NAME).splitlines()[0])
    args = parser.parse_args(argv)
    common.quiet()
    device = common.resolve_device(args, parser)
    result = common.metadata_for(NAME, device, args.size)
    steps = {"smoke": 2, "small": 4, "full": 4}[args.size]
    noise = gpu_sections.SIZES[args.size]["noise"]  # 0 at the smoke size: exactly `steps` steps
    result.update(gpu_sections.cumulative(SIZES[args.size], device, steps=steps, noise=noise))
    result["markdown"] = markdown(result)
    path = common.write_json(result, args.out / f"{common.result_stem(NAME, device, args.size)}.json")
    print(result["markdown"])
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
