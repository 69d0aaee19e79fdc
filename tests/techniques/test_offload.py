"""The offload lever (memlab.techniques.offload): host bytes, the GPU side of its estimate, and the trainers' flags.

Host bytes of the levers that keep memory on the host (DESIGN.md 2.4, issue 60): estimated from what the dry
run's offload would keep, counted live by the offload itself and checked against the process's RSS growth, judged
against host_budget= in the API and the CLI.

The GPU side of an offload plan in a CUDA estimate made on fake tensors (issue 60): what the offload moves to the
host is not in the GPU's bytes, in the dry run on the CPU's kernels (a machine without CUDA, where the device and the
host are the same fake CPU) and with CUDA's branch made to run (``cuda_watched``); what it keeps on the host is
counted as before; ``fit``'s dry run picks an offload plan where only it fits.

issue 60, the user's activation-offloading flags: transformers' ``gradient_checkpointing_kwargs={"offload": True}``
(``activation_checkpointing_kwargs`` in 5.x) and TRL's ``activation_offloading=True`` read as memlab's
``offload="activations"``, measured and estimated as the trainer runs, and exported back to those flags.

On this CPU-only machine neither flag can train: transformers' offload asks for pinned memory ("pin_memory=True
requires a CUDA or other accelerator backend") and TRL's ``OffloadActivations`` reads
``torch.accelerator.current_accelerator().type``, which is None here, as the SFTTrainer is built. The TRL trainers
below are built with TRL's context manager stood in by a no-op (the config keeps ``activation_offloading=True``, as
the user wrote it); on a CPU offload moves nothing, and memlab's trial says so. A CUDA estimate of the same
trainers keeps the trainer's plan and says that memlab's estimate does not model offload on fake tensors. Tiny
Llamas."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from models import mlp_batch, mlp_loss, tiny_llama, tiny_mlp

import memlab
from memlab import Plan
from memlab.estimation.dryrun.fake import FakeMode
from memlab.live.host import HOST
from memlab.measure.tracker import MemoryTracker
from memlab.techniques.core.technique import HostLedger
from memlab.techniques.offload import (
    NOTHING_TO_MOVE,
    OFFLOAD_ESTIMATED,
    OffloadedOptimizer,
    counted_save_on_cpu,
    tensors_host_bytes,
)

pytest.importorskip("trl")
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from test_dpo import preferences  # noqa: E402
from test_trainer_contract import arguments, llama, pad, rows, tokenizer  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _optimizer_host_bytes(model: torch.nn.Module, pinned: bool) -> int:
    """What a live OffloadedOptimizer keeps on the host after its first step, blocks pinned as on a GPU machine."""
    model(torch.randint(0, 128, (2, 16))).logits.sum().backward()
    optimizer = OffloadedOptimizer([p for p in model.parameters() if p.requires_grad],
                                   lambda ps: torch.optim.AdamW(ps, lr=1e-5))
    optimizer.step()
    state = [v for values in optimizer.inner.state.values() for v in values.values() if isinstance(v, torch.Tensor)]
    copies = [*optimizer.cpu_parameters, *(p.grad for p in optimizer.cpu_parameters)]
    return tensors_host_bytes(copies, pinned) + tensors_host_bytes(state, pinned=False)


def test_the_estimate_counts_what_the_offloaded_optimizer_keeps_on_the_host() -> None:
    batch = {"input_ids": (2, 16), "labels": (2, 16)}
    estimated = memlab.estimate(tiny_llama(), batch, Plan(offload="optimizer"), device="cuda")
    assert estimated.status == "ok", estimated.error
    assert estimated.host_bytes == _optimizer_host_bytes(tiny_llama(), pinned=True)
    assert memlab.estimate(tiny_llama(), batch, Plan(), device="cuda").host_bytes == 0
    both = memlab.estimate(tiny_llama(), batch, Plan(offload="all"), device="cuda")
    assert both.host_bytes > estimated.host_bytes  # the saved activations on top of the optimizer's copies


def test_the_estimate_counts_the_saved_activations_a_live_step_moves() -> None:
    model, batch = tiny_mlp(blocks=4, width=256), mlp_batch(rows=512, width=256)
    estimated = memlab.estimate(model, batch, Plan(offload="activations"), loss_fn=mlp_loss, device="cuda")
    ledger = HostLedger()
    with counted_save_on_cpu(ledger, move=False, pinned=True):
        loss = mlp_loss(model, batch)
    loss.backward()
    assert ledger.held == 0 and ledger.held_peak > 0
    assert estimated.host_bytes == ledger.held_peak
    checkpointed = memlab.estimate(model, batch, Plan(offload="activations", checkpointing=True), loss_fn=mlp_loss,
                                   device="cuda")
    assert 0 < checkpointed.host_bytes < estimated.host_bytes  # only the blocks' inputs are saved, then moved


def test_a_paged_optimizer_counts_its_state_as_its_possible_spill() -> None:
    batch = {"input_ids": (2, 16), "labels": (2, 16)}
    paged = memlab.estimate(tiny_llama(), batch, Plan(optimizer="paged_adamw8bit"), device="cuda")
    unpaged = memlab.estimate(tiny_llama(), batch, Plan(optimizer="adamw8bit"), device="cuda")
    assert paged.status == unpaged.status == "ok"
    assert unpaged.host_bytes == 0 and paged.host_bytes > 0
    assert paged.host_bytes <= paged.breakdown["optimizer"]


def test_a_paged_state_computed_from_its_size_is_its_spill_too(monkeypatch: pytest.MonkeyPatch) -> None:
    import bitsandbytes

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("bitsandbytes cannot run on fake tensors here")

    monkeypatch.setattr(bitsandbytes.optim.AdamW8bit, "step", refuse)  # PagedAdamW8bit is built the same way
    batch = {"input_ids": (2, 16), "labels": (2, 16)}
    paged = memlab.estimate(tiny_llama(), batch, Plan(optimizer="paged_adamw8bit"), device="cuda")
    assert paged.status == "ok" and any("computed from its known size" in note for note in paged.notes)
    assert paged.host_bytes == paged.breakdown["optimizer"] > 0


def test_estimate_judges_the_host_budget_beside_the_card_budget() -> None:
    batch = {"input_ids": (2, 16), "labels": (2, 16)}
    over = memlab.estimate(tiny_llama(), batch, Plan(offload="optimizer"), device="cuda", budget="80GiB",
                           host_budget="64KiB")
    assert over.host_budget == 64 * 1024 and not over.fits and over.verdict_figure == "host"
    assert "does not fit (host)" in over.to_text()
    within = memlab.estimate(tiny_llama(), batch, Plan(offload="optimizer"), device="cuda", budget="80GiB",
                             host_budget="1GiB")
    assert within.fits and within.verdict_figure == "card"
    with pytest.raises(memlab.MemlabError, match="host_budget 'lots'"):
        memlab.estimate(tiny_llama(), batch, Plan(), host_budget="lots")


def test_a_live_cpu_trial_moves_nothing_and_is_judged_against_the_available_memory() -> None:
    model = tiny_mlp()
    trial = memlab.measure(model, mlp_batch(), Plan(offload="all"), loss_fn=mlp_loss, steps=1, progress=False)
    assert trial.status == "ok" and trial.host_bytes == 0 and NOTHING_TO_MOVE in trial.notes
    assert trial.host_budget is not None and trial.host_budget > 2**20  # what psutil says the machine has free
    tight = memlab.measure(model, mlp_batch(), Plan(), loss_fn=mlp_loss, steps=1, progress=False, host_budget="1KiB")
    assert tight.host_budget == 1024 and tight.fits
    report = memlab.compare(model, mlp_batch(), [Plan(), Plan(offload="all")], loss_fn=mlp_loss, steps=1,
                            progress=False, host_budget="2GiB")
    assert [t.host_budget for t in report] == [2 * 2**30] * 2


@pytest.mark.slow
def test_limits_stops_where_the_host_budget_is_missed() -> None:
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                         vocab_size=256, max_position_embeddings=4096)
    plan = Plan(offload="activations")
    at_512 = memlab.estimate(config, {"input_ids": (1, 512), "labels": (1, 512)}, plan, device="cuda").host_bytes
    batch = {"input_ids": (1, 64), "labels": (1, 64)}
    card_only = memlab.limits(config, plan, budget="80GiB", batch=batch, device="cuda")
    tight = memlab.limits(config, plan, budget="80GiB", batch=batch, device="cuda", host_budget=at_512)
    assert card_only.value == 4096 and tight.value is not None and 64 <= tight.value < 4096
    assert tight.next is not None and tight.next > tight.value


def _estimate_cli(folder: Path, *args: str) -> tuple[int, str]:
    """``memlab estimate`` on a tiny Llama's config saved in ``folder``, with ``args``: its exit status and output."""
    from memlab.frontends.cli.main import main

    config = tiny_llama().config
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(folder)
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "stdout", out)
        patch.setattr(sys, "stderr", io.StringIO())
        status = main(["estimate", str(folder), "--batch", "2x16", *args])
    return status, out.getvalue()


