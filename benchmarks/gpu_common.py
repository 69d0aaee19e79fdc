"""What the sections of the GPU acceptance run share (see :mod:`benchmarks.gpu_acceptance`): the sizes, the checks'
bookkeeping, the models and batches, the CUDA figures read beside memlab's, and the fresh process a section can
re-measure in.

Each section returns a dict with its figures and a list of ``checks``: ``{"check": what, "passed": True/False/None,
...figures}``, where None means "cannot be judged here" (a CUDA-only figure on the CPU, or a library that is not
installed, with the reason).
"""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks import common

ROOT = Path(__file__).resolve().parent.parent

# --- sizes ------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Llama:
    """A Llama causal LM's shape (built from its config with random weights) and a batch of random tokens."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    rows: int
    length: int
    tie: bool = False

    def config(self) -> Any:
        from transformers import LlamaConfig

        return LlamaConfig(
            hidden_size=self.hidden, intermediate_size=self.intermediate, num_hidden_layers=self.layers,
            num_attention_heads=self.heads, num_key_value_heads=self.kv_heads, vocab_size=self.vocab,
            max_position_embeddings=max(2048, self.length), tie_word_embeddings=self.tie,
        )

    def replace(self, **changes: Any) -> Llama:
        return dataclasses.replace(self, **changes)


TINY = Llama(hidden=64, layers=2, heads=2, kv_heads=2, intermediate=128, vocab=256, rows=4, length=32)
# Llama-3.2-1B's shape: 16 layers of 2048, grouped-query attention (8 KV heads), 128256 tokens, tied head.
LLAMA_1B = Llama(hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192, vocab=128256, rows=2, length=2048,
                 tie=True)
_MID = Llama(hidden=1024, layers=8, heads=16, kv_heads=16, intermediate=2816, vocab=32000, rows=8, length=512)
_SMALL = Llama(hidden=512, layers=4, heads=8, kv_heads=8, intermediate=1408, vocab=32000, rows=8, length=256)
# Qwen2-0.5B's shape (the ``rl`` part builds it as a Qwen2 from these fields): 24 layers of 896, 2 KV heads, tied head.
QWEN2_05B = Llama(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936, rows=8, length=512,
                  tie=True)
_TINY_QWEN2 = Llama(hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128, vocab=64, rows=2, length=32, tie=True)
# Qwen3-8B's shape (``grpo_8b`` builds it as a Qwen3, heads of 128): 36 layers of 4096, 8 KV heads, untied head.
QWEN3_8B = Llama(hidden=4096, layers=36, heads=32, kv_heads=8, intermediate=12288, vocab=151936, rows=8, length=2048)
_TINY_QWEN3 = Llama(hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128, vocab=64, rows=2, length=32)


def grpo_setups(size: str) -> dict[str, dict[str, Any]]:
    """The GRPO parts' setups at ``size`` (issue 86), as the ``rl`` part's entry of :data:`SIZES` (its ``grpo``
    settings, the process limits), with the trainers each builds, the policy's family and dtype, whether the laptop
    builds it on the meta device, and the estimate's tolerance against ``train()``:

    - ``grpo_1024``: Qwen2-0.5B's shape, 8 completions of 1,024 tokens after a 64-token prompt, with a reference
      (beta 0.04, the policy saved and loaded back) and with LoRA, fp32 weights under bf16 autocast, as ``rl``;
    - ``grpo_8b``: Qwen3-8B's shape in bf16 (the H200's 141 GB holds it whole) with LoRA, 8 completions of 1,024
      tokens after a 128-token prompt; the laptop asks of a policy on the meta device (``memlab.trainer_on_meta``),
      as a user without the card must.

    At the CPU sizes the tiny Qwen2 and Qwen3 with completions of a few tokens: the code, not the figures."""
    full = size == "full"
    # Two steps: train()'s peak is then a steady step's, as memlab's figures describe it (the optimizer state alive
    # through the backward). With one, the peak was the first optimizer step, where the state is made: the H100's
    # GRPO with a reference measured 9.97 GB that way against a steady step's 10.43 (1.046; LoRA's tiny state, 1.012).
    # The 8B LoRA step keeps one (its optimizer state is the adapters', 0.2% of its peak; two would not fit the limit).
    long = {"rows": 8, "generations": 8, "prompt": 64, "completion": 1024, "steps": 2} if full else \
        {"rows": 2, "generations": 2, "prompt": 4, "completion": 8, "steps": 1}
    big = {**long, "prompt": 128, "steps": 1} if full else long
    limits = {"laptop_s": 150, "trainer_s": 110} if full else {"laptop_s": 240, "trainer_s": 120}
    return {
        "grpo_1024": {"shape": QWEN2_05B if full else _TINY_QWEN2, "family": "qwen2", "grpo": long,
                      "trainers": ("grpo", "grpo_lora"), "tolerance": 0.02, **limits},
        "grpo_8b": {"shape": QWEN3_8B if full else _TINY_QWEN3, "family": "qwen3", "dtype": "bfloat16",
                    "laptop_meta": True, "grpo": big, "trainers": ("grpo_lora",), "tolerance": 0.02,
                    **({"laptop_s": 180, "trainer_s": 200} if full else limits)},
    }

SIZES: dict[str, dict[str, Any]] = {
    "smoke": {
        "probe": TINY, "cap": TINY, "restore": TINY, "levers": TINY, "fit": TINY, "cumulative": TINY,
        "peft_model": TINY, "estimate_scale": "tiny", "steps": 1, "timed_steps": 1, "fit_budget_share": 0.8,
        "inference": {"shape": TINY.replace(kv_heads=1, rows=2), "contexts": (16, 32), "new_tokens": 3},
        "ties": {"shape": TINY, "runs": (0, 0), "calibration_steps": 2},  # their runs: benchmarks.ties --smoke
        "trainer": {"shape": TINY, "examples": 12, "longest": 48, "steps": 2,
                    "sft": {"examples": 12, "longest": 48, "max_length": 64, "steps": 2},
                    "overhead": {"rounds": 1, "steps": 3, "warmup": 1}},
        "loads": {"shape": TINY.replace(rows=2), "train": (2, 32), "prompt": (2, 16), "new_tokens": 3},
        "rl": {"shape": _TINY_QWEN2, "dpo": {"rows": 2, "prompt": 6, "completion": 8, "max_length": 32, "steps": 1},
               "grpo": {"rows": 2, "generations": 2, "prompt": 4, "completion": 4, "steps": 1}, "laptop_s": 240,
               "trainer_s": 120},
        "noise": 0,  # the smoke size exercises the code only: exactly its steps, no noise target
        "time_limit": 2.0,
        **grpo_setups("smoke"),
    },
    "small": {
        "probe": TINY, "cap": TINY, "restore": TINY, "levers": TINY, "fit": TINY, "cumulative": TINY,
        "peft_model": TINY, "estimate_scale": "tiny", "steps": 1, "timed_steps": 3, "fit_budget_share": 0.8,
        "inference": {"shape": TINY.replace(kv_heads=1, rows=2), "contexts": (32, 64), "new_tokens": 4},
        "ties": {"shape": TINY, "runs": (3, 3), "calibration_steps": 3},
        "trainer": {"shape": TINY, "examples": 16, "longest": 64, "steps": 3,
                    "sft": {"examples": 16, "longest": 64, "max_length": 128, "steps": 3},
                    "overhead": {"rounds": 3, "steps": 6, "warmup": 2}},
        "loads": {"shape": TINY.replace(rows=2), "train": (2, 64), "prompt": (2, 32), "new_tokens": 4},
        "rl": {"shape": _TINY_QWEN2, "dpo": {"rows": 2, "prompt": 8, "completion": 12, "max_length": 32, "steps": 2},
               "grpo": {"rows": 4, "generations": 4, "prompt": 6, "completion": 8, "steps": 1}, "laptop_s": 600,
               "trainer_s": 300},
        "noise": 0.05, "time_limit": 5.0,
        **grpo_setups("small"),
    },
    "full": {
        "probe": _MID,
        "cap": _MID,
        "restore": _SMALL,
        # Each lever alone on Llama-3.2-1B's shape at 2 x 1024 (fp32 AdamW: about 30 GB); one by one at 2 x 2048.
        "levers": LLAMA_1B.replace(length=1024),
        "fit": Llama(hidden=768, layers=12, heads=12, kv_heads=12, intermediate=2048, vocab=32000, rows=16,
                     length=512),
        "cumulative": LLAMA_1B,
        # The user's own get_peft_model model (issue 57): LoRA on every linear layer of the mid-sized Llama, 8 x 512.
        "peft_model": _MID,
        "estimate_scale": "full", "steps": 2, "timed_steps": 3, "fit_budget_share": 0.45,
        # Llama-3.2-1B's shape in bf16, int8 and NF4: 4 rows at a short and a long prompt, 32 new tokens.
        "inference": {"shape": LLAMA_1B.replace(rows=4), "contexts": (512, 4096), "new_tokens": 32},
        "ties": {"shape": _SMALL, "runs": (10, 10), "calibration_steps": 5},
        # The plain Trainer and TRL's SFTTrainer (packing to 1024 tokens, LoRA with dropout 0.05) on the same
        # shape; watch's overhead: plain and watched train() calls alternating (plain, watch, watch, plain), 12
        # steps each, 2 warm-up steps dropped: 20 step times a side.
        "trainer": {"shape": _MID, "examples": 48, "longest": 1024, "steps": 4,
                    "sft": {"examples": 64, "longest": 1024, "max_length": 1024, "steps": 4},
                    "overhead": {"rounds": 4, "steps": 12, "warmup": 2}},
        # Llama-3.2-1B's shape saved in bf16 and loaded as users load it: LoRA on 4 x 1024, generation after
        # 4 prompts of 512 tokens.
        "loads": {"shape": LLAMA_1B.replace(rows=4, length=1024), "train": (4, 1024), "prompt": (4, 512),
                  "new_tokens": 32},
        # TRL's DPO and GRPO trainers on a Qwen2-0.5B-shaped policy (random weights): DPO 2 pairs of a 128-token
        # prompt and 256-token answers (max_length 512), GRPO 8 completions of 256 tokens after a 64-token prompt.
        # laptop_s: the laptop's process (its estimates) at most, under the part's limit so that the GPU's figures
        # come back; at the CPU sizes over it, so that a slow shared CPU cuts the part rather than failing a check.
        "rl": {"shape": QWEN2_05B, "dpo": {"rows": 2, "prompt": 128, "completion": 256, "max_length": 512, "steps": 2},
               "grpo": {"rows": 8, "generations": 8, "prompt": 64, "completion": 256, "steps": 2}, "laptop_s": 140,
               "trainer_s": 90},
        "noise": 0.05,
        # A timed trial stops at 3 s even where its median's interval is not yet within 5%: the run has ten
        # minutes for everything (the ties section keeps memlab's own defaults: its question is the timing).
        "time_limit": 3.0,
        **grpo_setups("full"),
    },
}

# --- checks -----------------------------------------------------------------------------------------------------


class Checks:
    """The pass/fail lines of one section. Every check made in the process is also kept in :attr:`made`, so that a
    section that raises still reports the checks it made before (``gpu_acceptance.run_section_here``)."""

    made: list[dict[str, Any]] = []

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def add(self, check: str, passed: bool | None, **figures: Any) -> bool | None:
        self.items.append({"check": check, "passed": None if passed is None else bool(passed), **figures})
        Checks.made.append(self.items[-1])
        mark = {True: "PASS", False: "FAIL", None: "n/a "}[None if passed is None else bool(passed)]
        print(f"    [{mark}] {check} {json.dumps(figures, default=str)[:300]}", flush=True)
        return passed


def missing(*modules: str) -> str | None:
    """Why a part cannot run here: the first of ``modules`` that is not installed, or None when all are.

    Example:
        >>> missing("json"), missing("no_such_module_here")
        (None, 'no_such_module_here is not installed (carry its wheel: see benchmarks/gpu_acceptance.py)')
    """
    for module in modules:
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (carry its wheel: see benchmarks/gpu_acceptance.py)"
    return None


def within(value: float | None, reference: float | None, tolerance: float) -> bool | None:
    """|value / reference - 1| <= tolerance, or None where either is unknown."""
    if value is None or reference is None or reference == 0:
        return None
    return abs(value / reference - 1) <= tolerance


def ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or reference is None or reference == 0:
        return None
    return round(value / reference, 4)


def timing(size: str) -> dict[str, Any]:
    """The run options every measurement of a section takes: no progress bar, the size's noise target (none at
    the smoke size, which only exercises the code) and its time limit for a trial's timed steps."""
    return {"progress": False, "noise": SIZES[size]["noise"], "time_limit": SIZES[size]["time_limit"]}


