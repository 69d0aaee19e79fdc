"""The estimate sections of the GPU acceptance run (see :mod:`benchmarks.gpu_acceptance`): ``memlab.estimate`` made
on fake tensors, in a process that sees no GPU (as a laptop or CI makes it), against the peak measured on the GPU.

- ``estimate``: GPT-2, BERT, Llama (Llama-3.2-1B's shape) and a small Mixtral (a mixture of experts) in fp32, bf16
  autocast, pure bf16 weights and fp16 (with GradScaler): the allocated peak within 5%, the card figure within 5%.
- ``heldout``: the families the table of truth does not hold yet (issue 40): Qwen2, Mistral, Gemma-2, Phi-3,
  GPT-NeoX and T5, each at two sequence lengths, in fp32, bf16 autocast and pure bf16 (``Plan(weights="bf16")``):
  the allocated peak within 5%, the reserved peak within 10%.

Each row records, beside the allocated peak (``max_memory_allocated``, what the estimate predicts), the allocator's
reserved peak (``max_memory_reserved``) and the CUDA context (what the driver says is used, less what the allocator
reserves), and the estimate's own figures for them where this memlab has them (``reserved_bytes``,
``context_bytes``, ``card_bytes``).

The estimates are made first, all at once, by :func:`estimate_all` (the acceptance run starts one side process per
section with ``CUDA_VISIBLE_DEVICES=""`` while the GPU runs other parts, and passes its file in the variable
:func:`estimates_variable` names); without that file the section makes them itself.

One row, the 1B Llama's ``ckpt bf16`` at 2 x 1024, also records the CUDA allocations of 100 MB or more made during
memlab's tracked step (``torch.cuda.memory._record_memory_history``): the first GPU run saw about 5 GB, the size of
the parameters, in the "other" category at the optimizer step, which the CPU-made estimate misses.
"""

from __future__ import annotations

import inspect
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks import common
from benchmarks.gpu_common import (
    LLAMA_1B,
    SIZES,
    TINY,
    Checks,
    Llama,
    card_figures,
    card_reading,
    fresh_peaks,
    gpu_kind_name,
    is_cuda,
    made_estimates,
    plan_fields,
    ratio,
    release,
    token_batch,
    within,
)
from benchmarks.gpu_reference import LARGE, hand_made_peak, large_allocations

DIAGNOSED = ("llama", "ckpt bf16")
"""The row whose tracked step's large allocations are recorded."""

FP32: dict[str, Any] = {}
BF16, PURE_BF16, FP16 = {"precision": "bf16"}, {"weights": "bf16"}, {"precision": "fp16"}
CKPT_BF16 = {"precision": "bf16", "checkpointing": True}


def llama_config(shape: Llama) -> dict[str, Any]:
    """A Llama shape's config as ``model_type`` and keyword arguments (what ``benchmarks.cuda_truth`` stores)."""
    return {
        "model_type": "llama", "hidden_size": shape.hidden, "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads, "vocab_size": shape.vocab,
        "max_position_embeddings": max(2048, shape.length), "tie_word_embeddings": shape.tie,
    }


