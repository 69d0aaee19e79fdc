"""The GPU kinds (memlab.estimation.cuda.gpus): their facts, and the estimates made for them.

The GPU kinds an estimate answers for (issue 71): the cards people train on, each with its facts; a GPU memlab does
not list, described by its memory and compute capability; bf16 decided once from the capability, for a trial and
an estimate alike.

Estimates for the GPUs people have (issue 71): bf16 on a T4 refused with the fp16 to write, in Python and on the
command line, before anything is built; a GPU memlab does not list described by its memory and compute capability,
in Python (``memlab.gpu_kind``) and on the command line (``--gpu-memory``, ``--gpu-capability``)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import LlamaConfig

import memlab
from memlab.errors import MemlabError
from memlab.estimation.cuda.attention import efficient_refusals, flash_refusals, sdpa_backend
from memlab.estimation.cuda.gpus import DEFAULT_GPU, GPUS, gpu_kind
from memlab.frontends.cli.main import main
from memlab.plan import Plan
from memlab.report import Report, Trial
from memlab.search.speed import speed_prior
from memlab.search.suggest import combinations

ROOT = Path(__file__).resolve().parents[3]
MIB, GIB = 2**20, 2**30

# name, what torch calls the device, compute capability, and the board's nvidia-smi memory.total in MiB (torch's
# total_memory, the kind's memory, is under it: the driver keeps the rest; the H200, the A100s, the L40S, the RTX 4090
# and the L4 were at nvidia-smi's figure before issue 71)
NEW_KINDS = [
    ("H200-141GB", "NVIDIA H200", (9, 0), 143_771),
    ("A100-80GB", "NVIDIA A100-SXM4-80GB", (8, 0), 81_920),
    ("A100-40GB", "NVIDIA A100-SXM4-40GB", (8, 0), 40_960),
    ("L40S-48GB", "NVIDIA L40S", (8, 9), 46_068),
    ("RTX4090-24GB", "NVIDIA GeForce RTX 4090", (8, 9), 24_564),
    ("L4-24GB", "NVIDIA L4", (8, 9), 23_034),
    ("T4-16GB", "Tesla T4", (7, 5), 15_360),
    ("A10G-24GB", "NVIDIA A10G", (8, 6), 23_028),
    ("RTX3090-24GB", "NVIDIA GeForce RTX 3090", (8, 6), 24_576),
    ("RTX5090-32GB", "NVIDIA GeForce RTX 5090", (12, 0), 32_607),
    ("RTXA6000-48GB", "NVIDIA RTX A6000", (8, 6), 49_140),
    ("H20-96GB", "NVIDIA H20", (9, 0), 97_871),
    ("B200-180GB", "NVIDIA B200", (10, 0), 183_359),
]


@pytest.mark.parametrize(("name", "device_name", "capability", "smi_mib"), NEW_KINDS)
def test_the_cards_people_train_on_are_known(name: str, device_name: str, capability: tuple[int, int],
                                             smi_mib: int) -> None:
    kind = gpu_kind(name)
    assert (kind.device_name, kind.capability) == (device_name, capability)
    assert gpu_kind(device_name) is kind  # torch.cuda.get_device_name() finds it too
    # torch's figure: under the board's, by less than 3 %; the name's size is the marketed one
    assert 0.97 * smi_mib * MIB < kind.memory_bytes < smi_mib * MIB
    assert kind.bf16 is (capability >= (8, 0))
    assert kind.source.startswith("assumed") and kind.context_bytes == GPUS[DEFAULT_GPU].context_bytes


def test_a_t4_has_no_flash_attention_and_no_bf16_kernel() -> None:
    q = torch.empty(1, 4, 64, 64, dtype=torch.float16, requires_grad=True)
    assert "check_flash_attention_hardware_support" in flash_refusals(q, q, q, is_causal=True, gpu=GPUS["T4-16GB"])
    assert sdpa_backend(q, q, q, is_causal=True, gpu=GPUS["T4-16GB"]) == "efficient"
    assert sdpa_backend(q.float(), q.float(), q.float(), is_causal=True, gpu=GPUS["T4-16GB"]) == "efficient"
    half = q.detach().bfloat16().requires_grad_()
    assert "check_tensor_dtype" in efficient_refusals(half, half, half, gpu=GPUS["T4-16GB"])
    assert sdpa_backend(half, half, half, is_causal=True, gpu=GPUS["T4-16GB"]) == "math"
    assert sdpa_backend(half, half, half, is_causal=True, gpu=GPUS["A10G-24GB"]) == "flash"


def test_a_gpu_memlab_does_not_list_is_described() -> None:
    custom = memlab.gpu_kind("RTX PRO 6000", memory="96GiB", capability="12.0")
    assert (custom.name, custom.capability, custom.memory_bytes) == ("RTX PRO 6000", (12, 0), 96 * GIB)
    assert "described" in custom.source and custom.context_bytes == GPUS[DEFAULT_GPU].context_bytes
    unnamed = gpu_kind(memory=33_680_457_728, capability=(12, 0))
    assert unnamed.name == "sm120-31.37GiB" and unnamed.memory_bytes == 33_680_457_728
    smaller = gpu_kind("A100-40GB", memory="20GiB")
    assert (smaller.name, smaller.memory_bytes, smaller.capability) == ("A100-40GB with 20 GiB", 20 * GIB, (8, 0))
    assert gpu_kind("T4-16GB", capability=(7, 5)) is GPUS["T4-16GB"]  # nothing changed: the kind itself


@pytest.mark.parametrize(("keywords", "says"), [
    ({"memory": "lots", "capability": "12.0"}, "memory='lots' is not a size; write the GPU's memory with its unit"),
    ({"memory": "32GiB", "capability": "twelve"}, "capability='twelve' is not a compute capability; write major"),
    ({"memory": "32GiB", "capability": "12.0.1"}, "capability='12.0.1' is not a compute capability"),
    ({"memory": "32GiB"}, "needs both its memory and its compute capability; add capability="),
    ({"capability": (12, 0)}, "needs both its memory and its compute capability; add memory="),
    ({"memory": "1MiB", "capability": "8.0"}, "would not hold a CUDA context"),
])
def test_bad_descriptions_say_what_to_write(keywords: dict[str, object], says: str) -> None:
    with pytest.raises(MemlabError, match=re.escape(says)):
        gpu_kind("RTX PRO 6000", **keywords)  # type: ignore[arg-type]


def test_an_unknown_name_says_how_to_describe_it() -> None:
    with pytest.raises(MemlabError, match=re.escape("memlab.gpu_kind('V100', memory='32GiB', capability='12.0')")):
        gpu_kind("V100")


def test_bf16_is_decided_once_for_a_trial_on_a_gpu_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A live trial on a T4 runs bf16 autocast emulated, as transformers and TRL run it there, with the note an
    estimate for a T4 gives (one rule, one text); it is never refused."""
    from memlab.techniques import precision

    monkeypatch.setattr(precision, "cuda_bf16_supported", lambda device: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    live = precision.check_precision(Plan(precision="bf16"), torch.device("cuda", 0), [torch.zeros(1)])
    estimated = precision.bf16_emulated(GPUS["T4-16GB"].capability, "Tesla T4", precision="bf16")
    assert live == [estimated]
    assert "Tesla T4 (compute capability 7.5) has no native bf16: PyTorch emulates it" in estimated
    assert "precision='fp16'" in estimated
    assert precision.check_precision(Plan(precision="fp16"), torch.device("cuda", 0), [torch.zeros(1)]) == []


def test_suggestions_for_a_gpu_without_bf16_autocast_in_fp16() -> None:
    parts = {"params": 4 * GIB, "grads": 4 * GIB, "optimizer": 8 * GIB, "activations": GIB, "other": 0}
    base = Trial(Plan(), "ok", 17 * GIB, parts, None, None, None, "cuda", estimated=True)
    plans = combinations(base, budget=12 * GIB, rows=4, prior=speed_prior("cuda"), half="fp16")
    assert plans and {plan.precision for plan in plans} == {"fp32", "fp16"}
    assert {plan.weights for plan in plans} == {"fp32"}  # pure bf16 weights would run emulated on such a GPU
    assert "bf16" in {plan.precision for plan in combinations(base, budget=12 * GIB, rows=4,
                                                               prior=speed_prior("cuda"))}


def test_the_docs_list_every_gpu_kind() -> None:
    """docs/estimates.md's table of GPU kinds names exactly the kinds memlab knows, with their memory."""
    text = (ROOT / "docs" / "estimates.md").read_text(encoding="utf-8")
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| `")]
    named = {cells[0].strip().strip("`"): cells for cells in rows if cells[0].strip().strip("`") in GPUS}
    assert list(named) == list(GPUS)
    for name, cells in named.items():
        kind = GPUS[name]
        assert f"{kind.capability[0]}.{kind.capability[1]}" in cells[2]
        assert f"{kind.memory_bytes / GIB:.2f} GiB" in cells[3]


def test_refusals_name_the_kind_and_the_flag() -> None:
    from memlab.frontends.cli.gpu import check_gpu_flags

    check_gpu_flags(SimpleNamespace(gpu=None, gpu_memory="16GiB", gpu_capability="7.0", device=None))  # type: ignore[arg-type]
    check_gpu_flags(SimpleNamespace(gpu=None, device="cpu"))  # type: ignore[arg-type]
    # a GPU named beside --device cpu would be ignored: refused
    with pytest.raises(MemlabError, match=re.escape("drop --device cpu to estimate for that GPU, or drop --gpu")):
        check_gpu_flags(SimpleNamespace(gpu="T4-16GB", device="cpu"))  # type: ignore[arg-type]
    with pytest.raises(MemlabError, match=re.escape("drop --gpu-memory for the CPU")):
        check_gpu_flags(SimpleNamespace(gpu=None, gpu_memory="16GiB", device="cpu"))  # type: ignore[arg-type]


GIB = 2**30
CONFIG = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=2, vocab_size=256, max_position_embeddings=64)
BATCH = {"input_ids": (1, 32), "labels": (1, 32)}


def test_an_estimate_for_a_t4_runs_bf16_emulated_and_says_so() -> None:
    """bf16 on a T4 is estimated as PyTorch runs it there (emulated, attention on the math kernel, which keeps its
    probabilities: more than fp16's memory-efficient kernel), with the note that names fp16; never refused."""
    long = {"input_ids": (2, 64), "labels": (2, 64)}
    bf16 = memlab.estimate(CONFIG, long, Plan(precision="bf16"), gpu="T4-16GB")
    fp16 = memlab.estimate(CONFIG, long, Plan(precision="fp16"), gpu="T4-16GB")
    assert bf16.status == fp16.status == "ok"
    assert any("T4-16GB (compute capability 7.5) has no native bf16: PyTorch emulates it" in note
               for note in bf16.notes), bf16.notes
    assert not any("no native bf16" in note for note in fp16.notes), fp16.notes
    assert bf16.breakdown["activations"] > fp16.breakdown["activations"]
    served = memlab.estimate(CONFIG, {"input_ids": (1, 32)}, memlab.InferencePlan(weights="bf16"), gpu="Tesla T4")
    assert served.status == "ok" and any("weights='fp16' runs natively" in note for note in served.notes)
    described = memlab.estimate(CONFIG, BATCH, Plan(precision="bf16"),
                                gpu=memlab.gpu_kind("V100", memory="16GiB", capability="7.0"))
    assert any("no native bf16" in note for note in described.notes)
    trial = memlab.estimate(CONFIG, BATCH, Plan(precision="fp16"), gpu="T4-16GB", budget="15GiB")
    assert trial.status == "ok" and trial.fits
    assert any("Tesla T4 (sm75)" in note for note in trial.notes), trial.notes
    assert any("modelled for a T4-16GB" in note for note in trial.notes), trial.notes
    cpu = memlab.estimate(CONFIG, BATCH, Plan(precision="bf16"), gpu="T4-16GB", device="cpu")
    assert cpu.status == "ok" and not any("no native bf16" in note for note in cpu.notes)


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


def test_the_command_estimates_bf16_on_a_t4_and_says_it_is_emulated(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(importlib.import_module("memlab.estimation.estimate"), "estimate_plans", _estimates(seen))
    assert main(["estimate", "llama-7b", "--gpu", "T4-16GB", "--try", "precision=fp16"]) == 0
    assert seen == [GPUS["T4-16GB"]] and "for a T4-16GB, budget: its memory, 14.74 GiB" in capsys.readouterr().out
    assert main(["estimate", "llama-7b", "--gpu", "T4-16GB", "--try", "precision=fp32,bf16"]) == 0
    assert len(seen) > 1 and set(seen) == {GPUS["T4-16GB"]}
