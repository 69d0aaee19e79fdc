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


def _t5(tied: bool = True) -> torch.nn.Module:
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=128, d_model=32, d_ff=64, num_layers=2, num_heads=2, d_kv=16, decoder_start_token_id=0,
        tie_word_embeddings=tied))


def _bart() -> torch.nn.Module:
    return transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64))


ENCODER_DECODERS = {"t5": _t5, "t5 untied": lambda: _t5(tied=False), "bart": _bart}


@pytest.mark.parametrize("make", ENCODER_DECODERS.values(), ids=ENCODER_DECODERS.keys())
def test_an_encoder_decoders_shared_embedding_stays_with_the_root(make: Any) -> None:
    """T5's and BART's input-embedding weight is held by `shared`, the encoder's and the decoder's `embed_tokens`
    (and a tied head): accelerate's layout gave embed and head a group and left the others to the root, which FSDP2
    refuses ("shared with a parameter already managed by another FSDP group"), so every sharded estimate of an
    encoder-decoder was an error. No unit holds that weight now; every other parameter is in one unit at most."""
    model = make()
    weight = model.get_input_embeddings().weight
    seen: dict[int, int] = {}
    for index, (units, _) in enumerate(fsdp2_layout(model)):
        for unit in units:
            assert all(parameter is not weight for parameter in unit.parameters())
            for parameter in unit.parameters():
                assert seen.setdefault(id(parameter), index) == index
    ids = torch.randint(3, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": ids[:, :8].clone()}
    for strategy in ("fsdp2", "zero3"):
        estimate = memlab.estimate(model, batch, memlab.Plan(), gpus=2, strategy=strategy, device="cuda")
        assert estimate.status == "ok", (strategy, estimate.error)
        assert estimate.peak_bytes > 0


@pytest.mark.e2e
def test_the_exported_t5_sharding_runs_on_two_gloo_ranks_as_estimated(tmp_path: Any) -> None:
    """The layout above is what the exported script shards with: run for real on 2 gloo ranks (fully_shard, one
    step, then memlab's CPU tracker measuring three more and keeping the lowest: see fsdp2_torch_script), each
    rank's peak within 15% of the estimate."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from memlab.export.accelerate import fsdp2_torch_script

    config = {"vocab_size": 128, "d_model": 32, "d_ff": 64, "num_layers": 2, "num_heads": 2, "d_kv": 16,
              "decoder_start_token_id": 0}
    model_code = ("(torch.manual_seed(0), __import__('transformers').T5ForConditionalGeneration("
                  f"__import__('transformers').T5Config(**{config!r})))[1]")
    batch_code = "{'input_ids': torch.randint(3, 128, (2, 16)), 'labels': torch.randint(3, 128, (2, 8))}"
    record = str(tmp_path / "rank")
    script = tmp_path / "train.py"
    script.write_text("import torch\ntorch.set_num_threads(1)\n" + fsdp2_torch_script(
        memlab.Plan(), model_code=model_code, batch_code=batch_code, steps=2, backend="gloo", device="cpu",
        record=record))
    root = Path(__file__).resolve().parents[4]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
                           str(script)], capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    torch.manual_seed(0)
    estimate = memlab.estimate(transformers.T5ForConditionalGeneration(transformers.T5Config(**config)),
                               {"input_ids": (2, 16), "labels": (2, 8)}, memlab.Plan(), gpus=2, strategy="fsdp2",
                               device="cpu")
    assert estimate.status == "ok", estimate.error
    for rank in (0, 1):
        measured = json.loads(Path(f"{record}{rank}.json").read_text())
        assert abs(estimate.peak_bytes / measured["peak_bytes"] - 1) <= 0.15, (rank, measured, estimate.peak_bytes)
