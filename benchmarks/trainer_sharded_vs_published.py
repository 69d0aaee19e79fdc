"""A trainer launched on several GPUs, built as the source built it, against the per-GPU memory the source printed.

Each row is a published multi-GPU run of TRL's SFTTrainer under DeepSpeed or FSDP. Its trainer is built in a fresh
process as the source's script builds it: the model on the meta device with the source's ``from_pretrained``
keywords (``memlab.model_on_meta(config, **load)``, the config written from the Hub's ``config.json``), the
source's ``LoraConfig`` and ``SFTConfig`` keywords, ``memlab.trainer_on_meta(trl.SFTTrainer, ...)``, and the engine
the source's accelerate config launches: a ``deepspeed=`` dict (what accelerate builds from a DeepSpeed config with
no JSON file) or, since an FSDP trainer does not build in one process, ``fsdp`` / ``fsdp_config`` set on the built
trainer's arguments, as a launched script holds them. ``memlab.estimate(trainer, gpu=..., gpus=N)`` then reads the
sharding from the trainer and answers per GPU.

None of the sources names its counter (peft's docs show a GPU-memory chart's level, or print a figure); memlab's card
figure (the reserve of the step and the CUDA context, what such a chart or nvidia-smi shows) is compared with it,
read as decimal GB where the source says "GB". The results, with the time each took, go to
``benchmarks/results/trainer_sharded_vs_published-cpu.json``; the published runs this cannot reproduce are listed
there too (``NOT_EXPRESSED``), with why.

The same runs asked as a model, a batch shape and a plan are rows of :mod:`benchmarks.sharded_vs_published`.

Usage:
    python -m benchmarks.trainer_sharded_vs_published
    python -m benchmarks.trainer_sharded_vs_published --only "QLoRA"        # the rows whose name contains it
    python -m benchmarks.trainer_sharded_vs_published --smoke --out /tmp/smoke   # a tiny config, for the tests
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PEFT_DS = "https://huggingface.co/docs/peft/accelerate/deepspeed"
PEFT_FSDP = "https://huggingface.co/docs/peft/accelerate/fsdp"

LLAMA_2_70B = {"hidden_size": 8192, "intermediate_size": 28_672, "num_hidden_layers": 80, "num_attention_heads": 64,
               "num_key_value_heads": 8, "vocab_size": 32_000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
               "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu"}
"""meta-llama/Llama-2-70b-hf's ``config.json``: hidden 8,192, intermediate 28,672, 80 layers, 64 heads, 8 KV heads,
vocab 32,000, 4,096 positions, rms_norm_eps 1e-05, untied output (its ``torch_dtype`` "float16" is not what the
rows load: each gives its ``dtype``)."""

PEFT_LORA = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.1, "target_modules": "all-linear", "bias": "none",
             "task_type": "CAUSAL_LM"}
"""peft's examples/sft scripts: ``--lora_r 8 --lora_alpha 16 --lora_dropout 0.1 --lora_target_modules all-linear``
(``utils.py`` adds ``bias="none"``, ``task_type="CAUSAL_LM"``)."""

PEFT_QLORA_LOAD = {"dtype": "bfloat16", "quantization": {
    "load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_compute_dtype": "bfloat16",
    "bnb_4bit_use_double_quant": True, "bnb_4bit_quant_storage": "bfloat16"}}
"""peft's QLoRA scripts: ``--use_4bit_quantization True --use_nested_quant True --bnb_4bit_compute_dtype bfloat16
--bnb_4bit_quant_storage_dtype bfloat16``, the quant type left at the script's default ``nf4``; ``utils.py`` loads
with ``torch_dtype=quant_storage_dtype`` (bf16)."""

PEFT_QLORA_SFT: dict[str, Any] = {
    "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "max_length": 2048, "packing": True,
    "gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": True}, "bf16": True,
    "optim": "adamw_torch", "learning_rate": 1e-4, "weight_decay": 1e-4, "max_grad_norm": 1.0}
"""run_peft_qlora_fsdp.sh and run_peft_qlora_deepspeed_stage3.sh (peft 6008f272a): ``--per_device_train_batch_size 2
--gradient_accumulation_steps 2 --max_seq_len 2048 --packing True --gradient_checkpointing True --use_reentrant True
--bf16 True``; no ``--optim``: TrainingArguments' default of March 2024, torch's AdamW (``adamw_torch``)."""

QLORA_DIFFERS = ("memlab checkpoints with use_reentrant=False where the script asks True (the same block inputs "
                 "kept); sdpa's flash backend for flash-attention 2 (neither holds the attention matrix); TRL 1.16's "
                 "packing (best-fit rows of 2048 tokens, padding-free) for TRL 0.7's ConstantLengthDataset rows of "
                 "2048; the installed TRL builds the adapters without prepare_model_for_kbit_training, as TRL of "
                 "March 2024 skipped it for a QLoRA model loaded on the CPU for FSDP or ZeRO-3")

ZERO3_OF_ACCELERATE: dict[str, Any] = {
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "none"}, "offload_param": {"device": "none"},
                          "stage3_gather_16bit_weights_on_model_save": True},
    "bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto", "train_batch_size": "auto"}
"""The DeepSpeed config accelerate builds from a config file with ``zero_stage: 3``, ``offload_optimizer_device:
none``, ``offload_param_device: none``, ``zero3_save_16bit_model: true`` and ``mixed_precision: bf16`` (no JSON file;
DeepSpeed's bucket sizes left at its defaults)."""

FSDP1_PEFT = {"version": 1, "backward_prefetch": "backward_pre", "forward_prefetch": False, "use_orig_params": False,
              "cpu_ram_efficient_loading": True, "sync_module_states": True,
              "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}
"""peft's configs/fsdp_config*.yaml as ``fsdp_config``: FSDP1, ``BACKWARD_PRE``, no forward prefetch,
``use_orig_params: false``, ``cpu_ram_efficient_loading`` and ``sync_module_states`` true, ``TRANSFORMER_BASED_WRAP``
(train.py replaces the policy with peft's ``fsdp_auto_wrap_policy``, which wraps the LoRA layers too)."""


@dataclass(frozen=True)
class Row:
    """One published run: its source, the figure it printed per GPU and what that figure measures, and the
    keywords its trainer is built with (``load``: ``from_pretrained``'s, dtypes as names; ``lora``:
    ``LoraConfig``'s; ``sft``: ``SFTConfig``'s; ``deepspeed``: the engine's config, or ``fsdp`` and
    ``fsdp_config`` set on the built trainer's arguments)."""

    name: str
    source: str
    quote: str
    measures: str
    published_gb: float
    gpu: str
    gpus: int
    config: dict[str, Any]
    load: dict[str, Any]
    lora: dict[str, Any]
    sft: dict[str, Any]
    settings: str
    differs: str
    deepspeed: dict[str, Any] | None = None
    fsdp: str | None = None
    fsdp_config: dict[str, Any] = field(default_factory=dict)
    published_range_gb: tuple[float, float] | None = None


ROWS = (
    Row(
        name="peft Llama 2 70B LoRA SFTTrainer, ZeRO-3, 8 x H100",
        source=f"{PEFT_DS} (huggingface/peft aa2ca83ca, 2024-02-26; examples/sft/run_peft_deepspeed.sh, "
               "configs/deepspeed_config.yaml)",
        quote="the memory consumed per GPU is 64 GB (80%)",
        measures="a GPU-memory chart's level during training (tool and counter not named); compared as memlab's "
                 "card figure (reserved + CUDA context)",
        published_gb=64.0, gpu="H100-80GB", gpus=8, config=LLAMA_2_70B,
        load={"dtype": "float32"}, lora=PEFT_LORA,
        sft={"per_device_train_batch_size": 8, "gradient_accumulation_steps": 4, "max_length": 2048, "packing": True,
             "gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": False},
             "bf16": True, "optim": "adamw_torch", "learning_rate": 1e-4, "weight_decay": 1e-4, "max_grad_norm": 1.0},
        deepspeed=ZERO3_OF_ACCELERATE,
        settings="LoRA r8 alpha 16 dropout 0.1 all linear, loaded with no dtype (fp32; DeepSpeed's bf16 mode casts "
                 "it), bf16, batch 8 x 2048 packed, 4 accumulation steps, gradient checkpointing (use_reentrant "
                 "False), flash attention 2, TrainingArguments' default AdamW (adamw_torch), ZeRO-3 no offload",
        differs="sdpa's flash backend for flash-attention 2 (neither holds the attention matrix); TRL 1.16's packing "
                "(best-fit rows of 2048 tokens, padding-free) for TRL 0.7's ConstantLengthDataset rows of 2048",
    ),
    Row(
        name="peft Llama 2 70B LoRA SFTTrainer, FSDP1, 8 x H100",
        source=f"{PEFT_FSDP} (huggingface/peft aa2ca83ca, 2024-02-26; examples/sft/run_peft_fsdp.sh, "
               "configs/fsdp_config.yaml)",
        quote="the memory consumed per GPU is 72-80 GB (90-98%) [...] The slight increase in GPU memory at the end "
              "is when saving the model using FULL_STATE_DICT state dict type",
        measures="a GPU-memory chart (tool and counter not named): 72 GB while training, up to 80 GB as the model is "
                 "saved at the end; the training level (72) is compared, as memlab's card figure (reserved + CUDA "
                 "context), and the ratio to 80 is given beside it",
        published_gb=72.0, published_range_gb=(72.0, 80.0), gpu="H100-80GB", gpus=8, config=LLAMA_2_70B,
        load={"dtype": "float32"}, lora=PEFT_LORA,
        sft={"per_device_train_batch_size": 8, "gradient_accumulation_steps": 4, "max_length": 2048, "packing": True,
             "gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": False},
             "bf16": True, "optim": "adamw_torch", "learning_rate": 1e-4, "weight_decay": 1e-4, "max_grad_norm": 1.0},
        fsdp="full_shard auto_wrap", fsdp_config=FSDP1_PEFT,
        settings="LoRA r8 alpha 16 dropout 0.1 all linear, loaded with no dtype (fp32: utils.py at aa2ca83ca passes "
                 "no torch_dtype; FSDP1 keeps the fp32 flat shards and gathers them in bf16, accelerate's "
                 "mixed_precision bf16), batch 8 x 2048 packed, 4 accumulation steps, gradient checkpointing "
                 "(use_reentrant False), flash attention 2, adamw_torch, FSDP1 FULL_SHARD, BACKWARD_PRE, "
                 "use_orig_params false, no offload",
        differs="the published range includes the FULL_STATE_DICT save at the end, which memlab does not estimate "
                "(a training step only); the wrap policy is peft's fsdp_auto_wrap_policy in the source (LoRA layers "
                "their own units), transformers' by LlamaDecoderLayer here; sdpa for flash-attention 2; TRL 1.16's "
                "packing",
    ),
    Row(
        name="peft Llama 2 70B QLoRA SFTTrainer, FSDP1 + CPU offload, 2 GPUs",
        source=f"{PEFT_FSDP} (huggingface/peft 6008f272a, 2024-03-13, PR #1550; examples/sft/run_peft_qlora_fsdp.sh, "
               "configs/fsdp_config_qlora.yaml)",
        quote="the memory consumed per GPU is 19.6 GB while CPU RAM usage is around 107 GB",
        measures="not stated (a figure in the text, no screenshot); compared as memlab's card figure (reserved + "
                 "CUDA context). The GPU is not named (the section targets 2 x 24 GB): estimated for an RTX 4090",
        published_gb=19.6, gpu="RTX4090-24GB", gpus=2, config=LLAMA_2_70B, load=PEFT_QLORA_LOAD, lora=PEFT_LORA,
        sft=PEFT_QLORA_SFT, fsdp="full_shard auto_wrap offload", fsdp_config=FSDP1_PEFT,
        settings="QLoRA nf4 double quant, bf16 compute, quant storage bf16, loaded in bf16; LoRA r8 alpha 16 dropout "
                 "0.1 all linear; batch 2 x 2048 packed, 2 accumulation steps, gradient checkpointing "
                 "(use_reentrant True), bf16, flash attention 2, adamw_torch; FSDP1 FULL_SHARD with CPU offload of "
                 "the parameters, BACKWARD_PRE, use_orig_params false (accelerate's mixed_precision 'no')",
        differs=QLORA_DIFFERS + "; the wrap policy is peft's fsdp_auto_wrap_policy in the source",
    ),
    Row(
        name="peft Llama 2 70B QLoRA SFTTrainer, FSDP1, 2 GPUs, no offload",
        source=f"{PEFT_FSDP} (huggingface/peft 6008f272a, 2024-03-13, PR #1550; run_peft_qlora_fsdp.sh with "
               "fsdp_offload_params false)",
        quote="When disabling CPU offloading, the GPU memory usage is 35.6 GB/ GPU",
        measures="not stated; compared as memlab's card figure (reserved + CUDA context). The GPU is not named and "
                 "35.6 GB does not fit the section's 24 GB cards: estimated for an A100 80GB",
        published_gb=35.6, gpu="A100-80GB", gpus=2, config=LLAMA_2_70B, load=PEFT_QLORA_LOAD, lora=PEFT_LORA,
        sft=PEFT_QLORA_SFT, fsdp="full_shard auto_wrap", fsdp_config=FSDP1_PEFT,
        settings="as the row with CPU offload, fsdp_offload_params false",
        differs=QLORA_DIFFERS + "; the wrap policy is peft's fsdp_auto_wrap_policy in the source",
    ),
    Row(
        name="peft Llama 2 70B QLoRA SFTTrainer, ZeRO-3, 2 x 40GB",
        source=f"{PEFT_DS} (huggingface/peft 6008f272a, 2024-03-13, PR #1550; "
               "examples/sft/run_peft_qlora_deepspeed_stage3.sh, configs/deepspeed_config_z3_qlora.yaml)",
        quote="the memory consumed per GPU is 36.6 GB. Therefore, what took 8X80GB GPUs with DeepSpeed Stage "
              "3+LoRA and a couple of 80GB GPUs with DDP+QLoRA now requires 2X40GB GPUs",
        measures="not stated; compared as memlab's card figure (reserved + CUDA context), for an A100 40GB",
        published_gb=36.6, gpu="A100-40GB", gpus=2, config=LLAMA_2_70B, load=PEFT_QLORA_LOAD, lora=PEFT_LORA,
        sft=PEFT_QLORA_SFT, deepspeed=ZERO3_OF_ACCELERATE,
        settings="QLoRA nf4 double quant, bf16 compute, quant storage bf16, loaded in bf16; LoRA r8 alpha 16 dropout "
                 "0.1 all linear; batch 2 x 2048 packed, 2 accumulation steps, gradient checkpointing "
                 "(use_reentrant True), bf16, flash attention 2, adamw_torch; ZeRO-3, no offload",
        differs=QLORA_DIFFERS,
    ),
)

