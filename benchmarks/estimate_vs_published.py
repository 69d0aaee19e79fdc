"""memlab's estimate against GPU runs that other projects published: would memlab have said "fits" where it ran?

Each row is a run someone else measured on a named GPU, with the settings they published. memlab estimates the same
step from the model's config alone (on fake tensors, on a machine without a GPU), with the load, adapters and GPU of
that run, and the result records:

- ``measures``: what the published peak is (``allocated``: ``torch.cuda.max_memory_allocated`` or the allocator's
  peak of active bytes; ``reserved``: ``max_memory_reserved``; ``nvidia-smi``: the card's used memory;
  ``allocated+context``: the allocated peak plus what nvidia-smi shows beyond PyTorch's reserve, the CUDA context),
  in the unit the source wrote (``published`` and ``unit``; ``published_gb`` is the same number in GB, 1e9 bytes);
- ``ratio``: memlab's figure of the same kind over the published peak (``memlab_gb``: the allocated peak, the
  modelled reserve, the card figure, or the allocated peak plus the modelled CUDA context), and ``allocated_ratio``
  (rows whose source measured the allocated peak only): memlab's allocated peak over the published one;
- ``reserved_over_allocated``: memlab's modelled reserve over its allocated peak;
- ``card``: memlab's card figure (reserve + the CUDA context of that GPU kind), and ``fits``: whether memlab's
  verdict on that GPU's whole memory is "fits", the fact being that the run did fit there;
- ``differs``: what the source's run does that memlab's estimate does not model.

Sources (every number below is quoted from them, nothing else is):

- litgpt's resource tables, ``tutorials/resource-tables.md`` in Lightning-AI/litgpt (last updated 2023-10-20,
  litgpt commit 8641822, NVIDIA A100-SXM4-40GB, PyTorch 2.1.0+cu121, bitsandbytes 0.41.1). All runs there are
  ``--precision bf16-true`` (pure bf16 weights), LoRA through ``finetune/lora.py`` on the Alpaca data set with its
  longest example (1,304 tokens for Llama 2); "Max GPU RAM" is what the script prints, ``max_memory_allocated`` in
  GB (1e9 bytes). litgpt's LoRA defaults then: rank 8, alpha 16, dropout 0.05, on the query and value projections.
  ``bnb.nf4-dq`` is NF4 with double quantization; litgpt quantizes every linear layer, its LM head included, where
  memlab's load keeps the head in bf16 as transformers' ``from_pretrained`` does (a 0.2 GB difference for Llama 2
  7B, on memlab's side). Inference rows are ``generate/base.py``: bf16 weights, a short prompt, 50 new tokens.
  bitsandbytes 0.41.1's ``MatMul4Bit`` kept each 4-bit layer's input for backward (0.43.2 stopped it, its changelog
  calling it a QLoRA memory bug): the QLoRA rows are estimated with that release modelled (``bitsandbytes``).
- optimum's GPTQ/bitsandbytes benchmark, ``tests/benchmark/README.md`` in huggingface/optimum at commit 3ffebf99
  (2023-08-28, "Add bitsandbytes benchmark (#1320)"; AutoGPTQ 0.4.2, PyTorch 2.0.1, bitsandbytes 0.41.1,
  transformers 4.32), one NVIDIA A100-SXM4-80GB, ``daryl149/llama-2-13b-chat-hf`` (Llama 2 13B) loaded with
  ``torch_dtype=torch.float16``, or for ``--bitsandbytes`` with ``BitsAndBytesConfig(load_in_4bit=True,
  bnb_4bit_quant_type="fp4", bnb_4bit_compute_dtype=torch.float16)``. ``benchmark_gptq.py`` there feeds random
  prompts of 512 tokens (attention mask all ones) to ``model.generate`` with ``min_new_tokens = max_new_tokens``:
  512 for the generation tables, 1 for ``--prefill``, greedy, ``use_cache=True``. Its "Peak memory (MB)" / "Max
  memory (MB)" is ``allocated_bytes.all.peak`` plus (the peak of ``nvidia-smi --query-gpu=memory.used``, polled
  every 0.1 s, less ``reserved_bytes.all.peak``), in MB of 1e6 bytes: the allocated peak plus the CUDA context and
  whatever else outside PyTorch's allocator holds memory.
- torchtune's README, pytorch/torchtune. (a) The "Optimization flags" table added in commit 1814feb17 (2024-11-18,
  "add flags to readme (#2003)"): ``full_finetune_single_device``, Llama 3.2 3B, batch size 2, max seq len 4096,
  bf16 (torchtune's ``dtype: bf16``: weights, gradients and AdamW state in bf16), "Hardware: A100"; each row adds
  one technique to the one above, so the "+ Packed Dataset" row is the baseline (no compile, the plain
  ``CrossEntropyLoss``, no activation checkpointing, no optimizer step in backward, no activation offloading and
  ``torch.optim.AdamW``, the 8-bit AdamW coming later) with every row packed to 4,096 tokens. Its figure is "Peak
  Memory Active (GiB)": ``memory_stats()["active_bytes.all.peak"] / 1024**3`` (``torchtune/training/memory.py``).
  60.0 GiB is more than an A100 40GB holds: the A100 80GB. (b) The memory table of commit 0217d44c2 (2024-05-09,
  "Update readme table (#955)"): 1 x RTX 4090, LoRA, Llama2-7B, "Batch Size = 4, Seq Length = 2048", config
  ``llama2/7B_lora_single_device`` (``lora_llama2_7b``: LoRA rank 8, alpha 16 on ``q_proj`` and ``v_proj``, the
  builder's dropout 0.05; ``dtype: bf16``, activation checkpointing on, ``torch.optim.AdamW``,
  ``torch.nn.CrossEntropyLoss``, ``compile: False``); "Peak Memory per GPU (GB)" does not say which of the three
  figures torchtune logs (allocated, reserved, active; GB = 1e9 bytes in ``torchtune/utils/memory.py`` then): it
  is taken as allocated, the figure that README calls "peak allocated memory" for its Llama 3 runs.
- bitsandbytes' optimizer benchmark, ``benchmarking/README.md`` and
  ``benchmarking/optimizer_benchmark_comprehensive.py`` in bitsandbytes-foundation/bitsandbytes at commit 1b7b9bb4
  (2026-03-31, pull request #1908, not merged into main): "NVIDIA A100 80GB", ``Qwen/Qwen3-0.6B`` built with
  ``AutoModelForCausalLM.from_config(config, dtype=torch.float32)`` (full fine-tuning in fp32, no autocast), batch
  2 x 128 random tokens, ``labels = input_ids``, ``lr=2e-4``, 3 warm-up and 10 timed steps of forward, backward,
  ``optimizer.step()``, ``zero_grad()``; "Peak GPU Memory" is ``max_memory_allocated()`` in MB of 1024**2 bytes
  (``fmt_mb``). ``torch.optim.AdamW`` with no ``fused``/``foreach`` argument runs the foreach update on CUDA.

Run from the repository root (no GPU needed; a few minutes on 2 cores, and about 8 minutes for each row that
generates 512 tokens)::

    python -m benchmarks.estimate_vs_published
    python -m benchmarks.estimate_vs_published --markdown benchmarks/results/estimate_vs_published-cpu.json  # README
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks import common
from memlab.estimation.dryrun.adapters import modelled_bitsandbytes
from memlab.plan import Plan

NAME = "estimate_vs_published"
GB = 1e9
GIB = 2**30
UNITS = {"GB": 1e9, "GiB": 2**30, "MB": 1e6, "MiB": 2**20}
"""The units sources write their peaks in, in bytes."""
MEASURES = ("allocated", "reserved", "nvidia-smi", "allocated+context", "allocated, managed memory out")
"""What a published peak can measure (see the module docstring)."""
LITGPT = ("Lightning-AI/litgpt tutorials/resource-tables.md (2023-10-20, commit 8641822): NVIDIA A100-SXM4-40GB, "
          "PyTorch 2.1.0, bitsandbytes 0.41.1, --precision bf16-true")
OPTIMUM = ("huggingface/optimum tests/benchmark/README.md (commit 3ffebf99, 2023-08-28): NVIDIA A100-SXM4-80GB, "
           "PyTorch 2.0.1, transformers 4.32, bitsandbytes 0.41.1, daryl149/llama-2-13b-chat-hf, prompt length 512")
TORCHTUNE_FLAGS = ("pytorch/torchtune README.md 'Optimization flags' (commit 1814feb17, 2024-11-18): "
                   "full_finetune_single_device, Llama 3.2 3B, batch size 2, max seq len 4096, bf16, A100")
TORCHTUNE_TABLE = ("pytorch/torchtune README.md memory table (commit 0217d44c2, 2024-05-09): 1 x RTX 4090, "
                   "config llama2/7B_lora_single_device, 'Batch Size = 4, Seq Length = 2048'")
BNB_OPTIM = ("bitsandbytes-foundation/bitsandbytes benchmarking/README.md '8-bit Optimizers' (commit 1b7b9bb4, "
             "2026-03-31, pull request #1908): NVIDIA A100 80GB, Qwen/Qwen3-0.6B fp32, batch 2 x 128")
NF4_DQ = {"torch_dtype": torch.bfloat16,
          "quantization_config": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                  "bnb_4bit_compute_dtype": torch.bfloat16, "bnb_4bit_use_double_quant": True}}
NF4 = {"torch_dtype": torch.bfloat16,
       "quantization_config": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                               "bnb_4bit_compute_dtype": torch.bfloat16, "bnb_4bit_use_double_quant": False}}
BF16 = {"torch_dtype": torch.bfloat16}
FP32 = {"torch_dtype": torch.float32}


def litgpt_plan() -> Plan:
    """litgpt's finetune/lora.py: LoRA r=8, alpha=16, dropout 0.05 on query and value, bf16-true."""
    return Plan(weights="bf16", adapter="lora", lora_rank=8, lora_alpha=16, lora_dropout=0.05,
                lora_targets=("q_proj", "v_proj"))


