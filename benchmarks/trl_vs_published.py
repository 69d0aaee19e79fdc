"""memlab's estimate of TRL's GRPO, DPO and SFT steps against GPU memory figures that others published (issues 59, 83).

Each row is a run someone measured on a named GPU, with the settings they published. memlab builds the trainer
each source built, the way it built it, on this CPU and on the meta device (no weight exists, nothing is
downloaded): the model's config written from the Hub's ``config.json`` values (:mod:`benchmarks.trl_published_runs`),
``memlab.model_on_meta(config, **load)`` with the source's ``from_pretrained`` keywords (its ``dtype`` and
``BitsAndBytesConfig``: transformers' own quantizer puts bitsandbytes' layers in place), the source's
``LoraConfig``, and ``memlab.trainer_on_meta(trl.GRPOTrainer, trl.DPOTrainer or trl.SFTTrainer, args=...Config(...))``
with the keywords the source wrote (``optim``, ``use_liger_kernel``, ``gradient_checkpointing``, batch,
generations, lengths); TRL casts a quantized model's adapters itself. ``memlab.estimate(trainer, gpu=...)`` then
estimates the step for the GPU kind the row names: a GRPO step's generation (transformers' ``generate``, every
completion at ``max_completion_length``) and its training micro-batches, a DPO step with its peft reference, an SFT
step on rows of the length assumed. TRL's ``activation_offloading=True`` cannot be built without an accelerator
(its context asks for one): the trainer is built without it and estimated with its plan's ``offload="activations"``,
as ``memlab estimate --trainer sft --activation-offloading`` does.

Where the installed TRL (1.16) computes the loss differently from the source's TRL, the row's ``loss`` says how the
source's is run (:data:`benchmarks.trl_published_runs.LOSSES`), on the installed TRL's trainer:

- ``logits`` (trl 1.12, jsboige/CoursIA's probe): log-probs through the logits over the vocabulary
  (:func:`logits_log_probs`, the trainer's ``_get_per_token_logps_and_entropies``), where TRL 1.16 adds a fused
  LM head;
- ``logits-1.9.2`` (trl 1.9.2, the probe's later campaigns): the same, the logits divided by the temperature in place
  (``logits.div_(self.temperature)``, huggingface/trl#5254, until #6554 made it a division again in trl 1.10): an
  in-place operation on a view of the model's output, whose backward goes through ``CopySlices`` and holds a gradient
  the size of that output (huggingface/trl#6553) besides the slice's;
- ``liger-0.26.2`` (TRL's T4 notebook): TRL 0.26.2's ``compute_liger_loss`` (:func:`liger_grpo_trainer`), which
  hands the backbone's hidden states and the LM head's weight to Liger's ``LigerFusedLinearGRPOLoss`` outside the
  model's autocast (TRL 0.26.2's ``_ForwardRedirection`` calls it through the model's own ``forward``, not the
  autocast wrapper accelerate put on the instance), with the liger-kernel release the run had (0.6.4: installed
  with ``pip install --no-deps --target`` into a temporary folder and put first on the path of a process of its own;
  its model patches import there once ``transformers.cache_utils`` has a stand-in for the ``HybridCache`` class
  its Gemma modules name: :func:`hybrid_cache_stand_in`). The
  same notebook built as the installed TRL runs it (its own loss, liger-kernel's installed patches) is estimated too
  and recorded beside the row (``installed_trl``), not compared: it is not the run that printed the figure.
- ``sft-logits`` (TRL 0.28 and 0.29, TRL's SFT notebooks): ``SFTTrainer.compute_loss`` as those releases ran it
  (:func:`logits_sft_trainer`): the model's own loss over the logits, then the entropy and the token accuracy from
  the same logits, where TRL 1.16 scores the tokens through a fused LM head that never holds them. The installed
  TRL's estimate is recorded beside the row too (``installed_trl``).

The result records per row what the published figure measures (``allocated``: ``torch.cuda.max_memory_allocated``;
``reserved``: ``max_memory_reserved``; ``card``: nvidia-smi, the reserve and the CUDA context) and the estimate /
published ``ratio`` of the same kind. A paged optimizer (``optim="paged_adamw_8bit"``) keeps the 8-bit state of
every parameter of 100,000 elements or more in CUDA unified memory (bitsandbytes' ``get_state_buffer``), outside
PyTorch's allocator and so outside ``max_memory_reserved``; memlab counts it on the device (its note says so). A row
that compares a reserve subtracts it (``paged_state``: two bytes an element of those parameters, computed from the
trainer's own trainable parameters); nvidia-smi shows it (resident on the GPU while it has room), so a card figure
keeps it. ``differs`` says what the source's run does that the estimate does not; ``vague`` rows are those whose
source leaves settings out (each says what was assumed; ``prompt_range`` rows are estimated at other prompt lengths
too). ``not_expressed`` lists published figures memlab cannot be compared with, and why.

Sources (every number below is quoted from them):

- jsboige/CoursIA, ``MyIA.AI.Notebooks/GenAI/PostTraining/_measurements/vram_wall_probe.py`` (pull request #15634,
  2026-09-11) and its ``vram_probe_results_*.jsonl`` (#15634, #15640, #15643, and the 2026-09-22 and 2026-10-06
  files): TRL's ``GRPOTrainer`` (trl 1.12 on 2026-09-11, #15634; trl 1.9.2 on 2026-09-22, #17366, and assumed on
  2026-10-06, whose TRL is not recorded), ``from_pretrained(model, quantization_config=BitsAndBytesConfig(nf4,
  double quant, bf16 compute), device_map={"": 0})`` (no dtype: transformers 5's "auto", the checkpoint's bf16),
  ``LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05)`` on q/k/v/o/gate/up/down,
  ``GRPOConfig(num_generations=8, beta=0.0, per_device_train_batch_size=8, gradient_accumulation_steps=4,
  max_completion_length=96 (or as the row says), bf16=True, gradient_checkpointing=True)``, transformers'
  ``generate`` (no vLLM), a constant reward, prompts such as ``"Solve: 12 + 30 = ?"`` (plain text, no chat
  template: about 11 Qwen tokens, assumed here), 3 optimizer steps. ``max_vram_allocated_gb`` /
  ``max_vram_reserved_gb`` are ``torch.cuda.max_memory_allocated()`` / ``max_memory_reserved()`` over the trainer's
  construction and the 3 steps (``reset_peak_memory_stats()`` after loading), in GiB (``/ 2**30``).
- odyn-network/benchmark-finetune-dpo-v1 (a Hugging Face data set) quoting superkaiba/explore-persona-space issue
  #36: TRL's ``DPOTrainer``, Qwen2.5-7B, LoRA r=16, bf16, context 2,048, batch 1, accumulation 8, gradient
  checkpointing, one GPU, "peak" 19.08 GB. The issue itself was not readable here: the GPU, what was read and the
  LoRA targets are not given (vague). No published DPO figure found states all of them (``NOT_EXPRESSED`` lists
  those checked).
- huggingface/trl ``examples/notebooks/grpo_trl_lora_qlora.ipynb`` as added by c9a9e25 (PR #4660), its outputs from
  a free Colab T4 on 2025-12-19 (so trl 0.26.2 and liger-kernel 0.6.4, the latest that day; later commits changed
  the code, not the outputs): Qwen/Qwen2-7B-Instruct ``from_pretrained(dtype=torch.float16,
  BitsAndBytesConfig(load_in_4bit, fp16 compute, double quant, nf4))``, LoRA r=32 on every projection,
  ``GRPOConfig(per_device_train_batch_size=8, num_generations=8, max_completion_length=256,
  optim="paged_adamw_8bit", use_liger_kernel=True, gradient_checkpointing=True)``, bf16 and beta 0 by TRL's
  defaults: "Peak reserved memory = 8.832 GB" (``max_memory_reserved() / 2**30``, never reset: the loading's
  6.773 included), and its table's 9.6 GB for the same configuration on an A100-40GB (what was read not said).
- huggingface/trl ``examples/notebooks/sft_tool_calling.ipynb`` (9fc9a7dce, PR #5123; its trackio run of 2026-02-18:
  trl 0.28.0): CohereLabs/tiny-aya-global ``from_pretrained(dtype=torch.float16, BitsAndBytesConfig(load_in_4bit,
  fp16 compute, double quant, nf4))``, LoRA r=32 on every projection, ``SFTConfig(per_device_train_batch_size=1,
  gradient_accumulation_steps=4, optim="paged_adamw_8bit", max_length=1024, activation_offloading=True)``
  (checkpointing and bf16 by TRL's defaults) on an A100-SXM4-40GB: "Peak reserved memory = 11.928 GB"
  (``max_memory_reserved() / 2**30``, 4.648 before training). Its config is rasbt/LLMs-from-scratch@50be26871e06's
  ``ch05/15_tiny-aya/standalone-tiny-aya.ipynb`` (``TINY_AYA_CONFIG``).
- huggingface/trl ``examples/notebooks/sft_nemotron_3.ipynb`` (6648832df, PR #5272; its run of 2026-03-10: trl
  0.29.0, mamba-ssm 2.2.5): nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 ``from_pretrained(dtype=torch.bfloat16,
  attn_implementation="eager")``, LoRA r=8 on q/k/v/o/gate/up/down, ``SFTConfig(per_device_train_batch_size=1,
  gradient_accumulation_steps=4, optim="paged_adamw_8bit", max_length=128, gradient_checkpointing=False)`` on an
  A100-SXM4-80GB: "Peak reserved memory = 61.922 GB" (58.939 before training). Its config.json is the one
  jax-ml/jax-llm-examples@8b4b24602e06's ``nemotron3/tests/test_model.py`` copies (``NEMOTRON3_30B_JSON``).
  TRL's other SFT notebooks are in ``NOT_EXPRESSED``, with why.

Run from the repository root (no GPU needed; about 10 minutes on 2 cores)::

    python -m benchmarks.trl_vs_published
    python -m benchmarks.trl_vs_published --only SFT --out /tmp   # the rows whose name holds "SFT"
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks import common
from benchmarks.trl_published_runs import LOSSES, NOT_EXPRESSED, RUNS, Run, tiny_qwen3

NAME = "trl_vs_published"
UNITS = {"GB": 1e9, "GiB": 2**30}
ROOT = Path(__file__).resolve().parent.parent
PAGED_MIN_ELEMENTS = 100_000
"""bitsandbytes' paged optimizers page a state buffer of this many elements or more (``get_state_buffer``)."""


