"""The ``rl`` part of the GPU acceptance run (see :mod:`benchmarks.gpu_acceptance`): TRL 1.16's DPO and GRPO
trainers, built as users build them, their own ``train()`` beside memlab's estimates made on the GPU and on a
laptop.

Four trainers on a Qwen2-0.5B-shaped policy with random weights (``--full``; a tiny Qwen2 at the CPU sizes), bf16:

- ``dpo_ref``: ``DPOTrainer(model=policy, ref_model=reference)``, the reference a second model held apart;
- ``dpo_lora``: ``DPOTrainer`` with ``peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear")`` and
  no reference (the base with its adapters off);
- ``grpo``: ``GRPOTrainer`` with ``beta=0.04``, transformers' generation (no vLLM); TRL loads the reference from the
  policy's path, so the policy is saved and loaded back with ``from_pretrained`` as a user's checkpoint is;
- ``grpo_lora``: the same with the LoRA ``peft_config`` (the reference is the base with its adapters off).

For each, in this order: ``gpu_made``, ``memlab.estimate(trainer)`` for this GPU kind, made in this process before
any training (as a user asks before training); ``train_peak_bytes``, the trainer's own ``train()`` with no memlab
(``max_memory_allocated``, and ``train_reserved_bytes`` its ``max_memory_reserved``); ``laptop_made``, the estimate
made as on a laptop: a fresh process started first, beside the GPU's work, that sees no GPU
(``CUDA_VISIBLE_DEVICES=""``) and no Triton (``sys.modules["triton"] = None`` before any import), builds the same
trainer on the CPU with :func:`make_rl_trainer` (the one builder of both processes) and estimates it for this GPU
kind. Checks: the GPU-made peak within :data:`~benchmarks.gpu_sections_peft.ESTIMATE_TOLERANCE` of ``train()``'s
(GPU only), the laptop-made peak within :data:`LAPTOP_TOLERANCE` of the GPU-made one (a laptop's dry run of TRL takes
TRL's GPU path: :mod:`memlab.estimation.cuda.branches`), and the CUDA context alive after each call (``Guarded``).
At the CPU sizes both estimates are made for an H100 on the CPU, in the two kinds of process.

The GRPO parts of issue 86 (``grpo_1024``, ``grpo_8b``: :func:`benchmarks.gpu_common.grpo_setups`) run the same
machinery on another setup of :data:`~benchmarks.gpu_common.SIZES` (:func:`rl_section`): their own shape, family and
dtype, their trainers, their tolerance, and a laptop that may build the policy on the meta device.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import common
from benchmarks.gpu_common import SIZES, Checks, Llama, gpu_kind_name, in_fresh_process, is_cuda, ratio, within
from benchmarks.gpu_sections_peft import ESTIMATE_TOLERANCE, Guarded, figures, gpu_kind, train_peak

TRAINERS = ("dpo_ref", "dpo_lora", "grpo", "grpo_lora")
LORA = {"r": 16, "lora_alpha": 32, "target_modules": "all-linear"}
"""The LoRA ``peft_config`` of the ``*_lora`` trainers (TRL's recipes' adapters, no dropout)."""
GRPO_BETA = 0.04
LAPTOP_TOLERANCE = 0.02
"""The laptop-made estimate's peak against the one made on the GPU: the same dry run, the same answers."""
HELD_CHECK = "before train(), the process holds the trainer's models and nothing else on the GPU"
HELD_LIMIT = 64 * 2**20
"""What a trainer's process may hold beside its models before ``train()`` (the estimate's few cached tensors)."""
CPU_GPU = "H100-80GB"
"""The GPU kind both estimates are made for at the CPU sizes (no GPU to name)."""


def rl_missing() -> str | None:
    """Why the part cannot run here (TRL, ``datasets`` or peft does not import), or None."""
    from benchmarks.gpu_sections_trainer import sft_missing

    return sft_missing()