def litgpt_inference(four_bit: bool) -> Any:
    """litgpt's generate/base.py: bf16 weights (NF4 with double quantization for bnb.nf4-dq), 50 new tokens."""
    from memlab.plan import InferencePlan

    return InferencePlan(weights="bf16", quantize="nf4" if four_bit else "none", new_tokens=50)


def optimum_generate(new_tokens: int, four_bit: bool = False) -> Callable[[], Any]:
    """benchmark_gptq.py: fp16 weights (4-bit for --bitsandbytes, fp16 compute), greedy ``generate`` with the cache."""

    def plan() -> Any:
        from memlab.plan import InferencePlan

        return InferencePlan(weights="fp16", quantize="nf4" if four_bit else "none", new_tokens=new_tokens)

    return plan


def llama32_3b() -> Any:
    """Llama 3.2 3B as torchtune's ``llama3_2_3b()`` builds it (1814feb17): vocab 128,256, 28 layers, 24 heads, 8
    KV heads, embed dim 3,072, intermediate dim 8,192, norm eps 1e-5, rope base 500,000 with Llama 3 scaling
    (factor 32), output tied to the embedding."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=128_256, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                       num_attention_heads=24, num_key_value_heads=8, max_position_embeddings=131_072,
                       rms_norm_eps=1e-5, tie_word_embeddings=True,
                       rope_parameters={"rope_type": "llama3", "rope_theta": 500_000.0, "factor": 32.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 8192})


def qwen3_06b() -> Any:
    """Qwen/Qwen3-0.6B's config: vocab 151,936, hidden 1,024, intermediate 3,072, 28 layers, 16 heads of 128, 8 KV
    heads, tied embeddings (596,049,920 parameters: 2,273.8 MiB in fp32, the "Model Memory" bitsandbytes reports
    as 2274.3 MB with the allocator's rounding)."""
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=151_936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40_960,
                       rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})