def test_the_cli_says_does_not_fit_host_and_carries_both_in_json(tmp_path: Path) -> None:
    args = ["--try", "offload=none,optimizer", "--budget", "80GiB", "--host-budget", "256KiB"]
    status, text = _estimate_cli(tmp_path, *args)
    assert status == 0, text  # the plain plan fits both (its load stages the tiny model's 113 KiB on the host)
    # the host column's unit in its header, or said once above a table too wide for it in every header
    assert "does not fit (host)" in text and ("host MiB" in text.replace("host KiB", "host MiB")
                                              or "Memory in MiB:" in text.replace("in KiB:", "in MiB:"))
    rows = json.loads(_estimate_cli(tmp_path, *args, "--json")[1])["trials"]
    assert [row["verdict"] for row in rows] == ["ok (estimate)", "does not fit (host)"]
    assert rows[1]["host_bytes"] > 256 * 1024 and rows[1]["host_budget"] == 256 * 1024


def test_the_cli_with_only_a_host_budget_says_why_a_plan_misses_it(tmp_path: Path) -> None:
    status, text = _estimate_cli(tmp_path, "--try", "offload=optimizer", "--host-budget", "64KiB")
    text = " ".join(text.split())
    assert status == 1, text
    assert "Verdict: offload-optimizer does not fit: offload-optimizer fits the device but needs" in text
    assert "over the host budget of 64.0 KiB" in text and "Host budget: 64.0 KiB" in text


