"""What peft's ``prepare_model_for_kbit_training`` adds to a QLoRA step's peak (issue 47, the QLoRA cause).

TRL's ``SFTTrainer`` called peft's ``prepare_model_for_kbit_training`` on every k-bit model until TRL's own
version (huggingface/trl pull requests #4335 and #4457, October-November 2025). That function casts every
parameter that is not 4-bit (embeddings, norms, the LM head) to fp32. Under bf16 autocast this costs, for
hidden size H, vocab V, L layers and a batch of R x T tokens with checkpointing:

- ``2 * (2*V*H + norms)`` bytes: the upcast weights (untied embedding and head);
- ``2 * V * H``: autocast's bf16 copy of the fp32 head, kept for the backward of the logits;
- ``2 * (L + 1) * R * T * H``: the residual stream becomes fp32 (an fp32 embedding output plus bf16 sublayer
  outputs is fp32), so every checkpointed layer input and the final hidden state is twice as large.

This script checks that on the CPU: a tiny Llama saved and loaded through a real ``from_pretrained(...,
quantization_config=BitsAndBytesConfig(load_in_4bit=True, NF4, double quant, bf16 compute))``, LoRA r16 on
q/k/v/o, non-reentrant checkpointing, bf16 autocast, AdamW on the adapters; the peak of a steady step measured by
memlab's ``MemoryTracker`` without and with the preparation; and the same three terms for Llama 3.1 8B at 4 x 4096.

Run from the repository root (under a minute)::

    python -m benchmarks.kbit_upcast
"""

from __future__ import annotations

import collections
import tempfile
from typing import Any

import torch

from benchmarks import common

NAME = "kbit_upcast"


def upcast_bytes(hidden: int, vocab: int, layers: int, rows: int, tokens: int, tied: bool = False) -> dict[str, int]:
    """The three terms of the module docstring, in bytes.

    Example:
        >>> upcast_bytes(4096, 128_256, 32, 4, 4096)["total"] / 1e9  # Llama 3.1 8B, 4 x 4096
        7.581...
    """
    tables = 1 if tied else 2
    norms = (2 * layers + 1) * hidden
    terms = {"weights_to_fp32": 2 * (tables * vocab * hidden + norms), "head_bf16_copy": 2 * vocab * hidden,
             "fp32_residual_checkpoints": 2 * (layers + 1) * rows * tokens * hidden}
    return {**terms, "total": sum(terms.values())}


def measure(prepare: bool, path: str, ids: torch.Tensor) -> dict[str, Any]:
    """The peak of one steady QLoRA step of the saved tiny model, with or without peft's preparation."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from memlab.measure.tracker import MemoryTracker

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                               bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(path, quantization_config=quant, dtype=torch.bfloat16,
                                                 device_map="cpu")
    kwargs = {"use_reentrant": False}
    if prepare:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True,
                                                gradient_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj",
                                                                                   "o_proj"]))
    model.train()
    dtypes: collections.Counter[str] = collections.Counter()
    for p in model.parameters():
        dtypes[str(p.dtype).removeprefix("torch.")] += p.numel() * p.element_size()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # the optimizer state exists from here on
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    tracker = MemoryTracker(baseline={"params": [*model.parameters(), *model.buffers()], "optimizer": state})
    with tracker:
        step()
    return {"parameter_bytes_by_dtype": dict(dtypes), "peak_bytes": tracker.peak_bytes,
            "breakdown": tracker.breakdown}


def main() -> int:
    from transformers import AutoModelForCausalLM, LlamaConfig

    common.quiet()
    hidden, vocab, layers, rows, tokens = 256, 8192, 4, 4, 256  # Llama 3.1 8B's vocab / hidden ratio (31)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=896, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=False)
    torch.manual_seed(0)
    ids = torch.randint(0, vocab, (rows, tokens))
    with tempfile.TemporaryDirectory() as path:
        AutoModelForCausalLM.from_config(config).save_pretrained(path)
        without, prepared = measure(False, path, ids), measure(True, path, ids)
    analytic = upcast_bytes(hidden, vocab, layers, rows, tokens)
    extra = prepared["peak_bytes"] - without["peak_bytes"]
    payload = {
        **common.metadata_for(NAME, torch.device("cpu"), "tiny"),
        "what": "a QLoRA step's peak without and with peft's prepare_model_for_kbit_training, on this CPU",
        "tiny": {"hidden": hidden, "vocab": vocab, "layers": layers, "rows": rows, "tokens": tokens,
                 "without": without, "with_prepare": prepared, "measured_extra_bytes": extra,
                 "analytic_extra": analytic, "analytic_over_measured": common.rounded(analytic["total"] / extra, 3),
                 "peak_ratio_without_over_with": common.rounded(without["peak_bytes"] / prepared["peak_bytes"], 3)},
        "llama31_8b_4x4096": upcast_bytes(4096, 128_256, 32, 4, 4096),
        "llama32_3b_4x4096": upcast_bytes(3072, 128_256, 28, 4, 4096, tied=True),
    }
    print(payload["tiny"]["measured_extra_bytes"], analytic, payload["llama31_8b_4x4096"])
    common.write_json(payload, common.RESULTS_DIR / f"{NAME}-cpu.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