@dataclass(frozen=True)
class Run:
    """One published run: what ran, where, the peak its authors measured (in their unit, of which kind), and
    where they said so."""

    name: str
    model: str
    gpu: str
    published: float
    source: str
    unit: str = "GB"
    measures: str = "allocated"
    rows: int = 1
    tokens: int = 1304
    config: Callable[[], Any] | None = None
    plan_of: Callable[[], Any] = litgpt_plan
    load: dict[str, Any] | None = field(default_factory=lambda: dict(BF16))
    inference: bool = False
    four_bit: bool = False
    differs: str = ""
    bitsandbytes: str | None = None
    """The bitsandbytes release the run used, where it changes what memlab estimates (its 4-bit layers kept their
    inputs for backward before 0.43.2): the estimate models it (``modelled_bitsandbytes``)."""

    def __post_init__(self) -> None:
        if self.unit not in UNITS or self.measures not in MEASURES:
            raise ValueError(f"{self.name}: unit {self.unit!r} or measures {self.measures!r} is not known")

    @property
    def published_bytes(self) -> float:
        return self.published * UNITS[self.unit]

    def plan(self) -> Any:
        return self.plan_of()

    def batch(self) -> dict[str, tuple[int, int]]:
        if self.inference:
            return {"input_ids": (self.rows, self.tokens)}
        return {"input_ids": (self.rows, self.tokens), "labels": (self.rows, self.tokens)}


