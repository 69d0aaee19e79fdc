"""The GPU kinds an estimate answers for (issue 71): the cards people train on, each with its facts; a GPU memlab does
not list, described by its memory and compute capability; bf16 decided once from the capability, for a trial and
an estimate alike."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import memlab
from memlab.errors import MemlabError
from memlab.estimation.cuda.attention import efficient_refusals, flash_refusals, sdpa_backend
from memlab.estimation.cuda.gpus import DEFAULT_GPU, GPUS, gpu_kind
from memlab.plan import Plan
from memlab.report import Trial
from memlab.search.speed import speed_prior
from memlab.search.suggest import combinations

ROOT = Path(__file__).resolve().parents[2]
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
    assert "check_flash_attention_hardware_support" in flash_refusals(q, q, q, is_causal=True, gpu="T4-16GB")
    assert sdpa_backend(q, q, q, is_causal=True, gpu="T4-16GB") == "efficient"
    assert sdpa_backend(q.float(), q.float(), q.float(), is_causal=True, gpu="T4-16GB") == "efficient"
    half = q.detach().bfloat16().requires_grad_()
    assert "check_tensor_dtype" in efficient_refusals(half, half, half, gpu="T4-16GB")
    assert sdpa_backend(half, half, half, is_causal=True, gpu="T4-16GB") == "math"
    assert sdpa_backend(half, half, half, is_causal=True, gpu="A10G-24GB") == "flash"


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
    """A live trial on a T4 refuses bf16 autocast with the words an estimate for a T4 uses (one rule, one text)."""
    from memlab.techniques import precision

    monkeypatch.setattr(precision, "cuda_bf16_supported", lambda device: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    with pytest.raises(MemlabError) as live:
        precision.check_precision(Plan(precision="bf16"), torch.device("cuda", 0), [torch.zeros(1)])
    assert "write precision='fp16'" in str(live.value) and "Tesla T4 (compute capability 7.5)" in str(live.value)
    estimated = precision.bf16_refusal(GPUS["T4-16GB"].capability, "Tesla T4", precision="bf16")
    assert str(live.value) == estimated


def test_suggestions_for_a_gpu_without_bf16_autocast_in_fp16() -> None:
    parts = {"params": 4 * GIB, "grads": 4 * GIB, "optimizer": 8 * GIB, "activations": GIB, "other": 0}
    base = Trial(Plan(), "ok", 17 * GIB, parts, None, None, None, "cuda", estimated=True)
    plans = combinations(base, budget=12 * GIB, rows=4, prior=speed_prior("cuda"), half="fp16")
    assert plans and {plan.precision for plan in plans} == {"fp32", "fp16"}
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
    from memlab.frontends.gpu_cli import check_gpu_plans

    with pytest.raises(MemlabError, match=re.escape("write --try precision=fp16")):
        check_gpu_plans(SimpleNamespace(gpu=None, gpu_memory="16GiB", gpu_capability="7.0", device=None),  # type: ignore[arg-type]
                        [Plan(precision="bf16")])
    check_gpu_plans(SimpleNamespace(gpu=None, device="cpu"), [Plan(precision="bf16")])  # type: ignore[arg-type]
    # a GPU named beside --device cpu would be ignored: refused, whatever the plans
    with pytest.raises(MemlabError, match=re.escape("drop --device cpu to estimate for that GPU, or drop --gpu")):
        check_gpu_plans(SimpleNamespace(gpu="T4-16GB", device="cpu"), [Plan(precision="bf16")])  # type: ignore[arg-type]
    with pytest.raises(MemlabError, match=re.escape("drop --gpu-memory for the CPU")):
        check_gpu_plans(SimpleNamespace(gpu=None, gpu_memory="16GiB", device="cpu"), [Plan()])  # type: ignore[arg-type]