def families(scale: str) -> list[dict[str, Any]]:
    """The models of the estimate section: config (``model_type`` and keywords), class, batch (rows, length) and
    plans. (Qwen2, here before issue 40, is a held-out family now: :func:`heldout_families`.)"""
    if scale == "full":
        return [
            {"name": "gpt2", "config": {"model_type": "gpt2"}, "architecture": "GPT2LMHeadModel", "batch": (4, 1024),
             "plans": [FP32, BF16, PURE_BF16, FP16]},
            {"name": "llama", "config": llama_config(LLAMA_1B), "architecture": "LlamaForCausalLM",
             "batch": (2, 1024), "plans": [FP32, BF16, PURE_BF16, FP16, CKPT_BF16]},
            {"name": "bert", "config": {"model_type": "bert", "hidden_size": 1024, "num_hidden_layers": 24,
                                        "num_attention_heads": 16, "intermediate_size": 4096},
             "architecture": "BertForMaskedLM", "batch": (4, 512), "plans": [FP32, BF16, FP16]},
            # A small Mixtral: 8 layers of 1024, 8 experts of 2048, 2 per token (about 0.45B parameters).
            {"name": "mixtral", "config": {"model_type": "mixtral", "hidden_size": 1024, "intermediate_size": 2048,
                                           "num_hidden_layers": 8, "num_attention_heads": 16,
                                           "num_key_value_heads": 8, "num_local_experts": 8,
                                           "num_experts_per_tok": 2, "vocab_size": 32000,
                                           "max_position_embeddings": 2048},
             "architecture": "MixtralForCausalLM", "batch": (2, 1024), "plans": [FP32, BF16]},
        ]
    small = {"vocab_size": 256, "max_position_embeddings": 128}
    # The tiny sizes exercise the code: every family, a precision or two each (the precisions are memlab's tests').
    return [
        {"name": "gpt2", "config": {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 256,
                                    "n_positions": 128},
         "architecture": "GPT2LMHeadModel", "batch": (2, 32), "plans": [FP32, FP16]},
        {"name": "llama", "config": llama_config(TINY), "architecture": "LlamaForCausalLM", "batch": (2, 32),
         "plans": [FP32, CKPT_BF16]},
        {"name": "bert", "config": {"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2,
                                    "num_attention_heads": 2, "intermediate_size": 128, **small},
         "architecture": "BertForMaskedLM", "batch": (2, 32), "plans": [FP32]},
        {"name": "mixtral", "config": {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128,
                                       "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                       "num_local_experts": 4, "num_experts_per_tok": 2, **small},
         "architecture": "MixtralForCausalLM", "batch": (2, 32), "plans": [BF16]},
    ]


HELDOUT_LENGTHS = {"full": (512, 2048), "tiny": (16, 32)}
"""The two sequence lengths of every held-out family (T5's longer one is 1024 with ``--full``: its eager attention
keeps every score matrix of its 36 attention layers)."""
HELDOUT_ROWS = {"full": 2, "tiny": 2}
T5_TOKENS = {"decoder_start_token_id": 0, "pad_token_id": 0, "eos_token_id": 1}
"""T5's published token ids: its labels are shifted right behind ``decoder_start_token_id``, which a config made
from ``model_type`` alone does not set."""


def _heldout_shapes(scale: str) -> list[tuple[str, str, dict[str, Any]]]:
    """Each held-out family: name, class and config. With ``--full`` each is a published model's shape (widths,
    heads, vocabulary), with fewer layers where the whole model would not train in fp32 AdamW quickly on one GPU."""
    if scale == "full":
        return [
            # Qwen2-0.5B: 24 layers of 896, 14 heads over 2 KV heads, 151936 tokens, tied head (0.49B parameters).
            ("qwen2", "Qwen2ForCausalLM", {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
                                            "num_hidden_layers": 24, "num_attention_heads": 14,
                                            "num_key_value_heads": 2, "vocab_size": 151936,
                                            "max_position_embeddings": 4096, "tie_word_embeddings": True}),
            # Mistral-7B-v0.3's layers (4096 wide, 32 heads over 8 KV heads, 14336 in the MLP, 32768 tokens, sliding
            # window 4096), 4 of its 32 (1.14B parameters).
            ("mistral", "MistralForCausalLM", {"model_type": "mistral", "hidden_size": 4096,
                                                "intermediate_size": 14336, "num_hidden_layers": 4,
                                                "num_attention_heads": 32, "num_key_value_heads": 8,
                                                "vocab_size": 32768, "max_position_embeddings": 4096}),
            # Gemma-2-2B's layers (2304 wide, 8 heads of 256 over 4 KV heads, 9216 in the MLP, 256000 tokens, tied,
            # soft-capped logits, sliding and full attention alternating), 6 of its 26 (1.06B parameters).
            ("gemma2", "Gemma2ForCausalLM", {"model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216,
                                              "num_hidden_layers": 6, "num_attention_heads": 8,
                                              "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 256000,
                                              "max_position_embeddings": 4096}),
            # Phi-3-mini's layers (3072 wide, 32 heads, fused qkv and gate-up projections, 8192 in the MLP, 32064
            # tokens), 4 of its 32 (0.65B parameters).
            ("phi3", "Phi3ForCausalLM", {"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
                                          "num_hidden_layers": 4, "num_attention_heads": 32,
                                          "num_key_value_heads": 32, "vocab_size": 32064,
                                          "max_position_embeddings": 4096, "pad_token_id": 0}),
            # Pythia-410M (GPT-NeoX): 24 layers of 1024, 16 heads, rotary on a quarter of each head, 50304 tokens.
            ("gpt_neox", "GPTNeoXForCausalLM", {"model_type": "gpt_neox", "hidden_size": 1024,
                                                 "intermediate_size": 4096, "num_hidden_layers": 24,
                                                 "num_attention_heads": 16, "vocab_size": 50304,
                                                 "max_position_embeddings": 4096, "rotary_pct": 0.25}),
            # T5-base: 12 encoder and 12 decoder layers of 768, 12 heads, 3072 in the MLP, 32128 tokens, tied.
            ("t5", "T5ForConditionalGeneration", {"model_type": "t5", "d_model": 768, "d_kv": 64, "d_ff": 3072,
                                                   "num_layers": 12, "num_decoder_layers": 12, "num_heads": 12,
                                                   "vocab_size": 32128, **T5_TOKENS}),
        ]
    small = {"vocab_size": 256, "max_position_embeddings": 128}
    decoder = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, **small}
    return [
        ("qwen2", "Qwen2ForCausalLM", {"model_type": "qwen2", **decoder, "tie_word_embeddings": True}),
        ("mistral", "MistralForCausalLM", {"model_type": "mistral", **decoder, "sliding_window": 16}),
        ("gemma2", "Gemma2ForCausalLM", {"model_type": "gemma2", **decoder, "head_dim": 16, "sliding_window": 16}),
        ("phi3", "Phi3ForCausalLM", {"model_type": "phi3", **decoder, "num_key_value_heads": 4, "pad_token_id": 0,
                                      "bos_token_id": 1, "eos_token_id": 2}),
        ("gpt_neox", "GPTNeoXForCausalLM", {"model_type": "gpt_neox", **{k: v for k, v in decoder.items()
                                                                          if k != "num_key_value_heads"},
                                             "rotary_pct": 0.25}),
        ("t5", "T5ForConditionalGeneration", {"model_type": "t5", "d_model": 64, "d_kv": 16, "d_ff": 128,
                                               "num_layers": 2, "num_decoder_layers": 2, "num_heads": 4,
                                               "vocab_size": 256, **T5_TOKENS}),
    ]


