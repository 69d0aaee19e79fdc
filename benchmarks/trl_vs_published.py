"""memlab's estimate of TRL's GRPO and DPO steps against GPU memory figures that others published (issue 59).

Each row is a run someone measured on a named GPU, with the settings they published. memlab estimates the same step
from the model's config alone, on fake tensors, on this machine's CPU, for the GPU kind the row names. A real TRL
trainer at 2 to 14 billion parameters cannot be built on this CPU (its weights would be materialised), so each
GRPO row is estimated as the two steps TRL runs, through memlab's existing routes:

- **training**: ``memlab.estimate(config, generations, plan, loss_fn=..., load=...)`` over one micro-batch of
  generations (``per_device_train_batch_size`` rows of prompt + ``max_completion_length`` tokens, every completion
  full length, the advantages, and the reference / old-policy log-probs where the config computes them), with the
  loss TRL computes: the ``compute_loss`` of a tiny GRPOTrainer built with the row's ``GRPOConfig`` (its beta, loss
  type, temperature), called on the real-size fake model, its log-probs computed as the source's TRL computed them:
  trl 1.12 (the probe's) through the logits over the vocabulary (:func:`logits_log_probs`), the installed TRL
  through the fused LM head it adds to the policy (``trl.trainer.utils.add_fused_lm_head``). Under ``bf16=True``
  the Trainer's accelerate wraps the model's forward in autocast *and* converts its outputs to float32
  (``Accelerator.prepare_model``, ``convert_outputs_to_fp32``): memlab's ``Plan(precision="bf16")`` autocasts
  only, so the stand-in converts the outputs as accelerate does; ``bf16_outputs_ratio`` is the row without it;
- **generation**: ``memlab.estimate(config, prompts, InferencePlan(...))``: the generation batch
  (``per_device_train_batch_size x steps_per_generation`` completions) decoded with transformers' ``DynamicCache``;
  to keep the run short, its last decode step is estimated as a prefill of ``prompt + completion - 2`` tokens and
  two decode steps (the KV cache at its full length, as at the end of ``generate``), and sampling's
  ``2 x rows x vocab x 4`` bytes (:func:`memlab.kinds.grpo.estimate.sampling_bytes`) added; the LoRA weights and
  their optimizer state, held through it, are added too.

The peak is the larger of the two, as :mod:`memlab.kinds.grpo.estimate` combines them for a live GRPOTrainer.

The result records per row what the published figure measures (``allocated``: ``torch.cuda.max_memory_allocated``;
``reserved``: ``max_memory_reserved``), the estimate / published ``ratio`` of the same kind, and ``differs``: what
the source's run does that the estimate does not model. ``vague`` rows are those whose source leaves settings out
(each says which were assumed). ``not_expressed`` lists published figures memlab cannot be compared with, and why.

Sources (every number below is quoted from them):

- jsboige/CoursIA, ``MyIA.AI.Notebooks/GenAI/PostTraining/_measurements/vram_wall_probe.py`` (pull request #15634,
  2026-09-11) and its ``vram_probe_results_*.jsonl`` (#15634, #15640, #15643, and the 2026-09-22 and 2026-10-06
  files): TRL's ``GRPOTrainer`` (trl 1.12), ``from_pretrained(model, quantization_config=BitsAndBytesConfig(nf4,
  double quant, bf16 compute))``, ``LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05)`` on q/k/v/o/gate/up/down,
  ``GRPOConfig(num_generations=8, beta=0.0, per_device_train_batch_size=8, gradient_accumulation_steps=4,
  max_completion_length=96 (or as the row says), bf16=True, gradient_checkpointing=True)``, transformers'
  ``generate`` (no vLLM), a constant reward, prompts such as ``"Solve: 12 + 30 = ?"`` (plain text, no chat
  template: about 11 Qwen tokens, assumed here), 3 optimizer steps. ``max_vram_allocated_gb`` /
  ``max_vram_reserved_gb`` are ``torch.cuda.max_memory_allocated()`` / ``max_memory_reserved()`` over the trainer's
  construction and the 3 steps, in GiB (``/ 2**30``).
- odyn-network/benchmark-finetune-dpo-v1 (a Hugging Face data set) quoting superkaiba/explore-persona-space issue
  #36: TRL's ``DPOTrainer``, Qwen2.5-7B, LoRA r=16, bf16, context 2,048, batch 1, accumulation 8, gradient
  checkpointing, one GPU, "peak" 19.08 GB. The issue itself was not readable here: the GPU, what was read and the
  LoRA targets are not given (vague). No published DPO figure found states all of them (``NOT_EXPRESSED`` lists
  those checked); the row is estimated as the installed TRL runs it (:func:`dpo_loss`): the policy's log-probs
  through the fused LM head, then the reference's with the LoRA layers off, as TRL does for a peft policy.

- huggingface/trl ``examples/notebooks/grpo_trl_lora_qlora.ipynb`` (TRL's own notebook, its outputs from a free
  Colab T4 in 2025-12, as at trl 16b090302): Qwen/Qwen2-7B-Instruct in 4-bit NF4 (double quant, fp16 compute, the
  rest in float32), LoRA r=32 on every projection, ``GRPOConfig(per_device_train_batch_size=8, num_generations=8,
  max_completion_length=256, optim="paged_adamw_8bit", use_liger_kernel=True, gradient_checkpointing=True)``, bf16
  and beta 0 by TRL's defaults: "Peak reserved memory = 8.832 GB" (``max_memory_reserved() / 2**30``), and its table's
  9.6 GB for the same configuration on an A100-40GB (what was read not said). The T4 ran bf16 autocast emulated;
  memlab refuses bf16 on a GPU without it, as its own trial there does, so that row is estimated in fp16 (its
  ``differs`` says what that changes). The notebooks' SFT runs (a T4, an A100-40GB) are in ``NOT_EXPRESSED``.

Run from the repository root (no GPU needed; about 4 minutes on 2 cores)::

    python -m benchmarks.trl_vs_published
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks import common
from benchmarks.trl_published_runs import NOT_EXPRESSED, RUNS, Run, tiny_qwen3

NAME = "trl_vs_published"
GIB = 2**30
UNITS = {"GB": 1e9, "GiB": 2**30}
def _tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "[EOS]": 2, **{f"w{i}": i + 3 for i in range(60)}}
    words = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=words, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]")


def logits_log_probs(trainer: Any, fp32_outputs: bool = True) -> Callable[..., Any]:
    """trl 1.12's ``_get_per_token_logps_and_entropies`` (before the fused LM head): the logits of the completion
    positions materialised over the vocabulary, divided by the temperature, then ``selective_log_softmax`` and the
    entropies without gradients. ``fp32_outputs``: the model's outputs converted to float32 as the Trainer's
    accelerate returns them under ``bf16=True`` (``Accelerator.prepare_model`` wraps the forward in autocast and
    ``convert_outputs_to_fp32``), ``outputs`` kept alive through the loop's body as TRL keeps it."""
    from accelerate.utils import convert_outputs_to_fp32
    from trl.trainer.utils import entropy_from_logits, selective_log_softmax

    def log_probs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                  batch_size: int | None = None, compute_entropy: bool = False, **_: Any) -> Any:
        step = batch_size or input_ids.size(0)
        forward = convert_outputs_to_fp32(model.__call__) if fp32_outputs else model.__call__
        all_logps, all_entropies = [], []
        for start in range(0, input_ids.size(0), step):
            ids, mask = input_ids[start:start + step], attention_mask[start:start + step]
            outputs = forward(input_ids=ids, attention_mask=mask, logits_to_keep=logits_to_keep + 1)
            logits = outputs.logits[:, :-1, :][:, -logits_to_keep:, :] / trainer.temperature
            all_logps.append(selective_log_softmax(logits, ids[:, -logits_to_keep:]))
            if compute_entropy:
                with torch.no_grad():
                    all_entropies.append(entropy_from_logits(logits))
        entropies = torch.cat(all_entropies, dim=0) if compute_entropy else None
        return torch.cat(all_logps, dim=0), entropies, None

    return log_probs


