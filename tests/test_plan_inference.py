"""Inference mode, pure logic: the plan's checks and labels, --try grids, the KV-cache formula, bitsandbytes' byte
layout, the largest-batch search, and inference trials in reports (without disturbing training reports)."""

from __future__ import annotations

import pytest
import torch

import memlab
from memlab.errors import MemlabError
from memlab.inference.fit import LargestBatchReport, search_largest_batch
from memlab.inference.kv import kv_cache_bytes, kv_shape
from memlab.inference.weights import quantized_bytes
from memlab.plan import InferencePlan, parse_inference_axes, parse_inference_grid
from memlab.report import CATEGORIES, INFERENCE_CATEGORIES, InferenceTrial, Report, Trial


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"weights": "int8"}, "weights='int8' is not known; write one of fp32, bf16, fp16"),
        ({"quantize": "int4"}, "write one of none, int8, nf4"),
        ({"batch_size": 0}, "batch_size=0 is not allowed; write a whole number >= 1"),
        ({"batch_size": True}, "batch_size=True is not allowed"),
        ({"new_tokens": -1}, "new_tokens=-1 is not allowed; write a whole number >= 0"),
        ({"kv_cache": "on"}, "kv_cache='on' is not allowed; write True or False"),
        ({"precision": "bf16"}, "'precision' is not an inference setting; write one of batch_size, weights"),
    ],
)
def test_bad_settings_say_what_to_write(settings: dict[str, object], says: str) -> None:
    with pytest.raises(MemlabError, match=says.replace("(", r"\(").replace(")", r"\)")):
        InferencePlan(**settings)  # type: ignore[arg-type]


def test_labels_show_the_weights_and_what_differs() -> None:
    assert InferencePlan().label() == "fp32"
    assert InferencePlan(weights="bf16", batch_size=8).label() == "bf16 bs8"
    assert InferencePlan(quantize="nf4", weights="bf16", new_tokens=32).label() == "nf4 bf16 gen32"
    assert InferencePlan(quantize="int8", new_tokens=4, kv_cache=False).label() == "int8 gen4 no-kv"
    assert InferencePlan(batch_size=4).rows(2) == 4 and InferencePlan().rows(3) == 3
    assert "16 new tokens with KV cache" in InferencePlan(new_tokens=16).describe()


def test_grids_parse_every_lever() -> None:
    axes = parse_inference_axes("weights=fp32,bf16 quantize=none,nf4 batch_size=all,8 new_tokens=0,16 kv_cache=on,off")
    assert axes == {
        "weights": ["fp32", "bf16"], "quantize": ["none", "nf4"], "batch_size": [None, 8], "new_tokens": [0, 16],
        "kv_cache": [True, False],
    }
    plans = parse_inference_grid(["weights=fp32,bf16"], InferencePlan(new_tokens=4))
    assert [p.label() for p in plans] == ["fp32 gen4", "bf16 gen4"]
    assert parse_inference_grid([]) == [InferencePlan()]
    for bad, says in (
        (["weights"], "is not KEY=V1,V2"),
        (["kv_cache=maybe"], "write on or off"),
        (["new_tokens=many"], "is not a whole number"),
        (["weights=fp32", "weights=bf16"], "is given twice"),
    ):
        with pytest.raises(MemlabError, match=says):
            parse_inference_grid(bad)


def test_kv_cache_formula_counts_kv_heads_not_attention_heads() -> None:
    from transformers import GPT2Config, LlamaConfig

    gqa = LlamaConfig(hidden_size=256, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2)
    assert kv_shape(gqa) == (3, 2, 32)
    assert kv_cache_bytes(gqa, tokens=100, batch=4, dtype="bf16") == 2 * 3 * 2 * 32 * 100 * 4 * 2
    assert kv_cache_bytes(gqa, tokens=100, batch=4, dtype=torch.float32) == 2 * 3 * 2 * 32 * 100 * 4 * 4
    assert kv_cache_bytes(GPT2Config(n_layer=2, n_embd=64, n_head=4), tokens=10, dtype=1) == 2 * 2 * 4 * 16 * 10
    assert memlab.kv_cache_bytes is kv_cache_bytes
    with pytest.raises(MemlabError, match="write 'fp32', 'bf16', 'fp16'"):
        kv_cache_bytes(gqa, tokens=1, dtype="int4")
    with pytest.raises(MemlabError, match="tokens=-1 is not allowed"):
        kv_cache_bytes(gqa, tokens=-1)
    with pytest.raises(MemlabError, match="pass the config of a transformers decoder"):
        kv_cache_bytes(object(), tokens=1)


