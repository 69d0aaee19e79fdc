"""The table of truth for CUDA estimates made without CUDA: every peak the H100 runs measured, with what was run.

Reads ``results/gpu_acceptance-cuda-*.json`` and ``results/hf_table-cuda-*.json`` and writes
``results/cuda_truth.json``: per row, the model's config (as ``model_type`` plus keyword arguments), its class,
the batch's shapes, the plan's fields, the GPU, the versions, and ``measured_peak_bytes``
(``torch.cuda.max_memory_allocated`` of memlab's tracked step), with, where the run recorded them,
``measured_reserved_bytes`` (the allocator's reserved peak) and ``measured_context_bytes`` (the CUDA context: what
the driver used beyond the allocator). ``tests/estimation/cuda/test_cuda_truth.py`` estimates every training row on the
CPU for ``device="cuda"``. Inference rows (``InferencePlan`` fields) are kept apart, under ``inference_rows``, and
so are the rows of a checkpoint loaded as users load it (the ``loads`` section: bf16 or 4-bit ``from_pretrained``,
its keywords under ``load``), under ``load_rows``. The held-out families' rows (the ``heldout`` section) are
training rows like the ``estimate`` section's.

    python -m benchmarks.cuda_truth
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"

_LLAMA_SECTIONS = ("probe", "levers", "fit", "cumulative", "reserve")
_RESERVED_SECTIONS = ("probe", "levers", "cumulative", "reserve")
_ESTIMATE_SECTIONS = ("estimate", "heldout")  # rows that name their config, batch and plan
_ESTIMATE_CONFIGS = {  # the first run's estimate rows did not record their configs
    "gpt2": ({"model_type": "gpt2"}, "GPT2LMHeadModel"),
    "bert": ({"model_type": "bert", "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
              "intermediate_size": 4096}, "BertForMaskedLM"),
}


def plan_fields(label: str) -> dict[str, Any]:
    """The non-default Plan fields of a plan's label (``Plan.label``'s inverse for the labels the runs used; rows of
    later runs record their fields and need no parsing)."""
    fields: dict[str, Any] = {}
    for token in label.split():
        if token == "plain":
            continue
        if token.startswith("mb"):
            micro, accumulation = token[2:].split("x")
            fields.update(micro_batch=int(micro), accumulation=int(accumulation))
        elif token == "ckpt":
            fields["checkpointing"] = True
        elif token in ("bf16", "fp16"):
            fields["precision"] = token
        elif token == "bf16-weights":
            fields["weights"] = "bf16"
        elif token in ("adamw8bit", "paged_adamw8bit", "adafactor", "adamw_foreach"):
            fields["optimizer"] = token
        elif token.startswith("offload-"):
            fields["offload"] = token.removeprefix("offload-")
        elif token in ("lora", "qlora"):
            fields["adapter"] = token
        elif token == "attention":
            fields["lora_targets"] = token
        elif token.startswith("r") and token[1:].isdigit():
            fields["lora_rank"] = int(token[1:])
        elif token == "chunked-loss":
            fields["loss"] = "chunked"
        elif token == "opt-in-bwd":
            fields["optimizer_in_backward"] = True
        else:
            raise ValueError(f"unknown plan label token {token!r} in {label!r}")
    return fields


def _fields(trial: dict[str, Any]) -> dict[str, Any]:
    return trial["plan_fields"] if "plan_fields" in trial else plan_fields(trial["plan"])


def _card(reserved: int | None, context: int | None, source: str = "") -> dict[str, Any]:
    """The card figures a row carries: only those the run measured (and where the reserve was read)."""
    card: dict[str, Any] = {}
    if reserved:
        card["measured_reserved_bytes"] = reserved
        if source:
            card["reserved_source"] = source
    if context:
        card["measured_context_bytes"] = context
    return card


def _llama(model: dict[str, Any]) -> dict[str, Any]:
    return {
        "model_type": "llama", "hidden_size": model["hidden"], "intermediate_size": model["intermediate"],
        "num_hidden_layers": model["layers"], "num_attention_heads": model["heads"],
        "num_key_value_heads": model["kv_heads"], "vocab_size": model["vocab"],
        "max_position_embeddings": max(2048, model["length"]), "tie_word_embeddings": model["tie"],
    }


def _lm_batch(rows: int, length: int) -> dict[str, list[int]]:
    return {"input_ids": [rows, length], "attention_mask": [rows, length], "labels": [rows, length]}


def _acceptance_rows(data: dict[str, Any], source: str) -> list[dict[str, Any]]:
    rows = []
    parts = data["parts"]
    for section in _LLAMA_SECTIONS:
        part = parts.get(section)
        if not part or "model" not in part:
            continue
        model = part["model"]
        trials = part.get("rows") or part.get("trials") or []
        for trial in trials:
            if trial.get("status") != "ok":
                continue
            rows.append({
                "source": f"{source}:{section}", "config": _llama(model), "architecture": "LlamaForCausalLM",
                "batch": _lm_batch(model["rows"], model["length"]), "plan": _fields(trial),
                "plan_label": trial["plan"], "measured_peak_bytes": trial["peak_bytes"],
                # The fit section's trials ran under a budget's cap, which makes the allocator give cached segments
                # back at the cap: their reserve is not an uncapped step's and is left out.
                **_card(trial.get("reserved_bytes") if section in _RESERVED_SECTIONS else None,
                        trial.get("context_bytes"),
                        f"results/{source}.json parts.{section}: the trial's reserved_bytes (max_memory_reserved), "
                        "no budget"),
            })
    estimated = [(section, trial) for section in _ESTIMATE_SECTIONS
                 for trial in (parts.get(section) or {}).get("rows", [])]
    for section, trial in estimated:
        if trial["measured_status"] != "ok":
            continue
        if "batch_shapes" in trial:  # rows of later runs say what was run
            config, architecture = trial["config"], trial["architecture"]
            batch = {name: list(shape) for name, shape in trial["batch_shapes"].items()}
        else:
            config, architecture = _ESTIMATE_CONFIGS.get(trial["model"]) or (
                _llama({**parts["cumulative"]["model"], "length": 2048}), "LlamaForCausalLM")
            batch = _lm_batch(trial["rows"], trial["length"])
        rows.append({
            "source": f"{source}:{section}", "config": config, "architecture": architecture, "batch": batch,
            "plan": _fields(trial), "plan_label": trial["plan"], "measured_peak_bytes": trial["measured_bytes"],
            **_card(*_step_card(trial)),
        })
    return rows


def _step_card(trial: dict[str, Any]) -> tuple[int | None, int | None, str]:
    """An estimate or held-out row's measured reserve and context: the trial's own, the step's
    ``max_memory_reserved`` as the other sections read it, where the run recorded it.

    The section's ``reserved_peak_bytes`` spans the whole ``measure`` call, which until issue 57 included memlab's
    undo of a pure bf16 cast: the weights cast back to fp32 beside the optimizer state, in new segments (Phi-3 and
    Mistral 2 x 512 read 1.24 and 1.18 times their steps' reserve). memlab drops the step's state before it undoes a
    plan now, so the card a user sees over the call is the step's; the older runs' whole-call reading is kept only
    where a row has no trial figure.

    Example:
        >>> _step_card({"reserved_peak_bytes": 9, "context_bytes": 2, "trial": {"reserved_bytes": 7}})[:2]
        (7, 2)
    """
    step = (trial.get("trial") or {}).get("reserved_bytes")
    if step:
        return step, trial.get("context_bytes"), "the trial's reserved_bytes (max_memory_reserved of its steps)"
    return trial.get("reserved_peak_bytes"), trial.get("context_bytes"), ""


def _inference_rows(data: dict[str, Any], source: str) -> list[dict[str, Any]]:
    """The inference section's rows: a bf16 Llama generating ``new_tokens`` after a prompt, weights as named."""
    part = data["parts"].get("inference")
    if not part or "rows" not in part:
        return []
    model = part["model"]
    return [
        {"source": f"{source}:inference", "config": _llama(model), "architecture": "LlamaForCausalLM",
         "model_dtype": model.get("dtype", "bf16"),
         "batch": {name: [row["rows"], row["prompt_tokens"]] for name in ("input_ids", "attention_mask")},
         "inference_plan": {"weights": "bf16", "quantize": "none" if row["weights"] == "bf16" else row["weights"],
                            "new_tokens": part["new_tokens"]},
         "plan_label": row["plan"], "measured_peak_bytes": row["peak_bytes"],
         "measured_kv_cache_bytes": row["kv_cache_end_bytes"],
         **_card(row.get("reserved_bytes"), row.get("context_bytes"))}
        for row in part["rows"] if row["status"] == "ok"
    ]


def _load_rows(data: dict[str, Any], source: str) -> list[dict[str, Any]]:
    """The loads section's rows: a bf16 checkpoint loaded with ``from_pretrained`` as ``load`` says (the keywords, as
    JSON), then trained (``plan``: memlab's Plan fields; ``estimate(config, batch, Plan(**plan), load=load)``) or run
    for inference (``inference_plan``: the InferencePlan that estimates the same load)."""
    part = data["parts"].get("loads")
    if not part or "rows" not in part:
        return []
    model = part["model"]
    rows = []
    for row in part["rows"]:
        if row.get("status") != "ok" or not row.get("estimate_plan_fields"):
            continue
        workload = {"plan": row["plan_fields"]} if row["workload"] == "train" else {
            "inference_plan": row["estimate_plan_fields"]}
        rows.append({
            "source": f"{source}:loads", "config": _llama(model), "architecture": "LlamaForCausalLM",
            "load": row["from_pretrained"], "workload": row["workload"],
            "batch": {name: list(shape) for name, shape in row["batch_shapes"].items()}, **workload,
            "plan_label": f"{row['load']} load, {row['estimate_plan']}", "measured_peak_bytes": row["peak_bytes"],
            "measured_load_peak_bytes": row.get("load_peak_bytes"),
            **_card(row.get("reserved_peak_bytes"), row.get("context_bytes")),
        })
    return rows


def _hf_rows(data: dict[str, Any], source: str) -> list[dict[str, Any]]:
    model = data["model"]
    config = {"model_type": "bert", "hidden_size": model["hidden"], "num_hidden_layers": model["layers"],
              "num_attention_heads": model["heads"], "intermediate_size": model["intermediate"],
              "vocab_size": model["vocab"], "num_labels": 2}
    rows_, length = data["batch"]["rows_per_step"], model["length"]
    batch = {"input_ids": [rows_, length], "attention_mask": [rows_, length], "labels": [rows_]}
    return [
        {"source": f"{source}:{row['row']}", "config": config, "architecture": model["class"], "batch": batch,
         "plan": plan_fields(row["plan"]), "plan_label": row["plan"],
         "measured_peak_bytes": row["memlab"]["peak_bytes"],
         **_card(row["memlab"].get("reserved_bytes"), row["memlab"].get("context_bytes"))}
        for row in data["rows"]
        if row["plan"] and row["memlab"]["status"] == "ok"
    ]


def build() -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    inference: list[dict[str, Any]] = []
    loads: list[dict[str, Any]] = []
    for path in sorted(RESULTS.glob("gpu_acceptance-cuda-*.json")) + sorted(RESULTS.glob("hf_table-cuda-*.json")):
        data = json.loads(path.read_text())
        read = _hf_rows if data["benchmark"] == "hf_table" else _acceptance_rows
        device = {"gpu": data["device"]["gpu"], "capability": data["device"]["gpu_capability"],
                  "torch": data["versions"]["torch"], "transformers": data["versions"]["transformers"]}
        rows += [{**row, **device} for row in _optimizer_as_run(read(data, path.stem), data["date"])]
        if data["benchmark"] != "hf_table":
            inference += [{**row, **device} for row in _inference_rows(data, path.stem)]
            loads += [{**row, **device} for row in _load_rows(data, path.stem)]
    table = {"about": __doc__.split("\n\n")[0], "rows": _unique(rows), "inference_rows": _unique(inference)}
    if loads:  # the runs since issue 40's
        table["load_rows"] = _unique(loads)
    return table


# memlab's "adamw" became torch's fused AdamW in commit d80b15f (2026-11-23T04:19:03Z). Before that, build_optimizer
# made ``torch.optim.AdamW(parameters, foreach=True)`` on CUDA, whose step holds a temporary as large as the weights
# (``torch._foreach_sqrt`` of the second moments): what the runs of 2026-11-22 measured. Their rows are estimated
# with the optimizer that ran, ``adamw_foreach``, not with today's default.
_FUSED_ADAMW_SINCE = datetime.datetime(2026, 11, 23, 4, 19, 3, tzinfo=datetime.timezone.utc)
_FOREACH_NOTE = ("the run's memlab (before commit d80b15f) built torch's foreach AdamW on CUDA for the default "
                 "optimizer; the row names the optimizer that ran")


def _optimizer_as_run(rows: list[dict[str, Any]], date: str) -> list[dict[str, Any]]:
    """``rows`` with the default AdamW named as the kernel their run (started at ``date``, ISO 8601 with its UTC
    offset) used: see ``_FUSED_ADAMW_SINCE``."""
    if datetime.datetime.fromisoformat(date) >= _FUSED_ADAMW_SINCE:
        return rows
    ran = []
    for row in rows:
        plan = row["plan"]
        # An offloaded optimizer stepped on the CPU, where torch picked its own kernel: left as recorded.
        if plan.get("optimizer", "adamw") == "adamw" and plan.get("offload") not in ("optimizer", "all"):
            row = {**row, "plan": {**plan, "optimizer": "adamw_foreach"}, "optimizer_note": _FOREACH_NOTE}
        ran.append(row)
    return ran


def _unique(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per distinct measurement (the same row in two results counts once)."""
    return list({json.dumps({k: v for k, v in row.items() if k not in ("source", "reserved_source")},
                            sort_keys=True): row
                 for row in rows}.values())


if __name__ == "__main__":
    table = build()
    (RESULTS / "cuda_truth.json").write_text(json.dumps(table, indent=1) + "\n")
    print(f"{len(table['rows'])} rows, {len(table['inference_rows'])} inference rows, "
          f"{len(table.get('load_rows', []))} load rows")