def _words(count: int, start: int = 0) -> str:
    """``count`` words that :func:`memlab.frontends.cli.trainer.word_tokenizer` makes one token each."""
    return " ".join(f"w{(start + i) % 60}" for i in range(count))


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """trl 1.12's ``selective_log_softmax`` (``trl/trainer/utils.py``), copied: torch only (the installed TRL's
    answers a CUDA tensor with a Triton kernel that holds no log-softmax), float32 logits gathered and less their
    ``logsumexp`` row by row, half-precision ones through ``log_softmax`` row by row."""
    import torch.nn.functional as F

    squeeze = index.ndim == logits.ndim - 1
    if squeeze:
        index = index.unsqueeze(-1)
    if logits.dtype in [torch.float32, torch.float64]:
        selected_logits = torch.gather(logits, dim=-1, index=index)
        logsumexp_values = torch.stack([torch.logsumexp(lg, dim=-1) for lg in logits])
        per_token_logps = selected_logits - logsumexp_values.unsqueeze(-1)
    else:
        rows = []
        for row_logits, row_labels in zip(logits, index, strict=True):
            rows.append(F.log_softmax(row_logits, dim=-1).gather(dim=-1, index=row_labels))
        per_token_logps = torch.stack(rows)
    return per_token_logps.squeeze(-1) if squeeze else per_token_logps