def qwen2(shape: Llama, cpu: bool, seed: int = 0) -> Any:
    """A Qwen2 causal LM of ``shape`` with random weights in fp32, made on the CPU where ``cpu``, else on the GPU (a
    0.5B model's random init takes seconds on a CPU; its values, which differ between the two, no estimate reads)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                         num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.kv_heads, vocab_size=shape.vocab, tie_word_embeddings=shape.tie,
                         max_position_embeddings=max(2048, shape.length), pad_token_id=0)
    with torch.device("cpu" if cpu else "cuda"):
        return Qwen2ForCausalLM(config)


def causal_lm(shape: Llama, family: str, device: str, dtype: str | None = None, seed: int = 0) -> Any:
    """A ``family`` (``"qwen2"``, ``"qwen3"``) causal LM of ``shape`` with random weights, made on ``device``
    (``"meta"`` too) in ``dtype`` (default fp32) directly, as ``from_config(config, dtype=...)`` makes it."""
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config

    fields: dict[str, Any] = dict(
        hidden_size=shape.hidden, intermediate_size=shape.intermediate, num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads, vocab_size=shape.vocab,
        tie_word_embeddings=shape.tie, max_position_embeddings=max(2048, shape.length), pad_token_id=0)
    config = Qwen3Config(**fields, head_dim=shape.hidden // shape.heads) if family == "qwen3" else Qwen2Config(**fields)
    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype or "float32"))


def words(count: int, start: int) -> str:
    """``count`` words of the word tokenizer (one token each), from ``w{start}`` on."""
    return " ".join(f"w{(start + j) % 61}" for j in range(count))


def make_rl_trainer(kind: str, size: str, cpu: bool, folder: str, setup: str = "rl", meta: bool = False) -> Any:
    """The ``kind`` trainer of :data:`TRAINERS` at ``size`` (on the CPU where ``cpu``, else the GPU), bf16, seeds
    and data fixed: the one builder of the GPU's process and the laptop's. ``setup``: the entry of
    :data:`~benchmarks.gpu_common.SIZES` it is built from; ``meta``: its policy on the meta device, the trainer built
    with ``memlab.trainer_on_meta`` (a LoRA trainer, whose reference is the policy with its adapters off)."""
    import trl
    from datasets import Dataset
    from peft import LoraConfig

    from benchmarks.gpu_sections_trainer import word_tokenizer

    spec = SIZES[size][setup]
    shape: Llama = spec["shape"]
    common_args: dict[str, Any] = dict(output_dir=str(Path(folder) / kind), report_to=[], save_strategy="no",
                                       disable_tqdm=True, bf16=True, use_cpu=cpu, seed=0, logging_steps=1,
                                       dataloader_num_workers=0)
    peft = LoraConfig(task_type="CAUSAL_LM", **LORA) if kind.endswith("_lora") else None
    if kind.startswith("dpo"):
        dpo = spec["dpo"]
        # Rows of one length: every batch the worst, whichever train() draws.
        rows = [{"prompt": words(dpo["prompt"], i), "chosen": " " + words(dpo["completion"], 3 * i + 1),
                 "rejected": " " + words(dpo["completion"], 7 * i + 2)} for i in range(dpo["rows"] * dpo["steps"])]
        args = trl.DPOConfig(**common_args, max_steps=dpo["steps"], per_device_train_batch_size=dpo["rows"],
                             max_length=dpo["max_length"])
        reference = qwen2(shape, cpu, seed=1) if peft is None else None
        data = Dataset.from_list(rows)
        return trl.DPOTrainer(model=qwen2(shape, cpu), ref_model=reference, args=args, train_dataset=data,
                              processing_class=word_tokenizer(), peft_config=peft)
    grpo = spec["grpo"]
    prompts = [{"prompt": words(grpo["prompt"], i)} for i in range(2 * grpo["rows"] * grpo["steps"])]
    args = trl.GRPOConfig(**common_args, max_steps=grpo["steps"], per_device_train_batch_size=grpo["rows"],
                          num_generations=grpo["generations"], max_completion_length=grpo["completion"],
                          beta=GRPO_BETA, use_vllm=False)
    if "family" in spec:
        model = causal_lm(shape, spec["family"], "meta" if meta else "cpu" if cpu else "cuda", spec.get("dtype"))
    else:
        model = qwen2(shape, cpu)
    if peft is None:  # TRL loads the reference from the policy's path: a checkpoint, saved and loaded back
        model.save_pretrained(Path(folder) / f"{kind}-policy")
        model = type(model).from_pretrained(Path(folder) / f"{kind}-policy")
    keywords = dict(model=model, reward_funcs=completion_length, args=args, train_dataset=Dataset.from_list(prompts),
                    processing_class=word_tokenizer(), peft_config=peft)
    if meta:
        import memlab

        return memlab.trainer_on_meta(trl.GRPOTrainer, **keywords)
    return trl.GRPOTrainer(**keywords)


def completion_length(completions: list[Any], **_: Any) -> list[float]:
    """GRPO's reward: each completion's length."""
    return [float(len(completion)) for completion in completions]


def laptop_estimates(request: str) -> None:
    """The side process (no GPU, no Triton): each trainer built on the CPU and estimated for the GPU kind named;
    prints one JSON line of their figures."""
    import memlab

    asked = json.loads(request)
    common.quiet()
    answer: dict[str, Any] = {"status": "ok", "cuda_available": torch.cuda.is_available(),
                              "triton_hidden": "triton" in sys.modules and sys.modules["triton"] is None,
                              "trainers": {}}
    with tempfile.TemporaryDirectory(prefix="memlab-rl-laptop-") as folder:
        setup = asked.get("setup", "rl")
        meta = bool(SIZES[asked["size"]][setup].get("laptop_meta"))
        answer["meta"] = meta
        for kind in asked["trainers"]:
            try:
                trainer = make_rl_trainer(kind, asked["size"], True, folder, setup, meta=meta)
                answer["trainers"][kind] = figures(memlab.estimate(trainer, device="cuda", gpu=asked["gpu"]))
            except Exception as error:  # noqa: BLE001 - reported as that trainer's failed estimate
                answer["trainers"][kind] = {"status": "error", "error": f"{type(error).__name__}: {str(error)[:400]}"}
            trainer = None
            gc.collect()
    print(json.dumps(answer, default=common._jsonable), flush=True)


def start_laptop(size: str, gpu: str, pool: concurrent.futures.ThreadPoolExecutor,
                 setup: str = "rl") -> concurrent.futures.Future[Any]:
    """:func:`laptop_estimates` in a fresh process that sees no GPU and no Triton, started now (its answer later)."""
    threads = "8"  # half a 16-core GPU machine: the GPU's process beside it launches its kernels from the CPU
    env = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    spec = SIZES[size][setup]
    request = {"size": size, "gpu": gpu, "trainers": list(spec.get("trainers", TRAINERS)), "setup": setup}
    return pool.submit(in_fresh_process, "benchmarks.gpu_sections_rl:laptop_estimates", request,
                       spec["laptop_s"], env=env, hide=("triton",))


def model_bytes(*models: Any) -> int:
    """The bytes of ``models``' parameters and buffers (each storage once): what a process holding them and nothing
    else has allocated."""
    seen: dict[int, int] = {}
    for model in models:
        if model is None:
            continue
        for tensor in [*model.parameters(), *model.buffers()]:
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def one_trainer(name: str, size: str, device: torch.device, folder: str, setup: str = "rl") -> dict[str, Any]:
    """The ``name`` trainer built on ``device``, estimated (``gpu_made``) and trained with no memlab
    (``train_peak_bytes``), what the process held beside its models before ``train()``, and the checks made (the
    CUDA context alive after each call)."""
    import memlab

    kind = gpu_kind(device) if is_cuda(device) else {"device": "cuda", "gpu": CPU_GPU}
    checks = Checks()
    guard = Guarded(checks, device)
    started = time.perf_counter()
    trainer = guard(f"{name}: built", lambda: make_rl_trainer(name, size, not is_cuda(device), folder, setup))
    built = time.perf_counter()
    seconds: dict[str, Any] = {"built": round(built - started, 1)}
    if trainer is None:
        return {"gpu_made": None, "train_peak_bytes": None, "checks": checks.items, "tracebacks": guard.errors,
                "broken_at": guard.broken}
    made = guard(f"{name}: memlab.estimate(trainer)", lambda: memlab.estimate(trainer, **kind))
    estimated = time.perf_counter()
    seconds["estimate"] = round(estimated - built, 1)
    held = None
    if is_cuda(device):
        common.release(device)
        models = model_bytes(trainer.model, getattr(trainer, "ref_model", None))
        held = int(torch.cuda.memory_allocated(device)) - models
    # At the smoke size (the suite's one-command run, under a 60 s deadline) no train(): on the CPU its peak is not
    # read anyway; the small size runs it.
    peak = None if size == "smoke" else guard(f"{name}: the trainer's own train() (no memlab)",
                                              lambda: train_peak(trainer, device))
    seconds["train"] = None if size == "smoke" else round(time.perf_counter() - estimated, 1)
    reserved = int(torch.cuda.max_memory_reserved(device)) if peak is not None and is_cuda(device) else None
    return {"gpu_made": figures(made), "train_peak_bytes": peak, "train_reserved_bytes": reserved,
            "held_besides_models_bytes": held, "estimate_over_train": ratio(getattr(made, "peak_bytes", None), peak),
            "seconds": seconds, "checks": checks.items, "tracebacks": guard.errors, "broken_at": guard.broken}


def one_trainer_here(request: str) -> None:
    """:func:`one_trainer` in a process of its own (``in_fresh_process``): prints its answer as one JSON line."""
    asked = json.loads(request)
    common.quiet()
    device = torch.device(asked["device"])
    with tempfile.TemporaryDirectory(prefix="memlab-rl-") as folder:
        answer = one_trainer(asked["name"], asked["size"], device, folder, asked.get("setup", "rl"))
    print(json.dumps({"status": "ok", **answer}, default=common._jsonable), flush=True)


def section_rl(size: str, device: torch.device) -> dict[str, Any]:
    """TRL's DPO (a reference model; LoRA) and GRPO (beta 0.04; LoRA) trainers: memlab's estimate made on the GPU
    and on a laptop, against the trainer's own ``train()``.

    On a GPU each trainer runs in a process of its own: in one process, the H200's first run (2026-11-27) measured
    each ``train()`` with what the trainers before it left allocated (GRPO + LoRA 6.54 GB, 2.59 GB alone), and
    :data:`HELD_CHECK` says so where it happens again."""
    return rl_section(size, device, "rl")


def rl_section(size: str, device: torch.device, setup: str) -> dict[str, Any]:
    """The trainers of ``setup`` (an entry of :data:`~benchmarks.gpu_common.SIZES`: ``rl``, ``grpo_1024``,
    ``grpo_8b``), each estimated on the GPU and on a laptop and trained, with the checks of :func:`section_rl`."""
    spec = SIZES[size][setup]
    names: tuple[str, ...] = spec.get("trainers", TRAINERS)
    tolerance = spec.get("tolerance", ESTIMATE_TOLERANCE)
    checks = Checks()
    settings = {"grpo": {**spec["grpo"], "beta": GRPO_BETA}, "lora": LORA, "bf16": True,
                "dtype": spec.get("dtype", "float32"), "laptop_on_meta": bool(spec.get("laptop_meta")),
                "tolerance": tolerance, **({"dpo": spec["dpo"]} if "dpo" in spec else {})}
    result: dict[str, Any] = {"setup": setup,
                              "model": {"family": spec.get("family", "qwen2"), **dataclasses.asdict(spec["shape"])},
                              "missing": rl_missing(), "settings": settings}
    if result["missing"] is not None:
        checks.add("TRL's DPO and GRPO trainers ran", None, why=result["missing"])
        return {**result, "checks": checks.items}
    kind = gpu_kind(device) if is_cuda(device) else {"device": "cuda", "gpu": CPU_GPU}
    gpu = (gpu_kind_name(torch.cuda.get_device_name(device)) if is_cuda(device) else CPU_GPU) or CPU_GPU
    result["estimated_for"] = kind
    trainers: dict[str, dict[str, Any]] = {}
    broken: dict[str, str] = {}
    tracebacks: dict[str, str] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool, \
            tempfile.TemporaryDirectory(prefix="memlab-rl-") as folder:
        laptop = start_laptop(size, gpu, pool, setup)
        for name in names:
            if is_cuda(device):
                row = in_fresh_process("benchmarks.gpu_sections_rl:one_trainer_here",
                                       {"name": name, "size": size, "device": str(device), "setup": setup},
                                       spec["trainer_s"])
            else:
                row = one_trainer(name, size, device, folder, setup)
            for check in row.pop("checks", []):
                checks.add(check.pop("check"), check.pop("passed"), **check)
            if row.get("status") == "error":
                checks.add(f"{name}: the trainer's process answered", False, error=row.get("error"))
            tracebacks.update(row.pop("tracebacks", None) or {})
            if row.get("broken_at"):
                broken[name] = row["broken_at"]
            label = f"{name}: memlab.estimate(trainer) made {'on the GPU' if is_cuda(device) else 'in this process'}"
            made, peak = row.get("gpu_made"), row.get("train_peak_bytes")
            if is_cuda(device):
                held = row.get("held_besides_models_bytes")
                checks.add(f"{name}: {HELD_CHECK}", None if held is None else held <= HELD_LIMIT, held_bytes=held)
                ours = made.get("peak_bytes") if made and made.get("status") == "ok" else None
                checks.add(f"{label}: peak within {tolerance:.0%} of the trainer's own train()'s "
                           "max_memory_allocated", False if ours is None else within(ours, peak, tolerance),
                           memlab=ours, reference=peak, ratio=ratio(ours, peak),
                           error=(made or {}).get("error") or row.get("error"))
            else:
                checks.add(f"{label}: peak within {tolerance:.0%} of train()'s", None,
                           why="train()'s max_memory_allocated is a CUDA figure: on the CPU the code runs, unjudged"
                           + (" (no train() at the smoke size)" if size == "smoke" else ""))
            trainers[name] = row
            common.release(device)
        waited = time.perf_counter()
        answer = laptop.result()
        result["laptop_waited_s"] = round(time.perf_counter() - waited, 1)
    result["laptop"] = {key: answer.get(key) for key in ("status", "error", "cuda_available", "triton_hidden", "meta")}
    checks.add("the laptop's process saw no GPU and no Triton",
               answer.get("cuda_available") is False and answer.get("triton_hidden") is True,
               **result["laptop"])
    for name, row in trainers.items():
        laptop_made = answer.get("trainers", {}).get(name) or {"status": "error", "error": answer.get("error")}
        row["laptop_made"] = laptop_made
        theirs = laptop_made.get("peak_bytes") if laptop_made.get("status") == "ok" else None
        ours = (row.get("gpu_made") or {}).get("peak_bytes") if (row.get("gpu_made") or {}).get("status") == "ok" \
            else None
        row["laptop_over_gpu_made"] = ratio(theirs, ours)
        agree = within(theirs, ours, LAPTOP_TOLERANCE)
        checks.add(f"{name}: the laptop-made estimate's peak within {LAPTOP_TOLERANCE:.0%} of the GPU-made one",
                   False if agree is None else agree, laptop=theirs, gpu_made=ours, ratio=row["laptop_over_gpu_made"],
                   error=laptop_made.get("error"))
        if setup != "rl" and is_cuda(device):  # issue 86: GRPO's laptop-made figure against train() itself
            peak = row.get("train_peak_bytes")
            checks.add(f"{name}: the laptop-made estimate's peak within {tolerance:.0%} of the trainer's own "
                       "train()'s max_memory_allocated", False if theirs is None else within(theirs, peak, tolerance),
                       memlab=theirs, reference=peak, ratio=ratio(theirs, peak))
    return {**result, "trainers": trainers, "broken_at": broken or None, "tracebacks": tracebacks,
            "checks": checks.items}


def section_grpo_1024(size: str, device: torch.device) -> dict[str, Any]:
    """Issue 86: GRPO at 1,024 completion tokens on Qwen2-0.5B's shape, with a reference (beta 0.04) and with LoRA:
    the GPU-made and the laptop-made estimates within 2% of the trainer's own ``train()``."""
    return rl_section(size, device, "grpo_1024")


def section_grpo_8b(size: str, device: torch.device) -> dict[str, Any]:
    """Issue 86: a Qwen3-8B-shaped LoRA GRPO step in bf16 (1,024 completion tokens), the laptop's estimate asked of a
    policy on the meta device: both within 2% of the trainer's own ``train()``."""
    return rl_section(size, device, "grpo_8b")