def heldout_families(scale: str) -> list[dict[str, Any]]:
    """The held-out section's models, as :func:`families`: each family at two sequence lengths, in fp32, bf16
    autocast and pure bf16 with ``--full``; at the tiny size, which exercises the code, one plan and one length a
    family (the plans and lengths in turn)."""
    rows = HELDOUT_ROWS[scale]
    found = []
    for number, (name, architecture, config) in enumerate(_heldout_shapes(scale)):
        lengths: tuple[int, ...] = HELDOUT_LENGTHS[scale]
        if name == "t5" and scale == "full":
            lengths = (lengths[0], 1024)
        plans = [FP32, BF16, PURE_BF16]
        if scale != "full":
            lengths, plans = (lengths[number % 2],), [plans[number % 3]]
        found += [{"name": name, "config": config, "architecture": architecture, "batch": (rows, length),
                   "plans": plans} for length in lengths]
    return found


def encdec_families(scale: str) -> list[dict[str, Any]]:
    """The encoder-decoders (issue 57, item 2): T5-base (the held-out family that was off on the H200: its rows
    at 2 x 512 and 2 x 1024) and BART-base (6 encoder and 6 decoder layers of 768, 12 heads, 3072 in the MLP,
    50265 tokens, learned positions), each at two lengths in fp32, bf16 autocast and pure bf16 with ``--full``; at
    the tiny size a plan or two each."""
    t5 = next(config for name, _, config in _heldout_shapes(scale) if name == "t5")
    if scale == "full":
        bart = {"model_type": "bart", "d_model": 768, "encoder_layers": 6, "decoder_layers": 6,
                "encoder_attention_heads": 12, "decoder_attention_heads": 12, "encoder_ffn_dim": 3072,
                "decoder_ffn_dim": 3072, "vocab_size": 50265, "max_position_embeddings": 1024}
        return [{"name": name, "config": config, "architecture": architecture, "batch": (2, length),
                 "plans": [FP32, BF16, PURE_BF16]}
                for name, architecture, config in (("t5", "T5ForConditionalGeneration", t5),
                                                   ("bart", "BartForConditionalGeneration", bart))
                for length in (512, 1024)]
    bart = {"model_type": "bart", "d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
            "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128,
            "decoder_ffn_dim": 128, "vocab_size": 256, "max_position_embeddings": 128}
    return [{"name": "t5", "config": t5, "architecture": "T5ForConditionalGeneration", "batch": (2, 16),
             "plans": [FP32, PURE_BF16]},
            {"name": "bart", "config": bart, "architecture": "BartForConditionalGeneration", "batch": (2, 16),
             "plans": [BF16]}]


