"""CUDA estimates made on a machine without CUDA, against every peak an H100 or the H200 measured
(``results/cuda_truth.json``).

Each training row of the table of truth (offload rows aside: left out of the runs recorded before issue 60) is
estimated here with ``memlab.estimate(config, shapes, plan, device="cuda", gpu=...)`` (the GPU kind that measured
the row) on fake CPU tensors, and the result gives, per row, estimate / measured for the allocated peak and, where the
run recorded it without a budget, for the reserved peak. The rows of a checkpoint loaded as users load it
(``load_rows``, since issue 40's run) are estimated with that load (``load=``, or for inference the
``InferencePlan`` that holds the weights so), and give the card figure's ratio too (estimated reserve + CUDA
context over the measured ones).
``tests/estimation/cuda/test_cuda_truth.py`` holds the training rows to 5%; this runner records the ratios and their
spread for the README.

    python -m benchmarks.cuda_truth_estimates           # every row: about 30 minutes on 2 busy CPU cores
    python -m benchmarks.cuda_truth_estimates --smoke   # the two smallest one-step rows (the tests)

Writes ``results/cuda_truth_estimates-cpu.json`` (the markdown table included).
"""

from __future__ import annotations

import json
import statistics
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
from benchmarks.recorded_transformers import recorded_transformers

TABLE = common.RESULTS_DIR / "cuda_truth.json"
SMOKE_ROWS = 2
GIB = 2**30


