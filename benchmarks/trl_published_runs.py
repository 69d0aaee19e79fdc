"""The GPU memory figures others published for TRL's GRPO, DPO and SFT steps, with the settings they ran: the rows
:mod:`benchmarks.trl_vs_published` estimates (``RUNS``) and those it cannot compare, with why (``NOT_EXPRESSED``).
Its docstring names each source and what its figure measures; every number here is quoted from them, and each row's
trainer is built with the keywords its source wrote (``load``: ``from_pretrained``'s, ``lora``: ``LoraConfig``'s,
``settings``: ``GRPOConfig``'s, ``DPOConfig``'s or ``SFTConfig``'s).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

ALL_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
NF4_DQ_BF16 = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": torch.bfloat16,
               "bnb_4bit_use_double_quant": True}
NF4_DQ_FP16 = {**NF4_DQ_BF16, "bnb_4bit_compute_dtype": torch.float16}
PROBE_AT = "jsboige/CoursIA MyIA.AI.Notebooks/GenAI/PostTraining/_measurements/vram_wall_probe.py"
PROBE_RECIPE = ("GRPOTrainer, QLoRA nf4-dq r8 all-proj, 8 generations per device x 4 accumulation, bf16, "
                "checkpointing, beta 0, transformers generate")
PROBE = f"{PROBE_AT} (trl 1.12 {PROBE_RECIPE})"
PROBE_192 = f"{PROBE_AT} (trl 1.9.2 {PROBE_RECIPE})"
PROBE_DIFFERS = ("the probe's peak spans the trainer's construction and 3 steps, memlab's one steady step; built "
                 "with the installed TRL (1.16) as the probe built it, its log-probs through the logits over the "
                 "vocabulary as trl 1.12 computed them (TRL 1.16 adds a fused LM head); the prompt length is "
                 "assumed (11 tokens)")
PROBE_DIFFERS_192 = PROBE_DIFFERS.replace(
    "as trl 1.12 computed them", "as trl 1.9.2 computed them (the logits divided by the temperature in place)")
PROBE_LOAD = {"dtype": torch.bfloat16, "quantization_config": NF4_DQ_BF16}
"""The probe's ``from_pretrained(model_id, quantization_config=bnb, device_map={"": 0})``: no dtype, so
transformers 5's default (``"auto"``: the checkpoint's bf16) for what is not quantized."""
PROBE_LORA = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.05, "bias": "none", "target_modules": list(ALL_PROJ)}
PROBE_SETTINGS: dict[str, Any] = {"num_generations": 8, "beta": 0.0, "per_device_train_batch_size": 8,
                                  "gradient_accumulation_steps": 4, "learning_rate": 5e-6, "max_steps": 3,
                                  "max_completion_length": 96, "seed": 0, "bf16": True,
                                  "gradient_checkpointing": True}


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


def qwen2_7b_instruct() -> Any:
    """Qwen/Qwen2-7B-Instruct's config: Qwen2.5-7B's shape with 32,768 positions, bos 151,643, eos 151,645."""
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=152_064, hidden_size=3584, intermediate_size=18_944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32_768,
                       rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=151_643, eos_token_id=151_645,
                       rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})


def tiny_aya_global() -> Any:
    """CohereLabs/tiny-aya-global's config (a Cohere2 shape), as rasbt/LLMs-from-scratch@50be26871e06
    ``ch05/15_tiny-aya/standalone-tiny-aya.ipynb`` writes it out (``TINY_AYA_CONFIG``, whose 3,349,227,520 parameters
    this config has too): hidden 2,048, intermediate 11,008, 36 layers (three sliding-window ones of 4,096 to each
    full one), 16 heads, 4 KV heads of 128, vocab 262,144, tied embeddings, rope 50,000. Its maximum position (500,000
    or 8,192) sizes no tensor: Cohere2's rotary embedding holds the inverse frequencies only."""
    from transformers import Cohere2Config

    return Cohere2Config(vocab_size=262_144, hidden_size=2048, intermediate_size=11_008, num_hidden_layers=36,
                         num_attention_heads=16, num_key_value_heads=4, sliding_window=4096,
                         layer_types=(["sliding_attention"] * 3 + ["full_attention"]) * 9, layer_norm_eps=1e-5,
                         logit_scale=1.0, tie_word_embeddings=True, attention_bias=False, bos_token_id=2,
                         eos_token_id=3, pad_token_id=0, max_position_embeddings=500_000,
                         rope_parameters={"rope_type": "default", "rope_theta": 50_000.0})


