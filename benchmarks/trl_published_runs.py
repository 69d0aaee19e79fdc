"""The GPU memory figures others published for TRL's GRPO and DPO steps, with the settings they ran: the rows
:mod:`benchmarks.trl_vs_published` estimates (``RUNS``) and those it cannot compare, with why (``NOT_EXPRESSED``).
Its docstring names each source and what its figure measures; every number here is quoted from them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

ALL_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
NF4_DQ = {"dtype": torch.bfloat16,
          "quantization_config": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                  "bnb_4bit_compute_dtype": torch.bfloat16, "bnb_4bit_use_double_quant": True}}
PROBE = ("jsboige/CoursIA MyIA.AI.Notebooks/GenAI/PostTraining/_measurements/vram_wall_probe.py (trl 1.12 "
         "GRPOTrainer, QLoRA nf4-dq r8 all-proj, 8 generations per device x 4 accumulation, bf16, checkpointing, "
         "beta 0, transformers generate)")
PROBE_DIFFERS = ("the probe's peak spans the trainer's construction and 3 steps, memlab's one steady step (its "
                 "compute_loss from the installed TRL, the log-probs through the logits over the vocabulary as "
                 "trl 1.12 computed them, the outputs in float32 as accelerate returns them); the prompt length "
                 "is assumed (11 tokens)")


def qwen3(hidden: int, intermediate: int, layers: int, heads: int, tied: bool) -> Callable[[], Any]:
    """A Qwen3 config as the Hub's ``config.json`` gives it: vocab 151,936, 8 KV heads of 128, rope 1e6."""

    def config() -> Any:
        from transformers import Qwen3Config

        return Qwen3Config(vocab_size=151_936, hidden_size=hidden, intermediate_size=intermediate,
                           num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=8, head_dim=128,
                           max_position_embeddings=40_960, rms_norm_eps=1e-6, tie_word_embeddings=tied,
                           rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})

    return config


def qwen25_7b() -> Any:
    """Qwen/Qwen2.5-7B's config: vocab 152,064, hidden 3,584, intermediate 18,944, 28 layers, 28 heads, 4 KV heads."""
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=152_064, hidden_size=3584, intermediate_size=18_944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=131_072,
                       rms_norm_eps=1e-6, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})


def tiny_qwen3() -> Any:
    """A two-layer Qwen3 for the smoke run."""
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0)


QWEN3 = {"Qwen3-1.7B": qwen3(2048, 6144, 28, 16, True), "Qwen3-4B": qwen3(2560, 9728, 36, 32, True),
         "Qwen3-8B": qwen3(4096, 12_288, 36, 32, False), "Qwen3-14B": qwen3(5120, 17_408, 40, 40, False)}


@dataclass(frozen=True)
class Run:
    """One published run: the step's settings, the GPU it ran on, and its allocated (and reserved) peak."""

    name: str
    model: str
    config: Callable[[], Any]
    gpu: str
    """The GPU kind memlab estimates for (its attention kernels; the published card where memlab knows it)."""
    card: str
    """The card the source ran on, as it names it."""
    published: float
    source: str
    kind: str = "grpo"
    unit: str = "GiB"
    published_reserved: float | None = None
    prompt_tokens: int = 11
    completion_tokens: int = 96
    per_device: int = 8
    accumulation: int = 4
    num_generations: int = 8
    beta: float = 0.0
    lora_rank: int = 8
    lora_alpha: int = 16
    lora_targets: tuple[str, ...] = ALL_PROJ
    load: dict[str, Any] = field(default_factory=lambda: dict(NF4_DQ))
    differs: str = PROBE_DIFFERS
    vague: str | None = None
    checkpointing: bool = True
    precision: str = "bf16"
    fused_lm_head: bool = False
    """Whether the source's TRL scores completions through the fused LM head (TRL after 1.12) or, as trl 1.12 and
    before, through the logits over the vocabulary (:func:`logits_log_probs`)."""
    measures: str = "allocated"
    """What ``published`` is: ``allocated`` (``max_memory_allocated``), ``reserved`` (``max_memory_reserved``) or
    ``card`` (what nvidia-smi shows: the reserve and the CUDA context); the ratio compares memlab's figure of that
    kind."""
    optimizer: str = "adamw"
    lora_dropout: float = 0.05

    def plan(self) -> Any:
        from memlab.plan import Plan

        adapter = "qlora" if "quantization_config" in self.load else "lora"
        return Plan(adapter=adapter, lora_rank=self.lora_rank, lora_alpha=self.lora_alpha,
                    lora_dropout=self.lora_dropout, lora_targets=self.lora_targets, checkpointing=self.checkpointing,
                    precision=self.precision, optimizer=self.optimizer)


