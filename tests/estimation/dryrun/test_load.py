"""estimate(..., load=): the dry run materialises the weights as the user's from_pretrained loads them, checked against
the real from_pretrained path on a tiny saved config; the card figure follows that load; bad loads say what to write.
"""

from __future__ import annotations

import argparse
import io

import pytest
import torch
from torch import nn

import memlab
from memlab.errors import MemlabError
from memlab.estimation.dryrun.fake import FakeMode, fake_model
from memlab.estimation.dryrun.load import Load, apply_load, parse_load
from memlab.estimation.dryrun.reserved import cublas_workspace_bytes
from memlab.inference.weights import quantization_tensors

transformers = pytest.importorskip("transformers")
MIB = 2**20


def _config(**overrides):
    settings = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=2, vocab_size=256, tie_word_embeddings=False)
    return transformers.LlamaConfig(**{**settings, **overrides})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny Llama saved as a user's checkpoint is."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(_config()).save_pretrained(folder)
    return folder


def _storage_bytes(tensors):
    seen = {}
    for tensor in tensors:
        seen[tensor.untyped_storage().data_ptr() if not _fake(tensor) else id(tensor.untyped_storage())] = (
            tensor.untyped_storage().nbytes())
    return sum(seen.values())


def _fake(tensor):
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(tensor)


def _weights_bytes(model):
    """Parameters, and what quantized weights keep beside them (bitsandbytes' quant states, or the fake layers'
    buffers that stand for them)."""
    tensors = list(model.parameters())
    tensors += quantization_tensors(model)
    tensors += [b for n, b in model.named_buffers() if not n.endswith("inv_freq")]
    return _storage_bytes(tensors)


def _loaded_fake(load):
    mode = FakeMode()
    model = fake_model(_config(), mode, torch.device("cpu"))
    apply_load(model, load, mode, torch.device("cpu"))
    return model


def test_a_bf16_load_holds_the_weight_bytes_of_from_pretrained_in_bf16(saved):
    real = transformers.AutoModelForCausalLM.from_pretrained(saved, torch_dtype=torch.bfloat16)
    fake = _loaded_fake(parse_load({"torch_dtype": torch.bfloat16}, memlab.Plan()))
    assert {p.dtype for p in fake.parameters()} == {torch.bfloat16}
    assert _weights_bytes(fake) == _weights_bytes(real)
    assert {b.dtype for b in fake.buffers()} == {b.dtype for b in real.buffers()}  # inv_freq stays fp32


@pytest.mark.parametrize("double_quant", [True, False])
def test_a_4bit_load_holds_the_bytes_of_from_pretrained_with_a_bitsandbytes_config(saved, double_quant):
    pytest.importorskip("bitsandbytes")
    config = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                             bnb_4bit_compute_dtype=torch.bfloat16,
                                             bnb_4bit_use_double_quant=double_quant)
    real = transformers.AutoModelForCausalLM.from_pretrained(saved, torch_dtype=torch.bfloat16,
                                                             quantization_config=config)
    fake = _loaded_fake(parse_load({"torch_dtype": torch.bfloat16, "quantization_config": config},
                                   memlab.Plan(adapter="lora")))
    real_layers = sorted(n for n, m in real.named_modules() if type(m).__name__ == "Linear4bit")
    fake_layers = sorted(n for n, m in fake.named_modules() if type(m).__name__ == "FakeNF4Linear")
    assert fake_layers == real_layers and "lm_head" not in fake_layers  # the head stays unquantized, as loaded
    assert _weights_bytes(fake) == _weights_bytes(real)


def test_an_8bit_load_holds_the_bytes_of_from_pretrained_in_8bit(saved):
    pytest.importorskip("bitsandbytes")
    config = transformers.BitsAndBytesConfig(load_in_8bit=True)
    real = transformers.AutoModelForCausalLM.from_pretrained(saved, torch_dtype=torch.float16,
                                                             quantization_config=config)
    fake = _loaded_fake(parse_load({"dtype": "float16", "quantization_config": config.to_dict()},
                                   memlab.Plan(adapter="lora")))
    assert _weights_bytes(fake) == _weights_bytes(real)


def test_the_load_is_put_back_after_the_dry_run():
    mode = FakeMode()
    model = fake_model(_config(), mode, torch.device("cpu"))
    before = [(n, p.dtype, type(model.get_submodule(n.rpartition(".")[0])).__name__)
              for n, p in model.named_parameters()]
    undo = apply_load(model, Load(torch.bfloat16, "nf4", torch.bfloat16, double_quant=True), mode,
                      torch.device("cpu"))
    undo()
    assert [(n, p.dtype, type(model.get_submodule(n.rpartition(".")[0])).__name__)
            for n, p in model.named_parameters()] == before


SHAPES = {"input_ids": (1, 64), "labels": (1, 64)}


def test_the_plan_implies_the_load_and_the_notes_name_it():
    bf16 = memlab.estimate(_config(), SHAPES, memlab.Plan(weights="bf16"), device="cpu")
    qlora = memlab.estimate(_config(), SHAPES, memlab.Plan(adapter="qlora", lora_rank=4), device="cpu")
    assert any("from_pretrained(name, dtype=torch.bfloat16)" in n and "implies" in n for n in bf16.notes)
    assert any("load_in_4bit=True" in n for n in qlora.notes)
    given = memlab.estimate(_config(), SHAPES, memlab.Plan(adapter="lora", lora_rank=4), device="cpu",
                            load={"torch_dtype": torch.bfloat16})
    plain = memlab.estimate(_config(), SHAPES, memlab.Plan(adapter="lora", lora_rank=4), device="cpu")
    assert given.breakdown["params"] < 0.6 * plain.breakdown["params"]  # the frozen base in bf16, not fp32
    assert any("the load given" in n for n in given.notes)