# --- models and batches -----------------------------------------------------------------------------------------


def build_llama(shape: Llama, device: torch.device, seed: int = 0) -> nn.Module:
    """The Llama of ``shape``, its weights created directly on ``device``."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        return LlamaForCausalLM(shape.config())


def token_batch(vocab: int, rows: int, length: int, device: torch.device, seed: int = 1) -> dict[str, torch.Tensor]:
    """Random tokens as a causal-LM batch (labels are the ids), on ``device``."""
    return common.to_device(common.lm_batch(vocab=vocab, rows=rows, length=length, seed=seed), device)


def adamw_steps(model: nn.Module, batch: dict[str, torch.Tensor], steps: int, device: torch.device) -> float:
    """``steps`` plain training steps of ``model`` on ``batch`` (its own loss, torch's AdamW, fused on CUDA, the
    gradients freed after each step), as a user's loop runs them; the seconds they took."""
    import time

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=is_cuda(device))
    started = time.perf_counter()
    for _ in range(steps):
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss
    return round(time.perf_counter() - started, 1)


def parameter_count(model: nn.Module) -> int:
    """Distinct parameters (a tied head counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


# --- CUDA figures -----------------------------------------------------------------------------------------------


def is_cuda(device: torch.device) -> bool:
    return device.type == "cuda"


def allocated(device: torch.device) -> int | None:
    """``memory_allocated`` on CUDA after collecting garbage; None on the CPU."""
    gc.collect()
    if not is_cuda(device):
        return None
    torch.cuda.synchronize(device)
    return int(torch.cuda.memory_allocated(device))


def release(device: torch.device) -> None:
    common.release(device)


def fresh_peaks(device: torch.device) -> None:
    """Cached blocks given back and the allocator's peaks reset, so that the next reading is one run's own."""
    release(device)
    if is_cuda(device):
        torch.cuda.reset_peak_memory_stats(device)


def other_processes_bytes(device: torch.device) -> int | None:
    """GPU memory that processes other than this one hold on ``device`` (NVML), or None where NVML cannot say."""
    import os

    try:
        import pynvml

        pynvml.nvmlInit()
        index = device.index if device.index is not None else torch.cuda.current_device()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:  # noqa: BLE001 - NVML is optional: no figure then
        return None
    return sum(int(p.usedGpuMemory or 0) for p in processes if p.pid != os.getpid())


def card_reading(device: torch.device) -> dict[str, int | None]:
    """What the card shows for this process, read beside memlab: the allocator's reserved peak since
    :func:`fresh_peaks` (``max_memory_reserved``) and the CUDA context: what the driver says is used on the device
    (``mem_get_info``), less what the allocator reserves now and what other processes hold (NVML, where it
    answers). None on the CPU."""
    if not is_cuda(device):
        return {"reserved_peak_bytes": None, "context_bytes": None, "card_bytes": None}
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    used, reserved_now = int(total - free), int(torch.cuda.memory_reserved(device))
    others = other_processes_bytes(device)
    context = used - reserved_now - (others or 0)
    reserved = int(torch.cuda.max_memory_reserved(device))
    return {"reserved_peak_bytes": reserved, "context_bytes": context, "card_bytes": reserved + context,
            "driver_used_bytes": used, "reserved_now_bytes": reserved_now, "other_processes_bytes": others}


def unique_cuda_bytes(tensors: Iterator[torch.Tensor] | list[torch.Tensor]) -> int:
    """Bytes of the distinct storages among ``tensors`` that live on a non-CPU device (shared maps count once)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        if tensor.device.type == "cpu":
            continue
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def plan_fields(plan: Any) -> dict[str, Any]:
    """The fields of ``plan`` that differ from their defaults (tuples as lists): what rebuilds it, as JSON."""
    fields = {}
    for field in dataclasses.fields(plan):
        value = getattr(plan, field.name)
        if value != field.default:
            fields[field.name] = list(value) if isinstance(value, tuple) else value
    return fields


