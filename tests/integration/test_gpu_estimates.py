"""Estimates for the GPUs people have (issue 71): bf16 on a T4 refused with the fp16 to write, in Python and on the
command line, before anything is built; a GPU memlab does not list described by its memory and compute capability,
in Python (``memlab.gpu_kind``) and on the command line (``--gpu-memory``, ``--gpu-capability``)."""

from __future__ import annotations

import importlib
import re
from typing import Any

import pytest
from transformers import LlamaConfig

import memlab
from memlab.errors import MemlabError
from memlab.estimation.cuda.gpus import GpuKind
from memlab.frontends.cli import main
from memlab.plan import Plan
from memlab.report import Report, Trial

GIB = 2**30
CONFIG = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=2, vocab_size=256, max_position_embeddings=64)
BATCH = {"input_ids": (1, 32), "labels": (1, 32)}


def test_an_estimate_for_a_t4_refuses_bf16_with_what_to_write() -> None:
    with pytest.raises(MemlabError, match=re.escape("T4-16GB (compute capability 7.5) has no native bf16")) as said:
        memlab.estimate(CONFIG, BATCH, Plan(precision="bf16"), gpu="T4-16GB")
    assert "write precision='fp16'" in str(said.value)
    with pytest.raises(MemlabError, match=re.escape("write weights='fp16'")):
        memlab.estimate(CONFIG, {"input_ids": (1, 32)}, memlab.InferencePlan(weights="bf16"), gpu="Tesla T4")
    with pytest.raises(MemlabError, match="no native bf16"):  # a described GPU below 8.0 too
        memlab.estimate(CONFIG, BATCH, Plan(precision="bf16"),
                        gpu=memlab.gpu_kind("V100", memory="16GiB", capability="7.0"))
    # what it says to write runs, on the T4's kernels; a CPU estimate is not the T4's business
    trial = memlab.estimate(CONFIG, BATCH, Plan(precision="fp16"), gpu="T4-16GB", budget="15GiB")
    assert trial.status == "ok" and trial.fits
    assert any("Tesla T4 (sm75)" in note for note in trial.notes), trial.notes
    assert any("modelled for a T4-16GB" in note for note in trial.notes), trial.notes
    assert memlab.estimate(CONFIG, BATCH, Plan(precision="bf16"), gpu="T4-16GB", device="cpu").status == "ok"


def test_an_estimate_for_a_described_gpu_uses_its_memory_and_capability() -> None:
    gpu = memlab.gpu_kind("RTX PRO 6000", memory="96GiB", capability="12.0")
    trial = memlab.estimate(CONFIG, BATCH, Plan(precision="bf16"), gpu=gpu)
    assert trial.status == "ok" and trial.context_bytes == gpu.context_bytes
    assert any("RTX PRO 6000 (sm120)" in note for note in trial.notes), trial.notes
    assert any("modelled for an RTX PRO 6000" in note and "described" in note for note in trial.notes), trial.notes
    with pytest.raises(MemlabError, match=re.escape("capability='twelve' is not a compute capability")):
        memlab.estimate(CONFIG, BATCH, Plan(), gpu=memlab.gpu_kind("X", memory="32GiB", capability="twelve"))


def _estimates(seen: list[Any]) -> Any:
    """Stands in for ``estimate_plans``: records the ``gpu=`` it is given, and a plan of 10 GiB estimated for CUDA
    (the dry run is not the command's concern)."""

    def estimate_plans(model: Any, batch: Any, plans: Any, *, budget: Any = None, device: Any = None,
                       gpu: Any = None, load: Any = None) -> Report:
        seen.append(gpu)
        trials = [Trial(plan, "ok", 10 * GIB, {"params": 6 * GIB}, None, None, None, "cuda", budget=budget,
                        reserved_bytes=11 * GIB, estimated=True) for plan in plans]
        return Report(trials, budget=budget)

    return estimate_plans


