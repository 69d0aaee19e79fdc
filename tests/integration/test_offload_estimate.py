"""The GPU side of an offload plan in a CUDA estimate made on fake tensors (issue 60): what the offload moves to the
host is not in the GPU's bytes, in the dry run on the CPU's kernels (a machine without CUDA, where the device and the
host are the same fake CPU) and with CUDA's branch made to run (``cuda_watched``); what it keeps on the host is
counted as before; ``fit``'s dry run picks an offload plan where only it fits."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import memlab
from memlab import Plan
from memlab.estimation.dryrun.fake import FakeMode
from memlab.measure.tracker import MemoryTracker
from memlab.techniques.core.technique import HostLedger
from memlab.techniques.offload import HOST, OFFLOAD_ESTIMATED, OffloadedOptimizer, counted_save_on_cpu
from tests.models import mlp_batch, mlp_loss, tiny_llama, tiny_mlp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_no_cuda_under_dry_run import cuda_watched  # noqa: E402

LLAMA_BATCH = {"input_ids": (2, 16), "labels": (2, 16)}


def _estimates(model: torch.nn.Module, batch: object, offloads: tuple[str, ...],
               **keywords: object) -> dict[str, memlab.Trial]:
    trials = {offload: memlab.estimate(model, batch, Plan(offload=offload), device="cuda", **keywords)
              for offload in ("none", *offloads)}
    for trial in trials.values():
        assert trial.status == "ok", trial.error
    return trials


def test_an_offloaded_optimizer_leaves_its_state_off_the_gpu() -> None:
    """The GPU holds no optimizer state where the update runs on the CPU: the peak drops by the state's bytes, while
    the weights and gradients stay; the host holds the fp32 copies, their gradient buffers and the state."""
    trials = _estimates(tiny_llama(), LLAMA_BATCH, ("optimizer",))
    plain, offloaded = trials["none"], trials["optimizer"]
    assert plain.breakdown["optimizer"] > 0 and offloaded.breakdown["optimizer"] == 0
    assert offloaded.breakdown["params"] == plain.breakdown["params"]
    assert offloaded.peak_bytes == pytest.approx(plain.peak_bytes - plain.breakdown["optimizer"], rel=0.01)
    assert offloaded.host_bytes > plain.breakdown["optimizer"]  # the state, and the weights' fp32 copies beside it
    assert OFFLOAD_ESTIMATED in offloaded.notes and not any("no change" in note for note in offloaded.notes)


def test_offloaded_activations_leave_the_gpu_until_backward_brings_them_back() -> None:
    """Saved activations go to the host in forward (host_bytes, as a live step counts them) and come back one
    backward node at a time: the activations at the peak drop, and "all" drops both parts."""
    model, batch = tiny_mlp(blocks=4, width=256), mlp_batch(rows=512, width=256)
    trials = _estimates(model, batch, ("activations", "optimizer", "all"), loss_fn=mlp_loss)
    plain, activations, optimizer, both = (trials[key] for key in ("none", "activations", "optimizer", "all"))
    live = HostLedger()
    with counted_save_on_cpu(live, move=False, pinned=True):  # what a live step on a GPU counts
        loss = mlp_loss(model, batch)
    loss.backward()
    assert activations.host_bytes == live.held_peak > 0
    assert activations.breakdown["activations"] < plain.breakdown["activations"]
    # each block's saved input and output (its 512 x 256 floats) left the GPU; one block's are back at a time
    one_block = 2 * 512 * 256 * 4
    assert activations.peak_bytes <= plain.peak_bytes - one_block
    assert optimizer.peak_bytes == pytest.approx(plain.peak_bytes - plain.breakdown["optimizer"], rel=0.01)
    assert both.breakdown["optimizer"] == 0 and both.peak_bytes < min(activations.peak_bytes, optimizer.peak_bytes)
    assert both.host_bytes == pytest.approx(activations.host_bytes + optimizer.host_bytes, rel=0.01)


def test_the_saving_holds_with_the_cuda_branch_run() -> None:
    """CUDA made to look initialised: the same saving, and no CUDA call under the dry run's modes."""
    with cuda_watched() as recorder:
        trials = _estimates(tiny_llama(), LLAMA_BATCH, ("optimizer",))
    assert not recorder.violations, "\n".join(recorder.violations[:3])
    assert trials["optimizer"].breakdown["optimizer"] == 0
    plain = trials["none"]
    assert trials["optimizer"].peak_bytes == pytest.approx(plain.peak_bytes - plain.breakdown["optimizer"], rel=0.01)


