"""Every public entry point on every kind of model of the zoo.

Every promise on every kind of model: measure, compare, estimate and restore across transformers' families
(decoders, mixture-of-experts, encoders, encoder-decoders, vision, audio), plain modules and odd batch types.

Each case is a tiny model from a config (nothing is downloaded) and a batch the model takes. For each: the plain
plan and a second plan run, the model comes back bit-exact with nothing left on it, and the dry-run estimate of the
plain plan is within 10% of the measured step.

Every public entry point on every architecture of the zoo: each answers with a result or one MemlabError that
says what to write, never a library's own exception.

The zoo is :mod:`test_model_zoo`'s cases (decoders, mixture-of-experts, encoders, encoder-decoders, vision, audio,
plain modules with odd batches) plus more transformers families built from tiny configs. For each model, in one test
(the model built once and shared by the entry points): ``measure``, ``estimate`` for training and for inference (with
the training-shaped batch, labels and all), ``apply`` of an adapter plan, one step and ``undo``, and every export
(``to_training_arguments``, ``to_deepspeed``, ``to_code``, ``to_peft_config(model=...)``,
``to_accelerate_config`` with ``layer_classes`` in one of the forms its docstring allows, in turn)."""

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
from memlab.errors import MemlabError
from memlab.inference import InferencePlan

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


Build = Callable[[], tuple[nn.Module, Any, Any]]
SIZES = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)


def _classes(config: str, model: str) -> tuple[Any, Any]:
    """The config and model classes, imported now, while the session collects: the heap it freezes then holds each
    family's modeling module, which memlab's held-memory scan of every CPU trial then never walks again."""
    return getattr(transformers, config), getattr(transformers, model)


def _lm(config: str, model: str, **settings: Any) -> Build:
    config_class, model_class = _classes(config, model)

    def build() -> tuple[nn.Module, Any, Any]:
        return model_class(config_class(**settings)), _tokens(), None

    return build


def _encoder(config: str, model: str, **settings: Any) -> Build:
    config_class, model_class = _classes(config, model)

    def build() -> tuple[nn.Module, Any, Any]:
        net = model_class(config_class(**settings))
        return net, {"input_ids": _tokens()["input_ids"], "labels": torch.tensor([0, 1])}, None

    return build


def _image(config: str, model: str, **settings: Any) -> Build:
    config_class, model_class = _classes(config, model)

    def build() -> tuple[nn.Module, Any, Any]:
        net = model_class(config_class(**settings))
        return net, {"pixel_values": torch.randn(2, 3, 32, 32), "labels": torch.tensor([0, 1])}, None

    return build


MORE: dict[str, Build] = {
    "gpt2": _lm("GPT2Config", "GPT2LMHeadModel", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2),
    "opt": _lm("OPTConfig", "OPTForCausalLM", vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
               num_attention_heads=2, word_embed_proj_dim=32),
    "bloom": _lm("BloomConfig", "BloomForCausalLM", vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=2),
    "falcon": _lm("FalconConfig", "FalconForCausalLM", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=2),
    "phi": _lm("PhiConfig", "PhiForCausalLM", **SIZES),
    "qwen3": _lm("Qwen3Config", "Qwen3ForCausalLM", **SIZES, num_key_value_heads=2, head_dim=16),
    "gemma2": _lm("Gemma2Config", "Gemma2ForCausalLM", **SIZES, num_key_value_heads=2, head_dim=16),
    "starcoder2": _lm("Starcoder2Config", "Starcoder2ForCausalLM", **SIZES, num_key_value_heads=2),
    "stablelm": _lm("StableLmConfig", "StableLmForCausalLM", **SIZES, num_key_value_heads=2),
    "gptj": _lm("GPTJConfig", "GPTJForCausalLM", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, rotary_dim=8),
    # Four heads, as every CodeGen checkpoint has a multiple of: transformers 5.17 (not 5.24) cuts the qkv projection in
    # its 4 TPU shards (mp_num = 4) and 2 heads leave 0 per shard (shape '[2, 16, 4, 0, 16]' is invalid).
    "codegen": _lm("CodeGenConfig", "CodeGenForCausalLM", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                   rotary_dim=8),
    "olmo2": _lm("Olmo2Config", "Olmo2ForCausalLM", **SIZES, num_key_value_heads=2),
    "granite": _lm("GraniteConfig", "GraniteForCausalLM", **SIZES, num_key_value_heads=2),
    "nemotron": _lm("NemotronConfig", "NemotronForCausalLM", **SIZES, num_key_value_heads=2),
    "persimmon": _lm("PersimmonConfig", "PersimmonForCausalLM", **SIZES),
    "biogpt": _lm("BioGptConfig", "BioGptForCausalLM", **SIZES),
    "mpt": _lm("MptConfig", "MptForCausalLM", vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=2),
    "xglm": _lm("XGLMConfig", "XGLMForCausalLM", vocab_size=VOCAB, d_model=32, num_layers=2, attention_heads=2,
                ffn_dim=64),
    "gpt_bigcode": _lm("GPTBigCodeConfig", "GPTBigCodeForCausalLM", vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2,
                       bos_token_id=0, eos_token_id=0),
    "llama (score head)": _encoder("LlamaConfig", "LlamaForSequenceClassification", **SIZES, pad_token_id=0),
    "bert (masked LM)": _lm("BertConfig", "BertForMaskedLM", **SIZES),
    "bert (token classes)": lambda: (transformers.BertForTokenClassification(transformers.BertConfig(**SIZES)), {
        "input_ids": _tokens()["input_ids"], "labels": _tokens()["labels"] % 2}, None),
    "electra": _encoder("ElectraConfig", "ElectraForSequenceClassification", **SIZES, embedding_size=32),
    "albert": _encoder("AlbertConfig", "AlbertForSequenceClassification", **SIZES, embedding_size=16),
    "xlm_roberta": _encoder("XLMRobertaConfig", "XLMRobertaForSequenceClassification", **SIZES),
    "mpnet": _encoder("MPNetConfig", "MPNetForSequenceClassification", **SIZES),
    "mbart": _lm("MBartConfig", "MBartForConditionalGeneration", vocab_size=VOCAB, d_model=32, encoder_layers=1,
                 decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                 decoder_ffn_dim=64),
    "pegasus": _lm("PegasusConfig", "PegasusForConditionalGeneration", vocab_size=VOCAB, d_model=32,
                   encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
                   encoder_ffn_dim=64, decoder_ffn_dim=64),
    "deit (vision)": _image("DeiTConfig", "DeiTForImageClassification", hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=8),
    "convnext (vision)": _image("ConvNextConfig", "ConvNextForImageClassification", hidden_sizes=[8, 16],
                                depths=[1, 1], num_stages=2, image_size=32),
    "resnet (vision)": _image("ResNetConfig", "ResNetForImageClassification", hidden_sizes=[8, 16], depths=[1, 1],
                              embedding_size=8, layer_type="basic"),
}
ZOO: dict[str, Build] = {**CASES, **MORE}
LAYER_CLASSES_FORMS = ("name", "names", "tuple", "class", "none")