OFF_ON_THE_H200 = ("mistral", "phi3")
"""The decoder-only held-out families whose pure-bf16 reserve was off on the H200 (0.85 and 0.84 of the measured:
issue 57, item 3); T5's rows are the ``encdec`` part's."""


def heldout_off_families(scale: str) -> list[dict[str, Any]]:
    """The held-out rows that were off on the H200, in pure bf16 (:data:`OFF_ON_THE_H200`), at both lengths with
    ``--full`` (a length each at the tiny size)."""
    return [{**family, "plans": [PURE_BF16]} for family in heldout_families("full" if scale == "full" else "tiny")
            if family["name"] in OFF_ON_THE_H200]


FAMILIES = {"estimate": families, "heldout": heldout_families, "encdec": encdec_families,
            "heldout_off": heldout_off_families}
"""Each estimate section's models, by section."""
REFERENCED = ("encdec",)
"""The sections whose rows also run a hand-made step (its ``max_memory_allocated`` beside memlab's measured peak)."""


def make_config(family: dict[str, Any]) -> Any:
    """The transformers config of a family, its class named in ``architectures`` (as ``cuda_truth``'s test)."""
    from transformers import AutoConfig

    fields = dict(family["config"])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    config.architectures = [family["architecture"]]
    return config


def make_model(family: dict[str, Any], device: torch.device) -> nn.Module:
    import transformers

    torch.manual_seed(0)
    with torch.device(device):
        model: nn.Module = getattr(transformers, family["architecture"])(make_config(family))
    return model