def entropy_from_logits(logits: torch.Tensor, chunk_size: int = 128) -> torch.Tensor:
    """trl 1.12's ``entropy_from_logits``, copied: the entropy of each row in chunks of ``chunk_size`` rows."""
    import torch.nn.functional as F

    original_shape = logits.shape[:-1]
    flat_logits = logits.reshape(-1, logits.shape[-1])
    entropies = []
    for chunk in flat_logits.split(chunk_size, dim=0):
        logps = F.log_softmax(chunk, dim=-1)
        entropies.append(-(torch.exp(logps) * logps).sum(-1))
    return torch.cat(entropies, dim=0).reshape(original_shape)


def logits_log_probs(trainer: Any, in_place: bool = False) -> Callable[..., Any]:
    """trl 1.12's ``_get_per_token_logps_and_entropies`` for a text model (before the fused LM head), copied: the
    logits of the completion positions materialised over the vocabulary, divided by the temperature into a new
    tensor (trl 1.10 and later; ``in_place``: ``logits.div_(self.temperature)`` on the view of the model's output,
    as trl 1.9.2 and the releases since huggingface/trl#5254 divide them), then :func:`selective_log_softmax` and
    the entropies without gradients (:func:`entropy_from_logits`), ``outputs`` kept alive through the loop's body
    as TRL keeps it. The model's outputs are in float32 where the Trainer's accelerate converts them under
    ``bf16=True`` (memlab's trainer route wraps the model's forward so, as ``Accelerator.prepare_model`` does)."""

    def log_probs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                  batch_size: int | None = None, compute_entropy: bool = False, **_: Any) -> Any:
        step = batch_size or input_ids.size(0)
        all_logps, all_entropies = [], []
        for start in range(0, input_ids.size(0), step):
            ids, mask = input_ids[start:start + step], attention_mask[start:start + step]
            outputs = model(input_ids=ids, attention_mask=mask, logits_to_keep=logits_to_keep + 1, use_cache=False)
            logits = outputs.logits[:, :-1, :][:, -logits_to_keep:, :]
            if in_place:  # trl 1.9.2: its backward's CopySlices holds a gradient of the whole output
                logits.div_(trainer.temperature)
            else:
                logits = logits / trainer.temperature
            all_logps.append(selective_log_softmax(logits, ids[:, -logits_to_keep:]))
            if compute_entropy:
                with torch.no_grad():
                    all_entropies.append(entropy_from_logits(logits))
        entropies = torch.cat(all_entropies, dim=0) if compute_entropy else None
        return torch.cat(all_logps, dim=0), entropies, None

    return log_probs


