"""The VLM part of the GPU acceptance run (see :mod:`benchmarks.gpu_acceptance`): a vision-language model trained on
the GPU, beside a hand-made step and memlab's CPU-made estimate.

With ``--full`` a small model of a real shape, built from its config with random weights (nothing downloaded):
LLaVA-1.5's vision tower (CLIP ViT-L/14 at 336 pixels: 24 layers of 1024, 576 image tokens after the CLS feature is
dropped) under TinyLlama-1.1B's text model (22 layers of 2048, 32 heads over 4 KV heads, 5632 in the MLP), 1.4B
parameters; two rows of 1,024 tokens, the first 576 of each the image's. At the tiny size a tower of 2 x 2 patches
under a Llama of 64. Each plan (fp32, bf16 autocast, bf16 with checkpointing): memlab's measured peak within 2% of a
hand-made step's ``max_memory_allocated``, the CPU-made estimate (``memlab.estimate(config, batch, plan)`` in a
process that sees no GPU, the batch's values kept, as for any image batch) within 5% of the measured allocated peak
and its reserve within 10%.

tests/vlms.py builds the tiny families with their processors on the CPU; here the batch is made as a LLaVA
processor makes it (the image token repeated once per image feature, labels ignoring those positions), so that
the GPU machine needs no image library.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from benchmarks import common
from benchmarks.gpu_common import Checks, card_figures, card_reading, fresh_peaks, is_cuda, ratio, release, within

IMAGE_TOKEN = 32000
"""The image token's id (LLaVA-1.5's), inside a vocabulary of 32064."""

SPECS: dict[str, dict[str, Any]] = {
    "full": {
        "name": "llava (CLIP ViT-L/14-336 + TinyLlama-1.1B)",
        "text": {"vocab_size": 32064, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
                 "num_attention_heads": 32, "num_key_value_heads": 4, "max_position_embeddings": 2048,
                 "pad_token_id": 0},
        "vision": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                   "num_attention_heads": 16, "image_size": 336, "patch_size": 14, "projection_dim": 768},
        "image_tokens": 576, "rows": 2, "length": 1024,
    },
    "tiny": {
        "name": "llava (tiny)",
        "text": {"vocab_size": 32064, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                 "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 256,
                 "pad_token_id": 0},
        "vision": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                   "image_size": 32, "patch_size": 16},
        "image_tokens": 4, "rows": 2, "length": 24,
    },
}
PLANS: dict[str, list[dict[str, Any]]] = {
    "full": [{}, {"precision": "bf16"}, {"precision": "bf16", "checkpointing": True}],
    "tiny": [{}, {"precision": "bf16", "checkpointing": True}],
}


def scale(size: str) -> str:
    return "full" if size == "full" else "tiny"


def vlm_config(spec: dict[str, Any]) -> Any:
    """LLaVA's config of ``spec``: the text and vision towers, the image token, the CLS feature dropped."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    config = LlavaConfig(text_config=LlamaConfig(**spec["text"]), vision_config=CLIPVisionConfig(**spec["vision"]),
                         image_token_index=IMAGE_TOKEN, image_seq_length=spec["image_tokens"],
                         vision_feature_select_strategy="default")
    config.architectures = ["LlavaForConditionalGeneration"]
    return config


def vlm_batch(spec: dict[str, Any], device: torch.device | str = "cpu", seed: int = 1) -> dict[str, torch.Tensor]:
    """A training batch as LLaVA's processor makes one: an image per row, its token repeated once per image feature
    at the row's start, random text after; labels ignore the image's positions. Seeded: the same on every machine.

    Example:
        >>> batch = vlm_batch(SPECS["tiny"])
        >>> batch["input_ids"].shape, int((batch["input_ids"] == IMAGE_TOKEN).sum()), batch["pixel_values"].shape
        (torch.Size([2, 24]), 8, torch.Size([2, 3, 32, 32]))
    """
    generator = torch.Generator().manual_seed(seed)
    rows, length, images = spec["rows"], spec["length"], spec["image_tokens"]
    ids = torch.randint(3, IMAGE_TOKEN, (rows, length), generator=generator)
    ids[:, :images] = IMAGE_TOKEN
    labels = ids.clone()
    labels[:, :images] = -100
    size = spec["vision"]["image_size"]
    pixels = torch.randn(rows, 3, size, size, generator=generator)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels, "pixel_values": pixels}
    return common.to_device(batch, torch.device(device))


def row_id(plan: Any) -> str:
    return f"vlm {plan.label()}"


