"""The table of truth for CUDA estimates made without CUDA: every peak the H100 runs measured, with what was run.

Reads ``results/gpu_acceptance-cuda-*.json`` and ``results/hf_table-cuda-*.json`` and writes
``results/cuda_truth.json``: per row, the model's config (as ``model_type`` plus keyword arguments), its class,
the batch's shapes, the plan's fields, the GPU, the versions, and ``measured_peak_bytes``
(``torch.cuda.max_memory_allocated`` of memlab's tracked step). Rows of the sections that ran without a budget
(:data:`_RESERVED_SECTIONS`) also carry ``measured_reserved_bytes`` (``torch.cuda.max_memory_reserved`` of the same
step, as the run recorded it) and ``reserved_source`` (where it was read). The ``fit`` section's trials ran under
a budget's cap, which makes the allocator give cached segments back when it reaches the cap, so their reserved
figure is not an uncapped step's and is left out. ``tests/integration/test_cuda_truth.py`` estimates every row on
the CPU for ``device="cuda"``.

    python -m benchmarks.cuda_truth
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"

_LLAMA_SECTIONS = ("probe", "levers", "fit", "cumulative")
_RESERVED_SECTIONS = ("probe", "levers", "cumulative")


def plan_fields(label: str) -> dict[str, Any]:
    """The non-default Plan fields of a plan's label (``Plan.label``'s inverse for the labels the runs used)."""
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
        elif token in ("adamw8bit", "paged_adamw8bit", "adafactor"):
            fields["optimizer"] = token
        elif token.startswith("offload-"):
            fields["offload"] = token.removeprefix("offload-")
        elif token in ("lora", "qlora"):
            fields["adapter"] = token
        else:
            raise ValueError(f"unknown plan label token {token!r} in {label!r}")
    return fields


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
        if not part:
            continue
        model = part["model"]
        trials = part.get("rows") or part.get("trials") or []
        for trial in trials:
            if trial.get("status") != "ok":
                continue
            row = {
                "source": f"{source}:{section}", "config": _llama(model), "architecture": "LlamaForCausalLM",
                "batch": _lm_batch(model["rows"], model["length"]), "plan": plan_fields(trial["plan"]),
                "plan_label": trial["plan"], "measured_peak_bytes": trial["peak_bytes"],
            }
            if section in _RESERVED_SECTIONS and trial.get("reserved_bytes"):
                row["measured_reserved_bytes"] = trial["reserved_bytes"]
                row["reserved_source"] = (
                    f"results/{source}.json parts.{section}: the trial's reserved_bytes (max_memory_reserved), "
                    "no budget"
                )
            rows.append(row)
    estimate = parts.get("estimate")
    if estimate:
        configs = {
            "gpt2": ({"model_type": "gpt2"}, "GPT2LMHeadModel"),
            "llama": (_llama({**parts["cumulative"]["model"], "length": 2048}), "LlamaForCausalLM"),
            "bert": ({"model_type": "bert", "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
                      "intermediate_size": 4096}, "BertForMaskedLM"),
        }
        for trial in estimate["rows"]:
            if trial["measured_status"] != "ok":
                continue
            config, architecture = configs[trial["model"]]
            rows.append({
                "source": f"{source}:estimate", "config": config, "architecture": architecture,
                "batch": _lm_batch(trial["rows"], trial["length"]), "plan": plan_fields(trial["plan"]),
                "plan_label": trial["plan"], "measured_peak_bytes": trial["measured_bytes"],
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
         "measured_peak_bytes": row["memlab"]["peak_bytes"]}
        for row in data["rows"]
        if row["plan"] and row["memlab"]["status"] == "ok"
    ]


def build() -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    devices = {}
    for path in sorted(RESULTS.glob("gpu_acceptance-cuda-*.json")) + sorted(RESULTS.glob("hf_table-cuda-*.json")):
        data = json.loads(path.read_text())
        read = _hf_rows if data["benchmark"] == "hf_table" else _acceptance_rows
        found = read(data, path.stem)
        device = {"gpu": data["device"]["gpu"], "capability": data["device"]["gpu_capability"],
                  "torch": data["versions"]["torch"], "transformers": data["versions"]["transformers"]}
        devices[path.stem] = device
        rows += [{**row, **device} for row in found]
    unique = {json.dumps({k: v for k, v in row.items() if k not in ("source", "reserved_source")}, sort_keys=True): row
              for row in rows}
    return {"about": __doc__.split("\n\n")[0], "rows": list(unique.values())}


if __name__ == "__main__":
    table = build()
    (RESULTS / "cuda_truth.json").write_text(json.dumps(table, indent=1) + "\n")
    print(f"{len(table['rows'])} rows")
