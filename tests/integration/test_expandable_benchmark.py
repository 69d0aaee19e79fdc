"""benchmarks/expandable_segments.py on its two smallest rows: both estimates of each row, the same allocated peak,
and the figures it writes computed from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_the_benchmark_estimates_each_row_both_ways(tmp_path: Path) -> None:
    from benchmarks import expandable_segments as runner

    result = runner.main(["--smoke", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "expandable_segments-cpu-smoke.json").read_text())
    assert data["markdown"] == result["markdown"] and data["rows_done"] == "2 of 2"
    for row in data["rows"]:
        assert row["status"] == "ok" and row["same_allocated_peak"]
        saved = row["estimate_reserved_bytes"] - row["expandable_reserved_bytes"]
        assert row["saved_mib"] == round(saved / 2**20, 1)
        assert row["expandable_reserved_bytes"] >= row["estimate_peak_bytes"]
    with pytest.raises(SystemExit):
        runner.main(["--device", "cuda", "--out", str(tmp_path)])