def stand_in_trainer(run: Run, folder: Path) -> Any:
    """A tiny GRPOTrainer built with ``run``'s GRPOConfig (beta, generations, batch, completion length): its
    ``compute_loss`` is the loss of the row's step."""
    import trl
    from datasets import Dataset
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    args = trl.GRPOConfig(output_dir=str(folder), report_to=[], use_cpu=True, save_strategy="no", bf16=False,
                          per_device_train_batch_size=run.per_device, gradient_accumulation_steps=run.accumulation,
                          num_generations=run.num_generations, max_completion_length=run.completion_tokens,
                          beta=run.beta, disable_tqdm=True)
    prompts = Dataset.from_list([{"prompt": "w1 w2 w3"}] * (run.per_device * run.accumulation))
    trainer = trl.GRPOTrainer(model=Qwen3ForCausalLM(tiny_qwen3()), args=args, train_dataset=prompts,
                              reward_funcs=lambda completions, **_: [0.5] * len(completions),
                              processing_class=_tokenizer())
    trainer.current_gradient_accumulation_steps = 1  # memlab scales the loss for accumulation itself
    return trainer


def grpo_loss(run: Run, folder: Path, fp32_outputs: bool = True) -> Callable[[Any, Any], Any]:
    """``loss_fn(model, generations)``: the stand-in trainer's ``compute_loss`` on the model memlab gives it: with
    TRL's fused LM head added to that model once (as GRPOTrainer adds it to the policy) where
    ``run.fused_lm_head``, else scoring through the logits as trl 1.12 did (:func:`logits_log_probs`)."""
    from trl.trainer.utils import add_fused_lm_head

    trainer = stand_in_trainer(run, folder)
    if not run.fused_lm_head:
        trainer._get_per_token_logps_and_entropies = logits_log_probs(trainer, fp32_outputs)
    patched: set[int] = set()

    def loss_fn(model: Any, batch: Any) -> Any:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        if run.fused_lm_head and id(base) not in patched:
            add_fused_lm_head(base, temperature=trainer.temperature,
                              cast_lm_head_to_fp32=trainer.args.cast_lm_head_to_fp32, outputs=("log_probs", "entropy"))
            patched.add(id(base))
        inputs = dict(batch)
        inputs["num_items_in_batch"] = inputs["completion_mask"].sum()
        return trainer.compute_loss(model, inputs)

    return loss_fn