def liger_grpo_trainer() -> type:
    """The installed TRL's GRPOTrainer whose loss is TRL 0.26.2's ``compute_liger_loss`` (copied from that release):
    the backbone's last hidden states of the completion tokens and the LM head's weight into the installed
    liger-kernel's ``LigerFusedLinearGRPOLoss``, built with the trainer's beta, clipping, temperature and loss type.
    TRL 0.26.2 called it through ``_ForwardRedirection``, which calls the model's class ``forward`` in place of the
    autocast wrapper accelerate set on the instance, so the loss ran outside autocast: here too."""
    import trl
    from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

    class LigerLossGRPOTrainer(trl.GRPOTrainer):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.liger_grpo_loss = LigerFusedLinearGRPOLoss(
                beta=self.beta, epsilon_low=self.epsilon_low, epsilon_high=self.epsilon_high,
                temperature=self.temperature, use_ref_model=self.beta != 0.0, loss_type=self.loss_type,
                max_completion_length=self.max_completion_length)

        def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            with torch.autocast("cpu", enabled=False), torch.autocast("cuda", enabled=False):
                unwrapped = self.accelerator.unwrap_model(model)
                completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
                input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
                attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
                keep = completion_ids.size(1)
                base = unwrapped.base_model.model if hasattr(unwrapped, "get_base_model") else unwrapped
                hidden = base.model(input_ids=input_ids, attention_mask=attention_mask,
                                    use_cache=False).last_hidden_state
                hidden = hidden[:, :-1, :][:, -keep:, :]
                loss, _metrics = self.liger_grpo_loss(
                    _input=hidden, lin_weight=base.lm_head.weight, selected_token_ids=completion_ids,
                    attention_mask=completion_mask, advantages=inputs["advantages"], bias=base.lm_head.bias,
                    old_per_token_logps=inputs.get("old_per_token_logps"),
                    ref_per_token_logps=inputs.get("ref_per_token_logps"))
                return loss / self.current_gradient_accumulation_steps

    return LigerLossGRPOTrainer


def logits_sft_trainer() -> type:
    """The installed TRL's SFTTrainer whose ``compute_loss`` is TRL 0.28's (0.29's is the same without Liger), copied:
    transformers' ``Trainer.compute_loss`` (the model's own loss over the logits, ``ForCausalLMLoss`` in float32), then
    without gradients the entropy of every position (:func:`entropy_from_logits`, in chunks of 128 rows) and the
    argmax token accuracy from a contiguous copy of the shifted logits, ``outputs`` alive throughout as TRL keeps it.
    TRL 1.16 computes the same figures through its fused LM head (``fused_lm_head=True``), which never holds the
    logits; without that keyword its patched forward is the model's own."""
    import transformers
    import trl

    class LogitsSFTTrainer(trl.SFTTrainer):  # type: ignore[misc]
        def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            labels = inputs["labels"]
            inputs["use_cache"] = False
            loss, outputs = transformers.Trainer.compute_loss(self, model, inputs, return_outputs=True,
                                                              num_items_in_batch=num_items_in_batch)
            with torch.no_grad():
                per_token_entropy = entropy_from_logits(outputs.logits)
                mask = inputs["attention_mask"]
                entropy = torch.sum(per_token_entropy * mask) / mask.sum()
                predictions = outputs.logits[..., :-1, :].contiguous().argmax(dim=-1)
                shift_labels = labels[..., 1:].contiguous()
                counted = shift_labels != -100
                accuracy = ((predictions == shift_labels) & counted).sum() / counted.sum().clamp(min=1)
            self.logits_metrics = (entropy, accuracy)  # TRL logs their .item(), which fake tensors have not
            return (loss, outputs) if return_outputs else loss

    return LogitsSFTTrainer