def test_a_sharded_estimate_shares_the_node_host_budget_among_its_ranks(tmp_path: Path) -> None:
    status, text = _estimate_cli(tmp_path, "--gpus", "16", "--strategy", "zero2", "--try", "offload=none,optimizer",
                                 "--budget", "80GiB", "--host-budget", "64KiB")
    assert status == 0, text
    rows = [line for line in text.splitlines() if line.lstrip().startswith(("plain", "offload-optimizer"))]
    assert rows[0].endswith("fits (allocated peak) [1]") and rows[1].endswith("does not fit (host)"), text
    assert "1. ZeRO-2 is judged on its allocated peak: ZeRO's figures come from DeepSpeed's formulas" in text
    assert "per GPU" in text and "per node of 8 GPUs" in text


@pytest.mark.slow
def test_the_offload_accounting_matches_the_process_rss_growth() -> None:
    """The levers' own count of their host copies against RSS growth, each case in a fresh process (within 10%)."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.host_rss", "--smoke"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("counted off by") == 2


from test_dryrun_no_cuda import cuda_watched  # noqa: E402

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


FAST: dict[str, Any] = {"steps": 1, "warmup": 0, "noise": 0, "progress": False}


@pytest.fixture
def trl_offload_stood_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """TRL's activation-offloading context cannot be made without an accelerator: a no-op in its place, so that an
    SFTTrainer/DPOTrainer with ``activation_offloading=True`` can be built on this CPU."""
    for module in (trl.trainer.sft_trainer, trl.trainer.dpo_trainer):
        monkeypatch.setattr(module, "get_act_offloading_ctx_manager", lambda model, **_: StoodIn())


class StoodIn(contextlib.AbstractContextManager):
    """TRL's offloading context as a CPU-only machine could have it: nothing to move."""

    def __exit__(self, *exc: object) -> None:
        return None