def test_the_command_refuses_bf16_on_a_t4_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(importlib.import_module("memlab.estimation.estimate"), "estimate_plans", _estimates(seen))
    assert main(["estimate", "llama-7b", "--gpu", "T4-16GB", "--try", "precision=fp32,bf16"]) == 2
    err = capsys.readouterr().err
    assert "the T4-16GB (compute capability 7.5) has no native bf16" in err and "write --try precision=fp16" in err
    assert seen == []
    assert main(["estimate", "llama-7b", "--gpu", "T4-16GB", "--try", "precision=fp16"]) == 0
    assert seen == ["T4-16GB"] and "for a T4-16GB, budget: its memory, 14.74 GiB" in capsys.readouterr().out


@pytest.mark.parametrize(("flags", "name", "budget"), [
    (["--gpu-memory", "32GiB", "--gpu-capability", "12.0"], "sm120-32GiB", "32.00 GiB"),
    (["--gpu", "A100-40GB", "--gpu-memory", "20GiB"], "A100-40GB with 20 GiB", "20.00 GiB"),
])
def test_the_command_estimates_for_a_described_gpu(
    flags: list[str], name: str, budget: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(importlib.import_module("memlab.estimation.estimate"), "estimate_plans", _estimates(seen))
    assert main(["estimate", "llama-7b", *flags]) == 0
    out = capsys.readouterr().out
    assert isinstance(seen[0], GpuKind) and seen[0].name == name
    said = " ".join(out.split())
    assert f"for an {name}, budget: its memory, {budget}" in said
    assert "the CUDA context, 774.8 MiB" in said  # the described GPU's context, in the card column's note


@pytest.mark.parametrize(("flags", "says"), [
    (["--gpu-memory", "lots", "--gpu-capability", "12.0"], "--gpu-memory 'lots' is not a size; write the GPU's "
     "memory with its unit, e.g. --gpu-memory 32GiB"),
    (["--gpu-memory", "32GiB", "--gpu-capability", "twelve"], "--gpu-capability 'twelve' is not a compute "
     "capability; write MAJOR.MINOR, e.g. --gpu-capability 8.6"),
    (["--gpu-memory", "32GiB"], "needs both its memory and its compute capability; add --gpu-capability, e.g. "
     "--gpu-capability 12.0"),
    (["--gpu-capability", "8.6"], "add --gpu-memory, e.g. --gpu-memory 32GiB"),
    (["--gpu-memory", "1MiB", "--gpu-capability", "8.6"], "--gpu-memory '1MiB' would not hold a CUDA context"),
])
def test_the_command_says_what_to_write_for_a_bad_description(
    flags: list[str], says: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(importlib.import_module("memlab.estimation.estimate"), "estimate_plans", _estimates(seen))
    assert main(["estimate", "llama-7b", *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and seen == []


def test_the_commands_suggested_repeat_the_described_gpu() -> None:
    import argparse

    from memlab.frontends.estimate.next import command_for

    args = argparse.Namespace(model="llama-7b", config=None, batch="1x512", budget=None, gpu=None,
                              gpu_memory="32GiB", gpu_capability="12.0", device=None)
    assert command_for(args, ["adapter=lora"]) == ("memlab estimate llama-7b --batch 1x512 --gpu-memory 32GiB "
                                                   "--gpu-capability 12.0 --try adapter=lora")


def test_the_help_lists_every_gpu_kind(capsys: pytest.CaptureFixture[str]) -> None:
    from memlab.estimation.cuda.gpus import GPUS

    main(["estimate", "--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert all(name in said for name in GPUS) and "--gpu-memory SIZE" in said and "--gpu-capability" in said


def test_a_trainer_in_bf16_estimated_for_a_t4_is_told_its_arguments(tmp_path: Any) -> None:
    """A Trainer set up with bf16=True, estimated for a T4, is refused as its live trial there would be, in words a
    Trainer's user can act on."""
    import dataclasses

    from tests.trainers import make_trainer

    trainer = make_trainer(tmp_path, steps=1)
    trainer.args = dataclasses.replace(trainer.args, bf16=True)
    with pytest.raises(MemlabError, match=re.escape("a Trainer's fp16=True, bf16=False")):
        memlab.estimate(trainer, device="cuda", gpu="T4-16GB")
    assert memlab.estimate(trainer, device="cuda", gpu="A10G-24GB").status == "ok"