def _zero_reward(completions: list[Any], **_: Any) -> list[float]:
    return [0.0 for _ in completions]


def build_trainer(run: Run, folder: Path, *, loss: str | None = None, liger_patches: bool | None = None,
                  prompt_tokens: int | None = None) -> Any:
    """``run``'s trainer as its source built it, on the meta device: ``memlab.model_on_meta(config, **run.load)``,
    the source's LoRA and TRL config keywords, ``memlab.trainer_on_meta``; prompts (and DPO answers, SFT rows) of the
    row's lengths in a word-level tokenizer (an estimate reads their lengths only). ``loss`` replaces the row's (a key
    of :data:`LOSSES`); ``liger_patches`` False builds it with ``use_liger_kernel=False``. TRL's
    ``activation_offloading`` is left off the config (:func:`estimate_trainer` estimates it as memlab's offload)."""
    import peft
    import trl
    from datasets import Dataset

    import memlab
    from memlab.frontends.cli.trainer import word_tokenizer

    loss = loss or run.loss
    prompt = prompt_tokens or run.prompt_tokens
    config = run.config()
    policy = memlab.model_on_meta(config, **run.load)
    tokenizer = word_tokenizer(int(config.vocab_size))
    settings = dict(run.settings)
    if liger_patches is False:
        settings["use_liger_kernel"] = False
    settings.pop("activation_offloading", None)  # TRL's context needs an accelerator to be built
    common_args = dict(output_dir=str(folder), report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True)
    lora = peft.LoraConfig(task_type="CAUSAL_LM", **run.lora)
    rows = settings.get("per_device_train_batch_size", 8) * settings.get("gradient_accumulation_steps", 1)
    if run.kind == "dpo":
        answer = run.completion_tokens
        pairs = [{"prompt": _words(prompt, i), "chosen": " " + _words(answer, i + 1),
                  "rejected": " " + _words(answer, i + 2)} for i in range(max(rows, 8))]
        return memlab.trainer_on_meta(trl.DPOTrainer, model=policy, args=trl.DPOConfig(**common_args, **settings),
                                      train_dataset=Dataset.from_list(pairs), processing_class=tokenizer,
                                      peft_config=lora)
    if run.kind == "sft":
        texts = Dataset.from_list([{"text": _words(run.completion_tokens, i)} for i in range(max(rows, 8))])
        sft_class = logits_sft_trainer() if loss == "sft-logits" else trl.SFTTrainer
        return memlab.trainer_on_meta(sft_class, model=policy, args=trl.SFTConfig(**common_args, **settings),
                                      train_dataset=texts, processing_class=tokenizer, peft_config=lora)
    trainer_class = liger_grpo_trainer() if loss == "liger-0.26.2" else trl.GRPOTrainer
    prompts = Dataset.from_list([{"prompt": _words(prompt, i)} for i in range(max(rows, 8))])
    trainer = memlab.trainer_on_meta(trainer_class, model=policy, args=trl.GRPOConfig(**common_args, **settings),
                                     reward_funcs=_zero_reward, train_dataset=prompts, processing_class=tokenizer,
                                     peft_config=lora)
    if loss in ("logits", "logits-1.9.2"):
        trainer._get_per_token_logps_and_entropies = logits_log_probs(trainer, in_place=loss == "logits-1.9.2")
    return trainer