NOT_EXPRESSED = (
    {"run": "philschmid Llama 3 70B QLoRA SFTTrainer, FSDP1 + CPU offload, 4 x A10G",
     "source": "https://www.philschmid.de/fsdp-qlora-llama3 (philschmid/deep-learning-pytorch-huggingface 57cab54 / "
               "4a0caad, 2024-04-22; training/scripts/run_fsdp_qlora.py)",
     "published": "22 GB/GPU ('FSDP + Q-Lora + CPU offloading needs 4x24GB GPUs, with 22 GB/GPU and 127 GB CPU RAM "
                  "with a sequence length of 3072 and a batch size of 1')",
     "why": "the sequence length cannot be settled: the notebook's yaml sets max_seq_len: 3072, but the script of "
            "that date declares the field max_seq_length (default 512), and TRL 0.8.6's TrlParser copies yaml values "
            "only onto fields of the same name, so the run as published packed 512-token rows while the text says "
            "3072; estimating both and keeping the nearer would fit the row to its figure"},
    {"run": "Qwen README Qwen-7B full fine-tune, ZeRO-3, 2 x A100 80GB (seq 256 / 512 / 1024)",
     "source": "https://github.com/QwenLM/Qwen/blob/main/README.md (e6f2a7a, 2023-10-11), 'Profiling of Memory and "
               "Speed'",
     "published": "139.2G / 148.0G / 162.0G",
     "why": "a transformers Trainer of Qwen 1's remote code (not built here without its code), its figures summed over "
            "the two GPUs (162.0G is more than 80 GB a GPU, so the split or the counter is unknown), and the README's "
            "8 accumulation steps against the script's 16; composed as a Qwen2 of its shape in "
            "benchmarks.sharded_vs_published"},
    {"run": "Qwen README Qwen-72B LoRA, ZeRO-3, 4 x A100 80GB (seq 256 to 8192)",
     "source": "https://github.com/QwenLM/Qwen/blob/main/README.md (e8e1596, 2023-11-30)",
     "published": "215.4G to 289.2G",
     "why": "summed over the four GPUs, a transformers Trainer of Qwen 1's remote code, and base vs Chat (which "
            "decides whether the embeddings train) not stated"},
)
"""Published multi-GPU runs of these trainers with a per-GPU (or summed) figure that this benchmark does not
reproduce, with why (the research note of issue 85 lists what else was looked at and rejected)."""


