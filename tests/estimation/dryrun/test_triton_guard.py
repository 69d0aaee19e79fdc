"""No Triton kernel is launched on fake tensors in a dry run (memlab/estimation/dryrun/triton_guard.py).

On an H100 (benchmarks/results/gpu_acceptance-cuda-nvidia-h100-80gb-hbm3-first-eight.json), ``memlab.estimate`` of
TRL 1.16's SFTTrainer with a LoRA ``peft_config`` killed the CUDA context: TRL's fused LM head folds each vocabulary
tile with a Triton kernel on CUDA (``trl/kernels/chunked_logprob.py``), and in the dry run that kernel was launched on
fake tensors (``an illegal memory access was encountered``). This machine has no Triton, so a stand-in takes its place
with Triton's two launch points (``KernelInterface.__getitem__``, ``JITFunction.run``): a launch on real tensors runs
the kernel's Python body (TRL's own torch fallback), a launch on fake tensors fails as the GPU did. TRL's module is
switched to its Triton branch, so the test runs TRL's own code on a fake CUDA device.

What a skipped launch would have taken is counted (memlab/estimation/dryrun/triton_launches.py): a stand-in host
wrapper written as Liger's RMSNorm (its workspace sized by torch.cuda's multiprocessors, patched to an H100's) around
stand-in kernels whose launch takes a global scratch known from Triton's compiled metadata, from the tensor
descriptors in the kernel's source, from memlab's table, or from nothing (named with its bound, not counted). Each
is estimated against the same step whose launch takes nothing: the peaks differ by exactly those bytes.
"""

from __future__ import annotations

import contextlib
import importlib
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


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
    with contextlib.suppress(ImportError):  # and TRL imported against this machine's Triton, if it has one
        importlib.import_module("trl.trainer.utils")
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
    """TRL's fused LM head as on a machine with Triton (its own rule: Triton on CUDA), its kernels the stand-in's
    (running TRL's torch tiles). A dry run for CUDA keeps its fake tensors on the CPU's device here; memlab's CUDA
    emulation answers TRL's choice as on the GPU (memlab/estimation/cuda/branches.py)."""
    pytest.importorskip("trl")
    chunked = pytest.importorskip("trl.kernels.chunked_logprob")
    utils = pytest.importorskip("trl.trainer.utils")
    if not hasattr(chunked, "_forward_tile") or not hasattr(utils, "_use_triton"):
        pytest.skip("this TRL has no fused LM head")
    kernels = {"_forward_kernel": JITFunction(chunked._forward_tile),
               "_backward_kernel": JITFunction(chunked._backward_tile)}
    def use_triton(device: torch.device) -> bool:
        return device.type in ("cuda", "xpu")

    for module in (chunked, utils):
        monkeypatch.setattr(module, "_use_triton", use_triton)
    monkeypatch.setattr(chunked, "triton", triton, raising=False)
    for name, kernel in kernels.items():
        kernel.fn.__name__ = name  # as Triton names the kernel: the decorated function's name
        monkeypatch.setattr(chunked, name, kernel, raising=False)
    return kernels