def _layer_classes(model: nn.Module, form: str) -> Any:
    blocks = list(getattr(model, "_no_split_modules", None) or ())
    block = next((m for m in model.modules() if type(m).__name__ in blocks), None)
    if block is None or form == "none":
        return None
    return {"name": type(block).__name__, "names": [type(block).__name__], "tuple": (type(block).__name__,),
            "class": type(block)}[form]


def _answer(results: dict[str, Any], entry: str, call: Callable[[], Any]) -> None:
    try:
        results[entry] = call()
    except MemlabError as error:
        message = str(error)
        assert "\n" not in message.strip() and message, (entry, message)
        results[entry] = error
    except Exception as error:  # noqa: BLE001 - what the test is about
        pytest.fail(f"{entry} raised a library's own {type(error).__name__}: {error}")


@pytest.mark.parametrize("name", list(ZOO))
def test_every_entry_point_answers_on_every_architecture(name: str) -> None:
    torch.manual_seed(0)
    model, batch, loss_fn = ZOO[name]()
    before = fingerprint(model)
    results: dict[str, Any] = {}
    quick: dict[str, Any] = dict(steps=1, warmup=0, noise=0, progress=False)
    lora = memlab.Plan(adapter="lora", lora_rank=2)
    _answer(results, "measure", lambda: memlab.measure(model, batch, memlab.Plan(), loss_fn=loss_fn, **quick))
    _answer(results, "estimate", lambda: memlab.estimate(model, batch, memlab.Plan(), loss_fn=loss_fn, device="cpu"))
    _answer(results, "estimate inference", lambda: memlab.estimate(model, batch, InferencePlan(), device="cpu"))

    def apply_step_undo() -> float:
        applied = memlab.apply(model, lora, loss_fn=loss_fn, lr=1e-3)
        try:
            return applied.step(batch)
        finally:
            applied.undo(adapter="discard")

    _answer(results, "apply/undo", apply_step_undo)
    _answer(results, "to_training_arguments", memlab.Plan(checkpointing=True).to_training_arguments)
    _answer(results, "to_deepspeed", memlab.Plan(precision="bf16").to_deepspeed)
    _answer(results, "to_code", lora.to_code)
    _answer(results, "to_peft_config", lambda: lora.to_peft_config(model=model))
    form = LAYER_CLASSES_FORMS[list(ZOO).index(name) % len(LAYER_CLASSES_FORMS)]
    _answer(results, "to_accelerate_config", lambda: memlab.Plan().to_accelerate_config(
        gpus=2, strategy="fsdp2", layer_classes=_layer_classes(model, form)))

    assert_same(before, fingerprint(model))
    assert results["measure"].status == "ok", results["measure"].error  # every zoo model trains plainly
    assert not isinstance(results["estimate"], MemlabError), results["estimate"]
    for entry in ("measure", "estimate"):
        assert results[entry].status == "ok", (entry, results[entry].error)
    refused = {entry: str(value) for entry, value in results.items() if isinstance(value, MemlabError)}
    assert all("write" in message or "use" in message or "pass" in message for message in refused.values()), refused


def test_the_zoo_is_large() -> None:
    assert len(ZOO) >= 50
