"""Host bytes of the levers that keep memory on the host (DESIGN.md 2.4, issue 60): estimated from what the dry
run's offload would keep, counted live by the offload itself and checked against the process's RSS growth, judged
against host_budget= in the API and the CLI."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import memlab
from memlab import Plan
from memlab.techniques.core.technique import HostLedger
from memlab.techniques.offload import (
    NOTHING_TO_MOVE,
    OffloadedOptimizer,
    counted_save_on_cpu,
    tensors_host_bytes,
)
from tests.models import mlp_batch, mlp_loss, tiny_llama, tiny_mlp

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
    from memlab.frontends.cli import main

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


def test_the_offload_accounting_matches_the_process_rss_growth() -> None:
    """The levers' own count of their host copies against RSS growth, each case in a fresh process (within 10%)."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.host_rss", "--smoke"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("counted off by") == 2
