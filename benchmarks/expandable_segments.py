"""The card figure with and without the CUDA caching allocator's expandable segments, estimated on this machine
for every H200 row of the table of truth (``results/cuda_truth.json``) that recorded the reserved peak.

The H200 runs set no ``PYTORCH_CUDA_ALLOC_CONF`` (none of the GPU runners sets it and the rows name no allocator
setting): they ran PyTorch's default allocator, so the measured reserved peak checks the default model only. Each
row is estimated twice with ``memlab.estimate(..., device="cuda", gpu="H200-141GB")``: as the row ran
(``expandable_segments=False``: the estimate the table of truth checks) and with ``expandable_segments=True``.
For each, the reserve over the allocated peak; for the expandable one, how far it is from its floor: the allocated
peak plus cuBLAS's workspaces rounded up to the large pool's 20 MiB pages (a dry run's allocations are mostly
large; the small pool adds a few 2 MiB pages).

    python -m benchmarks.expandable_segments            # every H200 row, smallest first: 1-2 min a row, 2 busy cores
    python -m benchmarks.expandable_segments --smoke    # the two smallest one-step rows

Writes ``results/expandable_segments-cpu.json`` (the markdown table included), row by row as they finish.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:
    from benchmarks import common
except ImportError:  # run as a script from inside benchmarks/
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks import common
from benchmarks.cuda_truth_estimates import TABLE, _config, gpu_of, load_rows, training_rows
from benchmarks.recorded_transformers import recorded_transformers

MIB = 2**20
PAGE = 20 * MIB
SMOKE_ROWS = 2


def h200_rows(table: dict[str, Any]) -> list[dict[str, Any]]:
    """The H200 rows that recorded the reserved peak, training and loads.

    Example:
        >>> h200_rows({"rows": [{"gpu": "NVIDIA H200", "plan": {}, "measured_reserved_bytes": 1},
        ...                     {"gpu": "NVIDIA H100 80GB HBM3", "plan": {}, "measured_reserved_bytes": 1}]})
        [{'gpu': 'NVIDIA H200', 'plan': {}, 'measured_reserved_bytes': 1}]
    """
    rows = training_rows(table) + load_rows(table)
    return [row for row in rows if "H200" in str(row.get("gpu")) and row.get("measured_reserved_bytes")]


def floor_bytes(peak: int, workspaces: int) -> int:
    """The allocated peak and cuBLAS's workspaces rounded up to 20 MiB pages: the least an expandable large pool
    maps for them.

    Example:
        >>> floor_bytes(100 * MIB, 64 * MIB) // MIB
        180
    """
    return -(-(peak + workspaces) // PAGE) * PAGE


def estimate_row(row: dict[str, Any]) -> dict[str, Any]:
    """One row estimated without and with expandable segments, beside what the H200 measured."""
    import memlab
    from memlab.estimation.cuda.gpus import GPUS
    from memlab.estimation.dryrun.reserved import CUBLAS_WORKSPACES, cublas_workspace_bytes

    batch = {name: tuple(shape) for name, shape in row["batch"].items()}
    keywords: dict[str, Any] = {"device": "cuda", **gpu_of(row)}
    if "inference_plan" in row:
        plan: Any = memlab.InferencePlan(**row["inference_plan"])
        handles = 1
    else:
        plan = memlab.Plan(**row["plan"])
        handles = CUBLAS_WORKSPACES
        if "load" in row:
            keywords["load"] = row["load"]
    trials = {}
    started = time.perf_counter()
    for expandable in (False, True):
        with recorded_transformers(row.get("transformers")):
            trials[expandable] = memlab.estimate(_config(row), batch, plan, expandable_segments=expandable,
                                                 **keywords)
    seconds = time.perf_counter() - started
    default, expandable_trial = trials[False], trials[True]
    capability = GPUS[keywords.get("gpu", "H100-80GB")].capability
    measured = row["measured_reserved_bytes"]
    result: dict[str, Any] = {
        "source": row["source"], "model_type": row["config"]["model_type"], "plan_label": row["plan_label"],
        "batch": "x".join(map(str, row["batch"]["input_ids"])), "status": default.status,
        "allocator_setting_measured": "default (no PYTORCH_CUDA_ALLOC_CONF)",
        "measured_peak_bytes": row["measured_peak_bytes"], "measured_reserved_bytes": measured,
        "estimate_peak_bytes": default.peak_bytes, "estimate_reserved_bytes": default.reserved_bytes,
        "expandable_reserved_bytes": expandable_trial.reserved_bytes,
        "same_allocated_peak": default.peak_bytes == expandable_trial.peak_bytes,
        "seconds": round(seconds, 1),
    }
    if default.reserved_bytes and expandable_trial.reserved_bytes:
        floor = floor_bytes(expandable_trial.peak_bytes, cublas_workspace_bytes(capability, "") * handles)
        result.update({
            "default_ratio_to_measured": common.rounded(default.reserved_bytes / measured, 4),
            "measured_reserve_over_allocated_mib": common.mib(measured - row["measured_peak_bytes"]),
            "default_reserve_over_allocated_mib": common.mib(default.reserved_bytes - default.peak_bytes),
            "expandable_reserve_over_allocated_mib": common.mib(expandable_trial.reserved_bytes
                                                                - expandable_trial.peak_bytes),
            "saved_mib": common.mib(default.reserved_bytes - expandable_trial.reserved_bytes),
            "expandable_at_most_default": expandable_trial.reserved_bytes <= default.reserved_bytes,
            "floor_bytes": floor,
            "over_floor_mib": common.mib(expandable_trial.reserved_bytes - floor),
        })
    return result


def markdown(results: Sequence[dict[str, Any]]) -> str:
    """The rows as a markdown table (MiB)."""
    rows = [[r["model_type"], r["plan_label"], r["batch"], common.mib(r["measured_reserved_bytes"]),
             common.mib(r["estimate_reserved_bytes"]), common.mib(r["expandable_reserved_bytes"]),
             r.get("saved_mib"), r.get("over_floor_mib")] for r in results]
    return common.markdown_table(["model", "plan", "batch", "H200 reserved (default)", "estimate, default",
                                  "estimate, expandable", "saved", "expandable over its floor"], rows)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = common.build_parser(__doc__.split("\n\n")[0])
    args = parser.parse_args(argv)
    if args.device == "cuda" or args.size == "full":
        parser.error("these are estimates made without CUDA: leave out --device and --full")
    common.quiet()
    device = common.resolve_device(args, parser)
    rows = h200_rows(json.loads(TABLE.read_text()))
    rows.sort(key=lambda row: row["measured_peak_bytes"])  # the quickest first: a run cut short has the most rows
    if args.size == "smoke":
        rows = [row for row in rows if row.get("plan", {}).get("accumulation", 1) == 1][:SMOKE_ROWS]
    out = Path(args.out or common.RESULTS_DIR) / f"{common.result_stem('expandable_segments', device, args.size)}.json"
    results: list[dict[str, Any]] = []
    payload: dict[str, Any] = {}
    for number, row in enumerate(rows, 1):
        results.append(estimate_row(row))
        last = results[-1]
        print(f"[{number}/{len(rows)}] {row['source']} {row['plan_label']}: default "
              f"{last.get('default_ratio_to_measured')} of measured, saved {last.get('saved_mib')} MiB, "
              f"{last.get('over_floor_mib')} MiB over the floor "
              f"in {last['seconds']} s", flush=True)
        compared = [r for r in results if "saved_mib" in r]
        payload = {
            **common.metadata_for("expandable_segments", device, args.size),
            "truth": "results/cuda_truth.json's H200 rows: max_memory_reserved with PyTorch's default allocator",
            "estimated_for": "device='cuda', gpu='H200-141GB', on fake CPU tensors, expandable_segments False and True",
            "rows_done": f"{len(results)} of {len(rows)}",
            "expandable_at_most_default": sum(r["expandable_at_most_default"] for r in compared),
            "compared": len(compared),
            "saved_mib": {"min": min((r["saved_mib"] for r in compared), default=None),
                          "max": max((r["saved_mib"] for r in compared), default=None)},
            "over_floor_mib": {"min": min((r["over_floor_mib"] for r in compared), default=None),
                               "max": max((r["over_floor_mib"] for r in compared), default=None)},
            "rows": results,
            "markdown": markdown(results),
        }
        common.write_json(payload, out)
    return payload


if __name__ == "__main__":
    main()