def vlm_estimates(size: str, device: str, gpu: str | None) -> dict[str, Any]:
    """Every plan's estimate from the config and the batch (made on the CPU, its values kept), by row id."""
    import memlab

    spec = SPECS[scale(size)]
    config, batch = vlm_config(spec), vlm_batch(spec)
    keywords: dict[str, Any] = {"device": device, **({"gpu": gpu} if gpu else {})}
    made: dict[str, Any] = {}
    for fields in PLANS[scale(size)]:
        plan = memlab.Plan(**fields)
        started = time.perf_counter()
        try:
            trial = memlab.estimate(config, batch, plan, **keywords)
            figures = {"status": trial.status, "error": trial.error, "peak_bytes": trial.peak_bytes,
                       "breakdown": dict(trial.breakdown), **card_figures(trial)}
        except Exception as error:  # noqa: BLE001 - a failed estimate is a row that says why
            figures = {"status": "error", "error": f"{type(error).__name__}: {error}"[:500], "peak_bytes": None}
        made[row_id(plan)] = {**figures, "seconds": round(time.perf_counter() - started, 2), "gpu": gpu}
    return made


def section_vlm(size: str, device: torch.device) -> dict[str, Any]:
    """The VLM measured, against a hand-made step and the CPU-made estimate, for each plan."""
    from transformers import LlavaForConditionalGeneration

    import memlab
    from benchmarks.gpu_common import gpu_kind_name, made_estimates
    from benchmarks.gpu_reference import hand_made_peak

    spec = SPECS[scale(size)]
    made, made_on = made_estimates("vlm", device)
    if not made:
        gpu = gpu_kind_name(torch.cuda.get_device_name(device)) if is_cuda(device) else None
        made = vlm_estimates(size, device.type, gpu)
    torch.manual_seed(0)
    with torch.device(device):
        model: nn.Module = LlavaForConditionalGeneration(vlm_config(spec))
    batch = vlm_batch(spec, device)
    checks, rows = Checks(), []
    for fields in PLANS[scale(size)]:
        plan = memlab.Plan(**fields)
        name = row_id(plan)
        estimate = made[name]
        fresh_peaks(device)
        trial = memlab.measure(model, batch, plan, steps=1, warmup=1, progress=False, noise=0)
        card = card_reading(device)
        release(device)
        hand = hand_made_peak(model, batch, plan)
        rows.append({
            "model": spec["name"], "plan": plan.label(), "rows": spec["rows"], "length": spec["length"],
            "image_tokens": spec["image_tokens"], "measured_bytes": trial.peak_bytes, "measured_status": trial.status,
            "measured_error": trial.error, "measured_breakdown": dict(trial.breakdown), **card,
            "hand_made_bytes": hand, "estimate_bytes": estimate["peak_bytes"], "estimate_status": estimate["status"],
            "estimate_error": estimate.get("error"), "estimate_reserved_bytes": estimate.get("reserved_bytes"),
            "measured_over_hand_made": ratio(trial.peak_bytes, hand),
            "estimate_over_measured": ratio(estimate["peak_bytes"], trial.peak_bytes),
            "reserved_estimate_over_measured": ratio(estimate.get("reserved_bytes"), card["reserved_peak_bytes"]),
        })
        ran = trial.status == "ok" and estimate["status"] == "ok"
        checks.add(f"{name}: memlab's measured peak within 2% of a hand-made step's max_memory_allocated",
                   within(trial.peak_bytes, hand, 0.02) if trial.status == "ok" else False,
                   memlab=trial.peak_bytes, hand_made=hand, error=trial.error)
        checks.add(f"{name}: estimate within 5% of the measured allocated peak",
                   within(estimate["peak_bytes"], trial.peak_bytes, 0.05) if ran else False,
                   estimate=estimate["peak_bytes"], measured=trial.peak_bytes,
                   error=trial.error or estimate.get("error"))
        checks.add(f"{name}: reserved estimate within 10% of the measured reserved peak",
                   within(estimate.get("reserved_bytes"), card["reserved_peak_bytes"], 0.10) if ran else None,
                   estimate=estimate.get("reserved_bytes"), measured=card["reserved_peak_bytes"],
                   why=None if is_cuda(device) else "a CUDA figure: no reserve on the CPU")
    del model, batch
    release(device)
    return {"model": {"name": spec["name"], "text": spec["text"], "vision": spec["vision"]},
            "estimates_made_in": made_on, "rows": rows, "checks": checks.items}
