"""No Triton kernel is launched on fake tensors in a dry run (memlab/estimation/dryrun/triton_guard.py).

On an H100 (benchmarks/results/gpu_acceptance-cuda-nvidia-h100-80gb-hbm3-first-eight.json), ``memlab.estimate`` of
TRL 1.16's SFTTrainer with a LoRA ``peft_config`` killed the CUDA context: TRL's fused LM head folds each vocabulary
tile with a Triton kernel on CUDA (``trl/kernels/chunked_logprob.py``), and in the dry run that kernel was launched on
fake tensors (``an illegal memory access was encountered``). This machine has no Triton, so a stand-in takes its place
with Triton's two launch points (``KernelInterface.__getitem__``, ``JITFunction.run``): a launch on real tensors runs
the kernel's Python body (TRL's own torch fallback), a launch on fake tensors fails as the GPU did. TRL's module is
switched to its Triton branch, so the test runs TRL's own code on a fake CUDA device.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import sys
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import is_fake

import memlab
from memlab import Plan
from memlab.estimation.dryrun.fake import FakeMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class KernelInterface:
    """Triton's ``kernel[grid](...)``: the launch goes through ``run`` (as in triton/runtime/jit.py)."""

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        return lambda *args, **kwargs: self.run(*args, grid=grid, warmup=False, **kwargs)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


class JITFunction(KernelInterface):
    """A kernel: on real tensors it runs ``fn`` (the CPU's stand-in for the GPU), on fake ones it fails as CUDA did."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.launches = 0
        self.fake_launches = 0

    def run(self, *args: Any, grid: Any = None, warmup: bool = False, **kwargs: Any) -> Any:
        tensors = [value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor)]
        if any(is_fake(tensor) or tensor.is_meta for tensor in tensors):
            self.fake_launches += 1
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        self.launches += 1
        return self.fn(*args, **kwargs)


@pytest.fixture
def triton(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """A stand-in ``triton`` package (``triton.runtime.jit`` with the two launch points, ``triton.cdiv``)."""
    with contextlib.suppress(ImportError):  # transformers' answer is cached as this machine's (no Triton) first
        from transformers.utils import is_triton_available

        is_triton_available()
    package, runtime, jit = (types.ModuleType(name) for name in ("triton", "triton.runtime", "triton.runtime.jit"))
    for module in (package, runtime, jit):
        module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)
    jit.KernelInterface, jit.JITFunction = KernelInterface, JITFunction  # type: ignore[attr-defined]
    package.cdiv = lambda a, b: -(-a // b)  # type: ignore[attr-defined]
    package.runtime, runtime.jit = runtime, jit  # type: ignore[attr-defined]
    for module in (package, runtime, jit):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    yield package


def test_a_launch_on_fake_tensors_is_skipped_and_named(triton: types.ModuleType) -> None:
    def fold(source: torch.Tensor, target: torch.Tensor) -> None:
        target.copy_(source * 2)

    kernel = JITFunction(fold)
    launch_points = (KernelInterface.__getitem__, JITFunction.run)
    real_source, real_target = torch.ones(3), torch.zeros(3)
    with FakeMode() as mode:
        source = torch.ones(4, device="cuda")
        target = torch.empty_like(source)
        assert kernel[(4,)](source, target) is None
        assert kernel.run(source, target, grid=(4,)) is None
        # Another thread's real training (fake modes are per thread, the launch points are not): its launch runs.
        other = threading.Thread(target=lambda: kernel[(3,)](real_source, real_target))
        other.start()
        other.join()
    assert kernel.fake_launches == 0
    assert kernel.launches == 1 and torch.equal(real_target, torch.full((3,), 2.0))
    assert mode.skipped_kernels == {"fold"}
    assert (KernelInterface.__getitem__, JITFunction.run) == launch_points, "the launch points were not put back"


def test_nested_dry_runs_share_one_patch(triton: types.ModuleType) -> None:
    kernel = JITFunction(lambda tensor: None)
    with FakeMode() as outer:
        with FakeMode() as inner:
            kernel[(1,)](torch.ones(2, device="cuda"))
        kernel[(1,)](torch.ones(2, device="cuda"))
    assert kernel.fake_launches == 0
    assert inner.skipped_kernels == {"<lambda>"} and outer.skipped_kernels == {"<lambda>"}
    assert JITFunction.run.__qualname__ == "JITFunction.run"


@pytest.fixture
def trl_on_triton(triton: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> dict[str, JITFunction]:
    """TRL's fused LM head switched to its Triton branch, its kernels the stand-in's (running TRL's torch tiles).

    Without a CUDA build the dry run's fake tensors sit on the CPU's device (CUDA's memory rules emulated), where TRL
    takes its torch branch; ``_use_triton`` answers as on a GPU machine, where they sit on CUDA's."""
    pytest.importorskip("trl")
    chunked = pytest.importorskip("trl.kernels.chunked_logprob")
    utils = pytest.importorskip("trl.trainer.utils")
    if not hasattr(chunked, "_forward_tile") or not hasattr(utils, "_use_triton"):
        pytest.skip("this TRL has no fused LM head")
    kernels = {"_forward_kernel": JITFunction(chunked._forward_tile),
               "_backward_kernel": JITFunction(chunked._backward_tile)}
    for module in (chunked, utils):
        monkeypatch.setattr(module, "_use_triton", lambda device: True)
    monkeypatch.setattr(chunked, "triton", triton, raising=False)
    for name, kernel in kernels.items():
        kernel.fn.__name__ = name  # as Triton names the kernel: the decorated function's name
        monkeypatch.setattr(chunked, name, kernel, raising=False)
    return kernels


def test_sft_trainer_with_peft_estimated_for_cuda_launches_no_kernel(
        tmp_path: Path, trl_on_triton: dict[str, JITFunction], monkeypatch: pytest.MonkeyPatch) -> None:
    peft = pytest.importorskip("peft")
    from test_trainer_setups import sft

    trainer = sft(tmp_path, peft_config=peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    estimated = memlab.estimate(trainer, Plan(), device="cuda")
    assert estimated.status == "ok", estimated.error
    assert [kernel.fake_launches for kernel in trl_on_triton.values()] == [0, 0]
    note = next((note for note in estimated.notes if note.startswith("Triton kernels")), "")
    assert "_forward_kernel" in note and "_backward_kernel" in note, estimated.notes
    # TRL's torch branch (the CPU's) launches nothing, and no note says otherwise.
    for module in (sys.modules["trl.kernels.chunked_logprob"], sys.modules["trl.trainer.utils"]):
        monkeypatch.setattr(module, "_use_triton", lambda device: False)
    tiles = memlab.estimate(trainer, Plan(), device="cuda")
    assert tiles.status == "ok" and not any(note.startswith("Triton kernels") for note in tiles.notes)


def test_an_entered_fake_mode_stays_copyable() -> None:
    """The guard's state is plain data on the mode: a QLoRA dry run deep-copies what holds it (a generator there
    failed with ``cannot pickle 'generator' object``, tests/integration/test_qlora_task_heads.py)."""
    import copy

    with FakeMode() as mode:
        twin = copy.deepcopy(mode)
    assert twin.skipped_kernels == set() and twin is not mode