def test_an_estimate_with_a_reserve_never_says_the_reserve_is_not_in_it():
    trial = memlab.estimate(_config(), SHAPES, memlab.Plan(weights="bf16"), gpu="A100-40GB")
    assert trial.reserved_bytes is not None
    assert not [n for n in trial.notes if "reserve" in n and "not in it" in n]
    assert not [n for n in trial.notes if "not included" in n and "reserve" in n]


# A config large enough that its weights are not lost in cuBLAS's workspaces (fake tensors: nothing is allocated).
_MID = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=4, num_attention_heads=16,
            num_key_value_heads=16, vocab_size=32000)


def test_the_reserve_of_a_bf16_or_4bit_load_keeps_no_full_precision_copy():
    config = _config(**_MID)
    for plan in (memlab.Plan(weights="bf16"), memlab.Plan(adapter="qlora", lora_rank=8)):
        trial = memlab.estimate(config, SHAPES, plan, gpu="A100-40GB")
        workspaces = 2 * cublas_workspace_bytes((8, 0), "")
        assert trial.reserved_bytes - workspaces <= 1.25 * trial.peak_bytes, plan.label()


def test_a_live_fp32_model_tried_in_bf16_gets_the_card_of_a_model_loaded_in_bf16():
    torch.manual_seed(0)
    live = transformers.LlamaForCausalLM(_config(**{**_MID, "num_hidden_layers": 2}))
    config = live.config
    plan = memlab.Plan(weights="bf16")
    cast = memlab.estimate(live, SHAPES, plan, device="cuda")
    loaded = memlab.estimate(config, SHAPES, plan, device="cuda")
    assert cast.peak_bytes == loaded.peak_bytes
    # The fp32 copy (0.9 GB) was given back: the two reserves differ by at most a segment's placement.
    assert abs(cast.reserved_bytes - loaded.reserved_bytes) <= 0.02 * loaded.reserved_bytes
    assert any("(name, dtype=torch.bfloat16)" in n and "given back" in n for n in cast.notes)
    assert all(p.dtype == torch.float32 for p in live.parameters())  # the live model is not touched


def test_the_cublas_workspaces_follow_the_gpu_kind_and_the_environment(monkeypatch):
    assert cublas_workspace_bytes((9, 0), "") == 32 * MIB
    assert cublas_workspace_bytes((8, 9), "") == 8 * MIB + 128 * 1024
    assert cublas_workspace_bytes((8, 0), ":4096:8") == 32 * MIB
    hopper = memlab.estimate(_config(), SHAPES, memlab.Plan(), gpu="H100-80GB")
    ampere = memlab.estimate(_config(), SHAPES, memlab.Plan(), gpu="A100-80GB")
    # Hopper: two 32 MiB workspaces; Ampere: two of 8.125 MiB, which share one 20 MiB segment.
    assert hopper.reserved_bytes - ampere.reserved_bytes == 64 * MIB - 20 * MIB
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    assert memlab.estimate(_config(), SHAPES, memlab.Plan(), gpu="A100-80GB").reserved_bytes == hopper.reserved_bytes


@pytest.mark.parametrize(
    ("load", "plan", "says"),
    [
        ({"torch_dtype": "int4"}, memlab.Plan(), "torch.bfloat16"),
        ({"device_map": "auto"}, memlab.Plan(), "torch_dtype"),
        ({"quantization_config": {"load_in_4bit": True}}, memlab.Plan(), "adapter='lora'"),
        ({"quantization_config": {"load_in_8bit": True}}, memlab.Plan(adapter="qlora"), "adapter='lora'"),
        ({"quantization_config": {"load_in_4bit": True, "bnb_4bit_quant_type": "int4"}}, memlab.Plan(adapter="lora"),
         "'nf4'"),
        ({"quantization_config": "4bit"}, memlab.Plan(adapter="lora"), "BitsAndBytesConfig"),
        ("bf16", memlab.Plan(), "load={'dtype'"),
    ],
)
def test_a_bad_load_says_what_to_write(load, plan, says):
    with pytest.raises(MemlabError, match="write") as caught:
        memlab.estimate(_config(), SHAPES, plan, device="cpu", load=load)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_a_live_model_refuses_a_load():
    with pytest.raises(MemlabError, match="already loaded.*model.config"):
        memlab.estimate(nn.Linear(4, 2), torch.randn(2, 4), memlab.Plan(), loss_fn=lambda m, b: m(b).sum(),
                        load={"torch_dtype": torch.bfloat16})


def _cli(*argv):
    from memlab.frontends.cli.estimate import command as estimate_cli

    parser = argparse.ArgumentParser(prog="memlab estimate")
    estimate_cli.add_arguments(parser)
    out, err = io.StringIO(), io.StringIO()
    status = estimate_cli.run(parser.parse_args(list(argv)), out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def test_the_cli_says_the_load_and_refuses_a_4bit_setting_without_4bit(tmp_path):
    path = tmp_path / "config.json"
    _config().to_json_file(path)
    status, out, _ = _cli(str(path), "--batch", "1x64", "--budget", "40GB", "--try", "adapter=lora", "lora_rank=8",
                          "lora_dropout=0.05", "--torch-dtype", "bfloat16", "--load-in-4bit",
                          "--bnb-4bit-quant-type", "nf4", "--bnb-4bit-compute-dtype", "bfloat16",
                          "--bnb-4bit-use-double-quant")
    assert status == 0
    assert "quantization_config=BitsAndBytesConfig(load_in_4bit=True" in out
    status, _, err = _cli(str(path), "--batch", "1x64", "--bnb-4bit-quant-type", "nf4")
    assert status == 2 and err.strip().endswith("add --load-in-4bit") and err.count("\n") == 1