def batch_shapes(family: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """The shapes of the batch measured (:func:`benchmarks.gpu_common.token_batch`): ids, mask and labels."""
    rows, length = family["batch"]
    return {"input_ids": (rows, length), "attention_mask": (rows, length), "labels": (rows, length)}


def row_id(family: dict[str, Any], plan: Any) -> str:
    """A row's name: family, batch and plan (``"gpt2 4x1024 bf16"``)."""
    rows, length = family["batch"]
    return f"{family['name']} {rows}x{length} {plan.label()}"


def estimate_one(family: dict[str, Any], plan: Any, device: str, gpu: str | None) -> dict[str, Any]:
    """One estimate's figures (and how long it took)."""
    import memlab

    keywords: dict[str, Any] = {"device": device}
    if gpu is not None and "gpu" in inspect.signature(memlab.estimate).parameters:
        keywords["gpu"] = gpu
    started = time.perf_counter()
    try:
        trial = memlab.estimate(make_config(family), batch_shapes(family), plan, **keywords)
    except Exception as error:  # noqa: BLE001 - a failed estimate is a row that says why
        return {"status": "error", "error": f"{type(error).__name__}: {error}"[:500], "peak_bytes": None}
    return {
        "status": trial.status, "error": trial.error, "peak_bytes": trial.peak_bytes,
        "breakdown": dict(trial.breakdown), **card_figures(trial), "notes": list(trial.notes),
        "seconds": round(time.perf_counter() - started, 2), "gpu": keywords.get("gpu"),
    }


def estimate_all(request: str) -> None:
    """Every estimate of the section ``request["section"]`` (``estimate``, ``heldout``, ``heldout_off``, ``encdec``,
    ``vlm`` or ``loads``; default
    ``estimate``) at the size ``request["size"]``, into the file ``request["out"]`` (``{row id: figures}``): run in
    a process that sees no GPU, so that the estimates are the CPU-made ones."""
    common.quiet()
    asked = json.loads(request)
    section = asked.get("section", "estimate")
    made = section_estimates(section, asked["size"], asked["device"], asked.get("gpu"))
    made["_made_on"] = {"cuda_visible": torch.cuda.is_available(),
                        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}
    Path(asked["out"]).write_text(json.dumps(made, default=common._jsonable))


def section_estimates(section: str, size: str, device: str, gpu: str | None) -> dict[str, Any]:
    """The estimates of ``section`` at ``size`` by row id, made in this process."""
    if section == "loads":
        from benchmarks.gpu_sections_loads import load_estimates

        return load_estimates(size, device, gpu)
    if section == "vlm":
        from benchmarks.gpu_sections_vlm import vlm_estimates

        return vlm_estimates(size, device, gpu)
    from memlab import Plan

    return {row_id(family, Plan(**fields)): estimate_one(family, Plan(**fields), device, gpu)
            for family in FAMILIES[section](SIZES[size]["estimate_scale"]) for fields in family["plans"]}


def section_estimate(size: str, device: torch.device) -> dict[str, Any]:
    """4. ``estimate`` (fake tensors, from the config, made without the GPU) against the measured peak, for four
    families and four precisions: the allocated peak within 5%, and the card figure (reserved + CUDA context)
    within 5% where the estimate gives one."""
    return compare_families("estimate", size, device)


def section_heldout(size: str, device: torch.device) -> dict[str, Any]:
    """The held-out families (Qwen2, Mistral, Gemma-2, Phi-3, GPT-NeoX, T5) at two sequence lengths in fp32, bf16
    autocast and pure bf16: the CPU-made estimate's allocated peak within 5% of the measured one, its reserved peak
    within 10%."""
    return compare_families("heldout", size, device)


def section_encdec(size: str, device: torch.device) -> dict[str, Any]:
    """The encoder-decoders (T5-base, BART-base) at two lengths in fp32, bf16 autocast and pure bf16: a hand-made
    step's ``max_memory_allocated`` beside memlab's measured peak (2%), and the CPU-made estimate's allocated peak
    (5%) and reserved peak (10%) against the measured ones."""
    return compare_families("encdec", size, device)


def section_heldout_off(size: str, device: torch.device) -> dict[str, Any]:
    """The held-out rows whose reserve was off on the H200 (Mistral and Phi-3 in pure bf16), as ``heldout``."""
    return compare_families("heldout_off", size, device)


def compare_families(section: str, size: str, device: torch.device) -> dict[str, Any]:
    """Each model and plan of ``section`` measured on ``device`` beside its CPU-made estimate, with the section's
    checks."""
    import memlab
    from memlab import Plan

    made, made_on = made_estimates(section, device)
    gpu = gpu_kind_name(torch.cuda.get_device_name(device) if is_cuda(device) else None)
    checks, rows = Checks(), []
    diagnostic: dict[str, Any] | None = None
    built: tuple[str, nn.Module] | None = None  # the last model, kept for the same family's next batch
    for family in FAMILIES[section](SIZES[size]["estimate_scale"]):
        rows_, length = family["batch"]
        key = json.dumps([family["architecture"], family["config"]], sort_keys=True)
        if built is None or built[0] != key:
            built = None
            release(device)
            built = (key, make_model(family, device))
        model = built[1]
        batch = token_batch(make_config(family).vocab_size, rows_, length, device)
        for fields in family["plans"]:
            plan = Plan(**fields)
            name = row_id(family, plan)
            estimate = made.get(name) or estimate_one(family, plan, device.type, gpu)
            fresh_peaks(device)
            if section == "estimate" and (family["name"], plan.label()) == DIAGNOSED and is_cuda(device):
                trial, diagnostic = traced_trial(model, batch, plan, device)
            else:
                trial = memlab.measure(model, batch, plan, steps=1, warmup=1, progress=False, noise=0)
            card = card_reading(device)
            release(device)
            hand = hand_made_peak(model, batch, plan) if section in REFERENCED else None
            row = {
                "model": family["name"], "config": family["config"], "architecture": family["architecture"],
                "batch_shapes": batch_shapes(family), "plan": plan.label(), "plan_fields": plan_fields(plan),
                "rows": rows_, "length": length,
                "estimate_bytes": estimate["peak_bytes"], "estimate_status": estimate["status"],
                "estimate_error": estimate.get("error"), "estimate_breakdown": estimate.get("breakdown"),
                "estimate_reserved_bytes": estimate.get("reserved_bytes"),
                "estimate_context_bytes": estimate.get("context_bytes"),
                "estimate_card_bytes": estimate.get("card_bytes"), "estimate_s": estimate.get("seconds"),
                "measured_bytes": trial.peak_bytes, "measured_status": trial.status, "measured_error": trial.error,
                "measured_breakdown": dict(trial.breakdown), "trial": card_figures(trial), **card,
                "estimate_over_measured": ratio(estimate["peak_bytes"], trial.peak_bytes),
                "reserved_estimate_over_measured": ratio(estimate.get("reserved_bytes"), card["reserved_peak_bytes"]),
                "card_estimate_over_measured": ratio(estimate.get("card_bytes"), card["card_bytes"]),
            }
            rows.append(row)
            ran = trial.status == "ok" and estimate["status"] == "ok"
            if section in REFERENCED:
                row.update(hand_made_bytes=hand, measured_over_hand_made=ratio(trial.peak_bytes, hand),
                           estimate_over_hand_made=ratio(estimate["peak_bytes"], hand))
                checks.add(
                    f"{name}: memlab's measured peak within 2% of a hand-made step's max_memory_allocated",
                    within(trial.peak_bytes, hand, 0.02) if trial.status == "ok" else False,
                    memlab=trial.peak_bytes, hand_made=hand, ratio=row["measured_over_hand_made"],
                    why=None if is_cuda(device) else "a CUDA figure: max_memory_allocated",
                )
            checks.add(
                f"{name}: estimate within 5% of the measured allocated peak",
                within(estimate["peak_bytes"], trial.peak_bytes, 0.05) if ran else False,
                estimate=estimate["peak_bytes"], measured=trial.peak_bytes, ratio=row["estimate_over_measured"],
                error=trial.error or estimate.get("error"),
            )
            if section != "estimate":
                checks.add(
                    f"{name}: reserved estimate within 10% of the measured reserved peak",
                    within(estimate.get("reserved_bytes"), card["reserved_peak_bytes"], 0.10) if ran else None,
                    estimate=estimate.get("reserved_bytes"), measured=card["reserved_peak_bytes"],
                    ratio=row["reserved_estimate_over_measured"],
                    why=None if is_cuda(device) else "a CUDA figure: no reserve on the CPU",
                )
                continue
            checks.add(
                f"{name}: card estimate within 5% of the measured reserved peak + CUDA context",
                within(estimate.get("card_bytes"), card["card_bytes"], 0.05) if ran else None,
                estimate=estimate.get("card_bytes"), measured=card["card_bytes"],
                why=None if estimate.get("card_bytes") is not None else "this memlab's estimate has no card figure",
            )
        del model, batch
        release(device)
    del built
    release(device)
    return {"estimates_made_in": made_on, "estimate_gpu": gpu, "rows": rows, "diagnostic": diagnostic,
            "checks": checks.items}


# --- the diagnostic -----------------------------------------------------------------------------------------------


def traced_trial(model: nn.Module, batch: Any, plan: Any, device: torch.device) -> tuple[Any, dict[str, Any]]:
    """``measure`` with the CUDA allocator's history recorded over the tracked step only (from the end of the
    warm-up to the end of the tracked step): the trial, and the allocations of :data:`LARGE` bytes or more."""
    import memlab
    from memlab.events import StepFinished

    record = torch.cuda.memory._record_memory_history
    state: dict[str, Any] = {"on": False, "snapshot": None}

    def callback(event: Any) -> None:
        if not isinstance(event, StepFinished):
            return
        if event.kind == "warmup" and not state["on"]:
            record(enabled="all", context="alloc", stacks="python", max_entries=200_000, device=device)
            state["on"] = True
        elif event.kind == "tracked" and state["on"]:
            state["snapshot"] = torch.cuda.memory._snapshot(device)
            record(enabled=None, device=device)
            state["on"] = False

    try:
        trial = memlab.measure(model, batch, plan, steps=1, warmup=1, progress=False, noise=0, callback=callback)
    finally:
        if state["on"]:
            record(enabled=None, device=device)
    snapshot = state["snapshot"]
    allocations = large_allocations(snapshot, device) if snapshot is not None else []
    return trial, {
        "row": " ".join(DIAGNOSED), "threshold_bytes": LARGE, "breakdown": dict(trial.breakdown),
        "peak_bytes": trial.peak_bytes, "recorded": snapshot is not None,
        "allocations": allocations,
        "in_optimizer_bytes": sum(a["size"] for a in allocations if a["in_optimizer"] and a["action"] == "alloc"),
    }