def generations(run: Run, vocab: int) -> dict[str, torch.Tensor]:
    """One micro-batch of generations as TRL's ``_generate_and_score_completions`` returns them, every completion
    full length (beta 0: no reference log-probs; one iteration per generation: no old-policy log-probs)."""
    rows, prompt, completion = run.per_device, run.prompt_tokens, run.completion_tokens
    generator = torch.Generator().manual_seed(0)
    batch = {"prompt_ids": torch.randint(vocab, (rows, prompt), generator=generator),
             "prompt_mask": torch.ones(rows, prompt, dtype=torch.long),
             "completion_ids": torch.randint(vocab, (rows, completion), generator=generator),
             "completion_mask": torch.ones(rows, completion, dtype=torch.long),
             "advantages": torch.randn(rows, generator=generator)}
    if run.beta != 0.0:
        batch["ref_per_token_logps"] = -torch.rand(rows, completion, generator=generator)
    return batch


def estimate_grpo(run: Run, folder: Path) -> dict[str, Any]:
    """The training and generation estimates of a GRPO row, and the step's peak (the larger)."""
    import memlab
    from memlab.inference.plan import InferencePlan
    from memlab.kinds.grpo.estimate import sampling_bytes

    config = run.config()
    vocab = int(config.vocab_size)
    training = memlab.estimate(config, generations(run, vocab), run.plan(), loss_fn=grpo_loss(run, folder),
                               gpu=run.gpu, load=run.load)
    rows = run.per_device * run.accumulation  # steps_per_generation defaults to the accumulation steps
    quantize = "nf4" if "quantization_config" in run.load else "none"
    generation = memlab.estimate(config, {"input_ids": (rows, run.prompt_tokens + run.completion_tokens - 2)},
                                 InferencePlan(new_tokens=2, weights="fp16" if run.precision == "fp16" else "bf16",
                                               quantize=quantize), gpu=run.gpu)
    if training.status != "ok" or generation.status != "ok":
        return {"status": f"training {training.status}, generation {generation.status}",
                "error": training.error or generation.error}
    # The same step with the outputs as memlab's bf16 plan leaves them (bf16): what it misses of accelerate's.
    plain = None if run.fused_lm_head else memlab.estimate(
        config, generations(run, vocab), run.plan(), loss_fn=grpo_loss(run, folder, fp32_outputs=False),
        gpu=run.gpu, load=run.load)
    held = max(0, training.breakdown.get("params", 0) - generation.breakdown.get("params", 0))
    held += training.breakdown.get("optimizer", 0)
    sampling = sampling_bytes(rows, vocab)
    generation_peak = generation.peak_bytes + sampling + held
    generation_reserved = (generation.reserved_bytes or 0) + sampling + held
    peak = max(training.peak_bytes, generation_peak)
    return {"status": "ok", "peak_bytes": peak, "phase": "generation" if generation_peak > training.peak_bytes
            else "training", "reserved_bytes": max(training.reserved_bytes or 0, generation_reserved),
            "training_peak_bytes": training.peak_bytes, "generation_peak_bytes": generation_peak,
            "kv_cache_bytes": generation.breakdown.get("kv_cache", 0), "sampling_bytes": sampling,
            "bf16_outputs_training_bytes": plain.peak_bytes if plain is not None and plain.status == "ok" else None,
            "notes": [*training.notes, *generation.notes]}