def test_a_cpu_estimate_moves_nothing() -> None:
    trials = {offload: memlab.estimate(tiny_llama(), LLAMA_BATCH, Plan(offload=offload), device="cpu")
              for offload in ("none", "all")}
    assert trials["all"].peak_bytes == trials["none"].peak_bytes and trials["all"].host_bytes == 0
    assert OFFLOAD_ESTIMATED not in trials["all"].notes


def test_on_fake_cuda_tensors_the_host_copies_are_not_the_gpus() -> None:
    """The kernels=cuda dry run (a machine with CUDA), at its tracker: a saved tensor packed to a fake CPU copy is not
    the GPU's, its copy back is; the offloaded optimizer's fp32 copies are host ones. (A whole fake-CUDA step cannot
    run on a CPU build of torch: its autograd aborts the process on a CUDA tensor that requires grad.)"""
    with cuda_watched(available=True), FakeMode():
        weight = torch.nn.Parameter(torch.empty(64, 64, device="cuda:0"), requires_grad=False)
        saved = torch.empty(128, 64, device="cuda:0")
        tracker = MemoryTracker(device="cuda:0", baseline={"params": [weight], "activations": [saved]})
        hooks = counted_save_on_cpu(ledger := HostLedger(), move=True, pinned=True)
        with tracker:
            packed = hooks.pack_hook(saved)
            before = tracker.live_bytes
            unpacked = hooks.unpack_hook(packed)
            after = tracker.live_bytes
            optimizer = OffloadedOptimizer([weight], lambda parameters: torch.optim.AdamW(parameters))
            built = tracker.live_bytes
    assert ledger.held == 128 * 64 * 4 and before == 64 * 64 * 4 + 128 * 64 * 4  # the copy is not the GPU's
    assert unpacked.device.type == "cuda" and after == before + 128 * 64 * 4  # the copy back is
    assert built == after and all(HOST.holds(p.untyped_storage()) for p in optimizer.cpu_parameters)


def test_fit_picks_the_offload_plan_where_only_it_fits() -> None:
    """A model on the meta device is fitted for CUDA; with a budget between the plain plan's estimate and the
    offloaded optimizer's, the dry run picks the offload."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    batch = {"input_ids": torch.randint(0, 512, (2, 64)), "labels": torch.randint(0, 512, (2, 64))}
    plain = memlab.estimate(model, batch, Plan())
    offloaded = memlab.estimate(model, batch, Plan(offload="optimizer"))
    assert offloaded.verdict_bytes < plain.verdict_bytes
    budget = (plain.verdict_bytes + offloaded.verdict_bytes) // 2
    space = {"offload": ["none", "optimizer"], "optimizer": ["adamw"], "precision": ["fp32"], "checkpointing": [False]}
    report = memlab.fit(model, batch, budget=budget, dry_run=True, space=space, progress=False)
    assert report.best is not None and report.best.plan.offload == "optimizer"
    assert not next(trial for trial in report if trial.plan == Plan()).fits


def test_a_sharded_estimate_composed_from_one_gpu_moves_the_activations_to_the_host() -> None:
    """Adapters shard by composition from the one-GPU dry run: its saved activations leave each GPU, and each GPU's
    host_bytes holds them (with the optimizer's offload, beside its state's)."""
    batch = {"input_ids": (4, 64), "labels": (4, 64)}
    lora = Plan(adapter="lora", lora_rank=4)
    plain, moved, both = (memlab.estimate(tiny_llama(), batch, lora.replace(offload=offload), device="cuda", gpus=2,
                                          strategy="zero3") for offload in ("none", "activations", "all"))
    one_gpu = memlab.estimate(tiny_llama(), batch, lora.replace(offload="activations"), device="cuda")
    assert moved.breakdown["activations"] < plain.breakdown["activations"] and moved.peak_bytes < plain.peak_bytes
    assert plain.host_bytes == 0 and moved.host_bytes == one_gpu.host_bytes > 0
    assert both.host_bytes > moved.host_bytes