def hf_trainer(tmp_path: Any, offload: bool = True, **settings: Any) -> Trainer:
    args = arguments(tmp_path, gradient_checkpointing=True, gradient_checkpointing_kwargs={"offload": offload},
                     **settings)
    return Trainer(model=llama(), args=args, train_dataset=Dataset.from_list(rows()), data_collator=pad)


def sft_trainer(tmp_path: Any, **settings: Any) -> trl.SFTTrainer:
    settings = {"gradient_checkpointing": False, "bf16": False, "per_device_train_batch_size": 2, **settings}
    config = trl.SFTConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no", max_steps=1,
                           disable_tqdm=True, **settings)
    return trl.SFTTrainer(model=llama(), args=config, train_dataset=Dataset.from_list(rows()),
                          processing_class=tokenizer())


def test_trl_configs_with_activation_offloading_read_as_offloaded_activations(tmp_path: Any) -> None:
    for config in (trl.SFTConfig, trl.DPOConfig):
        common = dict(output_dir=str(tmp_path), report_to=[], use_cpu=True, per_device_train_batch_size=2,
                      activation_offloading=True)
        alone = config(**common, gradient_checkpointing=False, bf16=False)
        assert Plan.from_training_arguments(alone) == Plan(micro_batch=2, offload="activations"), config.__name__
        # TRL's defaults (SFTConfig: checkpointing on, bf16) with the flag
        defaults = Plan.from_training_arguments(config(**common))
        assert defaults.offload == "activations", config.__name__
        off = Plan.from_training_arguments(config(**{**common, "activation_offloading": False}))
        assert defaults == off.replace(offload="activations"), config.__name__


@pytest.mark.parametrize("setup", ["trainer", "sft"])
def test_offloading_trainers_measured_and_estimated_as_set_up(tmp_path: Any, setup: str,
                                                              trl_offload_stood_in: None) -> None:
    """The must-show: the trainer as set up (plan=None) measured and estimated within 5%, offloaded."""
    if setup == "trainer":
        trainer: Any = hf_trainer(tmp_path)
        expected = Plan(micro_batch=2, checkpointing=True, offload="activations")
    else:
        trainer = sft_trainer(tmp_path, activation_offloading=True)
        expected = Plan(micro_batch=2, offload="activations")
    assert Plan.from_trainer(trainer) == expected
    measured = memlab.measure(trainer, **FAST)
    assert measured.status == "ok", measured.error
    assert measured.plan == expected and NOTHING_TO_MOVE in measured.notes
    estimated = memlab.estimate(trainer)
    assert estimated.status == "ok" and estimated.plan == expected
    assert abs(estimated.peak_bytes - measured.peak_bytes) <= 0.05 * measured.peak_bytes
    # A CUDA estimate keeps the plan the trainer runs, and says how its offload's host side is modelled.
    gpu = memlab.estimate(trainer, device="cuda")
    assert gpu.status == "ok" and gpu.plan == expected
    assert OFFLOAD_ESTIMATED in gpu.notes


def test_dpo_trainer_with_activation_offloading_is_read(tmp_path: Any, trl_offload_stood_in: None) -> None:
    config = trl.DPOConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no", max_steps=1,
                           per_device_train_batch_size=2, disable_tqdm=True, activation_offloading=True, bf16=False)
    trainer = trl.DPOTrainer(model=llama(), ref_model=llama(), args=config, train_dataset=preferences(),
                             processing_class=tokenizer())
    # DPOConfig checkpoints by default; the flag adds the offload
    assert Plan.from_trainer(trainer) == Plan(micro_batch=2, checkpointing=True, offload="activations")


@pytest.mark.parametrize("plan", [Plan(micro_batch=2, offload="activations"),
                                  Plan(micro_batch=2, checkpointing=True, offload="activations"),
                                  Plan(micro_batch=1, accumulation=2, precision="bf16", offload="activations")],
                         ids=lambda plan: plan.label())