def test_sft_trainer_with_peft_estimated_for_cuda_launches_no_kernel(
        tmp_path: Path, trl_on_triton: dict[str, JITFunction]) -> None:
    peft = pytest.importorskip("peft")
    from test_trainer_setups import sft

    trainer = sft(tmp_path, peft_config=peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    estimated = memlab.estimate(trainer, Plan(), device="cuda")
    assert estimated.status == "ok", estimated.error
    assert [kernel.fake_launches for kernel in trl_on_triton.values()] == [0, 0]
    note = next((note for note in estimated.notes if note.startswith("Triton kernels")), "")
    assert "_forward_kernel" in note and "_backward_kernel" in note, estimated.notes
    # Estimated for the CPU, TRL takes its torch branch (the CPU's): nothing is launched, and no note says otherwise.
    tiles = memlab.estimate(trainer, Plan(), device="cpu")
    assert tiles.status == "ok" and not any(note.startswith("Triton kernels") for note in tiles.notes)
    assert [kernel.fake_launches for kernel in trl_on_triton.values()] == [0, 0]


def test_an_entered_fake_mode_stays_copyable() -> None:
    """The guard's state is plain data on the mode: a QLoRA dry run deep-copies what holds it (a generator there
    failed with ``cannot pickle 'generator' object``, tests/techniques/test_adapters.py)."""
    import copy

    with FakeMode() as mode:
        twin = copy.deepcopy(mode)
    assert twin.skipped_kernels == set() and twin is not mode


# --- what a skipped launch would have taken: counted (memlab/estimation/dryrun/triton_launches.py) -------------------

ROWS, HIDDEN, SMS = 64, 256, 132
"""The stand-in step's rows and width, and the multiprocessors the patched torch.cuda reports (an H100's)."""


def _use_triton(device: torch.device) -> bool:
    """The host code's choice, as TRL's and Liger's make it: Triton on CUDA. A dry run for CUDA on this machine keeps
    its fake tensors on the CPU's device, so the tests switch it on."""
    return device.type == "cuda"


def _scale_tile(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, n_cols: int, BLOCK: int = 256) -> None:
    """The kernel's body (the stand-in runs it on real tensors): each row of ``x`` scaled by ``w`` into ``out``."""
    out.copy_(x * w)


def _described_tile(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, n_cols: int, BLOCK: int = 256) -> None:
    """A kernel that makes two tensor descriptors on the device (TMA on Hopper): Triton asks a global scratch of
    128 B per descriptor, program and pipeline stage."""
    source = TL.make_tensor_descriptor(x, shape=[n_cols], strides=[1], block_shape=[BLOCK])
    target = TL.make_tensor_descriptor(out, shape=[n_cols], strides=[1], block_shape=[BLOCK])
    target.store([0], source.load([0]) * w)


TL = types.SimpleNamespace(make_tensor_descriptor=lambda *args, **kwargs: None)
"""Where ``_described_tile`` finds ``make_tensor_descriptor`` (never called: its launches are skipped)."""


def _opaque_tile() -> Callable[..., None]:
    """A kernel function whose source cannot be read (made by ``exec``): neither in memlab's table nor bounded by
    its source."""
    namespace: dict[str, Any] = {}
    exec("def opaque(x, w, out, n_cols, BLOCK=256):\n    out.copy_(x * w)\n", namespace)  # noqa: S102
    return namespace["opaque"]


class _Scaled(torch.autograd.Function):
    """A host wrapper around a Triton launch, as Liger's RMSNorm is written: its outputs (and, with ``workspace``, a
    float32 buffer of one row per multiprocessor, Liger's ``_dW``) made with torch, then the kernel launched on them."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, kernel: Any, workspace: bool,
                options: dict[str, Any]) -> torch.Tensor:
        out = torch.empty_like(x)
        ctx.save_for_backward(x)
        if not _use_triton(x.device):
            return out.copy_(x * w)
        # A float32 statistic per row, dropped after the launch (TRL's running max): the launch's moment stays the
        # step's peak, above the loss's 4 bytes made while ``out`` lives.
        stats = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
        partial = None
        if workspace:
            sms = torch.cuda.get_device_properties(x.device).multi_processor_count
            partial = torch.empty((sms, x.shape[-1]), dtype=torch.float32, device=x.device)
        kernel[(x.shape[0],)](x, w, out, x.shape[-1], BLOCK=256, **options)
        del partial, stats
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        (x,) = ctx.saved_tensors
        return None, x.sum(0), None, None, None  # the loss is out.sum(): each row's gradient is one


class _ScaledModel(torch.nn.Module):
    def __init__(self, kernel: Any, workspace: bool = False, **options: Any) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(HIDDEN))
        self.kernel, self.workspace, self.options = kernel, workspace, options

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Scaled.apply(x, self.w, self.kernel, self.workspace, self.options).sum()


def _estimate(kernel: Any, workspace: bool = False, **options: Any) -> memlab.Trial:
    """The stand-in step estimated for CUDA. Its peak is the launch's moment (the batch, its output and whatever
    the launch takes), so two estimates differ by exactly what one launch takes more."""
    trial = memlab.estimate(_ScaledModel(kernel, workspace, **options), torch.randn(ROWS, HIDDEN), Plan(),
                            device="cuda", loss_fn=lambda model, batch: model(batch))
    assert trial.status == "ok", trial.error
    return trial


def _note(trial: memlab.Trial) -> str:
    return next((note for note in trial.notes if note.startswith("Triton kernels")), "")


@pytest.fixture
def cuda_branch(triton: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host wrapper's CUDA branch on this machine: Triton chosen, and torch.cuda telling an H100's
    multiprocessors (Liger sizes its RMSNorm workspace by them)."""
    monkeypatch.setattr(sys.modules[__name__], "_use_triton", lambda device: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: types.SimpleNamespace(multi_processor_count=SMS, name="NVIDIA H100"))