_TABLE = f"{LITGPT}, 'Finetuning with LoRA on 1 GPU'"
_INFERENCE = f"{LITGPT}, 'Single-GPU Inference'"
_LITGPT_4BIT: dict[str, Any] = dict(load=NF4_DQ, four_bit=True, bitsandbytes="0.41.1")
_LITGPT_INFERENCE: dict[str, Any] = dict(tokens=6, inference=True, load=None)
_OPTIMUM: dict[str, Any] = dict(model="llama-13b", gpu="A100-80GB", unit="MB", measures="allocated+context", tokens=512,
                inference=True, load=None)
_TRANSFORMERS_432 = ("transformers 4.32's Llama: eager attention (fp16 scores and an fp32 softmax per layer), the "
                     "LM head on every prompt position cast to fp32 (logits.float()), and a cache of per-layer "
                     "tuples grown by torch.cat, the previous step's tuple alive until the forward returns; memlab "
                     "estimates today's transformers (SDPA, logits of the last position only in generate, "
                     "DynamicCache grown layer by layer)")
_FP4 = ("bitsandbytes FP4 without double quantization (fp32 absmax per 64 weights), estimated as memlab's only 4-bit "
        "inference form, NF4 with double quantization (8-bit absmax): about 0.6 GB less for 13B's linear weights")
_BNB_OPTIM: dict[str, Any] = dict(model="Qwen3-0.6B", gpu="A100-80GB", unit="MiB", rows=2, tokens=128,
                                  config=qwen3_06b, load=FP32)
