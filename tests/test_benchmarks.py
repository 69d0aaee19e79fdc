"""The benchmark runners end to end at their hidden ``--smoke`` size: they run and write valid JSON (and HTML)
that names the device and the versions. Nothing here asserts on timings."""

from __future__ import annotations

import importlib
import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

# Each benchmark run end to end at its smoke size, several in processes of their own: minutes on a small CPU, so
# they run in the `e2e or slow` stage (`python -m pytest -m "e2e or slow"`, after the README's command in .ci/run).
pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def load(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Import a runner from ``benchmarks/`` (the repository root on ``sys.path`` for the test only); the logging
    settings that the runners quieten are put back afterwards."""
    from transformers.utils import logging as hf_logging

    monkeypatch.syspath_prepend(str(ROOT))
    verbosity = hf_logging.get_verbosity()
    progress = hf_logging.is_progress_bar_enabled()
    levels = {name: logging.getLogger(name).level for name in ("transformers", "accelerate", "bitsandbytes")}

    def loader(name: str) -> ModuleType:
        return importlib.import_module(f"benchmarks.{name}")

    yield loader
    hf_logging.set_verbosity(verbosity)
    if progress:
        hf_logging.enable_progress_bar()
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def check_result(path: Path, name: str) -> dict[str, Any]:
    """The JSON file is valid, strict JSON (no NaN) with the header every result has."""
    assert path.exists(), path
    data = json.loads(path.read_text(), parse_constant=lambda token: pytest.fail(f"{token} in {path}"))
    assert data["benchmark"] == name
    assert data["size"] == "smoke"
    assert data["date"]
    device = data["device"]
    assert device["type"] == "cpu"
    assert device["cpu"] and device["cpu_cores"] >= 1 and device["torch_threads"] >= 1
    versions = data["versions"]
    for package in ("torch", "transformers", "bitsandbytes", "accelerate", "python"):
        assert versions[package], package
    html = path.with_suffix(".html")
    assert html.exists() and "plotly" in html.read_text()
    return data


def test_overhead(load: Any, tmp_path: Path) -> None:
    result = load("overhead").main(["--smoke", "--device", "cpu", "--out", str(tmp_path)])
    data = check_result(tmp_path / "overhead-cpu-smoke.json", "overhead")
    assert data["ratio"] == pytest.approx(result["ratio"])
    assert data["ratio"] > 0 and math.isfinite(data["ratio"])
    for side in ("memlab", "hand"):
        assert len(data[side]["step_times_s"]) == data["rounds"]
        assert all(len(r) == data["timed_steps_per_round"] for r in data[side]["step_times_s"])
    assert data["goal"] == 0.97


def test_hf_table(load: Any, tmp_path: Path) -> None:
    load("hf_table").main(["--smoke", "--device", "cpu", "--rows", "7,9", "--out", str(tmp_path)])
    data = check_result(tmp_path / "hf_table-cpu-smoke.json", "hf_table")
    rows = {row["row"]: row for row in data["rows"]}
    # On the CPU the seeds' fp16 rows run in bf16: the Trainer would silently train fp16=True in fp32 there.
    assert data["half_precision"] == "bf16"
    adafactor = "bs1 ga4 + ckpt + bf16 + Adafactor"
    assert list(rows) == ["baseline", "bs1 ga4 + ckpt + bf16 + 8-bit Adam", adafactor]
    assert rows["bs1 ga4 + ckpt + bf16 + 8-bit Adam"]["training_arguments"]["bf16"] is True
    for name in ("baseline", "bs1 ga4 + ckpt + bf16 + 8-bit Adam", adafactor):
        for side in ("memlab", "trainer"):
            assert rows[name][side]["status"] == "ok", rows[name][side]
            assert rows[name][side]["peak_bytes"] > 0 and rows[name][side]["samples_per_s"] > 0
        assert rows[name]["throughput_ratio"] > 0
    assert rows["baseline"]["memlab"]["memory_saving"] == 0
    # Adafactor runs through memlab and the Trainer side by side, the same optimizer on both sides.
    assert rows[adafactor]["training_arguments"]["optim"] == "adafactor"
    assert rows[adafactor]["trainer"]["optimizer"] == "Adafactor"
    assert rows[adafactor]["memlab"]["breakdown"]["optimizer"] < rows["baseline"]["memlab"]["breakdown"]["optimizer"]
    assert "| row |" in data["markdown"]


def test_fit_vs_finders(load: Any, tmp_path: Path) -> None:
    load("fit_vs_finders").main(["--smoke", "--device", "cpu", "--activation-fraction", "0.5", "--out", str(tmp_path)])
    data = check_result(tmp_path / "fit_vs_finders-cpu-smoke.json", "fit_vs_finders")
    methods = {m["method"]: m for m in data["methods"]}
    assert set(methods) == {"memlab.fit", "seeds' recipe", "accelerate find_executable_batch_size"}
    for method in methods.values():
        assert method["trials_run"] >= 1 and method["wall_s"] >= 0
        if method["pick"] is not None:
            assert method["pick"]["fits"] and method["pick"]["peak_bytes"] <= data["budget_bytes"]
    assert methods["memlab.fit"]["pick"] is not None


@pytest.mark.parametrize("name", ["restore", "loads", "heldout", "trainer", "peft_model", "encdec", "vlm", "compile",
                                  "cast_reserve", "fp8", "compile_families"])
def test_gpu_acceptance_sections_run_on_the_cpu(load: Any, name: str) -> None:
    # On the CPU the CUDA figures cannot be judged (None); everything else must hold, so that the one GPU run a
    # session may get is not spent on a bug that shows without a GPU. Issue 40's parts (loads, heldout, trainer)
    # and issue 57's (the user's peft model, the encoder-decoders, a VLM) run at their smoke size too, every row of
    # them; the SFTTrainer with peft runs in the one command's smoke run below.
    import torch

    acceptance = load("gpu_acceptance")
    part = acceptance.run_section_here(name, "smoke", torch.device("cpu"))
    assert part["checks"], name
    failed = [c for c in part["checks"] if c["passed"] is False]
    assert not failed, failed
    tables = load("gpu_acceptance_tables")
    if name in tables.RENDERERS:  # the docs' table of the part, drawn from what it wrote
        assert tables.draw_part(name, part), name
    if name == "loads":  # a bf16 and a 4-bit load, each trained with LoRA (dropout 0.05) and run for inference
        rows = {(row["load"], row["workload"]): row for row in part["rows"]}
        assert set(rows) == {(load, work) for load in ("bf16", "nf4") for work in ("train", "infer")}
        assert all(row["status"] == "ok" and row["estimate_status"] == "ok" for row in rows.values()), rows
        assert rows["nf4", "train"]["quantized_layers"] > 0 and "drop0.05" in rows["bf16", "train"]["plan"]
        assert rows["nf4", "infer"]["estimate_plan_fields"]["quantize"] == "nf4"
    if name == "heldout":  # every held-out family, its CPU-made estimate beside the measured peak
        families = {"qwen2", "mistral", "gemma2", "phi3", "gpt_neox", "t5"}
        assert {row["model"] for row in part["rows"]} == families
        assert all(row["estimate_status"] == "ok" and row["measured_status"] == "ok" for row in part["rows"])
    if name == "trainer":  # the plain Trainer, with watch's overhead
        assert part["overhead"]["ratio"] > 0 and part["fit"]["best"] is not None
    if name == "peft_model":  # the user's own peft model: a hand-made step, measure, estimate and fit, each ran
        (row,) = part["rows"]
        assert row["measured"]["status"] == "ok" and row["estimated"]["status"] == "ok", row
        assert part["fit"]["best"] is not None and part["broken_at"] is None and not part["tracebacks"]
        assert any("bit-identical" in c["check"] and c["passed"] for c in part["checks"])
    if name == "compile":  # issue 69: the compiled step estimated as compiled, for the GPU, with no GPU
        assert set(part["estimates"]) >= {"eager", "compiled"} and part["estimates"]["cuda_available"] is False
        assert part["estimates"]["compiled"]["peak_bytes"] < part["estimates"]["eager"]["peak_bytes"]
    if name in ("encdec", "vlm"):  # each row measured, estimated and stepped by hand (its peak a CUDA figure)
        assert part["rows"] and all(row["estimate_status"] == "ok" and row["measured_status"] == "ok"
                                    and "hand_made_bytes" in row for row in part["rows"]), part["rows"]
        if name == "encdec":
            assert {row["model"] for row in part["rows"]} == {"t5", "bart"}
            assert "bf16-weights" in {row["plan"] for row in part["rows"]}  # the model cast and cast back
    if name == "cast_reserve":  # issue 86: built in fp32, cast, trained; estimated after an fp32 load
        assert {row["model"] for row in part["rows"]} == {"qwen2", "t5"}
        assert all(row["program"]["status"] == "ok" and row["estimate"]["status"] == "ok" for row in part["rows"])
    if name == "fp8":  # issue 86: pure bf16 and float8; on the CPU float8 cannot run, and a live trial says so
        rows = {row["row"]: row for row in part["rows"]}
        assert list(rows) == ["pure bf16", "pure bf16 + fp8", "pure bf16 + fp8 + checkpointing"]
        assert rows["pure bf16"]["loop"]["status"] == "ok" and rows["pure bf16"]["estimate"]["status"] == "ok"
        assert rows["pure bf16 + fp8"]["loop"]["status"] == "skipped" and "CUDA" in part["float8"]
        assert part["measured"]["status"] == "error" and "fp8" in part["measured"]["error"]
    if name == "compile_families":  # issue 86: two more families' compiled steps estimated as compiled
        assert set(part["families"]) == {"llama", "gpt2"} and part["cuda_available"] is False
        for family in part["families"].values():
            assert {family["estimates"][variant]["status"] for variant in ("eager", "compiled")} == {"ok"}


def test_gpu_acceptance_rl_part_estimates_each_trl_trainer_on_the_gpu_and_as_on_a_laptop(load: Any) -> None:
    # The rl part at its smoke size on the CPU: TRL's DPO (a reference model; LoRA) and GRPO (beta 0.04; LoRA)
    # trainers, each estimated for an H100 in this process and in a fresh one that sees no GPU and no Triton, the
    # laptop's trainer built by the same function: both dry runs of one trainer must agree within 2%.
    import torch

    acceptance = load("gpu_acceptance")
    assert "rl" in acceptance.ORDER and "rl" in acceptance.LIMITS
    part = acceptance.run_section_here("rl", "smoke", torch.device("cpu"))
    failed = [c for c in part["checks"] if c["passed"] is False]
    assert not failed, (failed, part.get("traceback"))
    assert part["broken_at"] is None and not part["tracebacks"]
    assert part["laptop"]["cuda_available"] is False and part["laptop"]["triton_hidden"] is True
    assert list(part["trainers"]) == ["dpo_ref", "dpo_lora", "grpo", "grpo_lora"]
    for name, row in part["trainers"].items():
        for made in ("gpu_made", "laptop_made"):
            assert row[made]["status"] == "ok" and row[made]["peak_bytes"] > 0, (name, made, row[made])
        assert row["train_peak_bytes"] is None  # a CUDA figure: not read on the CPU
        agree = [c for c in part["checks"] if c["check"].startswith(f"{name}: the laptop-made estimate")]
        assert len(agree) == 1 and agree[0]["passed"] is True, agree
        unjudged = [c for c in part["checks"] if c["check"].startswith(f"{name}: memlab.estimate(trainer) made")]
        assert len(unjudged) == 1 and unjudged[0]["passed"] is None and unjudged[0]["why"], unjudged
    # A reference model held apart costs more than the base with its adapters off.
    trainers = part["trainers"]
    assert trainers["dpo_ref"]["gpu_made"]["peak_bytes"] > trainers["dpo_lora"]["gpu_made"]["peak_bytes"]
    # On a GPU each trainer runs in a process of its own (one process measured each train() with what the trainers
    # before it left allocated): the wrapper answers the same estimate from a fresh process.
    fresh = load("gpu_common").in_fresh_process("benchmarks.gpu_sections_rl:one_trainer_here",
                                                {"name": "dpo_lora", "size": "smoke", "device": "cpu"}, 300)
    assert fresh["status"] == "ok", fresh.get("error")
    assert fresh["gpu_made"]["peak_bytes"] == trainers["dpo_lora"]["gpu_made"]["peak_bytes"]
    assert fresh["held_besides_models_bytes"] is None and [c["passed"] for c in fresh["checks"]] == []
    # The docs' table of the part: a row each, the laptop's estimate over the GPU's (1.0 on one machine).
    table = load("gpu_acceptance_tables").draw_part("rl", part)
    assert table[0].startswith("**TRL's DPO and GRPO trainers**"), table
    body = [line for line in table[2].splitlines() if line.startswith("| ") and "trainer" not in line]
    assert [line.split("|")[1].strip() for line in body] == list(trainers), table


@pytest.mark.parametrize(("name", "trainers", "meta"), [("grpo_1024", ["grpo", "grpo_lora"], False),
                                                        ("grpo_8b", ["grpo_lora"], True)])
def test_gpu_acceptance_grpo_parts_estimate_on_the_gpu_and_as_on_a_laptop(load: Any, name: str, trainers: list[str],
                                                                          meta: bool) -> None:
    # Issue 86's GRPO parts at their smoke size on the CPU: the rl part's machinery on another setup; the 8B's laptop
    # asks of a policy on the meta device (memlab.trainer_on_meta), as a user without the card must.
    import torch

    part = load("gpu_acceptance").run_section_here(name, "smoke", torch.device("cpu"))
    failed = [c for c in part["checks"] if c["passed"] is False]
    assert not failed, (failed, part.get("traceback"))
    assert part["setup"] == name and list(part["trainers"]) == trainers
    assert part["laptop"]["meta"] is meta and part["laptop"]["cuda_available"] is False
    assert part["settings"]["tolerance"] == 0.02
    for row in part["trainers"].values():
        assert row["gpu_made"]["status"] == "ok" and row["laptop_made"]["status"] == "ok", row
    assert load("gpu_acceptance_tables").draw_part(name, part)[0].startswith("**")


def test_gpu_acceptance_is_one_command_whose_parts_run_in_order_within_its_deadline(load: Any, tmp_path: Path) -> None:
    # The GPU run's very command at the smoke size: the parts in the queue's order (stale first: what failed on a GPU
    # and changed since, then what never ran there; tests/gpu/test_gpu_acceptance_order.py), each in its own process,
    # until the smoke deadline (60 s); the JSON names every part, those not reached as not started, a part another
    # issue provides and this checkout lacks as unavailable, and records the commit and each part's code digest. A
    # part cut at the deadline on a busy machine keeps the checks it printed; no check may fail but that cut.
    import os
    import subprocess
    import sys
    import time

    gpu_acceptance = load("gpu_acceptance")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_acceptance", "--smoke", "--device", "cpu", "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    seconds = time.perf_counter() - started
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads((tmp_path / "gpu_acceptance-cpu-smoke.json").read_text())
    assert data["benchmark"] == "gpu_acceptance" and data["size"] == "smoke" and data["deadline_s"] == 60
    queued = [place["part"] for place in data["queue"]]
    assert sorted(queued) == sorted(gpu_acceptance.ORDER) and tuple(data["parts"]) == tuple(queued)
    assert [place["tier"] for place in data["queue"]] == sorted(place["tier"] for place in data["queue"])
    assert "the queue:" in done.stdout and data["commit"] and data["commit_from"] == "git"
    failed = [c for c in (c for part in data["parts"].values() for c in part["checks"]) if c["passed"] is False]
    assert all(c["check"].endswith("ran to the end") and "stopped at its limit" in c["error"] for c in failed), failed
    ran = [name for name, part in data["parts"].items() if not part.get("not_started") and not part.get("unavailable")]
    reached = [name for name in queued if not data["parts"][name].get("unavailable")]
    assert ran and ran == reached[:len(ran)]  # the parts reached are the first ones of the queue
    assert data["summary"]["not_started"] == reached[len(ran):]
    for name in ran:  # what the next run's queue compares
        assert data["parts"][name]["commit"] == data["commit"] and data["parts"][name]["code_digest"], name
        assert data["parts"][name]["queued"]["part"] == name
    assert data["wheels"] == []  # the smoke size installs nothing
    assert seconds < data["deadline_s"] + 40, seconds  # its start, the last part's end and the JSON after the deadline


def test_the_gpu_parts_import_no_plotly(load: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The GPU image has no plotly: watch's figure is imported only where a figure is drawn (the H200 run's trainer
    # part failed at that import before it reached the SFTTrainer).
    import sys

    import torch

    overhead = load("watch_overhead")
    trainer = overhead.make_trainer(overhead.SIZES["smoke"], torch.device("cpu"), str(tmp_path))
    monkeypatch.setitem(sys.modules, "plotly", None)
    monkeypatch.delitem(sys.modules, "memlab.frontends.jupyter.watch_figure", raising=False)
    times, drawn = overhead.timed_train(trainer, 0, watch=True)
    assert times and drawn == 0
    with pytest.raises(ImportError):
        overhead.timed_train(trainer, 0, watch=True, figure=True)


def test_cumulative(load: Any, tmp_path: Path) -> None:
    result = load("cumulative").main(["--smoke", "--device", "cpu", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "cumulative-cpu-smoke.json").read_text())
    assert data["benchmark"] == "cumulative" and data["markdown"] == result["markdown"]
    steps = [row["step"] for row in data["rows"]]
    assert steps[0] == "fp32 AdamW (baseline)" and any("QLoRA" in step for step in steps)
    assert all(row["status"] == "ok" for row in data["rows"]), [row["error"] for row in data["rows"]]


def test_stability_counts_agreeing_runs_and_one_search_answers(load: Any) -> None:
    stability = load("stability")
    runs = [{"best": "ckpt", "ties": ["mb2x4"], "seconds": 2.0}, {"best": "mb2x4", "ties": ["ckpt"], "seconds": 4.0},
            {"best": "mb2x4", "ties": [], "seconds": 3.0}]
    summary = stability.summary(runs)
    assert summary["distinct_winners"] == 2 and summary["pairs"] == 3
    assert summary["agreeing_pairs"] == 2  # 1-2 and 2-3; run 3 named ckpt neither best nor tied, so not 1-3
    assert summary["contradicting_pairs"] == 0  # but run 1 named run 3's winner as tied
    answer = stability.one_run(threads=1, noise=0)  # the search's code; its timing is the benchmark's business
    assert answer["best"] is not None and answer["trials"] >= 2 and answer["timed_steps"] >= answer["ran"] >= 1


def test_watch_overhead(load: Any, tmp_path: Path) -> None:
    result = load("watch_overhead").main(["--smoke", "--device", "cpu", "--out", str(tmp_path), "--threads", "1"])
    data = check_result(tmp_path / "watch_overhead-cpu-smoke.json", "watch_overhead")
    assert set(data["ratio"]) == {"watch", "watch_allocator_style"} and data["ratio"] == result["ratio"]
    assert all(ratio > 0 and math.isfinite(ratio) for ratio in data["ratio"].values())
    assert data["sides"]["watch"]["figure_redraws_per_round"] == [data["steps_per_round"]]  # logging_steps=1
    assert data["sides"]["plain"]["figure_redraws_per_round"] == [0]


def test_cuda_truth_estimates(load: Any, tmp_path: Path) -> None:
    runner = load("cuda_truth_estimates")
    result = runner.main(["--smoke", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "cuda_truth_estimates-cpu-smoke.json").read_text())
    assert data["benchmark"] == "cuda_truth_estimates" and data["markdown"] == result["markdown"]
    assert len(data["rows"]) == runner.SMOKE_ROWS and data["allocated"]["rows"] == runner.SMOKE_ROWS
    for row in data["rows"]:
        assert row["status"] == "ok", row["error"]
        assert row["ratio"] == round(row["estimate_peak_bytes"] / row["measured_peak_bytes"], 4)
    with pytest.raises(SystemExit):
        runner.main(["--device", "cuda", "--out", str(tmp_path)])


def test_attention_vs_published(load: Any, tmp_path: Path) -> None:
    runner = load("attention_vs_published")
    result = runner.main(["--smoke", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "attention_vs_published-cpu-smoke.json").read_text())
    assert data["benchmark"] == "attention_vs_published" and data["size"] == "smoke"
    assert data["markdown"] == result["markdown"] and data["rejected"]
    (row,) = data["rows"]
    assert row["status"] == {"eager": "ok", "sdpa": "ok"}
    # Eager keeps the attention probabilities for backward, SDPA's flash kernel does not.
    assert row["memlab_eager"] > row["memlab_sdpa"]
    assert any("flash backend" in note for note in row["notes"]["sdpa"])
    assert not any("flash backend" in note for note in row["notes"]["eager"])


def test_timeline_cost(load: Any, tmp_path: Path) -> None:
    result = load("timeline_cost").main(["--smoke", "--device", "cpu", "--out", str(tmp_path)])
    data = check_result(tmp_path / "timeline_cost-cpu-smoke.json", "timeline_cost")
    assert data["same_peak"] and data["ratio_on_over_off"] == result["ratio_on_over_off"] > 0
    # What a saved notebook keeps of a timeline is bounded whatever the step's length (thinned, the peak kept).
    from memlab.report.timeline import MAX_POINTS

    assert data["points_kept"] <= MAX_POINTS and data["saved_svg_bytes"] < 1_000_000
    assert data["plotly_json_bytes"] < 1_000_000


def test_trl_vs_published(load: Any, tmp_path: Path) -> None:
    runner = load("trl_vs_published")
    result = runner.main(["--smoke", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "trl_vs_published-cpu-smoke.json").read_text())
    assert data["benchmark"] == "trl_vs_published" and data["size"] == "smoke"
    assert data["device"]["type"] == "cpu" and data["versions"]["torch"]
    assert data["markdown"] == result["markdown"]
    (row,) = data["rows"]
    assert row["status"] == "ok", row.get("error")
    assert row["trainer"] == "GRPOTrainer" and row["measures"] == "allocated"
    assert row["ratio"] == round(row["memlab"] / row["published"], 3)
    assert "memlab.trainer_on_meta(trl.GRPOTrainer)" in row["estimated"]
    # The trainer's own GRPO step: its generation and training phases, the peak the highest of them.
    assert row["phases"]["generation"] > 0 and row["memlab_allocated"] == max(row["phases"].values())
    # Every published row names its source, what it measures and how its loss runs; every row left out says why.
    from benchmarks.trl_published_runs import LOSSES

    assert all(run.source and run.published > 0 and run.loss in LOSSES for run in runner.RUNS)
    assert {run.measures for run in runner.RUNS} == {"allocated", "reserved", "card"}
    assert all(entry["why"] and entry["source"] for entry in runner.NOT_EXPRESSED)


def test_trl_vs_published_compares_the_figure_each_row_published(load: Any, tmp_path: Path) -> None:
    """A row that published the reserve (TRL's notebooks print max_memory_reserved) is compared with memlab's
    reserve less the paged optimizer state (bitsandbytes keeps it in unified memory, outside the reserve), one that
    read nvidia-smi with the card figure (the reserve, that state and the CUDA context of its GPU kind)."""
    import dataclasses

    from memlab.estimation.cuda.gpus import GPUS

    runner = load("trl_vs_published")
    smoke = runner.SMOKE[0]
    rows = {measures: runner.estimate_run(dataclasses.replace(smoke, measures=measures, gpu="T4-16GB"), tmp_path)
            for measures in ("allocated", "reserved", "card")}
    assert all(row["status"] == "ok" for row in rows.values()), rows
    sizes = rows["card"]["bytes"]
    assert sizes["context"] == GPUS["T4-16GB"].context_bytes and sizes["card"] == sizes["reserved"] + sizes["context"]
    for measures, figure in (("allocated", sizes["peak"]), ("reserved", sizes["reserved"] - sizes["paged_state"]),
                             ("card", sizes["card"])):
        assert rows[measures]["measures"] == measures
        assert rows[measures]["ratio"] == round(figure / (smoke.published * 1e9), 3)


def test_trl_vs_published_counts_the_paged_state_as_bitsandbytes_pages_it(load: Any) -> None:
    """bitsandbytes' paged 8-bit AdamW pages the two one-byte states of a parameter of 100,000 elements or more;
    smaller ones, frozen ones and unpaged optimizers page nothing."""
    from types import SimpleNamespace

    import torch

    runner = load("trl_vs_published")
    model = torch.nn.Sequential(torch.nn.Linear(400, 300, bias=False), torch.nn.Linear(300, 2),
                                torch.nn.Linear(500, 500))
    model[2].requires_grad_(False)

    def trainer(optim: str) -> Any:
        return SimpleNamespace(args=SimpleNamespace(optim=optim), model=model)

    assert runner.paged_state_bytes(trainer("paged_adamw_8bit")) == 2 * 400 * 300
    assert runner.paged_state_bytes(trainer("paged_adamw_32bit")) == 8 * 400 * 300
    assert runner.paged_state_bytes(trainer("adamw_8bit")) == runner.paged_state_bytes(trainer("adamw_torch")) == 0


def test_trl_vs_published_builds_the_notebooks_trainer_as_it_was_built(load: Any, tmp_path: Path) -> None:
    """The T4 notebook's row, at a tiny size: a policy loaded as its from_pretrained loads it (fp16, NF4 with
    double quantization and fp16 compute), TRL's own bf16 cast of the adapters, the notebook's GRPOConfig (paged
    8-bit AdamW, Liger, checkpointing), and TRL 0.26.2's Liger loss on the installed trainer, estimated for the
    T4 with the paged state counted apart."""
    import dataclasses

    import torch
    from transformers import Qwen2Config

    runner = load("trl_vs_published")
    (notebook,) = [run for run in runner.RUNS if run.name.endswith(", T4")]

    def tiny() -> Any:
        return Qwen2Config(hidden_size=64, intermediate_size=4096, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=64, max_position_embeddings=256, pad_token_id=0,
                           tie_word_embeddings=False)

    run = dataclasses.replace(notebook, config=tiny, prompt_tokens=6, completion_tokens=8,
                              settings={**notebook.settings, "max_completion_length": 8})
    trainer = runner.build_trainer(run, tmp_path, liger_patches=False)
    assert trainer.model.is_loaded_in_4bit and trainer.args.optim == "paged_adamw_8bit"
    assert {p.dtype for p in trainer.model.parameters() if p.requires_grad} == {torch.bfloat16}
    assert trainer.model.get_base_model().lm_head.weight.dtype == torch.float16
    assert hasattr(trainer, "liger_grpo_loss") and trainer.args.bf16
    result = runner.estimate_trainer(run, tmp_path, liger_patches=False)
    assert result["status"] == "ok", result.get("error")
    # The gate, up and down projections' wide adapters (4096 x 32) are paged; the rest are under 100,000 elements.
    assert result["paged_bytes"] == 2 * 3 * 2 * (4096 * 32)
    assert result["reserved_bytes"] > result["paged_bytes"] > 0


def test_trl_vs_published_builds_the_sft_notebooks_trainer_as_it_was_built(load: Any, tmp_path: Path) -> None:
    """The tool-calling SFT notebook's row, at a tiny size: an SFTTrainer around a policy loaded as its
    from_pretrained loads it (fp16, NF4 with fp16 compute), TRL's bf16 cast of the adapters, trl 0.28's loss over
    the logits, rows of the length assumed; TRL's activation offloading (its context needs an accelerator) left
    off the config and estimated as memlab's offload of the saved activations."""
    import dataclasses

    import torch
    import trl
    from transformers import Cohere2Config

    runner = load("trl_vs_published")
    (notebook,) = [run for run in runner.RUNS if run.name.startswith("tiny-aya-global SFT")]

    def tiny() -> Any:
        return Cohere2Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, logit_scale=1.0)

    run = dataclasses.replace(notebook, config=tiny, completion_tokens=12,
                              settings={**notebook.settings, "max_length": 12})
    trainer = runner.build_trainer(run, tmp_path)
    assert isinstance(trainer, trl.SFTTrainer) and type(trainer).__name__ == "LogitsSFTTrainer"
    assert trainer.model.is_loaded_in_4bit and not trainer.args.activation_offloading
    assert trainer.args.gradient_checkpointing and trainer.args.bf16  # SFTConfig's defaults, as the notebook ran
    assert {p.dtype for p in trainer.model.parameters() if p.requires_grad} == {torch.bfloat16}
    row = runner.estimate_run(run, tmp_path)
    assert row["status"] == "ok", row.get("error")
    assert row["trainer"] == "SFTTrainer" and "offload='activations'" in row["estimated"]
    assert row["installed_trl"]["memlab"] > 0  # TRL 1.16's own loss estimated beside it
    assert any("offload estimated as a GPU runs it" in note for note in row["notes"])