def test_quantized_bytes_follow_bitsandbytes_layout() -> None:
    numel = 4096 * 4096
    assert quantized_bytes(numel, 4096, "int8") == numel + 4 * 4096
    nf4 = quantized_bytes(numel, 4096, "nf4")
    assert numel // 2 < nf4 < numel // 2 + numel // 50  # half a byte, and about 1/64 byte of scales
    with pytest.raises(MemlabError, match="write one of none, int8, nf4"):
        quantized_bytes(numel, 4096, "int4")


def test_largest_batch_search_measures_few_sizes() -> None:
    def run(peak_of, budget: int, max_batch: int = 4096) -> tuple[int, list[int]]:
        tried: list[int] = []

        def fits(rows: int) -> bool:
            tried.append(rows)
            return peak_of(rows) <= budget

        def points() -> list[tuple[int, int]]:
            return sorted((r, peak_of(r)) for r in tried if peak_of(r) <= budget)

        return search_largest_batch(fits, points, budget, max_batch), tried

    assert run(lambda r: 100 + 10 * r, 1000) == (90, [1, 2, 90, 91])
    assert run(lambda r: 100 + 10 * r, 50)[0] == 0  # not even one row
    assert run(lambda r: 100 + 10 * r, 10**9, max_batch=64) == (64, [1, 2, 64])
    # Memory that grows faster than the line through the first two sizes: the predictions fail, bisection finds it.
    largest, tried = run(lambda r: 100 + r * r, 10_000)
    assert largest == 99 and len(tried) <= 16
    # A line through sizes 1 and 2 a little off (a size-1 peak 4 bytes high) overshoots by a few rows at size 200:
    # a step back and a second prediction find the answer, where bisecting from size 2 measured eleven sizes.
    largest, tried = run(lambda r: 1000 + 100 * r + (4 if r == 1 else 0), 23_000)
    assert largest == 220 and tried == [1, 2, 229, 201, 220, 221]


def test_inference_trials_have_their_own_categories_and_round_trip() -> None:
    trial = InferenceTrial(InferencePlan(weights="bf16", new_tokens=8), "ok", 1000, {"params": 400, "kv_cache": 100},
                           0.5, 8.0, 128.0, "cpu", rows_per_step=4, prefill_tokens_per_s=900.0,
                           decode_tokens_per_s=40.0, kv_cache_end_bytes=100, context_tokens=23)
    assert trial.categories == INFERENCE_CATEGORIES
    assert trial.breakdown == {"params": 400, "activations": 0, "kv_cache": 100, "other": 500}
    assert Trial.from_dict(trial.to_dict()) == trial
    report = Report([trial], budget=2000)
    assert Report.from_json(report.to_json()) == report
    assert report.categories == INFERENCE_CATEGORIES
    text = report.to_text()
    assert "kv_cache" in text and "grads" not in text and "decode tokens/s" in text
    frame = report.to_dataframe()
    assert {"kv_cache_bytes", "kv_cache_end_bytes", "prefill_tokens_per_s", "new_tokens"} <= set(frame.columns)
    assert "grads_bytes" not in frame.columns
    with pytest.raises(ValueError, match="unknown categories"):
        InferenceTrial(InferencePlan(), "ok", 10, {"grads": 1}, None, None, None, "cpu")
    figure = report.plot()
    assert [trace.name for trace in figure.data][:4] == list(INFERENCE_CATEGORIES)


def test_training_reports_are_unchanged() -> None:
    trial = Trial(memlab.Plan(), "ok", 100, {"params": 100}, 0.5, 8.0, None, "cpu")
    report = Report([trial])
    assert report.categories == CATEGORIES
    assert set(trial.breakdown) == set(CATEGORIES)
    assert "kv_cache" not in report.to_text() and "kv_cache_bytes" not in report.to_dataframe().columns
    # five categories, "out of memory", "over budget", "error", "samples/s" and the "marks" text trace
    traces = report.plot().data
    assert len(traces) == 10
    assert (traces[-1].name, traces[-1].type, traces[-1].mode) == ("marks", "scatter", "text")
    with pytest.raises(ValueError, match="unknown categories"):
        Trial(memlab.Plan(), "ok", 100, {"kv_cache": 1}, None, None, None, "cpu")


def test_largest_batch_report_names_the_largest_that_fits() -> None:
    def trial(rows: int, peak: int, speed: float) -> InferenceTrial:
        return InferenceTrial(InferencePlan(batch_size=rows), "ok", peak, {}, rows / speed, speed, None, "cpu",
                              rows_per_step=rows)

    report = LargestBatchReport([trial(1, 10, 50.0), trial(16, 90, 40.0), trial(17, 120, 45.0)], budget=100)
    assert report.best is not None and report.best.label == "fp32 bs16" and report.ties == []