def card_figures(trial: Any) -> dict[str, Any]:
    """A trial's figures beyond the allocated peak, where this memlab has them (the CUDA context and the card
    figure landed after the first GPU run): None otherwise."""
    return {name: getattr(trial, name, None) for name in ("reserved_bytes", "context_bytes", "card_bytes")}


def trial_row(trial: Any, baseline: Any | None = None) -> dict[str, Any]:
    """A trial's figures for the JSON, with saving and speed-up against ``baseline`` where given."""
    row: dict[str, Any] = {
        "plan": trial.plan.label(),
        "plan_fields": plan_fields(trial.plan),
        "status": trial.status,
        "error": trial.error,
        "peak_bytes": trial.peak_bytes,
        "peak_mib": common.mib(trial.peak_bytes),
        "breakdown": dict(trial.breakdown),
        **card_figures(trial),
        "step_time_s": common.rounded(trial.step_time_s, 5),
        "step_times_s": [round(s, 5) for s in trial.step_times],
        "samples_per_s": common.rounded(trial.samples_per_s, 3),
        "tokens_per_s": common.rounded(trial.tokens_per_s, 1),
        "notes": list(trial.notes),
    }
    if baseline is not None and trial.status == "ok" and baseline.status == "ok":
        row["memory_saving"] = round(1 - trial.peak_bytes / baseline.peak_bytes, 4)
        if trial.samples_per_s and baseline.samples_per_s:
            row["speedup"] = round(trial.samples_per_s / baseline.samples_per_s, 3)
    return row