def test_trl_vs_published_logits_path_scores_as_the_installed_trl(load: Any, tmp_path: Path) -> None:
    """The benchmark's copy of trl 1.12's log-probs (the logits over the vocabulary, its own selective log-softmax)
    gives the installed TRL's fused LM head's values, on the same tiny model and tokens."""
    from types import SimpleNamespace

    import torch
    from transformers import Qwen3ForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    runner = load("trl_vs_published")
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(runner.tiny_qwen3())
    ids = torch.randint(3, 64, (2, 7))
    mask = torch.ones_like(ids)
    ours, entropies, _ = runner.logits_log_probs(SimpleNamespace(temperature=1.0))(
        model, ids, mask, logits_to_keep=4, compute_entropy=True)
    add_fused_lm_head(model, temperature=1.0)
    theirs = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(torch.arange(7) < 3, -100),
                   fused_lm_head=True).log_probs[:, -4:]
    assert torch.allclose(ours, theirs, atol=1e-5)
    assert entropies is not None and entropies.shape == (2, 4)
    in_place, _, _ = runner.logits_log_probs(SimpleNamespace(temperature=0.7), in_place=True)(model, ids, mask, 4)
    divided, _, _ = runner.logits_log_probs(SimpleNamespace(temperature=0.7))(model, ids, mask, 4)
    assert torch.allclose(in_place, divided) and not torch.allclose(in_place, ours)  # trl 1.9.2's: same values


