"""The FSDP2 estimate shards as accelerate's ``fsdp2_prepare_model`` does (blocks, input embeddings, final norm and
head kept gathered, root), so tied-embedding encoders (BERT's masked LM) estimate; the accelerate export takes
``layer_classes`` in every form its docstring allows."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers

import memlab
from memlab.errors import MemlabError
from memlab.estimation.sharded.fsdp2 import fsdp2_layout


def _bert_mlm() -> torch.nn.Module:
    return transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64))


def _llama() -> torch.nn.Module:
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2))


def test_no_parameter_is_in_two_units_and_llama_has_accelerates_units() -> None:
    for model in (_bert_mlm(), _llama()):
        seen: dict[int, int] = {}
        for index, (units, _) in enumerate(fsdp2_layout(model)):
            for unit in units:
                for parameter in unit.parameters():
                    assert seen.setdefault(id(parameter), index) == index
    llama = _llama()
    layout = [([type(m).__name__ for m in units], reshard) for units, reshard in fsdp2_layout(llama)]
    assert layout == [(["LlamaDecoderLayer"], True)] * 2 + [(["Embedding"], True), (["LlamaRMSNorm", "Linear"], False)]


@pytest.mark.parametrize("strategy", ["fsdp2", "zero3"])
def test_a_tied_embedding_encoder_estimates_sharded(strategy: str) -> None:
    ids = torch.randint(3, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    estimate = memlab.estimate(_bert_mlm(), {"input_ids": ids, "labels": ids}, memlab.Plan(), gpus=2,
                               strategy=strategy)
    assert estimate.status == "ok", estimate.error
    assert estimate.peak_bytes > 0


@pytest.mark.parametrize("given", ["LlamaDecoderLayer", ["LlamaDecoderLayer"], ("LlamaDecoderLayer",),
                                   transformers.models.llama.modeling_llama.LlamaDecoderLayer,
                                   "LlamaDecoderLayer,LlamaRMSNorm"])
def test_layer_classes_in_every_form(given: Any) -> None:
    config = memlab.Plan().to_accelerate_config(gpus=2, strategy="fsdp2", layer_classes=given)
    wrapped = config["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"]
    assert wrapped.split(",")[0] == "LlamaDecoderLayer"
    with pytest.raises(MemlabError, match="layer_classes="):
        memlab.Plan().to_accelerate_config(gpus=2, strategy="fsdp2", layer_classes=[3])
