"""Encoder-decoders estimated for CUDA count what their attention code keeps (issue 57 item 2): T5, BART, Whisper and
mT5, eager and SDPA.

The CPU runs the same operators as CUDA where both take the same attention path: the eager attention of each family
(plain operators), and SDPA's math backend (``_scaled_dot_product_attention_math``, composite code), here forced with
``sdpa_kernel`` around both runs, as a CUDA run under it would take math too. In float32 without dropout (CUDA keeps a
one-byte dropout mask where the CPU keeps float32 noise) a dry run for ``device="cuda"`` must then keep, byte for
byte, the activations the CPU's measured step keeps (memlab's MemoryTracker).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import transformers
from packaging.version import Version
from torch.nn.attention import SDPBackend, sdpa_kernel

import memlab
from benchmarks.recorded_transformers import CONTIGUOUS_BIAS, recorded_transformers
from memlab import Plan

LENGTH = 48
T5_SIZES: dict[str, Any] = {"vocab_size": 128, "d_model": 64, "d_kv": 16, "d_ff": 128, "num_layers": 2,
                            "num_decoder_layers": 2, "num_heads": 4, "decoder_start_token_id": 0, "pad_token_id": 0}
BART_SIZES: dict[str, Any] = {"vocab_size": 128, "d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
                              "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128,
                              "decoder_ffn_dim": 128}
NO_DROPOUT = {"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0}


def t5(attention: str) -> torch.nn.Module:
    config = transformers.T5Config(**T5_SIZES, dropout_rate=0.0, attn_implementation=attention)
    return transformers.T5ForConditionalGeneration(config)


def mt5(attention: str) -> torch.nn.Module:
    config = transformers.MT5Config(**T5_SIZES, dropout_rate=0.0, attn_implementation=attention)
    return transformers.MT5ForConditionalGeneration(config)


def bart(attention: str) -> torch.nn.Module:
    config = transformers.BartConfig(**BART_SIZES, **NO_DROPOUT, max_position_embeddings=128,
                                     attn_implementation=attention)
    return transformers.BartForConditionalGeneration(config)


def whisper(attention: str) -> torch.nn.Module:
    config = transformers.WhisperConfig(**BART_SIZES, **NO_DROPOUT, num_mel_bins=8, max_source_positions=32,
                                        max_target_positions=64, decoder_start_token_id=1, pad_token_id=0,
                                        bos_token_id=1, eos_token_id=2, attn_implementation=attention)
    return transformers.WhisperForConditionalGeneration(config)


FAMILIES: dict[str, Callable[[str], torch.nn.Module]] = {"t5": t5, "bart": bart, "whisper": whisper, "mt5": mt5}


def batch(family: str) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(2, 128, (2, LENGTH), generator=generator)
    if family == "whisper":  # 64 frames of 8 mel bins: the encoder's two convolutions make 32 positions
        return {"input_features": torch.randn(2, 8, 64, generator=generator), "labels": labels}
    return {"input_ids": torch.randint(2, 128, (2, LENGTH), generator=generator), "labels": labels}


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_cuda_estimate_keeps_the_activations_the_same_attention_keeps_on_the_cpu(family: str,
                                                                                   attention: str) -> None:
    torch.manual_seed(0)
    model = FAMILIES[family](attention)
    with sdpa_kernel(SDPBackend.MATH):  # the backend a CUDA run takes under it, and the CPU's
        estimate = memlab.estimate(model, batch(family), Plan(), device="cuda")
        measured = memlab.measure(model, batch(family), Plan(), steps=1, warmup=1, progress=False, noise=0)
    assert estimate.status == measured.status == "ok", estimate.error or measured.error
    assert estimate.breakdown["activations"] == measured.breakdown["activations"]
    notes = [note for note in estimate.notes if note.startswith("CUDA attention emulated")]
    assert notes == ([] if attention == "eager" else [
        "CUDA attention emulated for NVIDIA H100 80GB HBM3 (sm90): scaled_dot_product_attention's math backend"])


@pytest.mark.parametrize("version", ["5.17.0", None])
def test_t5s_position_bias_takes_math_where_its_last_dimension_is_strided(version: str | None) -> None:
    """T5's SDPA mask is its position bias: up to transformers 5.19 as ``permute`` made it (strided: math, for the
    encoder's and the decoder's self-attention; the cross-attention's zeros are contiguous: memory-efficient), from
    5.20 made contiguous (memory-efficient throughout). None: the installed release's code (the floor stack's 5.17
    or the newest stack's)."""
    made = Version(version or transformers.__version__)
    backends = "efficient backend" if made >= CONTIGUOUS_BIAS else "efficient, math backends"
    config = transformers.T5Config(**T5_SIZES, attn_implementation="sdpa")
    config.architectures = ["T5ForConditionalGeneration"]
    shapes = {"input_ids": (2, LENGTH), "labels": (2, LENGTH)}
    with recorded_transformers(version):
        trial = memlab.estimate(config, shapes, Plan(), device="cuda")
    assert trial.status == "ok", trial.error
    assert f"scaled_dot_product_attention's {backends}" in " ".join(trial.notes)