# --- a fresh process --------------------------------------------------------------------------------------------


def in_fresh_process(function: str, request: dict[str, Any], timeout: float = 300, *,
                     env: dict[str, str] | None = None, hide: tuple[str, ...] = ()) -> dict[str, Any]:
    """Call ``function`` (``"module:name"``, taking the request as a JSON string and printing its answer as one
    JSON line) in a new Python process (``env``: variables added to its environment; ``hide``: modules that do not
    import there, set to None in ``sys.modules`` before anything else); its answer, or ``{"status": "error",
    "error": ...}``."""
    module, name = function.split(":")
    hidden = "".join(f"sys.modules[{gone!r}] = None; " for gone in hide)
    code = f"import sys; {hidden}from {module} import {name}; {name}(sys.argv[1])"
    try:
        done = subprocess.run([sys.executable, "-c", code, json.dumps(request)], cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout, env=None if env is None else {**os.environ, **env})
    except subprocess.TimeoutExpired:
        return {"status": "error", "error": f"the fresh process took more than {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"status": "error", "error": (done.stderr or done.stdout)[-2000:]}
    answer: dict[str, Any] = json.loads(lines[-1])
    return answer


# --- the CPU-made estimates of a side process -------------------------------------------------------------------

ESTIMATES_ENV = "MEMLAB_GPU_ESTIMATES"
"""The prefix of the variables that point a section at a side process's estimates (:func:`estimates_variable`)."""


def gpu_kind_name(device_name: str | None) -> str | None:
    """memlab's name of the GPU kind torch calls ``device_name`` (for ``estimate(gpu=...)``), where this memlab
    knows that kind; else None."""
    from memlab.estimation.cuda.gpus import GPUS

    return next((name for name, kind in GPUS.items() if device_name and kind.device_name == device_name), None)


def estimates_variable(section: str) -> str:
    """The environment variable that names the file of ``section``'s CPU-made estimates.

    Example:
        >>> estimates_variable("estimate"), estimates_variable("loads")
        ('MEMLAB_GPU_ESTIMATES', 'MEMLAB_GPU_ESTIMATES_LOADS')
    """
    return ESTIMATES_ENV if section == "estimate" else f"{ESTIMATES_ENV}_{section.upper()}"


def start_side_estimates(section: str, size: str, device: str, gpu: str | None, folder: Path,
                         threads: int) -> tuple[subprocess.Popen[bytes], Path]:
    """Start :func:`estimate_all` for ``section`` at ``size`` in a process that sees no GPU
    (``CUDA_VISIBLE_DEVICES=""``, ``threads`` threads), writing into ``folder``: the process and the file it writes
    (its log beside it)."""
    out = folder / f"estimates-{section}.json"
    request = json.dumps({"section": section, "size": size, "device": device, "gpu": gpu, "out": str(out)})
    code = "import sys; from benchmarks.gpu_sections_estimate import estimate_all; estimate_all(sys.argv[1])"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": str(threads),
           "MKL_NUM_THREADS": str(threads)}
    with out.with_suffix(".log").open("wb") as log:
        # Niced: the GPU's process launches its kernels from the CPU, and its parts come first.
        process = subprocess.Popen([sys.executable, "-c", code, request], cwd=ROOT, env=env, stdout=log, stderr=log,
                                   preexec_fn=lambda: os.nice(10))  # noqa: PLW1509 - no threads started yet
    return process, out


def made_estimates(section: str, device: torch.device) -> tuple[dict[str, Any], str]:
    """The estimates a side process made for ``section`` (its file, named by :func:`estimates_variable`), and where
    they were made; none where there is no such file (the section then makes each one itself)."""
    path = os.environ.get(estimates_variable(section))
    if path and Path(path).exists():
        return json.loads(Path(path).read_text()), "a side process that saw no GPU (CUDA_VISIBLE_DEVICES='')"
    return {}, f"this process ({device.type})"
