"""The load an estimate assumes is the one the installed transformers makes (issue 44): checked against the real
``from_pretrained`` on tiny Llama-, Qwen2- and GPT-2-style checkpoints saved in fp32 and bf16 (bf16, fp32, "auto",
no dtype, 4-bit NF4 with double quantization, 8-bit, and QLoRA's implied load); a live model, on the meta device or
loaded, in bf16 or in 4-bit, is estimated as it is; an InferencePlan takes ``load=``; and memlab's own load path
raises no deprecation warning with the pinned transformers.
"""

from __future__ import annotations

import argparse
import io
import logging
import warnings

import pytest
import torch
from torch import nn

import memlab
from memlab.errors import MemlabError
from memlab.estimation.dryrun.fake import fake_setup
from memlab.estimation.dryrun.load import apply_load, plan_loads
from memlab.inference import InferencePlan
from memlab.inference.weights import quantization_tensors

transformers = pytest.importorskip("transformers")
pytest.importorskip("bitsandbytes")

SHAPES = {"input_ids": (1, 8), "labels": (1, 8)}
NF4 = dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
           bnb_4bit_compute_dtype=torch.bfloat16)


def _config(architecture: str):
    if architecture == "gpt2":
        return transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64,
                                       bos_token_id=0, eos_token_id=0)
    sizes = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256)
    return (transformers.LlamaConfig if architecture == "llama" else transformers.Qwen2Config)(**sizes)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Tiny checkpoints saved as a user's are: {(architecture, dtype): folder}."""
    folders = {}
    for architecture in ("llama", "qwen2", "gpt2"):
        for dtype in (torch.float32, torch.bfloat16):
            folder = tmp_path_factory.mktemp(f"{architecture}-{str(dtype)[6:]}")
            torch.manual_seed(0)
            transformers.AutoModelForCausalLM.from_config(_config(architecture), dtype=dtype).save_pretrained(folder)
            folders[architecture, dtype] = folder
    return folders


def held_bytes(model: nn.Module) -> int:
    """What a model's weights hold: parameters, buffers, and bitsandbytes' quantization state (each storage once)."""
    from torch._subclasses.fake_tensor import is_fake

    seen = {}
    for tensor in [*model.parameters(), *model.buffers(), *quantization_tensors(model)]:
        storage = tensor.untyped_storage()
        seen[id(storage) if is_fake(tensor) else (storage.data_ptr(), storage.nbytes())] = storage.nbytes()
    return sum(seen.values())


def real(folder, **load) -> nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(folder, **load)