def _dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def build_trainer(row: Row, folder: Path) -> Any:
    """``row``'s SFTTrainer as its source built it, on the meta device (see the module docstring), its text examples
    ``max_length`` tokens each in a word-level tokenizer (an estimate reads their lengths only)."""
    import peft
    import trl
    from datasets import Dataset
    from transformers import BitsAndBytesConfig, LlamaConfig

    import memlab
    from memlab.frontends.cli.trainer import word_tokenizer

    config = LlamaConfig(**row.config)
    load: dict[str, Any] = {"dtype": _dtype(row.load["dtype"])}
    if "quantization" in row.load:
        quantization = {key: _dtype(value) if key in ("bnb_4bit_compute_dtype", "bnb_4bit_quant_storage") else value
                        for key, value in row.load["quantization"].items()}
        load["quantization_config"] = BitsAndBytesConfig(**quantization)
    policy = memlab.model_on_meta(config, **load)
    tokenizer = word_tokenizer(int(config.vocab_size))
    length = int(row.sft["max_length"])
    count = max(8, row.sft["per_device_train_batch_size"] * row.sft.get("gradient_accumulation_steps", 1))
    words = [" ".join(f"w{(start + i) % 1000}" for i in range(length)) for start in range(count)]
    args = trl.SFTConfig(output_dir=str(folder), report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
                         max_steps=1, seed=100, **row.sft)
    trainer = memlab.trainer_on_meta(trl.SFTTrainer, model=policy, args=args,
                                     train_dataset=Dataset.from_list([{"text": text} for text in words]),
                                     processing_class=tokenizer, peft_config=peft.LoraConfig(**row.lora))
    # The engine's arguments set on the built trainer, as a launched script holds them: an FSDP trainer does not build
    # in one process, and an SFTTrainer built with deepspeed= has an accelerator of DeepSpeed whose gather in TRL's
    # compute_loss (its token count) needs a process group, which one CPU process does not have.
    if row.fsdp:
        trainer.args.fsdp, trainer.args.fsdp_config = row.fsdp, dict(row.fsdp_config)
    if row.deepspeed:
        trainer.args.deepspeed = dict(row.deepspeed)
    return trainer