def training_rows(table: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows a CPU can estimate for CUDA: every training row but the offload plans.

    Example:
        >>> training_rows({"rows": [{"plan": {"offload": "all"}}, {"plan": {}}]})
        [{'plan': {}}]
    """
    return [row for row in table["rows"] if "offload" not in row["plan"]]


def _config(row: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    fields = dict(row["config"])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    config.architectures = [row["architecture"]]
    return config


def load_rows(table: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of a checkpoint loaded as users load it (bf16 or 4-bit ``from_pretrained``; the GPU runs since
    issue 40's), trained or run for inference: each is estimated with its load.

    Example:
        >>> load_rows({"rows": []}), load_rows({"load_rows": [{"load": {"torch_dtype": "bfloat16"}}]})
        ([], [{'load': {'torch_dtype': 'bfloat16'}}])
    """
    return list(table.get("load_rows", []))


def gpu_of(row: dict[str, Any]) -> dict[str, str]:
    """``estimate``'s ``gpu=`` for the GPU that measured ``row`` (its CUDA context, cuBLAS workspaces and memory),
    where memlab knows that kind; none (the default, an 80 GB H100) otherwise.

    Example:
        >>> gpu_of({"gpu": "NVIDIA H200"}), gpu_of({"gpu": "NVIDIA H100 80GB HBM3"}), gpu_of({})
        ({'gpu': 'H200-141GB'}, {'gpu': 'H100-80GB'}, {})
    """
    from memlab.estimation.cuda.gpus import GPUS

    name = next((kind for kind, spec in GPUS.items() if row.get("gpu") and spec.device_name == row["gpu"]), None)
    return {"gpu": name} if name else {}


def estimate_row(row: dict[str, Any]) -> dict[str, Any]:
    """One row estimated on this machine for ``device="cuda"``: the figures and their ratios to the H100's. A load
    row is estimated with its load (``load=`` for training, its ``InferencePlan`` for inference), and where the run
    read the CUDA context, the card figure (reserved + context) is compared too."""
    import memlab

    batch = {name: tuple(shape) for name, shape in row["batch"].items()}
    keywords: dict[str, Any] = {"device": "cuda", **gpu_of(row)}
    if "inference_plan" in row:
        plan: Any = memlab.InferencePlan(**row["inference_plan"])
    else:
        plan = memlab.Plan(**row["plan"])
        if "load" in row:
            keywords["load"] = row["load"]
    started = time.perf_counter()
    with recorded_transformers(row.get("transformers")):  # the code measured, where it kept other memory
        trial = memlab.estimate(_config(row), batch, plan, **keywords)
    seconds = time.perf_counter() - started
    measured, reserved = row["measured_peak_bytes"], row.get("measured_reserved_bytes")
    context = row.get("measured_context_bytes")
    card = getattr(trial, "card_bytes", None)
    return {
        "source": row["source"], "gpu": row.get("gpu"), "model_type": row["config"]["model_type"],
        "plan_label": row["plan_label"],
        "plan": row.get("plan", row.get("inference_plan")), "batch": "x".join(map(str, row["batch"]["input_ids"])),
        "status": trial.status, "error": trial.error, "measured_peak_bytes": measured,
        "estimate_peak_bytes": trial.peak_bytes,
        "ratio": common.rounded(trial.peak_bytes / measured, 4) if trial.status == "ok" else None,
        "measured_reserved_bytes": reserved, "estimate_reserved_bytes": trial.reserved_bytes,
        "reserved_ratio": (common.rounded(trial.reserved_bytes / reserved, 4)
                           if reserved and trial.reserved_bytes else None),
        **({"load": row["load"], "measured_context_bytes": context, "estimate_card_bytes": card,
            "card_ratio": (common.rounded(card / (reserved + context), 4) if card and reserved and context
                           else None)} if "load" in row else {}),
        "seconds": round(seconds, 1),
    }


def _spread(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"rows": 0}
    return {"rows": len(values), "within_5_percent": sum(abs(v - 1) <= 0.05 for v in values),
            "min": min(values), "median": common.rounded(statistics.median(values), 4), "max": max(values)}


def _run_section(source: str) -> str:
    """``gpu_acceptance:cumulative`` for ``gpu_acceptance-cuda-nvidia-h100-80gb-hbm3:cumulative`` (a run's file name
    less its device, then its section); a second run of the same device keeps its suffix.

    Example:
        >>> _run_section("gpu_acceptance-cuda-nvidia-h100-80gb-hbm3-adapters:cumulative")
        'gpu_acceptance-adapters:cumulative'
    """
    stem, _, section = source.rpartition(":")
    run, _, device = stem.partition("-cuda-")
    suffix = device.split("hbm3", 1)[-1] if "hbm3" in device else ""
    return f"{run}{suffix}:{section}"


def markdown(results: Sequence[dict[str, Any]]) -> str:
    """The README's table: one line per row, GiB to two places and the ratios."""
    return common.markdown_table(
        ["run:section", "GPU", "model", "plan", "batch", "measured GiB", "estimate GiB", "estimate / measured",
         "reserved ratio"],
        [[_run_section(row["source"]), _short(row.get("gpu")), row["model_type"], row["plan_label"],
          row["batch"], round(row["measured_peak_bytes"] / GIB, 2),
          None if row["status"] != "ok" else round(row["estimate_peak_bytes"] / GIB, 2), row["ratio"],
          row["reserved_ratio"]]
         for row in results],
    )


def _short(gpu: str | None) -> str | None:
    """``H200`` for ``NVIDIA H200``, ``H100`` for ``NVIDIA H100 80GB HBM3``."""
    return None if gpu is None else next((word for word in gpu.split() if word[:1] in "HABL" and word[1:2].isdigit()),
                                         gpu)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = common.build_parser(__doc__.split("\n\n")[0])
    args = parser.parse_args(argv)
    if args.device == "cuda":
        parser.error("these are estimates made without CUDA: leave out --device (or write --device cpu)")
    if args.size == "full":
        parser.error("--full is not a size here: without --smoke every row of the table is estimated")
    common.quiet()
    device = common.resolve_device(args, parser)
    table = json.loads(TABLE.read_text())
    rows = training_rows(table) + load_rows(table)
    if args.size == "smoke":
        one_step = [row for row in training_rows(table)
                    if row["plan"].get("accumulation", 1) == 1]  # quick: one micro-step
        rows = sorted(one_step, key=lambda row: row["measured_peak_bytes"])[:SMOKE_ROWS]
    results = []
    for number, row in enumerate(rows, 1):
        result = estimate_row(row)
        results.append(result)
        print(f"[{number}/{len(rows)}] {row['source']} {row['plan_label']}: ratio {result['ratio']} "
              f"(reserved {result['reserved_ratio']}) in {result['seconds']} s", flush=True)
    payload = {
        **common.metadata_for("cuda_truth_estimates", device, args.size),
        "truth": "results/cuda_truth.json (torch.cuda.max_memory_allocated and max_memory_reserved on an H100 and "
                 "an H200)",
        "estimated_for": "device='cuda', gpu= the kind that measured each row, on fake CPU tensors with CUDA's "
                         "kernels emulated",
        "allocated": _spread([r["ratio"] for r in results if r["ratio"] is not None]),
        "reserved": _spread([r["reserved_ratio"] for r in results if r["reserved_ratio"] is not None]),
        **({"card_of_loads": _spread([r["card_ratio"] for r in results if r.get("card_ratio") is not None])}
           if any("load" in r for r in results) else {}),
        "rows": results,
        "markdown": markdown(results),
    }
    out = args.out or common.RESULTS_DIR
    common.write_json(payload, Path(out) / f"{common.result_stem('cuda_truth_estimates', device, args.size)}.json")
    return payload


if __name__ == "__main__":
    main()