NEMOTRON_3_NANO_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
"""Nemotron 3 Nano 30B-A3B's 52 layers: 23 Mamba-2 (M), 23 MoE (E) and 6 attention (*)."""


def nemotron_3_nano_30b() -> Any:
    """nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16's config.json, as jax-ml/jax-llm-examples@8b4b24602e06
    ``nemotron3/tests/test_model.py`` copies it whole (``NEMOTRON3_30B_JSON``): hidden 2,688, the 52 layers of
    :data:`NEMOTRON_3_NANO_PATTERN`, Mamba-2 with 64 heads of 64 and a state of 128, 32 attention heads and 2 KV
    heads of 128, 128 routed experts of 1,856 (6 a token) and a shared one of 3,712, relu2, vocab 131,072, untied;
    31,577,937,344 parameters. Attention is ``eager``, as the notebook's ``from_pretrained`` asks."""
    from transformers import NemotronHConfig

    return NemotronHConfig(
        hidden_size=2688, hybrid_override_pattern=NEMOTRON_3_NANO_PATTERN, num_hidden_layers=52, mamba_num_heads=64,
        mamba_head_dim=64, ssm_state_size=128, n_groups=8, conv_kernel=4, expand=2, chunk_size=128,
        num_attention_heads=32, num_key_value_heads=2, head_dim=128, intermediate_size=1856,
        moe_intermediate_size=1856, moe_shared_expert_intermediate_size=3712, n_routed_experts=128,
        n_shared_experts=1, num_experts_per_tok=6, n_group=1, topk_group=1, norm_topk_prob=True,
        routed_scaling_factor=2.5, mlp_hidden_act="relu2", vocab_size=131_072, tie_word_embeddings=False,
        layer_norm_epsilon=1e-5, residual_in_fp32=False, max_position_embeddings=262_144,
        mamba_ssm_cache_dtype="float32", use_conv_bias=True, mamba_proj_bias=False, time_step_min=0.001,
        time_step_max=0.1, time_step_floor=1e-4, rope_theta=10_000, attn_implementation="eager")


def tiny_qwen3() -> Any:
    """A two-layer Qwen3 for the smoke run."""
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0)


QWEN3 = {"Qwen3-1.7B": qwen3(2048, 6144, 28, 16, True), "Qwen3-4B": qwen3(2560, 9728, 36, 32, True),
         "Qwen3-8B": qwen3(4096, 12_288, 36, 32, False), "Qwen3-14B": qwen3(5120, 17_408, 40, 40, False)}

LOSSES = {
    "trl": "the installed TRL's compute_loss (its fused LM head)",
    "logits": "the installed TRL's compute_loss, its log-probs through the logits over the vocabulary in float32 as "
              "trl 1.12 computed them (its code, copied: benchmarks.trl_vs_published.logits_log_probs)",
    "logits-1.9.2": "the installed TRL's compute_loss, its log-probs through the logits over the vocabulary in float32 "
                    "as trl 1.9.2 computed them: trl 1.12's code but for logits.div_(self.temperature), the division "
                    "in place on a view of the model's output (huggingface/trl#5254; trl 1.10 divides into a new "
                    "tensor again, #6554), whose backward's CopySlices holds a float32 gradient the size of that "
                    "output besides the slice's (huggingface/trl#6553): one more copy of the logits than trl 1.12's "
                    "(benchmarks.trl_vs_published.logits_log_probs with in_place=True)",
    "liger-0.26.2": "TRL 0.26.2's compute_liger_loss (the backbone's hidden states into Liger's "
                    "LigerFusedLinearGRPOLoss with the LM head's weight, outside the model's autocast as TRL "
                    "0.26.2's _ForwardRedirection calls it) on the installed TRL's GRPOTrainer",
    "sft-logits": "TRL 0.28 and 0.29's SFTTrainer.compute_loss on the installed TRL's SFTTrainer: the model's own loss "
                  "over the logits (transformers' ForCausalLMLoss, in float32), then the entropy (in chunks of 128 "
                  "rows) and the argmax token accuracy from the same logits without gradients; TRL 1.16 scores the "
                  "tokens through a fused LM head that never holds the logits "
                  "(benchmarks.trl_vs_published.logits_sft_trainer)",
}
"""How a row's loss is computed: the installed TRL's own, or the source's TRL's as copied here."""