RUNS = (
    Run("Llama 2 7B LoRA, bf16, micro-batch 1", "llama-7b", "A100-40GB", 21.30, _TABLE),
    Run("Llama 2 7B LoRA, bf16, micro-batch 2", "llama-7b", "A100-40GB", 29.07, _TABLE, rows=2),
    Run("Llama 2 7B QLoRA (bnb.nf4), micro-batch 1", "llama-7b", "A100-40GB", 14.14, _TABLE, load=NF4,
        four_bit=True, bitsandbytes="0.41.1"),
    Run("Llama 2 7B QLoRA (bnb.nf4-dq), micro-batch 1", "llama-7b", "A100-40GB", 13.84, _TABLE, **_LITGPT_4BIT),
    Run("Llama 2 13B LoRA, bf16, micro-batch 1", "llama-13b", "A100-40GB", 38.12, _TABLE),
    Run("Llama 2 13B QLoRA (bnb.nf4-dq), micro-batch 1", "llama-13b", "A100-40GB", 22.55, _TABLE, **_LITGPT_4BIT),
    Run("Llama 2 7B inference, bf16", "llama-7b", "A100-40GB", 13.52, _INFERENCE,
        plan_of=lambda: litgpt_inference(False), **_LITGPT_INFERENCE),
    Run("Llama 2 13B inference, bf16", "llama-13b", "A100-40GB", 26.21, _INFERENCE,
        plan_of=lambda: litgpt_inference(False), **_LITGPT_INFERENCE),
    Run("Llama 2 7B inference, bnb.nf4-dq", "llama-7b", "A100-40GB", 4.26, _INFERENCE,
        plan_of=lambda: litgpt_inference(True), four_bit=True, **_LITGPT_INFERENCE),
    Run("Llama 2 13B inference, bnb.nf4-dq", "llama-13b", "A100-40GB", 7.72, _INFERENCE,
        plan_of=lambda: litgpt_inference(True), four_bit=True, **_LITGPT_INFERENCE),
    Run("Llama 2 13B prefill, fp16, batch 1", published=27999.54, rows=1,
        source=f"{OPTIMUM}, 'Prefill-only benchmark results', batch size 1, quantization None",
        plan_of=optimum_generate(1), differs=_TRANSFORMERS_432, **_OPTIMUM),
    Run("Llama 2 13B prefill, fp16, batch 16", published=35871.88, rows=16,
        source=f"{OPTIMUM}, 'Prefill-only benchmark results', batch size 16, quantization None",
        plan_of=optimum_generate(1), differs=_TRANSFORMERS_432, **_OPTIMUM),
    Run("Llama 2 13B prefill, bnb fp4, batch 1", published=9952.65, rows=1, four_bit=True,
        source=f"{OPTIMUM}, 'Prefill-only benchmark results', batch size 1, quantization bitsandbytes",
        plan_of=optimum_generate(1, four_bit=True), differs=f"{_FP4}; {_TRANSFORMERS_432}", **_OPTIMUM),
    Run("Llama 2 13B prefill, bnb fp4, batch 16", published=17737.95, rows=16, four_bit=True,
        source=f"{OPTIMUM}, 'Prefill-only benchmark results', batch size 16, quantization bitsandbytes",
        plan_of=optimum_generate(1, four_bit=True), differs=f"{_FP4}; {_TRANSFORMERS_432}", **_OPTIMUM),
    Run("Llama 2 13B generate 512 tokens, fp16, batch 1", published=29152.98, rows=1,
        source=f"{OPTIMUM}, 'Generation benchmark results', batch size 1, quantization None, 512 new tokens",
        plan_of=optimum_generate(512), differs=_TRANSFORMERS_432, **_OPTIMUM),
    Run("Llama 2 13B generate 512 tokens, fp16, batch 16", published=53986.51, rows=16,
        source=f"{OPTIMUM}, 'Generation benchmark results', batch size 16, quantization None, 512 new tokens",
        plan_of=optimum_generate(512), differs=_TRANSFORMERS_432, **_OPTIMUM),
    Run("Llama 3.2 3B full fine-tune, bf16, packed 2x4096", "Llama 3.2 3B", "A100-80GB", 60.0,
        f"{TORCHTUNE_FLAGS}, row '+ Packed Dataset'", unit="GiB", rows=2, tokens=4096, config=llama32_3b,
        plan_of=lambda: Plan(weights="bf16", optimizer="adamw_foreach"),
        differs=("torchtune's own TransformerDecoder (not transformers' LlamaForCausalLM): its output cast to fp32 "
                 "(self.output(h).float()); packed samples attend through a block-causal mask (flex attention), "
                 "memlab's through one causal mask")),
    Run("Llama 2 7B LoRA, bf16, batch 4x2048, checkpointing", "llama-7b", "RTX4090-24GB", 21.3,
        f"{TORCHTUNE_TABLE}, row '1 x RTX 4090 | LoRA'", rows=4, tokens=2048,
        plan_of=lambda: Plan(weights="bf16", adapter="lora", lora_rank=8, lora_alpha=16, lora_dropout=0.05,
                             lora_targets=("q_proj", "v_proj"), checkpointing=True, optimizer="adamw_foreach"),
        differs=("torchtune's own TransformerDecoder and LoRALinear (not transformers + peft); its recipe casts the "
                 "logits to fp32 in the model (self.output(h).float()), then slices them with "
                 "logits[..., :-1, :].contiguous(), another fp32 copy; the README does not say whether its figure "
                 "is allocated, reserved or active memory")),
    Run("Qwen3 0.6B full fine-tune, fp32, torch AdamW", published=11609.8,
        source=f"{BNB_OPTIM}, 'Peak GPU Memory', PyTorch AdamW",
        plan_of=lambda: Plan(optimizer="adamw_foreach"), **_BNB_OPTIM),
    Run("Qwen3 0.6B full fine-tune, fp32, bnb AdamW8bit", published=7135.6,
        source=f"{BNB_OPTIM}, 'Peak GPU Memory', AdamW8bit",
        plan_of=lambda: Plan(optimizer="adamw8bit"), **_BNB_OPTIM),
    Run("Qwen3 0.6B full fine-tune, fp32, bnb PagedAdamW8bit", published=5983.6,
        source=f"{BNB_OPTIM}, 'Peak GPU Memory', PagedAdamW8bit",
        plan_of=lambda: Plan(optimizer="paged_adamw8bit"), measures="allocated, managed memory out",
        differs=("bitsandbytes' paged state is CUDA managed memory (cudaMallocManaged), outside PyTorch's "
                 "allocator, so max_memory_allocated leaves it out (the README's 'Optimizer State on GPU': 18.6 MB); "
                 "memlab's peak counts paged_adamw8bit's state on the device, where it stays until the GPU runs "
                 "short, and is compared here without it"),
        **_BNB_OPTIM),
)
"""The published runs, each with its source."""


