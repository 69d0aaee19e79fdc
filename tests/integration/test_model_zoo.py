"""Every promise on every kind of model: measure, compare, estimate and restore across transformers' families
(decoders, mixture-of-experts, encoders, encoder-decoders, vision, audio), plain modules and odd batch types.

Each case is a tiny model from a config (nothing is downloaded) and a batch the model takes. For each: the plain
plan and a second plan run, the model comes back bit-exact with nothing left on it, and the dry-run estimate of the
plain plan is within 10% of the measured step.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable
from typing import Any

import pytest
import torch
import transformers
from models import assert_same, fingerprint
from torch import nn

import memlab

VOCAB = 128
Pair = namedtuple("Pair", ["inputs", "targets"])


def _tokens(rows: int = 2, length: int = 16) -> dict[str, torch.Tensor]:
    ids = torch.randint(3, VOCAB, (rows, length), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids.clone()}


def _decoder(config: str, model: str, **extra: Any) -> Callable[[], tuple[nn.Module, Any, Any]]:
    sizes = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=2)

    def build() -> tuple[nn.Module, Any, Any]:
        settings = {**sizes, **extra}
        return getattr(transformers, model)(getattr(transformers, config)(**settings)), _tokens(), None

    return build


def _classifier(config: str, model: str, **sizes: Any) -> Callable[[], tuple[nn.Module, Any, Any]]:
    def build() -> tuple[nn.Module, Any, Any]:
        net = getattr(transformers, model)(getattr(transformers, config)(vocab_size=VOCAB, **sizes))
        return net, {"input_ids": _tokens()["input_ids"], "labels": torch.tensor([0, 1])}, None

    return build


def _seq2seq(config: str, model: str, **sizes: Any) -> Callable[[], tuple[nn.Module, Any, Any]]:
    def build() -> tuple[nn.Module, Any, Any]:
        net = getattr(transformers, model)(getattr(transformers, config)(vocab_size=VOCAB, **sizes))
        return net, {"input_ids": _tokens()["input_ids"], "labels": _tokens(length=8)["labels"]}, None

    return build


def _vit() -> tuple[nn.Module, Any, Any]:
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                    intermediate_size=64, image_size=16, patch_size=4)
    return transformers.ViTForImageClassification(config), {
        "pixel_values": torch.randn(2, 3, 16, 16), "labels": torch.tensor([0, 1])}, None


def _whisper() -> tuple[nn.Module, Any, Any]:
    config = transformers.WhisperConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=8,
        max_target_positions=16, decoder_start_token_id=1, pad_token_id=0, eos_token_id=2, bos_token_id=1,
        suppress_tokens=[], begin_suppress_tokens=[],
    )
    batch = {"input_features": torch.randn(2, 16, 16), "labels": torch.randint(3, VOCAB, (2, 8))}
    return transformers.WhisperForConditionalGeneration(config), batch, None


def _wav2vec2() -> tuple[nn.Module, Any, Any]:
    config = transformers.Wav2Vec2Config(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=2,
    )
    batch = {"input_values": torch.randn(2, 400), "labels": torch.tensor([0, 1])}
    return transformers.Wav2Vec2ForSequenceClassification(config), batch, None


class _LSTMNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.lstm = nn.LSTM(32, 64, num_layers=2, batch_first=True)
        self.head = nn.Linear(64, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(self.embed(ids))[0])


def _lstm_namedtuple() -> tuple[nn.Module, Any, Any]:
    tokens = _tokens()
    batch = Pair(tokens["input_ids"], tokens["labels"])
    return _LSTMNet(), batch, lambda m, b: nn.functional.cross_entropy(m(b.inputs).flatten(0, 1), b.targets.flatten())


def _conv_tensor() -> tuple[nn.Module, Any, Any]:
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.Flatten())
    return net, torch.randn(4, 3, 8, 8), lambda m, b: m(b).pow(2).mean()


def _mlp_list() -> tuple[nn.Module, Any, Any]:
    net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 1))
    batch = [torch.randn(8, 16), torch.randn(8)]
    return net, batch, lambda m, b: nn.functional.mse_loss(m(b[0]).squeeze(-1), b[1])


MOE = dict(num_experts_per_tok=2)
CASES: dict[str, Callable[[], tuple[nn.Module, Any, Any]]] = {
    "llama": _decoder("LlamaConfig", "LlamaForCausalLM"),
    "mistral": _decoder("MistralConfig", "MistralForCausalLM"),
    "qwen2": _decoder("Qwen2Config", "Qwen2ForCausalLM"),
    "gemma": _decoder("GemmaConfig", "GemmaForCausalLM", head_dim=16),
    "phi3": _decoder("Phi3Config", "Phi3ForCausalLM", pad_token_id=0),
    "gpt_neox": _decoder("GPTNeoXConfig", "GPTNeoXForCausalLM"),
    "mixtral (MoE)": _decoder("MixtralConfig", "MixtralForCausalLM", num_local_experts=4, **MOE),
    "qwen2_moe (MoE)": _decoder(
        "Qwen2MoeConfig", "Qwen2MoeForCausalLM", num_experts=4, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, **MOE,
    ),
    "olmoe (MoE)": _decoder("OlmoeConfig", "OlmoeForCausalLM", num_experts=4, pad_token_id=0, eos_token_id=1, **MOE),
    "bert": _classifier("BertConfig", "BertForSequenceClassification", hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64),
    "roberta": _classifier("RobertaConfig", "RobertaForSequenceClassification", hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=64),
    "deberta_v2": _classifier("DebertaV2Config", "DebertaV2ForSequenceClassification", hidden_size=32,
                              num_hidden_layers=2, num_attention_heads=2, intermediate_size=64),
    "distilbert": _classifier("DistilBertConfig", "DistilBertForSequenceClassification", dim=32, n_layers=2,
                              n_heads=2, hidden_dim=64),
    "t5": _seq2seq("T5Config", "T5ForConditionalGeneration", d_model=32, d_ff=64, d_kv=16, num_layers=2,
                   num_heads=2, decoder_start_token_id=0),
    "bart": _seq2seq("BartConfig", "BartForConditionalGeneration", d_model=32, encoder_layers=1, decoder_layers=1,
                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64),
    "vit (vision)": _vit,
    "whisper (audio)": _whisper,
    "wav2vec2 (audio)": _wav2vec2,
    "lstm, namedtuple batch": _lstm_namedtuple,
    "conv, tensor batch": _conv_tensor,
    "mlp, list batch": _mlp_list,
}


@pytest.mark.parametrize("name", list(CASES))
def test_measure_compare_estimate_and_restore(name: str) -> None:
    torch.manual_seed(0)
    model, batch, loss_fn = CASES[name]()
    second = memlab.Plan(checkpointing=True) if isinstance(model, transformers.PreTrainedModel) else memlab.Plan(
        micro_batch=1, accumulation=2
    )
    before = fingerprint(model)
    report = memlab.compare(model, batch, [memlab.Plan(), second], loss_fn=loss_fn, steps=1, noise=0, progress=False)
    assert [t.status for t in report] == ["ok", "ok"], [t.error for t in report]
    assert_same(before, fingerprint(model))

    estimated = memlab.estimate(model, batch, memlab.Plan(), loss_fn=loss_fn, device="cpu")
    assert estimated.status == "ok", estimated.error
    measured = report[0]
    step_alone = measured.peak_bytes - measured.preexisting_bytes  # a dry run cannot see this process's tensors
    assert abs(estimated.peak_bytes - step_alone) <= 0.10 * step_alone, (estimated.peak_bytes, step_alone)
    assert_same(before, fingerprint(model))