def _probe(name: str, model: str, card: str, gpu: str, allocated: float, reserved: float, file: str,
           completion: int = 96, generations: int = 8) -> Run:
    return Run(name, model, QWEN3[model], gpu, card, allocated, f"{PROBE}, {file}", published_reserved=reserved,
               completion_tokens=completion, num_generations=generations)


# TRL's own notebook, GRPO with QLoRA on a free Colab T4 (examples/notebooks/grpo_trl_lora_qlora.ipynb, outputs from
# 2025-12, as at huggingface/trl 16b090302): Qwen/Qwen2-7B-Instruct (the shape of Qwen2.5-7B: vocab 152,064, hidden
# 3,584, 28 layers, 4 KV heads) from_pretrained(dtype="float32", attn_implementation="sdpa", BitsAndBytesConfig(nf4,
# double quant, fp16 compute)); LoraConfig(r=32, lora_alpha=32) on every projection; GRPOConfig(per_device_train_
# batch_size=8, num_generations=8, max_completion_length=256, optim="paged_adamw_8bit", use_liger_kernel=True,
# gradient_checkpointing=True, max_steps=500; beta 0.0 and bf16=True by default); transformers' generate; prompts from
# AI-MO/NuminaMath-TIR after a system prompt, in the chat template.
TRL_GRPO_NOTEBOOK = "huggingface/trl examples/notebooks/grpo_trl_lora_qlora.ipynb (trl 16b090302, 2025-12 run)"
TRL_GRPO_SETTINGS: dict[str, Any] = {
    "prompt_tokens": 256, "completion_tokens": 256, "per_device": 8, "accumulation": 1, "num_generations": 8,
    "beta": 0.0, "lora_rank": 32, "lora_alpha": 32, "lora_dropout": 0.0, "optimizer": "paged_adamw8bit",
    "fused_lm_head": True,
    "load": {"dtype": torch.float32, "quantization_config": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                                                             "bnb_4bit_compute_dtype": torch.float16,
                                                             "bnb_4bit_use_double_quant": True}}}
TRL_GRPO_DIFFERS = ("the run's peak spans the trainer's construction and 500 steps of real prompts, memlab's one step "
                    "at the prompt length assumed; Liger's fused GRPO loss is estimated as TRL's fused LM head (the "
                    "log-probs in chunks, no logits over the vocabulary); the notebook reserved 6.773 GiB after "
                    "loading, before training, under memlab's weights for this load (params, 7.50 GiB: the "
                    "embeddings and LM head in float32, 2.03 GiB each)")
TRL_GRPO_VAGUE = ("the prompts' length is not given (NuminaMath-TIR problems after a 67-word system prompt, not "
                  "truncated): assumed 256 tokens for the longest")