def paged_state_bytes(trainer: Any) -> int:
    """The optimizer state a paged bitsandbytes optimizer keeps in CUDA unified memory for ``trainer``: state1 and
    state2 (one byte an element each for the 8-bit ones, four for ``paged_adamw_32bit``) of every trainable
    parameter of :data:`PAGED_MIN_ELEMENTS` or more; 0 for an optimizer that pages nothing."""
    optim = getattr(trainer.args, "optim", "")
    optim = str(getattr(optim, "value", optim)).lower()
    if "paged" not in optim:
        return 0
    per_element = 2 if "8bit" in optim else 8
    return sum(per_element * p.numel() for p in trainer.model.parameters()
               if p.requires_grad and p.numel() >= PAGED_MIN_ELEMENTS)


def estimate_trainer(run: Run, folder: Path, **build: Any) -> dict[str, Any]:
    """``memlab.estimate`` of :func:`build_trainer`'s trainer for ``run.gpu``: the peak, the reserve, the paged
    state outside it, each phase's highest, and the estimate's notes. A row with TRL's ``activation_offloading`` is
    estimated with the trainer's own plan and its saved activations offloaded (what TRL's context does)."""
    import memlab

    trainer = build_trainer(run, folder, **build)
    plan = None
    if run.settings.get("activation_offloading"):
        own = memlab.Plan.from_trainer(trainer)
        plan = own.replace(offload="all" if own.offload == "optimizer" else "activations")
    trial = memlab.estimate(trainer, plan, gpu=run.gpu)
    if trial.status != "ok":
        return {"status": trial.status, "error": trial.error}
    phases = trial.timeline.phase_peaks() if trial.timeline is not None else {}
    return {"status": "ok", "peak_bytes": trial.peak_bytes, "reserved_bytes": trial.reserved_bytes or 0,
            "context_bytes": trial.context_bytes or 0, "paged_bytes": paged_state_bytes(trainer),
            "phase": trial.timeline.peak.phase if trial.timeline is not None else "training",
            "phases": dict(phases), "breakdown": dict(trial.breakdown), "notes": list(trial.notes)}


def _liger_folder(release: str, under: Path) -> Path:
    """liger-kernel ``release`` installed (``--no-deps``) into a folder of its own under ``under``."""
    folder = under / f"liger-kernel-{release}"
    if not (folder / "liger_kernel").is_dir():
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(folder),
                               f"liger-kernel=={release}"], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"pip could not install liger-kernel=={release}: {done.stderr.strip()[-500:]}")
    return folder


def estimate_in_process_of_its_own(run: Run, folder: Path) -> dict[str, Any]:
    """:func:`estimate_trainer` of ``run`` in a child process whose path puts ``run.liger`` first (a 0.6.x release's
    model patches imported there with :func:`hybrid_cache_stand_in`), with ``run.prompt_range`` too."""
    libraries = _liger_folder(str(run.liger), folder)
    out = folder / "row.json"
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(libraries), str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "benchmarks.trl_vs_published", "--row", run.name,
                           "--row-out", str(out)], env=environment, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        return {"status": "error", "error": done.stderr.strip().splitlines()[-1:] or f"exit {done.returncode}"}
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def hybrid_cache_stand_in() -> bool:
    """Give ``transformers.cache_utils`` a class named ``HybridCache`` where transformers 5 has none (it was
    removed): liger-kernel 0.6.x's Gemma 2 and 3 modules import it for their type hints, so without it none of its
    model patches can be imported (its Llama and Qwen2 ones included, which never use it). True where it was given."""
    import transformers.cache_utils

    if hasattr(transformers.cache_utils, "HybridCache"):
        return False
    transformers.cache_utils.HybridCache = type("HybridCache", (transformers.cache_utils.Cache,), {})
    return True


def _row_child(name: str, out: Path) -> None:
    """The child of :func:`estimate_in_process_of_its_own`: the row named, estimated here, written to ``out``."""
    import importlib.metadata

    (run,) = [run for run in RUNS if run.name == name]
    version = importlib.metadata.version("liger-kernel")
    stand_in = hybrid_cache_stand_in() if version.startswith("0.6.") else False
    with tempfile.TemporaryDirectory() as folder:
        result = estimate_trainer(run, Path(folder))
        result["liger_kernel"] = version
        result["hybrid_cache_stand_in"] = stand_in
        result["at_prompts"] = {str(tokens): estimate_trainer(run, Path(folder), prompt_tokens=tokens)
                                for tokens in run.prompt_range}
    out.write_text(json.dumps(result))


