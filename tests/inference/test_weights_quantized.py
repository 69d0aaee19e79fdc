"""Issue 61 item 16: the layers memlab holds in 8-bit or 4-bit (inference's ``quantize=``, QLoRA's base, an estimate's
``load=BitsAndBytesConfig(...)``) are the layers transformers' own bitsandbytes load quantizes, family by family:
checked against the real ``from_pretrained(..., quantization_config=BitsAndBytesConfig(...))`` of a tiny checkpoint
saved to a temp dir (bitsandbytes' CPU path), over every transformers family the zoo builds.

A tiny multi-query Falcon is the case the issue met: transformers 5's load replaces exact ``nn.Linear`` layers only
(``replace_with_bnb_linear``: ``type(module) is nn.Linear``), so Falcon's ``FalconLinear`` layers stay in full
precision and its 8-bit load quantizes nothing (transformers 4 matched ``isinstance``, and quantized them). memlab
refused such a plan saying the model had no linear layers besides its output; it now says why, and what to write.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import transformers
from test_zoo import ZOO
from torch import nn

import memlab
from memlab.errors import UnsupportedTechnique
from memlab.inference import InferencePlan
from memlab.inference.weights import check_quantizable
from memlab.techniques import adapters
from memlab.techniques.adapters import quantized_targets

bnb = pytest.importorskip("bitsandbytes")

FAMILIES = [name for name, build in ZOO.items() if not name.startswith(("lstm", "conv,", "mlp,"))]
LOADS = {"int8": dict(load_in_8bit=True), "nf4": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4")}


def _falcon() -> nn.Module:
    torch.manual_seed(0)
    return transformers.FalconForCausalLM(transformers.FalconConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, multi_query=True))


def _loaded(model: nn.Module, folder: Path, quantize: str) -> list[str]:
    """The layers transformers' own bitsandbytes load of ``model``'s checkpoint holds quantized."""
    model.save_pretrained(folder)
    config = transformers.BitsAndBytesConfig(**LOADS[quantize])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = type(model).from_pretrained(folder, quantization_config=config, device_map="cpu")
    return [name for name, m in loaded.named_modules() if isinstance(m, (bnb.nn.Linear8bitLt, bnb.nn.Linear4bit))]


@pytest.mark.parametrize("name", FAMILIES)
def test_the_quantized_layers_are_the_ones_transformers_own_load_quantizes(name: str, tmp_path: Path) -> None:
    model, _, _ = ZOO[name]()
    assert isinstance(model, transformers.PreTrainedModel)
    for quantize in LOADS:
        theirs = _loaded(model, tmp_path / quantize, quantize)
        assert quantized_targets(model) == theirs, quantize
        if theirs:
            assert check_quantizable(model, quantize) == theirs
        else:  # nothing to quantize: refused, saying what to write
            with pytest.raises(UnsupportedTechnique, match="write quantize='none'"):
                check_quantizable(model, quantize)


@pytest.mark.parametrize("quantize", list(LOADS))
def test_a_falcon_is_refused_for_what_transformers_does_and_says_so(quantize: str, tmp_path: Path) -> None:
    model = _falcon()
    assert _loaded(model, tmp_path, quantize) == []  # transformers 5's own load quantizes none of its layers
    batch = {"input_ids": torch.randint(0, 128, (2, 8))}
    for call in (lambda: memlab.estimate(model, batch, InferencePlan(quantize=quantize), device="cpu"),
                 lambda: memlab.measure(model, batch, InferencePlan(quantize=quantize), steps=1, warmup=0, noise=0,
                                        progress=False)):
        with pytest.raises(UnsupportedTechnique) as refused:
            call()
        message = str(refused.value)
        assert "FalconLinear layers stay in full precision" in message and "write quantize='none'" in message
        assert "has none besides its output" not in message  # it has eight FalconLinear layers


def test_under_transformers_4s_rule_falcons_layers_are_quantized(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers 4's ``_replace_with_bnb_linear`` matched ``isinstance(module, nn.Linear)``: FalconLinear too."""
    model = _falcon()
    monkeypatch.setattr(adapters, "_exact_linear_only", lambda: False)
    targets = quantized_targets(model)
    falcon_linears = [n for n, m in model.named_modules() if type(m).__name__ == "FalconLinear"]
    assert targets == falcon_linears and len(targets) == 8 and "lm_head" not in targets