_3070 = "RTX 3070 Laptop 8GB"
RUNS = (
    _probe("Qwen3-1.7B GRPO QLoRA, 8 x (11+96)", "Qwen3-1.7B", _3070, "RTX4090-24GB", 2.744, 3.102,
           "vram_probe_results_2026-09-11.jsonl (torch 2.13.0+cu126)"),
    _probe("Qwen3-4B GRPO QLoRA, 8 x (11+96)", "Qwen3-4B", _3070, "RTX4090-24GB", 4.096, 5.0,
           "pull request #15640 (4.096 GiB allocated, 5.0 reserved)"),
    _probe("Qwen3-8B GRPO QLoRA, 8 x (11+96)", "Qwen3-8B", _3070, "RTX4090-24GB", 7.406, 8.172,
           "vram_probe_results_2026-09-11_8b.jsonl (torch 2.13.0+cu126)"),
    _probe("Qwen3-8B GRPO QLoRA, 8 x (11+96), 3080 Ti", "Qwen3-8B", "RTX 3080 Ti Laptop 16GB", "RTX4090-24GB", 7.85,
           8.6, "vram_probe_results_2026-10-06_8b_3080ti16.jsonl (torch 2.12.0+cu126)"),
    _probe("Qwen3-8B GRPO QLoRA, 8 x (11+160)", "Qwen3-8B", _3070, "RTX4090-24GB", 9.155, 10.184,
           "vram_probe_results_2026-09-22_envelope8b.jsonl (torch 2.6.0+cu124; past the card's 8 GB: the "
           "laptop's shared memory)", completion=160),
    _probe("Qwen3-8B GRPO QLoRA, 8 x (11+288)", "Qwen3-8B", _3070, "RTX4090-24GB", 11.773, 13.641,
           "vram_probe_results_2026-09-22_envelope8b.jsonl (torch 2.6.0+cu124; past the card's 8 GB: the "
           "laptop's shared memory)", completion=288),
    _probe("Qwen3-14B GRPO QLoRA, 8 x (11+96)", "Qwen3-14B", "RTX 4090", "RTX4090-24GB", 11.638, 12.512,
           "vram_probe_results_2026-10-06_9b14b_4090.jsonl (torch 2.13.0+cu126)"),
    _probe("Qwen3-14B GRPO QLoRA, 8 x (11+288)", "Qwen3-14B", "RTX 4090", "RTX4090-24GB", 15.73, 17.508,
           "vram_probe_results_2026-10-06_9b14b_4090.jsonl (torch 2.13.0+cu126)", completion=288),
    Run("Qwen2-7B-Instruct GRPO QLoRA r32, 8 x (256+256), T4", "Qwen2-7B-Instruct", qwen25_7b, "T4-16GB",
        "Tesla T4 (Colab)", 8.832, f"{TRL_GRPO_NOTEBOOK}: 'Peak reserved memory = 8.832 GB' (torch.cuda."
        "max_memory_reserved() / 2**30 after trainer.train(); 6.773 before it)", measures="reserved",
        **TRL_GRPO_SETTINGS, precision="fp16",
        differs=f"{TRL_GRPO_DIFFERS}; the run autocast in bf16 (GRPOConfig's default, bf16=True), which the T4 runs "
                "emulated, its attention on the math path: memlab refuses bf16 on a GPU without it (as its own "
                "trial there does) and the row is estimated in fp16, the same bytes but the memory-efficient "
                "attention kernel", vague=TRL_GRPO_VAGUE),
    Run("Qwen2-7B-Instruct GRPO QLoRA r32, 8 x (256+256), A100-40GB", "Qwen2-7B-Instruct", qwen25_7b, "A100-40GB",
        "A100-40GB", 9.6, f"{TRL_GRPO_NOTEBOOK}: its table's 'Best (all optimizations)' row, 'VRAM (A100-40GB)' 9.6 "
        "GB", unit="GiB", measures="card", **TRL_GRPO_SETTINGS, differs=TRL_GRPO_DIFFERS,
        vague=f"{TRL_GRPO_VAGUE}; what the table's VRAM is is not said: its T4 cell (9.2) is 0.37 over the T4's "
              "printed max_memory_reserved (8.832 GiB), as nvidia-smi (the reserve and the CUDA context) is; "
              "compared with memlab's card figure, in GiB as the notebook's prints are"),
    Run("Qwen2.5-7B DPO LoRA r16, 1 pair x 2048", "Qwen2.5-7B", qwen25_7b, "H100-80GB", "not given", 19.08,
        "odyn-network/benchmark-finetune-dpo-v1, quoting superkaiba/explore-persona-space issue #36 (TRL DPO LoRA, "
        "no precompute_ref_log_probs)", kind="dpo", unit="GB", prompt_tokens=0, completion_tokens=2048,
        per_device=1, accumulation=8, num_generations=1, beta=0.1, lora_rank=16, lora_alpha=32,
        lora_targets=("q_proj", "v_proj"), load={"dtype": torch.bfloat16},
        differs=("estimated as one step over chosen and rejected concatenated (2 rows of 2,048 tokens) through "
                 "the installed TRL's DPO loss (a stand-in DPOTrainer's compute_loss: the log-probs through its "
                 "fused LM head, then the reference forward with the adapters off, without gradients); the "
                 "source's TRL version is not given, and a TRL before the fused LM head held the logits over the "
                 "vocabulary"),
        vague=("the GPU, what was read (allocated, reserved or nvidia-smi), the LoRA alpha and targets and the "
               "prompt / completion split are not given: assumed max_memory_allocated, alpha 32 on q_proj and "
               "v_proj (peft's default for Qwen2), every pair at the full 2,048 tokens")),
)
"""The published runs memlab can express, each with its source."""