def estimate_row(row: Row) -> dict[str, Any]:
    """memlab's per-GPU estimate of ``row``'s trainer: the allocated peak, the reserve, the CUDA context, the phase of
    the peak and the estimate's notes."""
    import memlab
    from memlab.trainer.sharding import trainer_sharding

    with tempfile.TemporaryDirectory() as folder:
        trainer = build_trainer(row, Path(folder))
        sharding = trainer_sharding(trainer)
        trial = memlab.estimate(trainer, gpu=row.gpu, gpus=row.gpus)
    if trial.status != "ok":
        return {"status": trial.status, "error": trial.error}
    read = f" {sharding.strategy} x{row.gpus}" if sharding is not None else ""
    return {"status": "ok", "label": trial.plan.label() + read, "peak_bytes": trial.peak_bytes,
            "sharding": sharding.setting if sharding is not None else None,
            "reserved_bytes": trial.reserved_bytes or 0, "context_bytes": trial.context_bytes or 0,
            "phase": trial.timeline.peak.phase if trial.timeline is not None else None,
            "breakdown": {key: int(value) for key, value in dict(trial.breakdown).items()},
            "notes": list(trial.notes)}


def ask(row: Row, folder: Path) -> dict[str, Any]:
    """``row`` estimated in a fresh process (:func:`estimate_row`): the card and allocated figures per GPU, the ratio
    to the published figure (and to each end of its range), the seconds."""
    started = time.perf_counter()
    asked, answered = folder / "row-asked.json", folder / "row-answered.json"
    asked.write_text(json.dumps(asdict(row)))
    done = subprocess.run([sys.executable, "-m", "benchmarks.trainer_sharded_vs_published", "--row", str(asked),
                           "--row-out", str(answered)], cwd=ROOT, capture_output=True, text=True, check=False)
    seconds = round(time.perf_counter() - started, 1)
    record: dict[str, Any] = {**asdict(row), "seconds": seconds}
    if done.returncode != 0 or not answered.exists():
        return {**record, "status": "error", "error": done.stderr[-2000:]}
    result = json.loads(answered.read_text())
    if result["status"] != "ok":
        return {**record, **result}
    card = result["reserved_bytes"] + result["context_bytes"] if result["reserved_bytes"] else result["peak_bytes"]
    record.update({"status": "ok", "label": result["label"], "sharding": result["sharding"],
                   "card_gb": round(card / 1e9, 2),
                   "reserved_gb": round(result["reserved_bytes"] / 1e9, 2),
                   "allocated_gb": round(result["peak_bytes"] / 1e9, 2),
                   "ratio": round(card / 1e9 / row.published_gb, 3), "peak_phase": result["phase"],
                   "breakdown_gb": {key: round(value / 1e9, 3) for key, value in result["breakdown"].items()},
                   "notes": result["notes"]})
    if row.published_range_gb is not None:
        record["ratio_to_range"] = [round(card / 1e9 / end, 3) for end in row.published_range_gb]
    return record