def _kernel(fn: Callable[..., None], name: str, scratch: int | None = None) -> JITFunction:
    """The stand-in kernel of ``fn`` named ``name``; with ``scratch``, compiled in this process with that global
    scratch per program (as Triton keeps a compiled kernel: ``device_caches[device][0][key].metadata``)."""
    fn.__name__ = name
    kernel = JITFunction(fn)
    if scratch is not None:
        compiled = types.SimpleNamespace(metadata=types.SimpleNamespace(global_scratch_size=scratch, num_ctas=1))
        kernel.device_caches = {0: ({"key": compiled}, None, None, None)}  # type: ignore[attr-defined]
    return kernel


def test_a_host_wrappers_workspace_around_a_skipped_launch_is_counted(cuda_branch: None) -> None:
    plain = _estimate(_kernel(_scale_tile, "_scale_kernel"))
    with_workspace = _estimate(_kernel(_scale_tile, "_scale_kernel"), workspace=True)
    assert with_workspace.peak_bytes - plain.peak_bytes == SMS * HIDDEN * 4  # the (SMs, hidden) float32 buffer
    assert "_scale_kernel" in _note(plain) and "no tensor descriptor in its source: 0 B" in _note(plain)


def test_a_compiled_kernels_global_scratch_is_counted_around_its_skipped_launch(cuda_branch: None) -> None:
    none = _estimate(_kernel(_scale_tile, "_scale_kernel", scratch=0))
    scratch = _estimate(_kernel(_scale_tile, "_scale_kernel", scratch=384))
    assert scratch.peak_bytes - none.peak_bytes == ROWS * 384  # a program per row, 384 B each
    assert f"_scale_kernel (its compiled scratch: {ROWS * 384:,} B)" in _note(scratch), scratch.notes


def test_a_kernels_tensor_descriptors_are_counted_at_tritons_bound(cuda_branch: None) -> None:
    plain = _estimate(_kernel(_scale_tile, "_scale_kernel"))
    described = _estimate(_kernel(_described_tile, "_described_kernel"), num_stages=2)
    assert described.peak_bytes - plain.peak_bytes == ROWS * 128 * 2 * 2  # programs x 128 B x descriptors x stages
    assert f"_described_kernel (its source's bound: {ROWS * 512:,} B)" in _note(described), described.notes


def test_a_kernel_of_memlabs_table_is_counted_by_its_rule(cuda_branch: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from memlab.estimation.dryrun.triton_launches import KNOWN_KERNELS, KnownKernel

    plain = _estimate(_kernel(_scale_tile, "_scale_kernel"))
    rule = KnownKernel(lambda launch: (launch.programs() or 0) * 1000, "a workspace of 1,000 B a row")
    monkeypatch.setitem(KNOWN_KERNELS, (__name__, "_tabled_kernel"), rule)
    tabled = _estimate(_kernel(_scale_tile, "_tabled_kernel"))
    assert tabled.peak_bytes - plain.peak_bytes == ROWS * 1000
    assert f"_tabled_kernel (memlab's table: {ROWS * 1000:,} B)" in _note(tabled), tabled.notes


def test_an_unknown_kernel_is_named_with_its_bound_and_nothing_counted(cuda_branch: None) -> None:
    plain = _estimate(_kernel(_scale_tile, "_scale_kernel"))
    opaque = _estimate(_kernel(_opaque_tile(), "_opaque_kernel"))
    assert opaque.peak_bytes == plain.peak_bytes
    assert ("not counted: _opaque_kernel (at most its global scratch, programs x its compiled "
            "global_scratch_size)") in _note(opaque), opaque.notes


def test_trls_kernels_are_known_to_take_nothing_more(tmp_path: Path, trl_on_triton: dict[str, JITFunction]) -> None:
    peft = pytest.importorskip("peft")
    from test_trainer_setups import sft

    trainer = sft(tmp_path, peft_config=peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    note = _note(memlab.estimate(trainer, Plan(), device="cuda"))
    assert ("counted for _backward_kernel (memlab's table: 0 B), _forward_kernel (memlab's table: 0 B)" in note
            and "not counted" not in note), note