def estimate_run(run: Run) -> dict[str, Any]:
    """memlab's estimate of one published run, on its GPU kind, judged against that GPU's whole memory."""
    import memlab
    from memlab.estimation.cuda.gpus import gpu_kind

    kind = gpu_kind(run.gpu)
    capacity = _capacity(run.gpu)
    plan = run.plan()
    model = run.config() if run.config is not None else run.model
    started = time.perf_counter()
    load = None if run.inference else run.load
    library = modelled_bitsandbytes(run.bitsandbytes) if run.bitsandbytes else contextlib.nullcontext()
    with library:
        trial = memlab.estimate(model, run.batch(), plan, gpu=kind.name, budget=capacity, load=load)
    seconds = time.perf_counter() - started
    published = run.published_bytes
    compared = memlab_figure(trial, run.measures)
    return {
        "run": run.name,
        "model": run.model,
        "gpu": run.gpu,
        "batch": f"{run.rows}x{run.tokens}",
        "plan": plan.label(),
        "load": trial_load(trial),
        "published": run.published,
        "unit": run.unit,
        "measures": run.measures,
        "published_gb": common.rounded(published / GB, 3),
        "source": run.source,
        "differs": run.differs or None,
        "bitsandbytes_modelled": run.bitsandbytes,
        "status": trial.status,
        "memlab_gb": common.rounded(compared / GB, 3),
        "ratio": common.rounded(compared / published, 3),
        "allocated_gb": common.rounded(trial.peak_bytes / GB, 3),
        "allocated_ratio": common.rounded(trial.peak_bytes / published, 3) if run.measures == "allocated" else None,
        "reserved_gb": common.rounded((trial.reserved_bytes or 0) / GB, 3),
        "reserved_over_allocated": common.rounded((trial.reserved_bytes or 0) / trial.peak_bytes, 3),
        "card_gb": common.rounded((trial.card_bytes or 0) / GB, 3),
        "capacity_gb": common.rounded(capacity / GB, 3),
        "fits": bool(trial.fits),
        "ran_on_that_gpu": True,
        "verdict_matches": bool(trial.fits),
        "within": 0.15 if run.four_bit else 0.08,
        "seconds": common.rounded(seconds, 1),
        "notes": list(trial.notes),
    }