@dataclass(frozen=True)
class Run:
    """One published run: the trainer its source built (model, load, LoRA, the TRL config's keywords), the GPU it
    ran on, and its published peak."""

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
    """The TRL trainer built: ``grpo``, ``dpo`` or ``sft``."""
    unit: str = "GiB"
    published_reserved: float | None = None
    prompt_tokens: int = 11
    """The prompts' length in tokens (the dataset's longest, as memlab picks the costliest batch): assumed."""
    completion_tokens: int = 96
    """GRPO: ``max_completion_length``; DPO: the chosen and rejected answers' tokens; SFT: each row's tokens (plain
    text, the data set's longest as the trainer cuts it at ``max_length``)."""
    load: dict[str, Any] = field(default_factory=lambda: dict(PROBE_LOAD))
    lora: dict[str, Any] = field(default_factory=lambda: dict(PROBE_LORA))
    settings: dict[str, Any] = field(default_factory=lambda: dict(PROBE_SETTINGS))
    loss: str = "logits"
    """A key of :data:`LOSSES`."""
    liger: str | None = None
    """The liger-kernel release the source ran, where its loss is Liger's and it is not the installed one: the row
    is estimated in a process of its own with that release first on the path."""
    prompt_range: tuple[int, ...] = ()
    """Other prompt lengths the row is estimated at too, where the prompts' length is a guess: how much it moves."""
    differs: str = PROBE_DIFFERS
    vague: str | None = None
    measures: str = "allocated"
    """What ``published`` is: ``allocated`` (``max_memory_allocated``), ``reserved`` (``max_memory_reserved``) or
    ``card`` (what nvidia-smi shows: the reserve and the CUDA context); the ratio compares memlab's figure of that
    kind (a reserve less the paged optimizer state that lives outside it)."""

    @property
    def optim(self) -> str:
        return str(self.settings.get("optim", "adamw_torch_fused"))


PROBE_0911 = (
    "; this campaign (2026-09-11, the 3070 Laptop, torch 2.13) ran trl 1.12 (pull request #15634: 'le venv porte "
    "trl 1.12'), which divides the logits by the temperature into a new tensor; the later campaigns ran trl 1.9.2 "
    "(2026-09-22: pull request #17366), whose in-place division holds one more float32 copy of the logits in "
    "backward: the same 8B settings measured 7.406 GiB here, 7.85 on 2026-09-22 and 2026-10-06 (0.444 GiB more, "
    "8 x 97 x 151,936 x 4 bytes being 0.439)")
PROBE_0922 = (
    "; this campaign (2026-09-22, the 3070 Laptop, torch 2.6) ran trl 1.9.2 (pull request #17366: 'torch "
    "2.6.0+cu124, trl 1.9.2 vérifié'), which divides the logits by the temperature in place")
PROBE_1006 = (
    "; this campaign's TRL (2026-10-06) is not recorded (its jsonl records torch only): trl 1.9.2 assumed, as on "
    "2026-09-22, whose figures its 3080 Ti run reproduced to the last digit at 160 and 288 tokens (9.155 and 11.773 "
    "GiB, under torch 2.12 where 2026-09-22 ran 2.6); with trl 1.12's division (the 'logits' loss) the row is one "
    "float32 copy of the logits lower")


def _probe(name: str, model: str, card: str, gpu: str, allocated: float, reserved: float, file: str,
           completion: int = 96, campaign: str = "", trl: str = "1.12") -> Run:
    """A row of the probe run under ``trl`` (1.12 or 1.9.2): its source, its log-probs (:data:`LOSSES`) and what
    differs said for that release."""
    source, loss, differs = (PROBE, "logits", PROBE_DIFFERS) if trl == "1.12" else (
        PROBE_192, "logits-1.9.2", PROBE_DIFFERS_192)
    return Run(name, model, QWEN3[model], gpu, card, allocated, f"{source}, {file}", published_reserved=reserved,
               completion_tokens=completion, settings={**PROBE_SETTINGS, "max_completion_length": completion},
               loss=loss, differs=differs + campaign)


