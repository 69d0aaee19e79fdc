"""Llama-2-70B over 8 GPUs, estimated per GPU on this machine: time, RAM, and model-state bytes against the floor.

The estimate needs no GPU (fake tensors and a fake process group): ``--small`` and ``--full`` both ask for the real
70B shape on 8 GPUs (FSDP2, ZeRO-2, ZeRO-3; batch 1x512, fp32 AdamW, and bf16 autocast); ``--smoke`` asks for
llama-7b on 2 GPUs. Each strategy runs in a fresh Python process, so that its peak resident memory (``ru_maxrss``,
torch's import included) is its own. The floor of the model states per GPU is 16 bytes per parameter / N for FSDP2
and ZeRO-3 with fp32 AdamW (weights 4, gradients 4, moments 8; FSDP2 adds AdamW's 4-byte step counter per tensor),
and DeepSpeed's ``2*P + 18*P/N`` / ``4*L + 18*P/N`` for ZeRO-2 / ZeRO-3 with bf16.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from benchmarks import common

NAME = "sharded_70b"

_CHILD = r"""
import json, resource, sys, time
import memlab
name, gpus, strategy, precision = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
start = time.perf_counter()
trial = memlab.estimate(name, {"input_ids": (1, 512), "labels": (1, 512)}, memlab.Plan(precision=precision),
                        gpus=gpus, strategy=strategy, budget="80GiB")
seconds = time.perf_counter() - start
from memlab.estimation.sharded.per_gpu import layer_counts
parameters, largest = layer_counts(name)
print(json.dumps({"seconds": seconds, "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "peak_bytes": trial.peak_bytes, "fits_80GiB": trial.fits, "breakdown": trial.breakdown,
                  "detail": trial.detail, "model_state_bytes": trial.model_state_bytes, "parameters": parameters,
                  "largest_layer": largest, "status": trial.status, "error": trial.error}))
"""


def floor(strategy: str, precision: str, parameters: int, largest: int, gpus: int, tensors: int) -> int:
    """The model-state bytes per GPU that the strategy cannot go below (see the module docstring)."""
    if strategy == "fsdp2":
        return 16 * parameters // gpus + 4 * tensors
    w = 2 if precision != "fp32" else 4
    if strategy == "zero2":
        return w * parameters + (w + 16) * parameters // gpus
    return 2 * w * largest + (w + 16) * parameters // gpus


def run(name: str, gpus: int) -> dict[str, Any]:
    from memlab.estimation.estimate import load_config, meta_model

    tensors = sum(1 for _ in meta_model(load_config(name)).parameters())
    rows = []
    for strategy, precision in (("fsdp2", "fp32"), ("fsdp2", "bf16"), ("zero2", "bf16"), ("zero3", "bf16")):
        out = subprocess.run([sys.executable, "-c", _CHILD, name, str(gpus), strategy, precision],
                             capture_output=True, text=True, timeout=600, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row.update(strategy=strategy, precision=precision, gpus=gpus, model=name)
        row["floor_bytes"] = floor(strategy, precision, row["parameters"], row["largest_layer"], gpus, tensors)
        rows.append(row)
        print(f"{name} {strategy:5s} {precision}: {row['seconds']:.1f} s, RSS {common.mib(row['max_rss_bytes']):.0f}"
              f" MiB, peak {row['peak_bytes'] / 2**30:.2f} GiB, model states {row['model_state_bytes']} "
              f"(floor {row['floor_bytes']})", flush=True)
    return {"results": rows, "method": "memlab.estimate(name, 1x512, Plan(precision=...), gpus=N, strategy=...), "
            "each in a fresh process; seconds = wall time of the call; max_rss_bytes = ru_maxrss of that process"}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the estimates, write ``sharded_70b-<device>.json``; return the result."""
    parser = common.build_parser((__doc__ or NAME).splitlines()[0])
    args = parser.parse_args(argv)
    common.quiet()
    device = common.resolve_device(args, parser)
    result = common.metadata_for(NAME, device, args.size)
    result.update(run("llama-7b", 2) if args.size == "smoke" else run("llama-70b", 8))
    path = common.write_json(result, args.out / f"{common.result_stem(NAME, device, args.size)}.json")
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
