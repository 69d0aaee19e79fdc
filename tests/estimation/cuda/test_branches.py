"""A trainer built on a laptop and estimated for a GPU takes the code path the trainer takes on that GPU
(memlab/estimation/cuda/branches.py): TRL's fused log-probabilities and LM head, chosen by the tensors' device.

On an H100, a DPOTrainer estimated along the CPU's path came out 1.40x the GPU's measured peak where the estimate made
on the GPU gave 0.991: TRL materialized the log-softmax that the GPU's Triton kernel never makes. The reference here is
TRL as it runs on a CUDA machine with Triton, set up by the test itself (``gpu_machine``): TRL's device checks
answering CUDA, its Triton module imported against a stand-in ``triton`` whose kernels fail on fake tensors as the GPU
did, and its fp32 GEMMs on their CUDA branch; memlab's own switch is turned off for it. The estimate memlab makes on
this machine for CUDA must be within 2% of that one for the four trainer kinds (they are equal).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import subprocess
import sys
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

trl = pytest.importorskip("trl")
peft = pytest.importorskip("peft")

import memlab  # noqa: E402
import memlab.estimation.cuda.kernels as cuda_kernels  # noqa: E402
from memlab import Plan  # noqa: E402
from memlab.errors import MemlabError  # noqa: E402
from memlab.estimation.cuda.branches import StandInKernel, gpu_branches  # noqa: E402
from memlab.estimation.dryrun.reserved import cublas_workspace_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))
from trl_trainers import make_dpo_trainer, make_grpo_trainer  # noqa: E402

VOCAB = 2048
"""Wide enough that the log-softmax TRL's CPU path materializes dominates the tiny model's step."""


class KernelInterface:
    """Triton's ``kernel[grid](...)`` (triton/runtime/jit.py): on the GPU machine a launch on fake tensors fails as CUDA
    did, so the dry run must skip it."""

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        def launch(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        return launch


class JITFunction(KernelInterface):
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn


def _triton_package() -> dict[str, types.ModuleType]:
    """A ``triton`` package with its launch points where the dry run's guard looks for them."""
    names = ("triton", "triton.language", "triton.runtime", "triton.runtime.jit")
    package, language, runtime, jit = modules = [types.ModuleType(name) for name in names]
    language.constexpr = int  # type: ignore[attr-defined]
    jit.KernelInterface, jit.JITFunction = KernelInterface, JITFunction  # type: ignore[attr-defined]
    package.jit = JITFunction  # type: ignore[attr-defined]
    package.cdiv = lambda a, b: -(-a // b)  # type: ignore[attr-defined]
    package.language, package.runtime, runtime.jit = language, runtime, jit  # type: ignore[attr-defined]
    for module in modules:
        module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)
    return dict(zip(names, modules, strict=True))


@pytest.fixture
def gpu_machine(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """TRL as on a CUDA machine with Triton (the test's own set-up, memlab's switch off)."""
    chunked = importlib.import_module("trl.kernels.chunked_logprob")
    utils = importlib.import_module("trl.trainer.utils")
    modules = _triton_package()
    package = modules["triton"]
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delitem(sys.modules, "trl.kernels.logprob_entropy", raising=False)
    fused = importlib.import_module("trl.kernels.logprob_entropy").selective_log_softmax_and_entropy
    monkeypatch.setattr(cuda_kernels, "gpu_branches", contextlib.nullcontext)
    for module in (chunked, utils):
        monkeypatch.setattr(module, "_use_triton", lambda device: True)
    monkeypatch.setattr(utils, "is_triton_available", lambda *args, **kwargs: True)
    monkeypatch.setattr(utils, "_supports_trl_loss_kernel", lambda *args, **kwargs: True)
    monkeypatch.setattr(utils, "_fused_logprob_entropy", fused, raising=False)
    monkeypatch.setattr(chunked, "triton", package, raising=False)
    for name in ("_forward_kernel", "_backward_kernel"):
        kernel = getattr(chunked, name)
        monkeypatch.setattr(chunked, name, JITFunction(getattr(kernel, "fn", kernel)))
    monkeypatch.setattr(chunked, "_addmm_fp32",
                        lambda acc, a, b: torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc))
    yield


@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    import trl_trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    def llama() -> LlamaForCausalLM:
        torch.manual_seed(0)
        return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                            num_attention_heads=4, num_key_value_heads=4, vocab_size=VOCAB,
                                            max_position_embeddings=128, pad_token_id=0))

    monkeypatch.setattr(trl_trainers, "llama", llama)


def _sft(tmp_path: Path) -> Any:
    from test_trainer_setups import sft

    return sft(tmp_path, packing=True, peft_config=peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))


def _plain_trainer(tmp_path: Path) -> Any:
    import transformers
    import trl_trainers
    from test_trainer_setups import tokenizer, tokens

    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no",
                                          max_steps=1, per_device_train_batch_size=2, disable_tqdm=True)
    collator = transformers.DataCollatorForLanguageModeling(tokenizer(), mlm=False)
    return transformers.Trainer(model=trl_trainers.llama(), args=args, train_dataset=tokens(), data_collator=collator)


