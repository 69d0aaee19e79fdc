"""The loads section of the GPU acceptance run (see :mod:`benchmarks.gpu_acceptance`): the model loaded as users
load it, trained with LoRA and run for inference, beside memlab's CPU-made estimate of that load (issue 40).

A Llama of Llama-3.2-1B's shape (1.24B parameters with ``--full``) is made with random weights in bf16 and saved
with ``save_pretrained`` to a temporary folder: a checkpoint as a user has one. Then, each in a fresh Python
process (its own CUDA context, nothing cached before it), the checkpoint is loaded

- ``bf16``: ``from_pretrained(folder, torch_dtype=torch.bfloat16)``;
- ``nf4``: ``from_pretrained(folder, torch_dtype=torch.bfloat16, quantization_config=BitsAndBytesConfig(
  load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
  bnb_4bit_compute_dtype=torch.bfloat16))``;

and either trained (``memlab.measure`` of LoRA with dropout 0.05 on every linear layer, bf16 autocast and
checkpointing) or run for inference (greedy generation with the KV cache). Each row records the load's own peaks,
the trial's allocated peak, the allocator's reserved peak and the CUDA context (:func:`~benchmarks.gpu_common.
card_reading`), beside ``memlab.estimate(config, shapes, plan, load={...})`` made in a process that sees no GPU
(inference: ``InferencePlan(weights="bf16", quantize=...)``, which says the load itself). Checks: the allocated peak
within 5%, the reserved peak within 10%, the card figure (reserved + context) within 5%.

On the CPU (``--smoke``) every row runs, in one fresh process, but bitsandbytes' 4-bit layers there are not its
CUDA kernels: the 4-bit rows' comparisons are not judged (None, with the reason), nor is any reserve or context.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import common
from benchmarks.gpu_common import (
    SIZES,
    Checks,
    Llama,
    card_figures,
    card_reading,
    fresh_peaks,
    is_cuda,
    missing,
    parameter_count,
    plan_fields,
    ratio,
    release,
    within,
)

LOADS: dict[str, dict[str, Any]] = {
    "bf16": {"torch_dtype": "bfloat16"},
    "nf4": {"torch_dtype": "bfloat16",
            "quantization_config": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                    "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "bfloat16"}},
}
"""The ``from_pretrained`` keywords of each load, as JSON (``"bfloat16"`` for ``torch.bfloat16``; the quantization
config as ``BitsAndBytesConfig``'s keywords): what the measuring process passes, and ``estimate(load=...)`` too."""
WORKLOADS = ("train", "infer")
LORA_DROPOUT = 0.05


def train_plan() -> Any:
    """LoRA (rank 16, dropout 0.05, every linear layer) with bf16 autocast and checkpointing: a recipe's plan."""
    from memlab import Plan

    return Plan(adapter="lora", lora_dropout=LORA_DROPOUT, precision="bf16", checkpointing=True)


def infer_plan(load: str, new_tokens: int) -> Any:
    """Greedy generation with the KV cache, computing in bf16; for the estimate, the load's quantization too (a
    live model loaded in 4-bit is measured as it is, with nothing to quantize)."""
    from memlab import InferencePlan

    return InferencePlan(weights="bf16", quantize="nf4" if load == "nf4" else "none", new_tokens=new_tokens)


def row_id(load: str, workload: str) -> str:
    return f"{load} {workload}"


def shapes(spec: dict[str, Any], workload: str) -> dict[str, tuple[int, int]]:
    """The batch's shapes: a training batch (ids, mask, labels) or a prompt (ids, mask)."""
    rows, length = spec["train"] if workload == "train" else spec["prompt"]
    names = ("input_ids", "attention_mask", "labels") if workload == "train" else ("input_ids", "attention_mask")
    return {name: (rows, length) for name in names}


def batch(spec: dict[str, Any], workload: str, device: torch.device) -> dict[str, torch.Tensor]:
    """Random tokens of :func:`shapes` on ``device`` (labels are the ids)."""
    vocab = spec["shape"].vocab
    generator = torch.Generator().manual_seed(5)
    rows, length = spec["train"] if workload == "train" else spec["prompt"]
    ids = torch.randint(0, vocab, (rows, length), generator=generator)
    made = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if workload == "train":
        made["labels"] = ids.clone()
    return common.to_device(made, device)


def from_pretrained_keywords(load: str, device: torch.device) -> dict[str, Any]:
    """The keywords a user passes for ``load``, as torch and transformers objects, placed on ``device``."""
    place = str(torch.device("cuda", device.index or 0)) if is_cuda(device) else "cpu"
    keywords: dict[str, Any] = {"torch_dtype": torch.bfloat16, "device_map": {"": place}}
    quantization = LOADS[load].get("quantization_config")
    if quantization is not None:
        from transformers import BitsAndBytesConfig

        keywords["quantization_config"] = BitsAndBytesConfig(
            **{**quantization, "bnb_4bit_compute_dtype": torch.bfloat16})
    return keywords


# --- the estimates (in a process that sees no GPU) ----------------------------------------------------------------


def load_estimates(size: str, device: str, gpu: str | None) -> dict[str, Any]:
    """Every row's estimate at ``size`` by row id: training with ``load=``, inference with the load's
    ``InferencePlan``."""
    import memlab

    spec = SIZES[size]["loads"]
    config = spec["shape"].config()
    made: dict[str, Any] = {}
    for load in LOADS:
        for workload in WORKLOADS:
            keywords: dict[str, Any] = {"device": device}
            if gpu is not None:
                keywords["gpu"] = gpu
            if workload == "train":
                plan, keywords["load"] = train_plan(), LOADS[load]
            else:
                plan = infer_plan(load, spec["new_tokens"])
            started = time.perf_counter()
            try:
                trial = memlab.estimate(config, shapes(spec, workload), plan, **keywords)
                figures = {"status": trial.status, "error": trial.error, "peak_bytes": trial.peak_bytes,
                           "breakdown": dict(trial.breakdown), **card_figures(trial), "notes": list(trial.notes)}
            except Exception as error:  # noqa: BLE001 - a failed estimate is a row that says why
                figures = {"status": "error", "error": f"{type(error).__name__}: {error}"[:500], "peak_bytes": None}
            made[row_id(load, workload)] = {**figures, "plan": plan.label(), "plan_fields": plan_fields(plan),
                                            "gpu": gpu,
                                            "seconds": round(time.perf_counter() - started, 2)}
    return made


def collect(process: subprocess.Popen[bytes], out: Path, wait: float) -> dict[str, Any]:
    """The estimates of a side process (:func:`~benchmarks.gpu_sections_estimate.start_side_estimates`) once it
    ends (at most ``wait`` seconds); an error row for each where it failed."""
    try:
        process.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if process.returncode != 0 or not out.exists():
        log = out.with_suffix(".log")
        error = f"the estimating process failed: {log.read_text(errors='replace')[-1000:] if log.exists() else ''}"
        return {row_id(load, workload): {"status": "error", "error": error, "peak_bytes": None}
                for load in LOADS for workload in WORKLOADS}
    made: dict[str, Any] = json.loads(out.read_text())
    return made


# --- the measurements (each in a fresh process) --------------------------------------------------------------------


def save_checkpoint(shape: Llama, folder: Path, device: torch.device) -> dict[str, Any]:
    """A Llama of ``shape`` made on ``device`` in bf16 with random weights, saved to ``folder`` with
    ``save_pretrained`` (safetensors); its parameters and the seconds it took."""
    from transformers import LlamaForCausalLM

    started = time.perf_counter()
    torch.manual_seed(0)
    config = shape.config()
    config.architectures = ["LlamaForCausalLM"]
    with torch.device(device):
        model = LlamaForCausalLM(config).bfloat16()
    parameters = parameter_count(model)
    model.save_pretrained(folder)
    del model
    release(device)
    size = sum(path.stat().st_size for path in folder.iterdir())
    return {"parameters": parameters, "checkpoint_bytes": size, "seconds": round(time.perf_counter() - started, 1)}


def measure_loads(request: str) -> None:
    """The fresh process's side: for each ``[load, workload]`` of the request, load the checkpoint as the user does,
    measure the workload, read the card; print the answers as one JSON line."""
    common.quiet()
    asked = json.loads(request)
    device = torch.device(asked["device"])
    spec = {**asked["spec"], "shape": Llama(**asked["spec"]["shape"])}
    answers = [measure_one(Path(asked["folder"]), load, workload, spec, device) for load, workload in asked["rows"]]
    print(json.dumps({"answers": answers}, default=common._jsonable))


def measure_one(folder: Path, load: str, workload: str, spec: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Load, then train or generate: the load's figures, the trial's and the card's."""
    from transformers import AutoModelForCausalLM

    import memlab

    answer: dict[str, Any] = {"load": load, "workload": workload, "from_pretrained": LOADS[load]}
    started = time.perf_counter()
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, **from_pretrained_keywords(load, device))
    except Exception as error:  # noqa: BLE001 - a load that fails is a row that says why
        return {**answer, "status": "error", "error": f"loading: {type(error).__name__}: {error}"[:800]}
    answer["load_seconds"] = round(time.perf_counter() - started, 1)
    answer["quantized_layers"] = sum(type(m).__name__ == "Linear4bit" for m in model.modules())
    answer["dtypes"] = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()})
    answer["parameters"] = parameter_count(model)
    if is_cuda(device):
        torch.cuda.synchronize(device)
        answer["device_name"] = torch.cuda.get_device_name(device)
        answer["load_peak_bytes"] = int(torch.cuda.max_memory_allocated(device))
        answer["load_reserved_peak_bytes"] = int(torch.cuda.max_memory_reserved(device))
        answer["after_load_allocated_bytes"] = int(torch.cuda.memory_allocated(device))
        answer["after_load"] = card_reading(device)
    plan = train_plan() if workload == "train" else infer_plan("bf16", spec["new_tokens"])  # nothing to quantize
    fresh_peaks(device)
    try:
        trial = memlab.measure(model, batch(spec, workload, device), plan, steps=1, warmup=1, progress=False,
                               noise=0)
    except Exception as error:  # noqa: BLE001 - the next row runs all the same
        return {**answer, "status": "error", "error": f"measuring: {type(error).__name__}: {error}"[:800]}
    answer.update({
        "plan": trial.plan.label(), "plan_fields": plan_fields(trial.plan), "status": trial.status,
        "error": trial.error, "peak_bytes": trial.peak_bytes,
        "breakdown": dict(trial.breakdown), "trial": card_figures(trial), **card_reading(device),
        "notes": list(trial.notes), "step_time_s": common.rounded(trial.step_time_s, 5),
    })
    if workload == "infer":
        answer["kv_cache_end_bytes"] = getattr(trial, "kv_cache_end_bytes", None)
        answer["decode_tokens_per_s"] = common.rounded(getattr(trial, "decode_tokens_per_s", None), 1)
    return answer