def test_activation_offload_plans_round_trip_through_a_trl_config(tmp_path: Any, plan: Plan,
                                                                 trl_offload_stood_in: None) -> None:
    kwargs = plan.to_training_arguments(trl=True)
    assert kwargs["activation_offloading"] is True
    assert "offload" not in (kwargs.get("activation_checkpointing_kwargs") or {})  # TRL's flag carries it alone
    trainer = sft_trainer(tmp_path, **kwargs)
    assert Plan.from_trainer(trainer) == plan
    # Without trl=True the Trainer's own form: offload only under checkpointing, refused without it.
    if plan.checkpointing:
        hf = plan.to_training_arguments()
        # transformers 5.24 spells it activation_checkpointing_kwargs; 5.17 (the floor) gradient_checkpointing_kwargs
        spelled = [key for key in ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs") if key in hf]
        assert len(spelled) == 1 and hf[spelled[0]]["offload"] is True and "activation_offloading" not in hf
        args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, **hf)
        trained = Trainer(model=llama(), args=args, train_dataset=Dataset.from_list(rows()), data_collator=pad)
        assert Plan.from_trainer(trained) == plan
    else:
        with pytest.raises(memlab.MemlabError, match="without checkpointing"):
            plan.to_training_arguments()


def test_a_plan_without_activation_offload_switches_the_trl_flag_off() -> None:
    assert Plan(micro_batch=2).to_training_arguments(trl=True)["activation_offloading"] is False
    kwargs = Plan(micro_batch=2, checkpointing=True, offload="all").to_training_arguments(trl=True)
    assert kwargs["activation_offloading"] is True and "deepspeed" in kwargs  # the optimizer through ZeRO offload


def test_apply_switches_a_trl_trainers_offloading_and_undo_puts_it_back(tmp_path: Any,
                                                                         trl_offload_stood_in: None) -> None:
    """memlab.apply on an SFTTrainer: a plan without activation offload turns TRL's flag (and the context TRL
    enters around each training step) off; one with it turns them on, without checkpointing too (TRL's form)."""
    offloading = sft_trainer(tmp_path, activation_offloading=True)
    args, context = offloading.args, offloading.maybe_activation_offload_context
    plain = Plan(micro_batch=2)
    with memlab.apply(offloading, plain):
        assert offloading.args.activation_offloading is False
        assert isinstance(offloading.maybe_activation_offload_context, contextlib.nullcontext)
        assert Plan.from_trainer(offloading) == plain
    assert offloading.args is args and offloading.maybe_activation_offload_context is context
    other = sft_trainer(tmp_path / "other")
    offloaded = Plan(micro_batch=1, accumulation=2, offload="activations")
    with memlab.apply(other, offloaded):
        assert other.args.activation_offloading is True and Plan.from_trainer(other) == offloaded
        other.train()  # on this CPU TRL's context cannot be made: offload moves nothing, the step trains
    assert other.args.activation_offloading is False and Plan.from_trainer(other) == Plan(micro_batch=2)


def test_offload_on_cpu_moves_nothing_and_says_so():
    model, batch = tiny_mlp(), mlp_batch()
    with memlab.apply(model, memlab.Plan(offload="all"), loss_fn=mlp_loss) as applied:
        assert isinstance(applied.optimizer, torch.optim.AdamW)
        applied.step(batch)
    assert any("moves nothing" in note for note in applied.notes)


def test_offloaded_optimizer_updates_like_the_plain_one():
    from memlab.techniques.offload import OffloadedOptimizer

    model, batch = tiny_mlp(), mlp_batch()
    twin = copy.deepcopy(model)
    plain = torch.optim.AdamW(model.parameters(), lr=1e-2)
    offloaded = OffloadedOptimizer(list(twin.parameters()), lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    for net, optimizer in ((model, plain), (twin, offloaded)):
        for _ in range(3):
            mlp_loss(net, batch).backward()
            optimizer.step()
            optimizer.zero_grad()
    for a, b in zip(model.parameters(), twin.parameters(), strict=False):
        assert torch.allclose(a, b, atol=1e-6)