# TRL's own notebook, GRPO with QLoRA on a free Colab T4 (examples/notebooks/grpo_trl_lora_qlora.ipynb as added by
# huggingface/trl c9a9e25, PR #4660, its outputs from a run of 2025-12-19: trl 0.26.2 and liger-kernel 0.6.4, the
# latest of each that day): Qwen/Qwen2-7B-Instruct from_pretrained(attn_implementation="sdpa", dtype=torch.float16,
# BitsAndBytesConfig(load_in_4bit, fp16 compute, double quant, nf4)); LoraConfig(r=32, lora_alpha=32) on every
# projection; GRPOConfig(learning_rate=2e-5, max_steps=500, per_device_train_batch_size=8,
# max_completion_length=256, num_generations=8, optim="paged_adamw_8bit", use_liger_kernel=True,
# gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False}; beta 0.0 and bf16=True by
# TRL's defaults); transformers' generate; prompts from AI-MO/NuminaMath-TIR after a system prompt, in the chat
# template.
TRL_GRPO_NOTEBOOK = ("huggingface/trl examples/notebooks/grpo_trl_lora_qlora.ipynb (c9a9e25, PR #4660; run "
                     "2025-12-19: trl 0.26.2, liger-kernel 0.6.4)")
TRL_GRPO_SETTINGS: dict[str, Any] = {
    "learning_rate": 2e-5, "max_steps": 500, "per_device_train_batch_size": 8, "max_completion_length": 256,
    "num_generations": 8, "optim": "paged_adamw_8bit", "use_liger_kernel": True, "gradient_checkpointing": True,
    "gradient_checkpointing_kwargs": {"use_reentrant": False}, "log_completions": False}
TRL_GRPO_PROMPT = 256
TRL_GRPO_ROW: dict[str, Any] = {
    "prompt_tokens": TRL_GRPO_PROMPT, "completion_tokens": 256, "settings": TRL_GRPO_SETTINGS,
    "load": {"dtype": torch.float16, "quantization_config": NF4_DQ_FP16},
    "lora": {"r": 32, "lora_alpha": 32, "target_modules": list(ALL_PROJ)},
    "loss": "liger-0.26.2", "liger": "0.6.4"}
TRL_GRPO_DIFFERS = (
    "the run's peak spans the loading (6.773 GiB reserved before training: the load's own transients included), the "
    "trainer's construction and 500 steps of real prompts, memlab's one step at the prompt length assumed, every "
    "completion 256 tokens; liger-kernel 0.6.4's GRPO loss runs its whole chunk (logits, log-softmax, the gradients "
    "of the hidden states and of the frozen LM head's weight) compiled, here uncompiled on fake tensors, which may "
    "hold more; its model patches (RMSNorm, SwiGLU, RoPE) are put on as transformers 5 puts them, without the "
    "fused linear cross-entropy forward transformers 4.57 put on too (only generation ran that forward, and without "
    "labels it computes the logits as the model's own does)")
TRL_GRPO_VAGUE = (
    "the prompts' length is not given: the system prompt (369 characters) in Qwen2's chat template is about 90 "
    "tokens; the longest NuminaMath-TIR problem among the 500 the run drew is not known here (the notebook's first "
    "is 141 characters, about 45 tokens): assumed 256 tokens in all for the longest prompt")
# TRL's SFT notebooks (their runs dated by the trackio run ids they print; TRL's latest release that day). Neither
# sets gradient_checkpointing or bf16: SFTConfig's defaults, True both, in trl 0.28 and 0.29 as in 1.16.
TRL_SFT_TOOLS = ("huggingface/trl examples/notebooks/sft_tool_calling.ipynb (9fc9a7dce, PR #5123; run 2026-02-18: "
                 "trl 0.28.0)")
TRL_SFT_TOOLS_SETTINGS: dict[str, Any] = {
    "per_device_train_batch_size": 1, "gradient_accumulation_steps": 4, "warmup_steps": 5, "learning_rate": 2e-4,
    "optim": "paged_adamw_8bit", "logging_steps": 1, "max_length": 1024, "activation_offloading": True}