def smoke_row(folder: Path) -> Row:
    """A row of the same shape on a tiny Llama config: what the tests run (its "published" figure is made up, and
    says so)."""
    del folder  # the config travels in the row
    config = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128, "pad_token_id": 0}
    return Row(name="smoke: a tiny Llama, SFT LoRA, ZeRO-3 over 2", source="none (the smoke row)", quote="none",
               measures="made up", published_gb=1.0, gpu="H100-80GB", gpus=2, config=config,
               load={"dtype": "float32"}, lora={"r": 4, "lora_alpha": 8, "target_modules": "all-linear"},
               sft={"per_device_train_batch_size": 2, "max_length": 32, "bf16": True, "gradient_checkpointing": True},
               deepspeed={"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto",
                          "gradient_accumulation_steps": "auto"},
               settings="LoRA r4, batch 2 x 32", differs="made up")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--only", help="only the rows whose name contains this (their results are not written)")
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--row", help=argparse.SUPPRESS)
    parser.add_argument("--row-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.row:  # the fresh process of one row
        data = json.loads(Path(args.row).read_text())
        if data.get("published_range_gb") is not None:
            data["published_range_gb"] = tuple(data["published_range_gb"])
        Path(args.row_out).write_text(json.dumps(estimate_row(Row(**data))))
        return 0
    chosen = ((smoke_row(Path(args.out)),) if args.smoke else
              tuple(row for row in ROWS if not args.only or args.only in row.name))
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for row in chosen:
            rows.append(ask(row, Path(folder)))
            done = rows[-1]
            print(f"{done['name']}: published {done['published_gb']} GB, memlab card {done.get('card_gb')} GB "
                  f"(allocated {done.get('allocated_gb')}), ratio {done.get('ratio')} ({done['seconds']} s)"
                  + (f" error: {done.get('error')}" if done.get("status") != "ok" else ""), flush=True)
    import torch

    from benchmarks.common import metadata_for, write_json

    if args.only:
        return 0 if all(row["status"] == "ok" for row in rows) else 1
    size = "smoke" if args.smoke else "small"
    record = {**metadata_for("trainer_sharded_vs_published", torch.device("cpu"), size), "rows": rows,
              "not_expressed": [] if args.smoke else list(NOT_EXPRESSED)}
    stem = "trainer_sharded_vs_published-cpu" + ("-smoke" if args.smoke else "")
    out = write_json(record, Path(args.out) / f"{stem}.json")
    print(f"written to {out}")
    return 0 if all(row["status"] == "ok" for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