def _lora() -> Any:
    return peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")


TRAINERS: dict[str, Callable[[Path], Any]] = {
    "dpo": make_dpo_trainer,
    "dpo lora": lambda tmp_path: make_dpo_trainer(tmp_path, peft_config=_lora()),
    "grpo": lambda tmp_path: make_grpo_trainer(tmp_path, beta=0.04),
    "grpo lora": lambda tmp_path: make_grpo_trainer(tmp_path, beta=0.04, peft_config=_lora()),
    "sft packing lora": _sft,
    "trainer": _plain_trainer,
}


def _estimate(trainer: Any) -> Any:
    estimate = memlab.estimate(trainer, Plan(precision="bf16"), device="cuda", gpu="H100-80GB")
    assert estimate.status == "ok", estimate.error
    return estimate


@pytest.mark.parametrize("kind", list(TRAINERS))
def test_a_trainer_estimated_for_cuda_on_a_laptop_is_the_gpus_estimate(
        kind: str, tmp_path: Path, wide: None, request: pytest.FixtureRequest) -> None:
    trainer = TRAINERS[kind](tmp_path)
    laptop = _estimate(trainer)
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(cuda_kernels, "gpu_branches", contextlib.nullcontext)
        cpu_path = _estimate(trainer)
    request.getfixturevalue("gpu_machine")
    on_gpu = _estimate(trainer)
    assert abs(laptop.peak_bytes / on_gpu.peak_bytes - 1) <= 0.02, (kind, laptop.peak_bytes, on_gpu.peak_bytes)
    assert abs(laptop.card_bytes / on_gpu.card_bytes - 1) <= 0.02, (kind, laptop.card_bytes, on_gpu.card_bytes)
    kernels = next((note for note in laptop.notes if note.startswith("Triton kernels")), "")
    if kind == "trainer":  # transformers' own loss: TRL is not on its path, and nothing changes
        assert laptop.peak_bytes == cpu_path.peak_bytes and not kernels
        return
    # TRL's CPU path holds what its GPU kernels never do: the log-softmax of every token (DPO, GRPO); the LM head's
    # tiles folded by torch ops and copied to fp32 for the gradient GEMMs (SFT's fused head, fed every position).
    more = 1.1 if kind in ("dpo", "grpo") else 1.0
    workspaces = 2 * cublas_workspace_bytes((9, 0))  # the same in both, and most of these tiny steps' peaks
    assert cpu_path.peak_bytes - workspaces > more * (laptop.peak_bytes - workspaces), (
        kind, cpu_path.peak_bytes, laptop.peak_bytes)
    assert "_forward_kernel" in kernels and "_backward_kernel" in kernels, laptop.notes