# (the estimate's load=, the real from_pretrained's keywords)
LOADS = {
    "dtype bf16": ({"dtype": torch.bfloat16}, {"dtype": torch.bfloat16}),
    "torch_dtype fp32": ({"torch_dtype": torch.float32}, {"dtype": torch.float32}),
    "load={}": ({}, {}),
    "nf4": ({"quantization_config": NF4}, {"quantization_config": transformers.BitsAndBytesConfig(**NF4)}),
    "int8": ({"quantization_config": transformers.BitsAndBytesConfig(load_in_8bit=True)},
             {"quantization_config": transformers.BitsAndBytesConfig(load_in_8bit=True)}),
}


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("saved", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_estimates_load_holds_the_bytes_of_the_real_from_pretrained(checkpoints, architecture, saved):
    folder = checkpoints[architecture, saved]
    for name, (load, keywords) in LOADS.items():
        trial = memlab.estimate(folder, {"input_ids": (1, 8)}, InferencePlan(), load=load, device="cpu")
        assert trial.status == "ok", (name, trial.error)
        assert trial.breakdown["params"] == held_bytes(real(folder, **keywords)), name
    # No load at all: what from_pretrained(folder) holds with the installed transformers (the checkpoint's dtype).
    plain = memlab.estimate(folder, SHAPES, memlab.Plan(), device="cpu")
    assert plain.breakdown["params"] == held_bytes(real(folder)), "no load"
    # QLoRA's implied load: the BitsAndBytesConfig it names, the rest as transformers loads it by default.
    setup = fake_setup(folder, {"input_ids": (1, 8)}, "cpu")
    (implied,) = plan_loads(folder, [memlab.Plan(adapter="qlora")], None)
    undo = apply_load(setup.model, implied, setup.mode, setup.kernels)
    quantized = real(folder, quantization_config=transformers.BitsAndBytesConfig(**NF4))
    assert held_bytes(setup.model) == held_bytes(quantized)
    assert sorted(n for n, m in setup.model.named_modules() if type(m).__name__ == "FakeNF4Linear") == sorted(
        n for n, m in quantized.named_modules() if type(m).__name__ == "Linear4bit")
    undo()


def test_a_checkpoint_saved_in_bf16_is_estimated_in_bf16_and_the_notes_say_dtype(checkpoints):
    folder = checkpoints["llama", torch.bfloat16]
    plain = memlab.estimate(folder, SHAPES, memlab.Plan(), device="cpu")
    given = memlab.estimate(folder, SHAPES, memlab.Plan(), device="cpu", load={"dtype": torch.bfloat16})
    assert plain.peak_bytes == given.peak_bytes
    assert any("from_pretrained(name) loads them" in n and "torch.bfloat16" in n for n in plain.notes)
    assert any("from_pretrained(name, dtype=torch.bfloat16)" in n for n in given.notes)
    assert not any("torch_dtype" in note for trial in (plain, given) for note in trial.notes)


@pytest.mark.parametrize("architecture", ["llama", "gpt2"])
def test_a_live_bf16_model_is_estimated_as_it_is(checkpoints, architecture):
    config = _config(architecture)
    folder = checkpoints[architecture, torch.float32]
    loaded = memlab.estimate(config, SHAPES, memlab.Plan(), device="cpu", load={"dtype": torch.bfloat16})
    with torch.device("meta"):
        on_meta = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    built = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    live = real(folder, dtype=torch.bfloat16)
    for model in (on_meta, built, live):
        trial = memlab.estimate(model, SHAPES, memlab.Plan(), device="cpu")
        assert trial.status == "ok", trial.error
        assert trial.breakdown["params"] == loaded.breakdown["params"]
        assert trial.peak_bytes == loaded.peak_bytes
        assert not any("materialised" in note for note in trial.notes)
    assert all(p.dtype == torch.bfloat16 for p in built.parameters())  # the user's models are not touched


@pytest.mark.parametrize("architecture", ["llama", "gpt2"])
def test_a_live_model_loaded_in_4bit_is_estimated_as_the_same_load_of_its_config(checkpoints, architecture):
    folder = checkpoints[architecture, torch.bfloat16]
    model = real(folder, quantization_config=transformers.BitsAndBytesConfig(**NF4))
    plan = memlab.Plan(adapter="lora", lora_rank=4)
    live = memlab.estimate(model, SHAPES, plan, device="cpu")
    from_config = memlab.estimate(folder, SHAPES, plan, device="cpu", load={"quantization_config": NF4})
    assert live.status == from_config.status == "ok", (live.error, from_config.error)
    assert live.breakdown == from_config.breakdown
    assert any(type(m).__name__ == "Linear4bit" for m in model.modules())  # the user's model is as it was


def test_a_peft_model_on_a_4bit_base_is_estimated_with_its_own_adapters(checkpoints):
    peft = pytest.importorskip("peft")
    folder = checkpoints["llama", torch.bfloat16]
    base = real(folder, quantization_config=transformers.BitsAndBytesConfig(**NF4))
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    targets = tuple(sorted({name.rpartition(".")[2] for name in model.peft_config["default"].target_modules}))
    plan = memlab.Plan(adapter="lora", lora_rank=4, lora_alpha=8, lora_targets=targets)
    trial = memlab.estimate(model, SHAPES, plan, device="cpu")
    assert trial.status == "ok", trial.error
    adapters = [p for n, p in model.named_parameters() if "lora_" in n]
    lora = sum(p.numel() * p.element_size() for p in adapters)
    assert trial.breakdown["params"] == held_bytes(model)  # the 4-bit base and the adapters as they are
    # AdamW's two moments and step count of its own fp32 adapters, nothing more
    assert trial.breakdown["optimizer"] == 2 * lora + 4 * len(adapters)


def test_an_inference_plan_takes_load_and_refuses_a_second_quantization(checkpoints):
    folder = checkpoints["qwen2", torch.float32]
    trial = memlab.estimate(folder, {"input_ids": (2, 8)}, InferencePlan(new_tokens=2), load={"dtype": "bfloat16"},
                            device="cpu")
    assert trial.status == "ok" and trial.plan.weights == "bf16"
    assert trial.breakdown["params"] == held_bytes(real(folder, dtype=torch.bfloat16))
    with pytest.raises(MemlabError, match="drop quantize="):
        memlab.estimate(folder, {"input_ids": (1, 8)}, InferencePlan(quantize="nf4"), load={"quantization_config": NF4})
    with pytest.raises(MemlabError, match="drop weights="):
        memlab.estimate(folder, {"input_ids": (1, 8)}, InferencePlan(weights="fp16"), load={"dtype": torch.bfloat16})


def test_gpt2_is_quantized_for_inference_as_transformers_loads_it():
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(_config("gpt2"))
    batch = {"input_ids": torch.randint(0, 256, (1, 8))}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trial = memlab.measure(model, batch, InferencePlan(quantize="nf4"), steps=1, warmup=0, noise=0, progress=False)
    assert trial.status == "ok", trial.error
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    assert type(model.transformer.h[0].attn.c_attn).__name__ == "Conv1D"


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_memlabs_load_path_raises_no_deprecation_warning(checkpoints, tmp_path):
    from memlab.frontends.cli.estimate import command as estimate_cli

    folder = checkpoints["llama", torch.bfloat16]
    records = _Records()
    logging.getLogger("transformers").addHandler(records)
    parser = argparse.ArgumentParser(prog="memlab estimate")
    estimate_cli.add_arguments(parser)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for load in (None, {"torch_dtype": torch.float16}, {"quantization_config": NF4}):
                plan = memlab.Plan(adapter="lora", lora_rank=4) if load and "quantization_config" in load else None
                memlab.estimate(folder, SHAPES, plan, load=load, device="cpu")
            memlab.estimate(folder, {"input_ids": (1, 8)}, InferencePlan(), load={"dtype": "auto"}, device="cpu")
            memlab.estimate(_config("qwen2"), SHAPES, memlab.Plan(adapter="qlora", lora_rank=4), device="cpu")
            status = estimate_cli.run(parser.parse_args([str(folder), "--batch", "1x8", "--torch-dtype", "bf16"]),
                                      out=io.StringIO(), err=io.StringIO())
    finally:
        logging.getLogger("transformers").removeHandler(records)
    assert status == 0
    assert not [message for message in records.messages if "deprecat" in message.lower()]