def tiny_qwen2() -> Any:
    """A two-layer Qwen2 for the DPO stand-in trainer."""
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, pad_token_id=0)


class AdaptersOff:
    """A model called with its LoRA layers switched off, as ``PeftModel.disable_adapter()`` calls it: DPO's
    reference for a peft policy (memlab's plans inject the adapters into the model, without a ``PeftModel``)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def __call__(self, **inputs: Any) -> Any:
        from peft.tuners.tuners_utils import BaseTunerLayer

        layers = [module for module in self.model.modules() if isinstance(module, BaseTunerLayer)]
        for layer in layers:
            layer.enable_adapters(False)
        try:
            return self.model(**inputs)
        finally:
            for layer in layers:
                layer.enable_adapters(True)


def dpo_loss(run: Run, folder: Path) -> Callable[[Any, Any], Any]:
    """``loss_fn(model, pairs)``: TRL's DPO loss as the installed DPOTrainer computes it for a peft policy, from a
    tiny stand-in DPOTrainer built with the row's beta and LoRA targets: the policy's log-probs through the fused LM
    head that DPOTrainer adds to the base model, then the reference's, a forward without gradients of the same model
    with its adapters off (:class:`AdaptersOff`, as TRL's ``use_adapter`` does for a ``PeftModel``)."""
    import trl
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import Qwen2ForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    torch.manual_seed(0)
    args = trl.DPOConfig(output_dir=str(folder), report_to=[], use_cpu=True, save_strategy="no", bf16=False,
                         per_device_train_batch_size=run.per_device, beta=run.beta, disable_tqdm=True)
    pairs = Dataset.from_list([{"prompt": "w1 w2", "chosen": " w3 w4", "rejected": " w5"}] * 2)
    trainer = trl.DPOTrainer(model=Qwen2ForCausalLM(tiny_qwen2()), args=args, train_dataset=pairs,
                             processing_class=_tokenizer(),
                             peft_config=LoraConfig(r=run.lora_rank, lora_alpha=run.lora_alpha,
                                                    target_modules=list(run.lora_targets)))
    patched: set[int] = set()

    def loss_fn(model: Any, batch: Any) -> Any:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        if id(base) not in patched:
            add_fused_lm_head(base, outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
            patched.add(id(base))
        trainer.ref_model = AdaptersOff(model)  # memlab injects the adapters: no PeftModel to switch them off
        inputs = dict(batch)
        inputs.setdefault("attention_mask", torch.ones_like(inputs["input_ids"]))  # every pair at full length
        return trainer.compute_loss(model, inputs)

    return loss_fn


def estimate_dpo(run: Run, folder: Path) -> dict[str, Any]:
    """A DPO row: one micro-batch of pairs, chosen and rejected concatenated at the full length (``2 x
    per_device`` rows), through TRL's DPO loss with the reference forward (:func:`dpo_loss`)."""
    import memlab

    rows, prompt, completion = 2 * run.per_device, run.prompt_tokens, run.completion_tokens
    tokens = prompt + completion
    generator = torch.Generator().manual_seed(0)
    mask = torch.ones(rows, tokens, dtype=torch.long)
    mask[:, :prompt] = 0
    pairs = {"input_ids": torch.randint(int(run.config().vocab_size), (rows, tokens), generator=generator),
             "completion_mask": mask}
    trial = memlab.estimate(run.config(), pairs, run.plan(), loss_fn=dpo_loss(run, folder), gpu=run.gpu,
                            load=run.load)
    if trial.status != "ok":
        return {"status": trial.status, "error": trial.error}
    return {"status": "ok", "peak_bytes": trial.peak_bytes, "phase": "training",
            "reserved_bytes": trial.reserved_bytes or 0, "training_peak_bytes": trial.peak_bytes,
            "notes": list(trial.notes)}


def estimate_run(run: Run, folder: Path) -> dict[str, Any]:
    """memlab's estimate of one published run, against its figures."""
    started = time.perf_counter()
    result = estimate_grpo(run, folder) if run.kind == "grpo" else estimate_dpo(run, folder)
    seconds = time.perf_counter() - started
    unit = UNITS[run.unit]
    row: dict[str, Any] = {
        "run": run.name, "trainer": "GRPOTrainer" if run.kind == "grpo" else "DPOTrainer", "model": run.model,
        "card": run.card, "gpu_estimated_for": run.gpu, "plan": run.plan().label(), "source": run.source,
        "settings": {"prompt_tokens": run.prompt_tokens, "completion_tokens": run.completion_tokens,
                     "per_device_train_batch_size": run.per_device, "gradient_accumulation_steps": run.accumulation,
                     "num_generations": run.num_generations, "beta": run.beta},
        "measures": run.measures, "published": run.published, "unit": run.unit,
        "published_reserved": run.published_reserved, "differs": run.differs, "vague": run.vague,
        "status": result["status"], "seconds": common.rounded(seconds, 1)}
    if result["status"] != "ok":
        return {**row, "error": result.get("error")}
    peak, reserved = result["peak_bytes"], result["reserved_bytes"]
    from memlab.estimation.cuda.gpus import gpu_kind

    card = reserved + gpu_kind(run.gpu).context_bytes  # what nvidia-smi shows: the reserve and the CUDA context
    compared = {"allocated": peak, "reserved": reserved, "card": card}[run.measures]
    row.update({
        "memlab": common.rounded(compared / unit, 3), "ratio": common.rounded(compared / (run.published * unit), 3),
        "memlab_allocated": common.rounded(peak / unit, 3), "memlab_card": common.rounded(card / unit, 3),
        "memlab_reserved": common.rounded(reserved / unit, 3),
        "reserved_ratio": (common.rounded(reserved / (run.published_reserved * unit), 3)
                           if run.published_reserved else None),
        "peak_phase": result["phase"],
        "training": common.rounded(result["training_peak_bytes"] / unit, 3),
        "generation": common.rounded(result["generation_peak_bytes"] / unit, 3)
        if "generation_peak_bytes" in result else None,
        "kv_cache": common.rounded(result["kv_cache_bytes"] / unit, 3) if "kv_cache_bytes" in result else None,
        "bf16_outputs_ratio": (
            common.rounded(max(result["bf16_outputs_training_bytes"], result["generation_peak_bytes"])
                           / (run.published * unit), 3)
            if result.get("bf16_outputs_training_bytes") and run.measures == "allocated" else None),
        "bytes": {"peak": peak, "reserved": reserved, "card": card, "training": result["training_peak_bytes"],
                  "generation": result.get("generation_peak_bytes")},
        "notes": result["notes"]})
    return row


def markdown(rows: list[dict[str, Any]], not_expressed: list[dict[str, Any]]) -> str:
    """The docs' tables: the rows compared (allocated and reserved figures in the row's unit, their ratios, the
    phase of the peak, the ratio with the model's outputs left in bf16), and the figures not compared with why.

    Example:
        >>> print(markdown([], [{"run": "r", "source": "a/b#1 (x)", "published": "1 GB", "why": "w"}]).splitlines()[-1])
        | r | a/b#1 | 1 GB | w |
    """
    compared = common.markdown_table(
        ["run", "card", "published", "memlab", "ratio", "reserved: published", "memlab", "ratio",
         "peak in", "ratio, outputs left bf16", "vague"],
        [[r["run"], r["card"], f"{r['published']} {r['unit']} {r['measures']}", r.get("memlab"), r.get("ratio"),
          r["published_reserved"], r.get("memlab_reserved"), r.get("reserved_ratio"), r.get("peak_phase"),
          r.get("bf16_outputs_ratio"), "yes" if r["vague"] else "no"] for r in rows])
    missing = common.markdown_table(["published figure", "source", "figure", "not compared because"],
                                    [[r["run"], r["source"].split(" ")[0].rstrip(","), r["published"], r["why"]]
                                     for r in not_expressed])
    return f"{compared}\n\n{missing}"


SMOKE = (Run("tiny Qwen3 GRPO LoRA, 2 x (3+4)", "tiny-qwen3", tiny_qwen3, "H100-80GB", "none", 1.0,
             "smoke: no published figure", unit="GB", prompt_tokens=3, completion_tokens=4, per_device=2,
             accumulation=2, num_generations=2, load={"dtype": torch.float32}, lora_targets=("q_proj", "v_proj"),
             checkpointing=False, precision="fp32", fused_lm_head=True),)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", default=None, help="run the rows whose name contains this text")
    parser.add_argument("--out", default=None, help="the folder to write the JSON to (default: benchmarks/results/)")
    parser.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    common.quiet()
    import tempfile

    runs = SMOKE if args.smoke else tuple(r for r in RUNS if args.only is None or args.only in r.name)
    with tempfile.TemporaryDirectory() as folder:
        rows = [estimate_run(run, Path(folder)) for run in runs]
    for row in rows:
        print(f"{row['run']}: {row['status']} memlab {row.get('memlab')} {row['unit']} ({row.get('ratio')} of "
              f"{row['published']}), reserved {row.get('memlab_reserved')} ({row.get('reserved_ratio')}), peak in "
              f"{row.get('peak_phase')} ({row['seconds']} s)")
    not_expressed = [] if args.smoke else list(NOT_EXPRESSED)
    size = "smoke" if args.smoke else "published"
    payload = {
        **common.metadata_for(NAME, torch.device("cpu"), size),
        "what": ("memlab.estimate of TRL GRPO and DPO runs others published, made on this CPU for the GPU kind each "
                 "row names, through memlab's training and inference routes (the module's docstring says how)"),
        "rows": rows, "not_expressed": not_expressed,
        "ratios": [r.get("ratio") for r in rows], "markdown": markdown(rows, not_expressed),
    }
    print(payload["markdown"])
    if args.only is None:
        stem = f"{NAME}-cpu" + ("-smoke" if args.smoke else "")
        path = (Path(args.out) if args.out else common.RESULTS_DIR) / f"{stem}.json"
        common.write_json(payload, path)
        print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