def _measure(folder: Path, rows: list[tuple[str, str]], spec: dict[str, Any], device: torch.device) -> list[Any]:
    """``rows`` measured in one fresh process; an error row for each where it failed."""
    from benchmarks.gpu_common import in_fresh_process

    request = {"folder": str(folder), "rows": rows, "device": str(device),
               "spec": {**spec, "shape": dataclasses.asdict(spec["shape"])}}
    answer = in_fresh_process("benchmarks.gpu_sections_loads:measure_loads", request, timeout=300)
    if "answers" not in answer:  # the process failed: in_fresh_process's error
        return [{"load": load, "workload": workload, **answer} for load, workload in rows]
    return list(answer["answers"])


def section_loads(size: str, device: torch.device) -> dict[str, Any]:
    """Issue 40's loads: a 1B Llama checkpoint loaded in bf16 and in 4-bit NF4, each trained with LoRA (dropout
    0.05) and run for inference, each in a fresh process, beside memlab's CPU-made estimate of the same load."""
    from benchmarks.gpu_common import gpu_kind_name, made_estimates, start_side_estimates

    spec = SIZES[size]["loads"]
    shape: Llama = spec["shape"]
    checks = Checks()
    no_4bit = missing("bitsandbytes")
    loads = [load for load in LOADS if load == "bf16" or no_4bit is None]
    for load in LOADS:
        if load not in loads:
            checks.add(f"{load} rows ran", None, why=no_4bit)
    rows = [(load, workload) for load in loads for workload in WORKLOADS]
    made, made_on = made_estimates("loads", device)
    with tempfile.TemporaryDirectory(prefix="memlab-loads-") as folder:
        side = None
        if not made and not is_cuda(device):  # no GPU to hide from the estimates: made here, one process fewer
            made = load_estimates(size, device.type, None)
        elif not made:  # no side process of the acceptance run made them: one started here, beside the measuring
            gpu = gpu_kind_name(torch.cuda.get_device_name(device) if is_cuda(device) else None)
            side = start_side_estimates("loads", size, device.type, gpu, Path(folder),
                                        threads=4 if is_cuda(device) else 1)
            made_on = "a process that saw no GPU (CUDA_VISIBLE_DEVICES=''), started by the section"
        saved = save_checkpoint(shape, Path(folder), device)
        if size == "full":  # each row alone: its own CUDA context, nothing cached before its load
            measured = [answer for row in rows for answer in _measure(Path(folder), [row], spec, device)]
        else:  # the code only: every row in one fresh process
            measured = _measure(Path(folder), rows, spec, device)
        if side is not None:
            made = collect(*side, wait=300)
    checks.add("the checkpoint has at least 1B parameters", saved["parameters"] >= 10**9 if size == "full" else None,
               parameters=saved["parameters"], why=None if size == "full" else "the smoke size's model is tiny")
    table = []
    for answer in measured:
        load, workload = answer["load"], answer["workload"]
        name = row_id(load, workload)
        estimate = made.get(name) or {"status": "error", "error": "no estimate was made", "peak_bytes": None}
        row = {**answer, "batch_shapes": shapes(spec, workload), "estimate_plan": estimate.get("plan"),
               "estimate_plan_fields": estimate.get("plan_fields"), "estimate_bytes": estimate.get("peak_bytes"),
               "estimate_status": estimate.get("status"), "estimate_error": estimate.get("error"),
               "estimate_breakdown": estimate.get("breakdown"),
               "estimate_reserved_bytes": estimate.get("reserved_bytes"),
               "estimate_context_bytes": estimate.get("context_bytes"),
               "estimate_card_bytes": estimate.get("card_bytes"), "estimate_s": estimate.get("seconds"),
               "estimate_over_measured": ratio(estimate.get("peak_bytes"), answer.get("peak_bytes")),
               "reserved_estimate_over_measured": ratio(estimate.get("reserved_bytes"),
                                                        answer.get("reserved_peak_bytes")),
               "card_estimate_over_measured": ratio(estimate.get("card_bytes"), answer.get("card_bytes"))}
        table.append(row)
        ran = answer.get("status") == "ok" and estimate.get("status") == "ok"
        checks.add(f"{name}: loaded and ran", answer.get("status") == "ok", error=answer.get("error"),
                   dtypes=answer.get("dtypes"), quantized_layers=answer.get("quantized_layers"))
        if load == "nf4":
            checks.add(f"{name}: the linear layers were loaded in 4-bit (bitsandbytes Linear4bit)",
                       bool(answer.get("quantized_layers")), quantized_layers=answer.get("quantized_layers"))
        cpu_4bit = load == "nf4" and not is_cuda(device)
        why = ("bitsandbytes' 4-bit layers on the CPU are not its CUDA kernels" if cpu_4bit else
               None if is_cuda(device) else "a CUDA figure: no reserve or context on the CPU")
        checks.add(f"{name}: estimate within 5% of the measured allocated peak",
                   None if cpu_4bit or not ran else within(estimate.get("peak_bytes"), answer.get("peak_bytes"), 0.05),
                   estimate=estimate.get("peak_bytes"), measured=answer.get("peak_bytes"),
                   ratio=row["estimate_over_measured"], why=why if cpu_4bit else None,
                   error=answer.get("error") or estimate.get("error"))
        checks.add(f"{name}: reserved estimate within 10% of the measured reserved peak",
                   within(estimate.get("reserved_bytes"), answer.get("reserved_peak_bytes"), 0.10) if ran else None,
                   estimate=estimate.get("reserved_bytes"), measured=answer.get("reserved_peak_bytes"),
                   ratio=row["reserved_estimate_over_measured"], why=why)
        checks.add(f"{name}: card estimate within 5% of the measured reserved peak + CUDA context",
                   within(estimate.get("card_bytes"), answer.get("card_bytes"), 0.05) if ran else None,
                   estimate=estimate.get("card_bytes"), measured=answer.get("card_bytes"),
                   ratio=row["card_estimate_over_measured"], why=why)
    return {"model": {**dataclasses.asdict(shape), "parameters": saved["parameters"], "dtype": "bf16"},
            "checkpoint": saved, "train": list(spec["train"]), "prompt": list(spec["prompt"]),
            "new_tokens": spec["new_tokens"], "train_plan": train_plan().label(), "loads": LOADS,
            "estimates_made_in": made_on, "rows": table,
            "checks": checks.items}