def memlab_figure(trial: Any, measures: str) -> float:
    """memlab's figure of the kind the published peak ``measures``: the allocated peak, the modelled reserve, the
    card figure (reserve + CUDA context), or the allocated peak plus the modelled CUDA context.

    Example:
        >>> from types import SimpleNamespace
        >>> trial = SimpleNamespace(peak_bytes=10, reserved_bytes=12, card_bytes=15, breakdown={"optimizer": 4})
        >>> [memlab_figure(trial, m) for m in MEASURES]
        [10, 12, 15, 13, 6]
    """
    reserved = trial.reserved_bytes or 0
    card = trial.card_bytes or 0
    return {
        "allocated": trial.peak_bytes,
        "reserved": reserved,
        "nvidia-smi": card,
        "allocated+context": trial.peak_bytes + (card - reserved),
        # A paged optimizer's state is CUDA managed memory, which max_memory_allocated does not count.
        "allocated, managed memory out": trial.peak_bytes - trial.breakdown.get("optimizer", 0),
    }[measures]


def trial_load(trial: Any) -> str | None:
    """The load the estimate's notes name."""
    return next((note for note in trial.notes if note.startswith("weights materialised as")), None)


def _capacity(gpu: str) -> int:
    """The GPU kind's whole memory, as memlab knows it (``GpuKind.memory_bytes``: nvidia-smi's memory.total, the
    H100's torch's ``total_memory``)."""
    from memlab.estimation.cuda.gpus import gpu_kind

    return gpu_kind(gpu).memory_bytes


def markdown(rows: list[dict[str, Any]]) -> str:
    """The README's table of the rows: the source's repository, what its figure measures, memlab's figure of that
    kind and the ratio, the reserve over the allocated peak, the card figure and memlab's verdict on that GPU."""
    return common.markdown_table(
        ["run", "GPU", "source", "published", "measures", "memlab", "ratio", "reserve / allocated", "card GB",
         "memlab: fits"],
        [[r["run"], r["gpu"], r["source"].split(" ")[0], f"{r['published']} {r['unit']}", r["measures"],
          f"{r['memlab_gb']} GB", r["ratio"], r["reserved_over_allocated"], r["card_gb"],
          "yes" if r["fits"] else "NO"] for r in rows],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="run the rows whose name contains this text")
    parser.add_argument("--out", default=None, help="where to write the JSON (default: benchmarks/results/)")
    parser.add_argument("--markdown", default=None, metavar="JSON",
                        help="print the README's table of a results file, estimating nothing")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())["rows"]))
        return 0
    common.quiet()
    device = torch.device("cpu")
    rows = [estimate_run(run) for run in RUNS if args.only is None or args.only in run.name]
    for row in rows:
        print(f"{row['run']}: {row['measures']} {row['memlab_gb']} GB ({row['ratio']} of {row['published']} "
              f"{row['unit']}), allocated {row['allocated_gb']} GB, reserved {row['reserved_gb']} GB, card "
              f"{row['card_gb']} GB, fits {row['fits']} ({row['seconds']} s)")
    payload = {
        **common.metadata_for(NAME, device, "published"),
        "what": "memlab.estimate of runs other projects published, made on this CPU for the GPU each ran on",
        "rows": rows,
        "all_within": all(abs(r["ratio"] - 1) <= r["within"] for r in rows),
        "all_reserved_within_1_25": all(r["reserved_over_allocated"] <= 1.25 for r in rows),
        "all_verdicts_match": all(r["verdict_matches"] for r in rows),
        "outside": [r["run"] for r in rows if abs(r["ratio"] - 1) > r["within"]],
    }
    print(markdown(rows))
    if args.only is None:
        path = Path(args.out) if args.out else common.RESULTS_DIR / f"{NAME}-cpu.json"
        common.write_json(payload, path)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