TRL_SFT_TOOLS_DIFFERS = (
    "the run's peak spans the loading (4.648 GiB reserved before training: the load's own transients included), the "
    "trainer's construction and 5 optimizer steps, memlab's one steady step; built with the installed TRL (1.16) "
    "running trl 0.28's compute_loss (the logits over the 262,144-token vocabulary); TRL's activation offloading "
    "(its context needs an accelerator to be built) estimated as memlab's offload='activations', which moves every "
    "saved tensor (TRL's keeps the output head's on the GPU); the printed cells are not all the committed code's: "
    "dataset['train'][0] prints 'messages' rows and the SFTTrainer cell tokenized an eval set, where the code makes "
    "prompt-completion rows and passes none: the run behind the figure may have had other settings too")
TRL_SFT_TOOLS_VAGUE = (
    "the rows' token lengths are not printed: each is the tool-aware chat template's system preamble and two tool "
    "schemas (about 3,500 characters rendered, 800 to 1,000 tokens) around a short query and its call; assumed every "
    "row cut at max_length 1,024, the most the config allows")
TRL_SFT_NEMOTRON = ("huggingface/trl examples/notebooks/sft_nemotron_3.ipynb (6648832df, PR #5272; run 2026-03-10: "
                    "trl 0.29.0, transformers 5.3 or later, mamba-ssm 2.2.5 and causal-conv1d 1.5.2)")
TRL_SFT_NEMOTRON_SETTINGS: dict[str, Any] = {
    "per_device_train_batch_size": 1, "gradient_accumulation_steps": 4, "num_train_epochs": 1,
    "learning_rate": 2e-4, "optim": "paged_adamw_8bit", "logging_steps": 10, "max_length": 128,
    "gradient_checkpointing": False}
TRL_SFT_NEMOTRON_DIFFERS = (
    "the run's peak spans the loading (58.939 GiB reserved before training), the trainer's construction and 250 "
    "optimizer steps, memlab's one steady step; built with the installed TRL (1.16) and transformers (5.24) running "
    "trl 0.29's compute_loss (the logits over the vocabulary); the LoRA targets name the attention's and the shared "
    "expert's projections (the 128 routed experts are 3-D parameters, not modules): 3,289,088 trained parameters, "
    "the run's 13.2 MB adapter in float32; the run had mamba-ssm, so transformers ran each Mamba-2 mixer through its "
    "fused mamba_split_conv1d_scan_combined, which recomputes the scan in backward, where the dry run (no mamba-ssm "
    "here) took transformers' PyTorch chunked scan, which keeps 34 MB a Mamba layer for backward at 128 tokens "
    "(0.7 GiB over the 23): the estimate is high by up to that, about 1% of the figure")
TRL_SFT_NEMOTRON_VAGUE = (
    "the rows' token lengths are not printed: each of HuggingFaceH4/Multilingual-Thinking's conversations holds a "
    "system prompt, a question, a reasoning trace and an answer (the first printed is over 2,000 characters); "
    "assumed every row cut at max_length 128, the most the config allows")