NOT_EXPRESSED = (
    {"run": "Qwen3.5-0.8B, Qwen3-2B and Qwen3.5-9B GRPO QLoRA (same probe)", "source": PROBE,
     "published": "2.938, 3.884 and 10.331 GiB allocated",
     "why": "no config of these models can be written out here from published sizes (Qwen3.5's layers are not "
            "Qwen3's, and no Qwen3-2B checkpoint is published), so their shapes would be guesses"},
    {"run": "Llama 3.1 8B GRPO, TRL + FA2, 20K context, 8 generations", "source": "unsloth.ai/blog/grpo (2025-02)",
     "published": "510.8 GB 'Total Memory Usage' (training 414, GRPO loss 78.3, inference 16, KV cache 2.5 GB)",
     "why": "a calculation, not a measurement: no GPU ran it, and the batch, LoRA settings and precision are not "
            "given"},
    {"run": "GRPO with Unsloth, 0.6B, 4-bit vs 16-bit, 4 vs 8 generations", "source": "unslothai/unsloth#1840",
     "published": "0.92 / 1.81 / 2.07 GiB max_memory_allocated",
     "why": "Unsloth's own kernels (its GRPO loss, offloaded checkpointing) replace TRL's step; the model, "
            "lengths and batch are not given"},
    {"run": "Qwen3-0.6B / 1.7B GRPO on an A100 80GB", "source": "huggingface/trl#3456",
     "published": "49,273 MiB and 78,147 MiB (nvidia-smi)",
     "why": "only batch 4, prompt 2,048 and completion 1,024 are given: num_generations, vLLM or not, "
            "precision and checkpointing are not, and nvidia-smi includes whatever vLLM reserved"},
    {"run": "GRPO on 1 vs 2 H20 with vLLM", "source": "huggingface/trl#2927",
     "published": "about 40 GB per GPU at the second step, then out of memory",
     "why": "vLLM's share (vllm_gpu_memory_utilization of the card) and multi-GPU training; memlab estimates a "
            "GRPO step on one device with transformers' generate"},
    {"run": "GRPO + vLLM on 8 x H100; colocated vLLM (ms-swift); long-context DPO (NeMo RL)",
     "source": "huggingface/trl#2688, modelscope/ms-swift#4594 and #9991, NVIDIA-NeMo/RL#2484",
     "published": "out-of-memory reports (figures not extracted here)",
     "why": "vLLM's engine share, ZeRO-3 over several GPUs, and NeMo RL's Megatron/DTensor policy are outside "
            "memlab's one-device TRL estimate; these threads report failures, not peaks with their settings"},
    {"run": "Qwen2.5-0.5B DPO QLoRA r64, prompts of about 1,000 tokens", "source": "huggingface/trl#5200",
     "published": "17 GB 'GPU mem'",
     "why": "checked for a faithful DPO row: trl 0.12, NF4 with fp16 compute, flash-attention 2 and LoRA on every "
            "projection are given, but not the GPU, the batch size, checkpointing or what was read (the title's "
            "17 GB reads as nvidia-smi)"},
    {"run": "Qwen2.5-0.5B and 1.5B DPO on an A100 80GB", "source": "huggingface/trl#3168",
     "published": "nvidia-smi screenshots (out of memory in fp32)",
     "why": "checked for a faithful DPO row: the figures are images of nvidia-smi (the whole process, the "
            "allocator's cache included) with DPOConfig's defaults; no allocated peak, and the lengths of the "
            "batches that ran are not given"},
    {"run": "Llama-3-8B LoRA DPO on an A10 24GB (LLaMA-Factory)", "source": "hiyouga/LlamaFactory#3716",
     "published": "no figure: a configuration said to run (batch 4, cutoff 1,024, fp16, LoRA on q/v)",
     "why": "checked for a faithful DPO row: LLaMA-Factory's own DPO step, and no memory was read"},
    {"run": "DPO memory tables (7B, LoRA / QLoRA)",
     "source": "theneuralbase.com/dpo, runlocalai.co (rlhf-dpo-ppo ch. 22), spheron.network DPO guide",
     "published": "about 18 GB and more for a 7B",
     "why": "checked for a faithful DPO row: calculations from the parameter count, not measurements"},
    {"run": "Qwen3-14B (unsloth bnb-4bit) SFT QLoRA r32 on a T4, 1 x 1,024 x 4 accumulation",
     "source": "huggingface/trl examples/notebooks/sft_trl_lora_qlora.ipynb (2025-12 run)",
     "published": "14.041 GiB max_memory_reserved (12.074 before training)",
     "why": "an SFT run (this benchmark estimates TRL's GRPO and DPO steps) with TRL's own activation_offloading "
            "(its saved-tensor hooks, not checked against memlab's offload='activations'), from a pre-quantized "
            "Unsloth checkpoint that keeps some layers unquantized (which ones its config says; nothing is "
            "downloaded here): 12.074 GiB reserved before training, where Qwen3-14B in NF4 is about 9"},
    {"run": "CohereLabs/tiny-aya-global SFT QLoRA r32 on an A100-40GB, 1 x 1,024 x 4 accumulation",
     "source": "huggingface/trl examples/notebooks/sft_tool_calling.ipynb",
     "published": "11.928 GiB max_memory_reserved (4.648 before training)",
     "why": "an SFT run with TRL's activation_offloading (as above), and memlab knows no config of tiny-aya-global "
            "by name (configs.KNOWN_SHAPES; nothing is downloaded here)"},
    {"run": "Ministral 3 VL SFT on a T4; Nemotron 3 SFT on an A100-80GB",
     "source": "huggingface/trl examples/notebooks/sft_ministral3_vl.ipynb, sft_nemotron_3.ipynb",
     "published": "13.881 GiB and 61.922 GiB max_memory_reserved",
     "why": "SFT runs of models whose configs memlab does not know by name (a VLM with its image processor, a hybrid "
            "Mamba-Transformer); their shapes would be guesses"},
    {"run": "Qwen2.5-7B DPO LoRA with precompute_ref_log_probs=True",
     "source": "odyn-network/benchmark-finetune-dpo-v1, quoting superkaiba/explore-persona-space issue #36",
     "published": "31.09 GB",
     "why": "its peak is the precompute pass, whose batch (precompute_ref_batch_size or the eval batch) the "
            "source does not give"},
)
"""Published figures memlab cannot be compared with, and why."""
