"""CUDA estimates made on this CPU against the H100's measured peaks (``benchmarks/results/cuda_truth.json``, built
by ``python -m benchmarks.cuda_truth`` from the committed GPU runs): each within 5%.

Rows of more than :data:`FAST_PEAK` measured bytes, or outside the quick sections, take too long to estimate on a
laptop's CPU for the default run: they run with ``MEMLAB_SLOW_TRUTH=1``. Offload plans cannot be estimated without
CUDA (the trial says so) and are not rows of the test.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoConfig

import memlab
from memlab import Plan

TABLE = Path(__file__).parents[2] / "benchmarks" / "results" / "cuda_truth.json"
ROWS = [row for row in json.loads(TABLE.read_text())["rows"] if "offload" not in row["plan"]]
FAST_SECTIONS = ("probe", "estimate")
FAST_PEAK = 9 * 10**9
TOLERANCE = 0.05


def _quick(row: dict[str, Any]) -> bool:
    return row["source"].rsplit(":", 1)[-1] in FAST_SECTIONS and row["measured_peak_bytes"] <= FAST_PEAK


def _params() -> list[Any]:
    slow = os.environ.get("MEMLAB_SLOW_TRUTH") == "1"
    return [
        pytest.param(row, id=f"{row['source'].rsplit(':', 1)[-1]}-{row['config']['model_type']}-{row['plan_label']}",
                     marks=() if slow or _quick(row) else pytest.mark.skip(reason="slow on CPU: MEMLAB_SLOW_TRUTH=1"))
        for row in ROWS
    ]


def _config(row: dict[str, Any]) -> Any:
    fields = dict(row["config"])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    config.architectures = [row["architecture"]]
    return config


def test_the_table_holds_the_must_show_row() -> None:
    gpt2 = [row for row in ROWS if row["config"]["model_type"] == "gpt2" and row["plan_label"] == "plain"]
    assert gpt2 and gpt2[0]["batch"]["input_ids"] == [4, 1024] and gpt2[0]["gpu"].startswith("NVIDIA H100")


@pytest.mark.parametrize("row", _params())
def test_a_cpu_made_cuda_estimate_is_within_5_percent_of_the_h100(row: dict[str, Any]) -> None:
    batch = {name: tuple(shape) for name, shape in row["batch"].items()}
    trial = memlab.estimate(_config(row), batch, Plan(**row["plan"]), device="cuda")
    assert trial.status == "ok", trial.error
    ratio = trial.peak_bytes / row["measured_peak_bytes"]
    assert abs(ratio - 1) <= TOLERANCE, f"estimate / measured = {ratio:.3f}"
    assert any("CUDA attention emulated for NVIDIA H100" in note for note in trial.notes)
