"""Issue 71, the command line's words and exit codes: every figure a table labels is the figure it names, every
refusing status says which budget, every error row changes the exit status, a key the command cannot use is refused
up front. Real dry runs of a small Llama config saved as config.json (CUDA emulated on the CPU).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
from pathlib import Path

import pytest
from transformers import LlamaConfig

from memlab.frontends.cli import main

LORA = ["--try", "precision=bf16", "weights=bf16", "adapter=lora"]


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("llama_256")
    LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=4, vocab_size=1024).save_pretrained(folder)
    return folder


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue()


def test_max_tokens_judges_and_names_the_card_figure_of_the_same_plan(config_dir: Path) -> None:
    """Item 1: --max-tokens showed a "peak" that was a card figure, and not the one the plan's own estimate gives
    (it dry-ran the meta model, loaded in fp32 and cast, where the estimate loads the config as the plan implies)."""
    command = ["estimate", str(config_dir), "--batch", "1x64", "--budget", "1GiB", *LORA]
    status, out, _ = _run([*command, "--json"])
    assert status == 0
    (trial,) = json.loads(out)["trials"]
    status, out, _ = _run([*command, "--max-tokens", "--json"])
    assert status == 0
    tried = {size: figure for size, _, figure in json.loads(out)[0]["tried"]}
    assert tried[64] == trial["card_bytes"] != trial["peak_bytes"]
    status, out, _ = _run([*command, "--max-tokens"])
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("tokens "))
    assert header.split()[:2] == ["tokens", "card"] and "peak" not in header, out
    assert any(line.startswith("card: the allocator's reserve + the CUDA context") for line in lines), out


@pytest.mark.parametrize(("item", "owner"), [("precompute_ref=on", "DPOTrainer"), ("vllm_memory=0.3", "GRPOTrainer"),
                                             ("vllm_sleep=on", "GRPOTrainer")])
def test_a_trainers_own_setting_is_refused_up_front_and_not_offered(
    config_dir: Path, item: str, owner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 2: --try precompute_ref=on ran, printed an error row and "1 plan estimated", and exited 0."""
    estimate_module = importlib.import_module("memlab.estimation.estimate")

    def never(*args: object, **keywords: object) -> None:
        raise AssertionError("a refused setting reached a dry run")

    monkeypatch.setattr(estimate_module, "estimate_plans", never)
    status, out, err = _run(["estimate", str(config_dir), "--device", "cpu", "--try", item])
    key = item.split("=")[0]
    assert status == 2 and out == "", out
    (line,) = err.strip().splitlines()
    assert line.startswith(f"memlab estimate: {key} is a setting of a TRL {owner}"), line
    assert f"memlab.estimate(trainer, memlab.Plan({key}=...))" in line, line
    status, out, _ = _run(["estimate", "--help"])
    assert status == 0
    said = " ".join(out.split())
    settings = said.split("The settings")[1].split("Not here:")[0]
    assert "precision=fp32|bf16|fp16" in settings and f"{key}=" not in settings, settings
    assert key in said.split("Not here:")[1]


def _error_trial(plan: object, **more: object) -> object:
    from memlab.report import Trial

    return Trial(plan, "error", 0, {}, None, None, None, "cuda", error="RuntimeError: boom", estimated=True,
                 **more)


def test_every_error_row_makes_the_exit_status_non_zero(config_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 2: an error row (dashes in every column) exited 0 as if the table were whole: on one GPU, with --gpus,
    with --max-tokens, judged on a host budget or none."""
    estimate_module = importlib.import_module("memlab.estimation.estimate")
    from memlab.estimation.sharded import per_gpu
    from memlab.estimation.sharded.fsdp2 import ShardedTrial
    from memlab.frontends.cli_errors import EXIT_FAILED
    from memlab.report import Report

    def estimate_plans(model: object, batch: object, plans: list[object], **keywords: object) -> Report:
        return Report([_error_trial(plan) for plan in plans], budget=keywords.get("budget"))

    monkeypatch.setattr(estimate_module, "estimate_plans", estimate_plans)
    folder = str(config_dir)
    for more in ([], ["--budget", "1GiB"], ["--host-budget", "64GiB"], ["--json"]):
        status, out, _ = _run(["estimate", folder, *more])
        assert status == EXIT_FAILED, (more, out)
    status, out, _ = _run(["estimate", folder])
    assert "could not be estimated" in out.splitlines()[1] and "1 plan estimated" not in out, out

    def sharded_trials(model: object, batch: object, plans: list[object], **keywords: object) -> list[object]:
        return [(plan, "zero3", ShardedTrial(plan, "error", 0, {}, None, None, None, "cuda", gpus=2, strategy="zero3",
                                             error="RuntimeError: boom")) for plan in plans]

    monkeypatch.setattr(per_gpu, "sharded_trials", sharded_trials)
    for more in ([], ["--json"], ["--budget", "80GiB"]):
        status, out, _ = _run(["estimate", folder, "--gpus", "2", *more])
        assert status == EXIT_FAILED, (more, out)

    def estimate(model: object, batch: object, plan: object, **keywords: object) -> object:
        return _error_trial(plan, budget=keywords.get("budget"))

    monkeypatch.setattr(estimate_module, "estimate", estimate)
    status, out, _ = _run(["estimate", folder, "--budget", "1GiB", "--max-tokens"])
    assert status == EXIT_FAILED and "RuntimeError: boom" in out, out