def test_trainer_sharded_vs_published_asks_each_row_as_its_trainer_per_gpu(load: Any, tmp_path: Path) -> None:
    runner = load("trainer_sharded_vs_published")
    assert runner.main(["--smoke", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "trainer_sharded_vs_published-cpu-smoke.json").read_text())
    assert data["benchmark"] == "trainer_sharded_vs_published" and data["size"] == "smoke"
    assert data["device"]["type"] == "cpu" and data["versions"]["torch"]
    (row,) = data["rows"]
    assert row["status"] == "ok" and row["label"].endswith("zero3 x2") and row["card_gb"] > 0
    assert row["sharding"] == "DeepSpeed ZeRO-3 (deepspeed=...)"
    assert abs(row["ratio"] - row["card_gb"] / row["published_gb"]) < 0.01
    assert {run.name for run in runner.ROWS} >= {
        "peft Llama 2 70B LoRA SFTTrainer, ZeRO-3, 8 x H100", "peft Llama 2 70B LoRA SFTTrainer, FSDP1, 8 x H100",
        "peft Llama 2 70B QLoRA SFTTrainer, FSDP1 + CPU offload, 2 GPUs",
        "peft Llama 2 70B QLoRA SFTTrainer, FSDP1, 2 GPUs, no offload",
        "peft Llama 2 70B QLoRA SFTTrainer, ZeRO-3, 2 x 40GB"}
    assert all(run.deepspeed or run.fsdp for run in runner.ROWS)  # each row says its engine as the trainer's own
    assert all(entry["why"] for entry in runner.NOT_EXPRESSED)
