"""CUDA estimates made on this CPU, each for the GPU kind that measured its row, against the H100's and the H200's
measured peaks (``benchmarks/results/cuda_truth.json``, built by ``python -m benchmarks.cuda_truth`` from the
committed GPU runs): each within 5%. Rows whose run also recorded
``max_memory_reserved`` without a budget hold the estimate's ``reserved_bytes`` (the caching allocator replayed,
:mod:`memlab.estimation.dryrun.reserved`) to the same 5%.

Rows of more than :data:`FAST_PEAK` measured bytes, or outside the quick sections, take too long to estimate on a
laptop's CPU for the default run: they run with ``MEMLAB_SLOW_TRUTH=1``. Offload plans are not rows of the test yet
(issue 60 made them estimable without CUDA: 0.943 to 1.027 on this CPU).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import pytest
import transformers
from transformers import AutoConfig

import memlab
from benchmarks.cuda_truth_estimates import gpu_of
from benchmarks.recorded_transformers import recorded_transformers
from memlab import Plan

TABLE = Path(__file__).parents[3] / "benchmarks" / "results" / "cuda_truth.json"
ROWS = [row for row in json.loads(TABLE.read_text())["rows"] if "offload" not in row["plan"]]
FAST_SECTIONS = ("probe", "estimate", "heldout")
FAST_PEAK = 9 * 10**9
TOLERANCE = 0.05


# Rows not yet within 5% (estimate / measured on this CPU, torch 2.13), keyed (section, model_type, plan label), with
# the batch's shape where rows differ only by it, or with the row's whole source (its results file and section) where
# only one run's row is off. They run, and are expected to fail, until fixed: the tolerance is not loosened for them.
KNOWN_OFF: dict[tuple[str, ...], float] = {
    # Not a miss of the model but what each side counts: bitsandbytes keeps paged 8-bit AdamW's state in CUDA
    # managed memory, outside PyTorch's allocator, so the GPU's max_memory_allocated leaves its 2.3 GiB out, where the
    # estimate counts it on the device until the GPU runs short (techniques/optimizer.py's PAGED_ESTIMATED).
    ("cumulative", "llama", "ckpt bf16 paged_adamw8bit"): 1.184,
    ("gpu_acceptance-cuda-nvidia-h100-80gb-hbm3-compile-levers:levers", "llama", "paged_adamw8bit"): 1.127,
    # Not a miss of the estimate but of the row: the H200 run (2026-11-26T01:55) read memlab.measure's step before
    # 8e127da (issue 57 item 5), whose tracker's dispatch mode made the engine sum the tied weight's two fp32
    # gradients (the head's, autocast's cast backward, and the embedding's) out of place: three fp32 copies of the
    # 256,000 x 2304 embedding at its backward (7,077,888,008 B of activations at the row's peak, as its fp32 row),
    # where a user's loop sums in place and holds two. Estimated with that out-of-place sum the row is 0.9993, its
    # breakdown the measured one to the byte; on a tiny tied Gemma-2 the estimate equals a user's loop (test_step).
    # The same run shows it on the tied 1B Llama (ckpt bf16, 2 x 1024): its row, memlab's old step, 21,944,758,272 B
    # (0.953 now); a hand-made step's max_memory_allocated (the timeline section) 20,907,682,816 B; the estimate
    # 20,907,623,252 B. A re-measure on an H200 replaces the row.
    ("heldout", "gemma2", "bf16", "2x512"): 0.917,
}
# Reserved peaks not yet within 5% (estimated / measured reserved on this CPU, torch 2.13).
KNOWN_OFF_RESERVED = {("cumulative", "llama", "ckpt bf16 paged_adamw8bit"): 1.271,  # its state, as above
                      ("gpu_acceptance-cuda-nvidia-h100-80gb-hbm3-compile-levers:levers", "llama", "paged_adamw8bit"):
                          1.105,
                      # The H100 run of 2026-11-22 (its adapters rows): LoRA's and QLoRA's checkpointed bf16 steps of
                      # the 1B Llama at 2 x 2048 reserved 1.31 and 1.68 times their allocated peaks; the same steps
                      # in the H100 run of 2026-11-27 reserved 1.13 and 1.20 times theirs, and the replay is within
                      # 1.4% of those. The earlier run's reserve is the outlier; what it held is not traced.
                      ("gpu_acceptance-cuda-nvidia-h100-80gb-hbm3-adapters:cumulative", "llama", "ckpt bf16 lora"):
                          0.860,
                      ("gpu_acceptance-cuda-nvidia-h100-80gb-hbm3-adapters:cumulative", "llama", "ckpt bf16 qlora"):
                          0.707,
                      # The H200 run's rows (torch 2.11), read as the step's own reserve (benchmarks/cuda_truth.py
                      # _step_card). Gemma-2's pure bf16 at 2 x 512 (a slow row): the replay reserves 1.148 times
                      # the step's 13.80 GB, close to the whole call's 16.16 GB that the old reading hid it behind;
                      # the cast of its 256k-token fp32 embedding is the suspect, not yet traced.
                      ("heldout", "gemma2", "bf16-weights", "2x512"): 1.148,
                      # Gemma-2's bf16 at 2 x 512: the reserve of memlab's step before 8e127da, its tied weight's
                      # gradients summed out of place (KNOWN_OFF's row).
                      ("heldout", "gemma2", "bf16", "2x512"): 0.918}
# Rows off only where the installed transformers is not the one the row ran: with it installed they are within 5%, and
# expected to pass. (Mixtral's bf16 reserve was one, 1.056 with transformers 5.24: its expert routing's index
# backward held its zeros and their filled copy at once on fake tensors; filled in place as a GPU fills them, 1.043.)
OFF_BY_TRANSFORMERS: set[tuple[str, ...]] = set()


def _known_off(row: dict[str, Any], table: dict[tuple[str, ...], float] = KNOWN_OFF) -> float | None:
    """A row's ratio in ``table``, keyed with its batch's shape (``"2x512"``) where rows differ only by that."""
    key = (row["source"].rsplit(":", 1)[-1], row["config"]["model_type"], row["plan_label"])
    if key in OFF_BY_TRANSFORMERS and row.get("transformers") == transformers.__version__:
        return None
    whole_source = (row["source"], *key[1:])
    return table.get(whole_source, table.get((*key, _shape(row)), table.get(key)))


def _row_id(row: dict[str, Any]) -> str:
    return f"{row['source'].rsplit(':', 1)[-1]}-{row['config']['model_type']}-{_shape(row)}-{row['plan_label']}"


def _shape(row: dict[str, Any]) -> str:
    return "x".join(str(size) for size in next(iter(row["batch"].values())))


def _marks(row: dict[str, Any], slow: bool, table: dict[tuple[str, ...], float] = KNOWN_OFF) -> tuple[Any, ...]:
    if not (slow or _quick(row)):
        return (pytest.mark.skip(reason="slow on CPU: MEMLAB_SLOW_TRUTH=1"),)
    off = _known_off(row, table)
    if off is not None:
        return (pytest.mark.xfail(reason=f"not yet within 5% (ratio {off})", strict=True),)
    return ()


def _quick(row: dict[str, Any]) -> bool:
    return row["source"].rsplit(":", 1)[-1] in FAST_SECTIONS and row["measured_peak_bytes"] <= FAST_PEAK


def _params(reserved: bool = False) -> list[Any]:
    slow = os.environ.get("MEMLAB_SLOW_TRUTH") == "1"
    table = KNOWN_OFF_RESERVED if reserved else KNOWN_OFF
    return [
        pytest.param(row, marks=_marks(row, slow, table), id=_row_id(row))
        for row in ROWS
        if not reserved or "measured_reserved_bytes" in row
    ]


def _config(row: dict[str, Any]) -> Any:
    fields = dict(row["config"])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    config.architectures = [row["architecture"]]
    return config


def test_the_table_holds_the_must_show_row() -> None:
    gpt2 = [row for row in ROWS if row["config"]["model_type"] == "gpt2" and row["plan_label"] == "plain"]
    assert gpt2 and gpt2[0]["batch"]["input_ids"] == [4, 1024] and gpt2[0]["gpu"].startswith("NVIDIA H100")


@functools.cache  # both tests of a row read one estimate (the allocated, then the reserved)
def _estimate(key: str) -> Any:
    """The row's estimate, made once for both tests of a row."""
    row = json.loads(key)
    batch = {name: tuple(shape) for name, shape in row["batch"].items()}
    with recorded_transformers(row.get("transformers")):  # the code measured, where it kept other memory
        return memlab.estimate(_config(row), batch, Plan(**row["plan"]), device="cuda", **gpu_of(row))


