"""CUDA's kernels on a machine without CUDA: whether a dry run emulates them, and the modes it runs under when it
does, in one place for the one-GPU and the sharded estimate.

A dry run for ``device="cuda"`` on a CPU-only machine runs fake CPU tensors through the CPU's kernels. Where the
CPU's choice keeps different memory than CUDA's, a ``TorchFunctionMode`` makes it CUDA's:

- :class:`~memlab.estimation.cuda.autocast.CudaAutocast`: CUDA autocast's dtypes (softmax, layer norm, ...);
- :class:`~memlab.estimation.cuda.dropout.CudaDropout`: the fused dropout and its one-byte mask;
- :class:`~memlab.estimation.cuda.attention.CudaAttention`: the attention backend the GPU kind has, and what it
  keeps for backward;
- :func:`~memlab.estimation.cuda.branches.gpu_branches`: libraries that choose their kernels by the tensors' device
  (TRL's fused log-probabilities and LM head) take their GPU path.

Checkpointing recomputes in backward, where no mode is active: every checkpoint whose forward runs under the
emulation, memlab's or the model's own, recomputes under fresh modes of the same kinds
(:func:`memlab.techniques.checkpointing.recomputed_under`), so that its recompute runs the kernels its forward ran.
The optimizer's update (fused or foreach AdamW) is chosen by the optimizer's target device, not here.

Example:
    >>> from memlab.estimation.cuda.gpus import GPUS
    >>> from memlab.estimation.dryrun.fake import FakeMode
    >>> with FakeMode(), cuda_kernels(GPUS["A100-80GB"]) as attention:
    ...     q = torch.empty(1, 2, 16, 64, dtype=torch.bfloat16)
    ...     _ = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    >>> attention.gpu.name, attention.backends
    ('A100-80GB', {'flash'})
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from memlab.estimation.cuda.attention import CudaAttention
from memlab.estimation.cuda.autocast import CudaAutocast
from memlab.estimation.cuda.branches import gpu_branches
from memlab.estimation.cuda.devices import kernels_device, target_device
from memlab.estimation.cuda.dropout import CudaDropout
from memlab.estimation.cuda.gpus import GpuKind
from memlab.techniques.checkpointing import recomputed_under

__all__ = [
    "EMULATED_NOTE", "OWN_CHECKPOINT_NOTE", "cuda_kernels", "kernel_emulation", "recompute_mismatch", "run_emulated",
]

ResultT = TypeVar("ResultT", bound=tuple[Any, ...])

EMULATED_NOTE = (
    "estimated on CPU kernels with CUDA's autocast dtypes, dropout, attention backends, optimizer update and TRL's "
    "kernel choices emulated; what other kernels hold inside themselves (a custom operator's buffers) as the CPU runs "
    "them"
)
"""The note of an estimate made under :func:`cuda_kernels`."""

OWN_CHECKPOINT_NOTE = (
    "CUDA's kernels not emulated: a checkpoint's recompute in backward did not match its forward under the "
    "emulation; estimated with the CPU's kernels (dropout noise, attention and autocast dtypes as the CPU keeps "
    "them; TRL's kernel choices still the GPU's)"
)
"""The note of a CUDA estimate whose emulated step failed in a checkpoint's recompute, made again without it: every
checkpoint recomputes under the emulation (:func:`cuda_kernels`), so a mismatch is one the modes did not cause alike
in the forward and its recompute."""


def kernel_emulation(model_or_config: Any, device: str | torch.device | None) -> bool:
    """Whether a dry run for ``device`` emulates CUDA's kernels: a CUDA target on a machine without CUDA.

    Example:
        >>> kernel_emulation(torch.nn.Linear(2, 2), "cpu")
        False
    """
    target = target_device(model_or_config, device)
    return target.type == "cuda" and kernels_device(target) != target


def recompute_mismatch(error: str | None) -> bool:
    """Whether a trial's ``error`` is a non-reentrant checkpoint's recompute that did not match its forward.

    Example:
        >>> recompute_mismatch("CheckpointError: torch.utils.checkpoint: Recomputed values for the following tensors "
        ...                    "have different metadata than during the forward pass."), recompute_mismatch(None)
        (True, False)
    """
    return bool(error) and "CheckpointError" in str(error) and "Recomputed values" in str(error)


def run_emulated(run: Callable[[bool], ResultT], emulate: bool) -> tuple[ResultT, bool]:
    """``run(emulate)``, whose result starts with its trial; where the trial failed in a checkpoint's recompute under
    the emulation (:func:`recompute_mismatch`), ``run(False)`` instead. The result, and whether it fell back.

    Example:
        >>> from types import SimpleNamespace
        >>> failed = SimpleNamespace(status="error", error="CheckpointError: Recomputed values differ")
        >>> run_emulated(lambda emulate: (failed if emulate else "cpu kernels",), True)
        (('cpu kernels',), True)
    """
    result = run(emulate)
    trial = result[0]
    if emulate and trial.status == "error" and recompute_mismatch(trial.error):
        return run(False), True
    return result, False


@contextlib.contextmanager
def cuda_kernels(gpu: GpuKind | None = None, *, kernels: bool = True) -> Iterator[CudaAttention | None]:
    """CUDA's kernels emulated for the GPU kind ``gpu`` (default an H100) while active, forward and checkpointing's
    recomputation alike; yields the attention mode, whose ``backends`` and ``gaps`` the trial's notes report.

    Every ``torch.utils.checkpoint`` whose forward runs meanwhile recomputes under fresh modes of the same kinds,
    whoever checkpoints: a trainer's ``gradient_checkpointing`` that TRL's DPOTrainer turns off around its reference
    forward and back on with its own keywords, in place of memlab's, recomputed the next step's blocks on the CPU's
    kernels, where the forward had run CUDA's; the recompute did not match, and the step was made again on the CPU's
    kernels (a DPOTrainer on rows of unequal lengths: with their padding mask the CPU's attention saves other tensors
    than CUDA's memory-efficient kernel).

    With ``kernels=False`` (the step made again after a recompute did not match its forward under the modes:
    :data:`OWN_CHECKPOINT_NOTE`) only the libraries' device choices answer as on the GPU
    (:func:`~memlab.estimation.cuda.branches.gpu_branches`: TRL's loss runs after the model's blocks, never inside their
    recompute), and it yields None. Without them, the DPOTrainer + LoRA of the H200's run of 2026-11-27, made again so,
    was estimated along TRL's CPU path: 1.57x the estimate made on the GPU (3.85 against 2.45 GB)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(gpu_branches())
        if not kernels:
            yield None
            return
        attention = CudaAttention(gpu)
        stack.enter_context(CudaAutocast())
        stack.enter_context(CudaDropout())
        stack.enter_context(attention)
        stack.enter_context(recomputed_under(CudaAutocast, CudaDropout, attention.twin))
        yield attention