def test_a_model_that_checkpoints_its_own_blocks_still_takes_trls_gpu_path(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A Qwen2 that checkpoints its own blocks (the trainer's ``gradient_checkpointing``, which TRL's DPOTrainer turns
    off around its reference forward and back on with the trainer's keywords, in place of memlab's) recomputes them
    under the kernel emulation, where it was made again on the CPU's kernels; TRL's loss, which runs after the blocks,
    takes its GPU path either way. On an H200 (2026-11-27, the acceptance run's ``rl`` part at a 0.5B Qwen2) the
    DPOTrainer + LoRA estimated on a laptop came out 1.57x the one made on the GPU (3.85 against 2.45 GB) without it."""
    from benchmarks.gpu_sections_rl import make_rl_trainer
    from memlab.estimation.cuda.kernels import EMULATED_NOTE, OWN_CHECKPOINT_NOTE

    trainer = make_rl_trainer("dpo_lora", "smoke", True, str(tmp_path))
    laptop = memlab.estimate(trainer, device="cuda", gpu="H200-141GB")
    assert laptop.status == "ok", laptop.error
    assert laptop.plan.checkpointing is True and trainer.args.gradient_checkpointing
    assert EMULATED_NOTE in laptop.notes and OWN_CHECKPOINT_NOTE not in laptop.notes, laptop.notes
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(cuda_kernels, "gpu_branches", contextlib.nullcontext)
        cpu_path = memlab.estimate(trainer, device="cuda", gpu="H200-141GB")
    request.getfixturevalue("gpu_machine")
    on_gpu = memlab.estimate(trainer, device="cuda", gpu="H200-141GB")
    assert (laptop.peak_bytes, laptop.card_bytes) == (on_gpu.peak_bytes, on_gpu.card_bytes)
    assert cpu_path.peak_bytes != laptop.peak_bytes  # TRL's CPU path holds other tensors: the test can tell them apart
    assert any(note.startswith("Triton kernels") for note in laptop.notes), laptop.notes


def test_nothing_of_trls_stays_changed(tmp_path: Path) -> None:
    chunked = importlib.import_module("trl.kernels.chunked_logprob")
    utils = importlib.import_module("trl.trainer.utils")
    before = {(module.__name__, name): vars(module).get(name, "absent") for module in (chunked, utils)
              for name in ("_use_triton", "_forward_kernel", "_backward_kernel", "triton", "_addmm_fp32",
                           "is_triton_available", "_supports_trl_loss_kernel", "_fused_logprob_entropy")}
    modules = {name for name in sys.modules if name == "triton" or name.startswith(("triton.", "trl.kernels."))}
    _estimate(make_dpo_trainer(tmp_path))
    after = {(module.__name__, name): vars(module).get(name, "absent") for module in (chunked, utils)
             for name in ("_use_triton", "_forward_kernel", "_backward_kernel", "triton", "_addmm_fp32",
                          "is_triton_available", "_supports_trl_loss_kernel", "_fused_logprob_entropy")}
    assert after == before
    assert {name for name in sys.modules if name == "triton" or name.startswith(("triton.", "trl.kernels."))} == modules


def test_only_the_dry_runs_thread_sees_the_gpus_answers() -> None:
    chunked = importlib.import_module("trl.kernels.chunked_logprob")
    cpu = torch.device("cpu")
    other: list[bool] = []
    with gpu_branches():
        assert chunked._use_triton(cpu)
        thread = threading.Thread(target=lambda: other.append(chunked._use_triton(cpu)))
        thread.start()
        thread.join()
    assert other == [False] and not chunked._use_triton(cpu)


def test_a_stand_in_kernel_refuses_to_run_outside_a_dry_run() -> None:
    def fold(x: torch.Tensor) -> None:
        x.zero_()

    with pytest.raises(MemlabError, match="Triton is not installed here.*run the step on a GPU machine with Triton"):
        StandInKernel(fold)[(1,)](torch.ones(2))


SAME_ESTIMATE = """
import sys
if sys.argv[1] == "hidden":
    sys.modules["triton"] = None  # as on a machine without Triton
sys.path.insert(0, sys.argv[2])
import tempfile, pathlib, torch, memlab
from memlab import Plan
from trl_trainers import make_dpo_trainer
trainer = make_dpo_trainer(pathlib.Path(tempfile.mkdtemp()))
estimate = memlab.estimate(trainer, Plan(precision="bf16"), device="cuda", gpu="H100-80GB")
print(estimate.status, estimate.peak_bytes, estimate.card_bytes)
"""


def test_memlabs_stand_ins_give_what_the_installed_triton_gives() -> None:
    """Where Triton is installed (the floor stack's CUDA build), TRL's own Triton kernels are skipped; hidden, memlab's
    stand-ins take their place: the same estimate."""
    pytest.importorskip("triton")
    answers = [subprocess.run([sys.executable, "-c", SAME_ESTIMATE, how, str(ROOT / "tests")], capture_output=True,
                              text=True, timeout=300, cwd=ROOT).stdout.strip().splitlines()[-1:]
               for how in ("installed", "hidden")]
    assert answers[0] == answers[1] and answers[0][0].startswith("ok "), answers


def test_trls_distillation_loss_takes_the_gpu_path_too() -> None:
    """``chunked_divergence`` (the distillation trainer's loss) holds ``chunked_logprob``'s helpers by name: each is
    answered where it is held, and its kernels are stood in for where Triton is missing."""
    chunked = importlib.import_module("trl.kernels.chunked_logprob")
    divergence = importlib.import_module("trl.kernels.chunked_divergence")
    held = {name: vars(divergence)[name] for name in ("_use_triton", "_addmm_fp32", "_stats_kernel")}
    cpu = torch.device("cpu")
    with gpu_branches():
        assert divergence._use_triton(cpu) and chunked._use_triton(cpu)
        assert divergence._addmm_fp32 is chunked._addmm_fp32 is not held["_addmm_fp32"]
        if importlib.util.find_spec("triton") is None:
            assert isinstance(divergence._stats_kernel, StandInKernel)
            assert divergence.triton.cdiv(5, 2) == 3
    assert {name: vars(divergence)[name] for name in held} == held


def test_ligers_fused_cross_entropy_takes_its_cuda_path_in_a_dry_run_for_cuda() -> None:
    """Liger's fused linear cross-entropy makes one logits buffer for all its chunks on CUDA (``torch.mm(out=)``)
    and a new one per chunk elsewhere: its device check answers as on CUDA while emulating, in this thread only."""
    fused = pytest.importorskip("liger_kernel.ops.fused_linear_cross_entropy")
    hidden, weight = torch.randn(4, 8), torch.randn(16, 8)
    seen: list[bool] = []

    def elsewhere() -> None:
        with torch.no_grad():  # grad mode is the thread's own
            seen.append(fused._can_use_mm_out(hidden, weight))

    with torch.no_grad():  # as inside Liger's autograd function
        assert not fused._can_use_mm_out(hidden, weight)
        with gpu_branches():
            assert fused._can_use_mm_out(hidden, weight)
            thread = threading.Thread(target=elsewhere)
            thread.start()
            thread.join()
        assert not fused._can_use_mm_out(hidden, weight)
    assert seen == [False]