def _compared(run: Run, result: dict[str, Any]) -> int:
    """memlab's figure of the kind ``run`` published: the allocated peak, the reserve less the paged optimizer
    state (outside ``max_memory_reserved``), or the card (the reserve, the paged state on the GPU, the context)."""
    reserved = result["reserved_bytes"]
    return {"allocated": result["peak_bytes"], "reserved": reserved - result["paged_bytes"],
            "card": reserved + result["context_bytes"]}[run.measures]


TRAINERS = {"grpo": "GRPOTrainer", "dpo": "DPOTrainer", "sft": "SFTTrainer"}
"""The TRL trainer class of each row kind."""


def how_estimated(run: Run) -> str:
    """In words, how the row was estimated: the trainer built as its source built it, and its loss."""
    said = (f"memlab.trainer_on_meta(trl.{TRAINERS[run.kind]}) around memlab.model_on_meta(config, **load), "
            f"estimated with memlab.estimate(trainer, gpu='{run.gpu}'); loss: {LOSSES[run.loss]}")
    if run.settings.get("activation_offloading"):
        said += ("; TRL's activation_offloading as memlab's offload='activations' (the trainer built without it: "
                 "TRL's context needs an accelerator)")
    if run.liger:
        said += (f"; liger-kernel {run.liger} (the run's) in a process of its own, its model patches on (imported "
                 "under transformers 5 with a stand-in for the HybridCache class its Gemma modules name)")
    return said


def estimate_run(run: Run, folder: Path) -> dict[str, Any]:
    """memlab's estimate of one published run, against its figures."""
    started = time.perf_counter()
    result = estimate_in_process_of_its_own(run, folder) if run.liger else estimate_trainer(run, folder)
    installed = None
    if (run.liger or (run.kind == "sft" and run.loss != "trl")) and result.get("status") == "ok":
        installed = estimate_trainer(run, folder, loss="trl")  # the same notebook as the installed TRL runs it
    seconds = time.perf_counter() - started
    unit = UNITS[run.unit]
    row: dict[str, Any] = {
        "run": run.name, "trainer": TRAINERS[run.kind], "model": run.model,
        "card": run.card, "gpu_estimated_for": run.gpu, "source": run.source, "estimated": how_estimated(run),
        "load": run.load, "lora": run.lora, "settings": run.settings, "loss": run.loss,
        "prompt_tokens": run.prompt_tokens, "completion_tokens": run.completion_tokens,
        "measures": run.measures, "published": run.published, "unit": run.unit,
        "published_reserved": run.published_reserved, "differs": run.differs, "vague": run.vague,
        "status": result["status"], "seconds": common.rounded(seconds, 1)}
    if result["status"] != "ok":
        return {**row, "error": result.get("error")}
    compared = _compared(run, result)
    peak, reserved = result["peak_bytes"], result["reserved_bytes"]
    card = reserved + result["context_bytes"]
    published = run.published * unit
    row.update({
        "memlab": common.rounded(compared / unit, 3), "ratio": common.rounded(compared / published, 3),
        "memlab_allocated": common.rounded(peak / unit, 3), "memlab_reserved": common.rounded(reserved / unit, 3),
        "memlab_card": common.rounded(card / unit, 3), "paged_state": common.rounded(result["paged_bytes"] / unit, 3),
        "reserved_ratio": (common.rounded((reserved - result["paged_bytes"]) / (run.published_reserved * unit), 3)
                           if run.published_reserved else None),
        "peak_phase": result["phase"],
        "phases": {name: common.rounded(nbytes / unit, 3) for name, nbytes in result["phases"].items()},
        "liger_kernel": result.get("liger_kernel"),
        "bytes": {"peak": peak, "reserved": reserved, "card": card, "paged_state": result["paged_bytes"],
                  "context": result["context_bytes"], **{f"breakdown_{k}": v for k, v in result["breakdown"].items()}},
        "notes": result["notes"]})
    at_prompts = {tokens: common.rounded(_compared(run, other) / published, 3)
                  for tokens, other in result.get("at_prompts", {}).items() if other.get("status") == "ok"}
    if at_prompts:
        row["ratio_at_prompt_tokens"] = at_prompts
    if installed is not None and installed.get("status") == "ok":
        row["installed_trl"] = {
            "what": f"the same notebook built with the installed TRL's {TRAINERS[run.kind]} (its own loss"
                    + (", the installed liger-kernel's model patches" if run.liger else "")
                    + "), not the run that printed the figure",
            "memlab": common.rounded(_compared(run, installed) / unit, 3),
            "ratio": common.rounded(_compared(run, installed) / published, 3), "peak_phase": installed["phase"]}
    return row