_3070 = "RTX 3070 Laptop 8GB"
RUNS = (
    _probe("Qwen3-1.7B GRPO QLoRA, 8 x (11+96)", "Qwen3-1.7B", _3070, "RTX4090-24GB", 2.744, 3.102,
           "vram_probe_results_2026-09-11.jsonl (torch 2.13.0+cu126)", campaign=PROBE_0911),
    _probe("Qwen3-4B GRPO QLoRA, 8 x (11+96)", "Qwen3-4B", _3070, "RTX4090-24GB", 4.096, 5.0,
           "vram_probe_results_2026-09-11_4b.jsonl, pull request #15640 (4.096 GiB allocated, 5.0 reserved)",
           campaign=PROBE_0911),
    _probe("Qwen3-8B GRPO QLoRA, 8 x (11+96)", "Qwen3-8B", _3070, "RTX4090-24GB", 7.406, 8.172,
           "vram_probe_results_2026-09-11_8b.jsonl (torch 2.13.0+cu126)", campaign=PROBE_0911),
    _probe("Qwen3-8B GRPO QLoRA, 8 x (11+96), 3080 Ti", "Qwen3-8B", "RTX 3080 Ti Laptop 16GB", "RTX4090-24GB", 7.85,
           8.6, "vram_probe_results_2026-10-06_8b_3080ti16.jsonl (torch 2.12.0+cu126)", campaign=PROBE_1006,
           trl="1.9.2"),
    _probe("Qwen3-8B GRPO QLoRA, 8 x (11+160)", "Qwen3-8B", _3070, "RTX4090-24GB", 9.155, 10.184,
           "vram_probe_results_2026-09-22_envelope8b.jsonl (torch 2.6.0+cu124; past the card's 8 GB: the "
           "laptop's shared memory)", completion=160, campaign=PROBE_0922, trl="1.9.2"),
    _probe("Qwen3-8B GRPO QLoRA, 8 x (11+288)", "Qwen3-8B", _3070, "RTX4090-24GB", 11.773, 13.641,
           "vram_probe_results_2026-09-22_envelope8b.jsonl (torch 2.6.0+cu124; past the card's 8 GB: the "
           "laptop's shared memory)", completion=288, campaign=PROBE_0922, trl="1.9.2"),
    _probe("Qwen3-14B GRPO QLoRA, 8 x (11+96)", "Qwen3-14B", "RTX 4090", "RTX4090-24GB", 11.638, 12.512,
           "vram_probe_results_2026-10-06_9b14b_4090.jsonl (torch 2.13.0+cu126)", campaign=PROBE_1006,
           trl="1.9.2"),
    _probe("Qwen3-14B GRPO QLoRA, 8 x (11+288)", "Qwen3-14B", "RTX 4090", "RTX4090-24GB", 15.73, 17.508,
           "vram_probe_results_2026-10-06_9b14b_4090.jsonl (torch 2.13.0+cu126)", completion=288,
           campaign=PROBE_1006, trl="1.9.2"),
    Run("Qwen2-7B-Instruct GRPO QLoRA r32, 8 x (256+256), T4", "Qwen2-7B-Instruct", qwen2_7b_instruct, "T4-16GB",
        "Tesla T4 (Colab)", 8.832, f"{TRL_GRPO_NOTEBOOK}: 'Peak reserved memory = 8.832 GB' (torch.cuda."
        "max_memory_reserved() / 2**30 after trainer.train(); 6.773 before it)", measures="reserved",
        **TRL_GRPO_ROW, prompt_range=(128, 384),
        differs=f"{TRL_GRPO_DIFFERS}; the run autocast in bf16 (GRPOConfig's default) emulated on the T4, as "
                "memlab estimates it (generation under it; TRL 0.26.2's Liger loss outside it, in the model's "
                "fp16)", vague=TRL_GRPO_VAGUE),
    Run("Qwen2-7B-Instruct GRPO QLoRA r32, 8 x (256+256), A100-40GB", "Qwen2-7B-Instruct", qwen2_7b_instruct,
        "A100-40GB", "A100-40GB", 9.6, f"{TRL_GRPO_NOTEBOOK}: its table's 'Best (all optimizations)' row, "
        "'VRAM (A100-40GB)' 9.6 GB", unit="GiB", measures="card", **TRL_GRPO_ROW, differs=TRL_GRPO_DIFFERS,
        vague=f"{TRL_GRPO_VAGUE}; the run behind the table is not published (its TRL and Liger assumed the T4 "
              "run's), nor what its VRAM is: its T4 cell (9.2) is 0.37 over the T4's printed max_memory_reserved "
              "(8.832 GiB), as nvidia-smi (the reserve, the paged optimizer state and the CUDA context) is; "
              "compared with memlab's card figure, in GiB as the notebook's prints are"),
    Run("Qwen2.5-7B DPO LoRA r16, 1 pair x 2048", "Qwen2.5-7B", qwen25_7b, "H100-80GB", "not given", 19.08,
        "odyn-network/benchmark-finetune-dpo-v1, quoting superkaiba/explore-persona-space issue #36 (TRL DPO LoRA, "
        "no precompute_ref_log_probs)", kind="dpo", unit="GB", prompt_tokens=64, completion_tokens=1984,
        load={"dtype": torch.bfloat16},
        lora={"r": 16, "lora_alpha": 32, "target_modules": ["q_proj", "v_proj"]},
        settings={"per_device_train_batch_size": 1, "gradient_accumulation_steps": 8, "beta": 0.1, "bf16": True,
                  "gradient_checkpointing": True, "max_length": 2048},
        loss="trl",
        differs=("built as the installed TRL's DPOTrainer around a peft policy (its reference: the policy with its "
                 "adapters off), every pair 2,048 tokens; the source's TRL version is not given, and a TRL before "
                 "the fused LM head held the logits over the vocabulary"),
        vague=("the GPU, what was read (allocated, reserved or nvidia-smi), the LoRA alpha and targets and the "
               "prompt / answer split are not given: assumed max_memory_allocated, alpha 32 on q_proj and v_proj "
               "(peft's default for Qwen2), prompts of 64 tokens and answers filling the 2,048")),
    Run("tiny-aya-global SFT QLoRA r32, 1 x 1024 x 4, A100-40GB", "tiny-aya-global", tiny_aya_global, "A100-40GB",
        "A100-SXM4-40GB (Colab)", 11.928, f"{TRL_SFT_TOOLS}: 'Peak reserved memory = 11.928 GB' (torch.cuda."
        "max_memory_reserved() / 2**30 after trainer.train(); 4.648 before it)", kind="sft", measures="reserved",
        prompt_tokens=0, completion_tokens=1024, load={"dtype": torch.float16, "quantization_config": NF4_DQ_FP16},
        lora={"r": 32, "lora_alpha": 32, "target_modules": list(ALL_PROJ)}, settings=TRL_SFT_TOOLS_SETTINGS,
        loss="sft-logits", differs=TRL_SFT_TOOLS_DIFFERS, vague=TRL_SFT_TOOLS_VAGUE),
    Run("Nemotron-3-Nano-30B-A3B SFT LoRA r8, 1 x 128 x 4, A100-80GB", "NVIDIA-Nemotron-3-Nano-30B-A3B",
        nemotron_3_nano_30b, "A100-80GB", "A100-SXM4-80GB", 61.922, f"{TRL_SFT_NEMOTRON}: 'Peak reserved memory = "
        "61.922 GB' (torch.cuda.max_memory_reserved() / 2**30 after trainer.train(); 58.939 before it)", kind="sft",
        measures="reserved", prompt_tokens=0, completion_tokens=128, load={"dtype": torch.bfloat16},
        lora={"r": 8, "lora_alpha": 16, "target_modules": list(ALL_PROJ)}, settings=TRL_SFT_NEMOTRON_SETTINGS,
        loss="sft-logits", differs=TRL_SFT_NEMOTRON_DIFFERS, vague=TRL_SFT_NEMOTRON_VAGUE),
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
    {"run": "Qwen3-14B (unsloth bnb-4bit) SFT QLoRA r32 on a T4, Liger and activation offloading, 1 x 1,024 x 4",
     "source": "huggingface/trl examples/notebooks/sft_trl_lora_qlora.ipynb (f6834206a, PR #4336; run 2025-10-24: "
               "trl 0.24, liger-kernel 0.6.2 by their dates)",
     "published": "14.041 GiB max_memory_reserved (12.074 before training)",
     "why": "the checkpoint is Unsloth's pre-quantized unsloth/qwen3-14b-unsloth-bnb-4bit, whose config.json's "
            "quantization_config keeps a list of layers unquantized (llm_int8_skip_modules, Unsloth's 'dynamic' "
            "choice per layer): 12.074 GiB reserved before training, where Qwen3-14B loaded in NF4 with fp16 "
            "embeddings and head is about 9. That list is not readable here (nothing is downloaded), so the "
            "policy's weights would be a guess of 3 GiB; TRL 0.24's SFTTrainer also ran Liger's fused linear "
            "cross-entropy in the model's forward, and the data set's longest conversation (HuggingFaceH4/"
            "Multilingual-Thinking, cut at max_length 1,024) is not given"},
    {"run": "Ministral 3 3B VL SFT on a T4 (a QLoRA VLM)",
     "source": "huggingface/trl examples/notebooks/sft_ministral3_vl.ipynb (903b57dd8, PR #4626)",
     "published": "13.881 GiB max_memory_reserved (6.346 before training)",
     "why": "mistralai/Ministral-3-3B-Instruct-2512-BF16's config.json (its text model and its Pixtral vision "
            "tower) and its image processor's settings (the patches an image makes) are not readable here: the "
            "vision tower's shape and the image tokens a row holds would be guesses"},
    {"run": "Qwen2.5-7B DPO LoRA with precompute_ref_log_probs=True",
     "source": "odyn-network/benchmark-finetune-dpo-v1, quoting superkaiba/explore-persona-space issue #36",
     "published": "31.09 GB",
     "why": "its peak is the precompute pass, whose batch (precompute_ref_batch_size or the eval batch) the "
            "source does not give"},
)
"""Published figures memlab cannot be compared with, and why."""
