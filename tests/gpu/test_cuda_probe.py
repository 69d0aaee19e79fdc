"""CUDA probes against hand-made references: the allocator's peak, the budget cap, the tracker on CUDA."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from memlab.live.device import cuda_bf16_supported
from memlab.measure import CudaPeak, MemoryTracker, cap_cuda_memory, is_oom_error
from memlab.measure.cuda import cuda_context_bytes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

MiB = 1024**2


@pytest.fixture
def device() -> torch.device:
    device = torch.device("cuda", torch.cuda.current_device())
    torch.empty(1, device=device)  # the context and the allocator exist before anything is measured
    torch.cuda.synchronize(device)
    return device


def _round_512(nbytes: int) -> int:
    return (nbytes + 511) // 512 * 512


def test_cuda_peak_matches_a_known_allocation(device: torch.device) -> None:
    numel = 25_000_003  # about 100 MB, deliberately not a multiple of 512 bytes
    with CudaPeak(device) as probe:
        x = torch.empty(numel, device=device)
        del x
    expected = _round_512(numel * 4)
    assert probe.peak_allocated - probe.start_allocated == pytest.approx(expected, rel=0.02)
    assert probe.peak_reserved >= probe.peak_allocated


def test_cuda_peak_reads_its_figures_when_the_block_raises(device: torch.device) -> None:
    probe = CudaPeak(device)
    with pytest.raises(ValueError):
        with probe:
            x = torch.empty(MiB, device=device)
            raise ValueError("user error")
    del x
    assert probe.peak_allocated - probe.start_allocated >= 4 * MiB


def test_cap_makes_a_too_large_allocation_oom_and_is_lifted_afterwards(device: torch.device) -> None:
    before = torch.cuda.get_per_process_memory_fraction(device)
    torch.cuda.empty_cache()
    # The budget is what the card shows: the CUDA context beside the allocator's reserve (on the H200 the context
    # alone, about 770 MiB, is more than a budget of the reserve and 256 MiB).
    budget = cuda_context_bytes(device) + torch.cuda.memory_reserved(device) + 256 * MiB
    with cap_cuda_memory(budget, device):
        small = torch.empty(64 * MiB, dtype=torch.uint8, device=device)
        with pytest.raises(torch.OutOfMemoryError) as caught:
            torch.empty(1024 * MiB, dtype=torch.uint8, device=device)
        del small
    assert is_oom_error(caught.value)
    assert torch.cuda.get_per_process_memory_fraction(device) == before
    big = torch.empty(1024 * MiB, dtype=torch.uint8, device=device)  # the cap is gone
    del big
    torch.cuda.empty_cache()


def test_cap_is_lifted_when_the_block_raises(device: torch.device) -> None:
    before = torch.cuda.get_per_process_memory_fraction(device)
    with pytest.raises(RuntimeError):
        with cap_cuda_memory(64 * MiB, device):
            raise RuntimeError("step failed")
    assert torch.cuda.get_per_process_memory_fraction(device) == before


def test_cap_with_no_budget_changes_nothing(device: torch.device) -> None:
    before = torch.cuda.get_per_process_memory_fraction(device)
    with cap_cuda_memory(None, device):
        assert torch.cuda.get_per_process_memory_fraction(device) == before


def test_tracker_on_cuda_agrees_with_the_allocator(device: torch.device) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096)).to(device)
    x = torch.randn(1024, 4096, device=device)
    model(x).sum().backward()  # warm-up: cuBLAS workspaces now exist and are not part of the step
    model.zero_grad(set_to_none=True)
    tracker = MemoryTracker(baseline={"params": model.parameters(), "other": [x]}, device=device)
    with CudaPeak(device) as probe, tracker:
        model(x).sum().backward()
    # Allocations outside a phase are charged to "other", so the step is the peak less what was there before.
    before = sum(p.numel() * p.element_size() for p in model.parameters()) + x.numel() * x.element_size()
    tracked_step = tracker.peak_bytes - before
    allocator_step = probe.peak_allocated - probe.start_allocated
    # The allocator also sees kernel-internal buffers and rounds every block up to 512 bytes.
    assert 0.8 * allocator_step <= tracked_step <= allocator_step
    model.zero_grad(set_to_none=True)


def test_bf16_support_is_a_bool(device: torch.device) -> None:
    major, _ = torch.cuda.get_device_capability(device)
    assert cuda_bf16_supported(device) is (major >= 8 or bool(torch.version.hip))