def markdown(rows: list[dict[str, Any]], not_expressed: list[dict[str, Any]]) -> str:
    """The docs' tables: the rows compared (the published figure and what it measures, memlab's of that kind and
    their ratio, the reserve's where the source printed one too, the paged optimizer state left out of a reserve,
    the phase of the peak, the loss the row's trainer ran), and the figures not compared with why.

    Example:
        >>> print(markdown([], [{"run": "r", "source": "a/b#1 (x)", "published": "1 GB", "why": "w"}]).splitlines()[-1])
        | r | a/b#1 | 1 GB | w |
    """
    loss_words = {"trl": "installed TRL's", "logits": "trl 1.12's (logits)", "logits-1.9.2": "trl 1.9.2's (logits)",
                  "liger-0.26.2": "TRL 0.26.2's Liger", "sft-logits": "TRL 0.28/0.29's SFT (logits)"}
    compared = common.markdown_table(
        ["run", "card", "published", "memlab", "ratio", "reserved: published", "memlab", "ratio",
         "paged state", "peak in", "loss", "vague"],
        [[r["run"], r["card"], f"{r['published']} {r['unit']} {r['measures']}", r.get("memlab"), r.get("ratio"),
          r["published_reserved"], r.get("memlab_reserved"), r.get("reserved_ratio"), r.get("paged_state") or None,
          r.get("peak_phase"),
          loss_words.get(r.get("loss", ""), r.get("loss")) + (f" + liger {r['liger_kernel']}"
                                                             if r.get("liger_kernel") else ""),
          "yes" if r["vague"] else "no"] for r in rows])
    missing = common.markdown_table(["published figure", "source", "figure", "not compared because"],
                                    [[r["run"], r["source"].split(" ")[0].rstrip(","), r["published"], r["why"]]
                                     for r in not_expressed])
    return f"{compared}\n\n{missing}"


SMOKE = (Run("tiny Qwen3 GRPO LoRA, 2 x (3+4)", "tiny-qwen3", tiny_qwen3, "H100-80GB", "none", 1.0,
             "smoke: no published figure", unit="GB", prompt_tokens=3, completion_tokens=4,
             load={"dtype": torch.float32}, lora={"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]},
             settings={"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "num_generations": 2,
                       "max_completion_length": 4, "beta": 0.0, "bf16": False}, loss="trl"),)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", default=None, help="run the rows whose name contains this text")
    parser.add_argument("--out", default=None, help="the folder to write the JSON to (default: benchmarks/results/)")
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--row", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--row-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    common.quiet()
    if args.row is not None:
        _row_child(args.row, Path(args.row_out))
        return {}
    runs = SMOKE if args.smoke else tuple(r for r in RUNS if args.only is None or args.only in r.name)
    with tempfile.TemporaryDirectory() as folder:
        rows = [estimate_run(run, Path(folder)) for run in runs]
    for row in rows:
        print(f"{row['run']}: {row['status']} memlab {row.get('memlab')} {row['unit']} ({row.get('ratio')} of "
              f"{row['published']} {row['measures']}), reserved {row.get('memlab_reserved')} "
              f"({row.get('reserved_ratio')}), peak in {row.get('peak_phase')} ({row['seconds']} s)"
              + (f" error: {row.get('error')}" if row["status"] != "ok" else ""))
    not_expressed = [] if args.smoke else list(NOT_EXPRESSED)
    size = "smoke" if args.smoke else "published"
    payload = {
        **common.metadata_for(NAME, torch.device("cpu"), size),
        "what": ("memlab.estimate of TRL GRPO, DPO and SFT trainers others published, each built on the meta device as "
                 "its source built it, made on this CPU for the GPU kind each row names (the module's docstring "
                 "says how)"),
        "rows": rows, "not_expressed": not_expressed,
        "ratios": [r.get("ratio") for r in rows], "markdown": markdown(rows, not_expressed),
    }
    print(payload["markdown"])
    if args.only is None or args.out:
        stem = f"{NAME}-cpu" + ("-smoke" if args.smoke else "") + ("-only" if args.only else "")
        path = (Path(args.out) if args.out else common.RESULTS_DIR) / f"{stem}.json"
        common.write_json(payload, path)
        print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
