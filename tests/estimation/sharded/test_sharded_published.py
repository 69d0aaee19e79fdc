"""The committed comparison of sharded estimates with published multi-GPU runs, and the k-bit upcast arithmetic."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "benchmarks" / "results"


@pytest.fixture()
def bench(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import sharded_vs_published

    return sharded_vs_published


def test_every_run_names_its_source_settings_and_what_its_figure_measures(bench) -> None:  # type: ignore[no-untyped-def]
    runs = bench.RUNS
    assert len(runs) >= 15 and len({run.source.split(" ")[0] for run in runs}) >= 3
    for run in runs:
        assert "commit" in run.source and run.measures in bench.MEASURES and run.settings
        assert (run.plan is None) == (run.cannot is not None), run.name
        assert run.cannot is None or run.cannot.endswith("yet: issue 47 item 1")
    counts = {run.gpus for run in runs if run.bounds and run.model == "Llama 3.1 8B"}
    assert len(counts) >= 2, "one run is published at several GPU counts"
    with pytest.raises(ValueError, match="give a plan or say why"):
        bench.Run("x", "llama-7b", "A100-80GB", 2, "FSDP2", "", 1.0, "commit 0")


def test_the_committed_results_match_the_runs_and_the_docs_table(bench) -> None:  # type: ignore[no-untyped-def]
    data = json.loads((RESULTS / "sharded_vs_published-cpu.json").read_text())
    assert data["device"]["type"] == "cpu"
    rows = data["rows"]
    assert [row["run"] for row in rows] == [run.name for run in bench.RUNS]
    assert data["markdown"] == bench.markdown(rows) and data["summary"] == bench.summary(rows)
    for row in rows:
        assert (row["estimate"] is None) == (row["cannot"] is not None), row["run"]
        if row["estimate"] is not None and row["published"] is not None:
            assert row["ratio"] == pytest.approx(row["estimate"]["gb"] / row["published_per_gpu_gb"], abs=0.002)
        if row["ratio"] is not None:
            assert row["counted_ratio"] == bench.counted_ratio(row), row["run"]
        comparison = row["allocated_comparison"]
        assert (comparison is not None) == (row["published_allocated"] is not None) == (
            row["compared_as"] == "allocated"), row["run"]
        if comparison is not None and row["estimate"] is not None:
            assert comparison["memlab_gb"] == row["estimate"]["allocated_gb"]
            assert comparison["ratio"] == pytest.approx(comparison["memlab_gb"] / comparison["published_gb"], abs=0.002)
    scaling = data["scaling"]
    assert scaling["gpus"] == sorted(scaling["gpus"]) and len(scaling["gpus"]) >= 2
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        import memlab_docs
    finally:
        sys.path.remove(str(ROOT / "docs" / "_ext"))
    page = (ROOT / "docs" / "multi_gpu.md").read_text(encoding="utf-8")
    assert data["markdown"] in memlab_docs.expand_benchmarks(page)


def test_within_15_percent_counts_the_allocated_peak_where_one_is_published(bench) -> None:  # type: ignore[no-untyped-def]
    """Issue 47 asks for allocated peaks: a row whose source publishes the allocated peak beside its headline figure
    is counted on memlab's allocated peak against it; the headline ratio is counted apart."""
    published = [run for run in bench.RUNS if run.published_allocated is not None]
    assert {run.name for run in published} >= {"fsdp_qlora Llama 2 7B LoRA, 2 x 3090, 1x512"}
    row = {"ratio": 0.78, "allocated_comparison": {"published_gb": 8.891, "memlab_gb": 8.535, "ratio": 0.96},
           "verdict_matches": True, "estimate": {}, "source": "a commit", "cannot": None}
    plain = {**row, "ratio": 0.96, "allocated_comparison": None}
    assert bench.counted_ratio(row) == 0.96 and bench.counted_ratio(plain) == 0.96
    counts = bench.summary([row, {**plain, "ratio": 0.7}])
    assert counts["within_15_percent"] == 1 and counts["within_15_percent_as_measured"] == 0
    assert counts["counted_as_allocated"] == 1
    assert "8.28 GiB; allocated" not in bench.markdown([]) and "allocated" in bench.markdown([{
        **row, "run": "r", "gpus": 2, "gpu": "g", "strategy": "s", "batch_per_gpu": "1x512", "published": 10.24,
        "unit": "GiB", "summed_over_gpus": False, "published_allocated": 8.28, "out_of_memory": False,
        "measures": "reserved", "estimate": {"gb": 8.586}, "fits": True}])


def test_prepare_model_for_kbit_training_upcasts_what_the_arithmetic_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real 4-bit load of a saved tiny Llama: peft's preparation turns every bf16 parameter fp32, exactly the
    ``weights_to_fp32`` bytes of ``upcast_bytes``, and leaves the 4-bit weights alone."""
    pytest.importorskip("bitsandbytes")
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig

    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks.kbit_upcast import upcast_bytes

    hidden, vocab, layers = 64, 512, 2
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16)

    def by_dtype(model: torch.nn.Module) -> dict[torch.dtype, int]:
        out: dict[torch.dtype, int] = {}
        for p in model.parameters():
            out[p.dtype] = out.get(p.dtype, 0) + p.numel() * p.element_size()
        return out

    with tempfile.TemporaryDirectory() as path:
        AutoModelForCausalLM.from_config(config).save_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, quantization_config=quant, dtype=torch.bfloat16,
                                                     device_map="cpu")
        before = by_dtype(model)
        after = by_dtype(prepare_model_for_kbit_training(model, use_gradient_checkpointing=False))
    assert before[torch.uint8] == after[torch.uint8] and torch.bfloat16 not in after
    added = sum(after.values()) - sum(before.values())
    assert added == before[torch.bfloat16] == upcast_bytes(hidden, vocab, layers, 1, 1)["weights_to_fp32"]