def _estimate_of(row: dict[str, Any]) -> Any:
    fields = ("config", "architecture", "batch", "plan", "transformers", "gpu")
    return _estimate(json.dumps({k: row.get(k) for k in fields}, sort_keys=True))


@pytest.mark.parametrize("row", _params())
def test_a_cpu_made_cuda_estimate_is_within_5_percent_of_the_h100(row: dict[str, Any]) -> None:
    trial = _estimate_of(row)
    assert trial.status == "ok", trial.error
    ratio = trial.peak_bytes / row["measured_peak_bytes"]
    assert abs(ratio - 1) <= TOLERANCE, f"estimate / measured = {ratio:.3f}"
    assert any(f"CUDA attention emulated for {row['gpu']}" in note for note in trial.notes)


@pytest.mark.parametrize("row", _params(reserved=True))
def test_a_cpu_made_cuda_estimate_reserves_within_5_percent_of_the_h100(row: dict[str, Any]) -> None:
    trial = _estimate_of(row)
    assert trial.status == "ok", trial.error
    assert trial.reserved_bytes is not None and trial.reserved_bytes >= trial.peak_bytes
    ratio = trial.reserved_bytes / row["measured_reserved_bytes"]
    assert abs(ratio - 1) <= TOLERANCE, f"estimated / measured reserved = {ratio:.3f}"
