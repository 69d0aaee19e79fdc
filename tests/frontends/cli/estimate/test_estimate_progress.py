"""``memlab estimate`` says each step of a long dry run on stderr as it starts; stdout holds only the table or JSON."""

from __future__ import annotations

import argparse
import io
import json
import re
from pathlib import Path

import pytest

from memlab.estimation.sharded.fsdp2 import ShardedRequest
from memlab.estimation.sharded.per_gpu import sharded_trials, smallest_gpus
from memlab.frontends.cli.estimate import command as estimate_cli
from memlab.plan import Plan, parse_budget

SHAPES = {"input_ids": (1, 16), "labels": (1, 16)}


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory: pytest.TempPathFactory) -> str:
    from transformers import LlamaConfig

    folder = tmp_path_factory.mktemp("tiny")
    LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=2, vocab_size=256, max_position_embeddings=64,
                architectures=["LlamaForCausalLM"]).save_pretrained(folder)
    return str(Path(folder) / "config.json")


def _estimate(*argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="memlab estimate")
    estimate_cli.add_arguments(parser)
    out, err = io.StringIO(), io.StringIO()
    status = estimate_cli.run(parser.parse_args(list(argv)), out=out, err=err)
    return status, out.getvalue(), err.getvalue()


PROGRESS = re.compile(r"^memlab estimate: .+ \.\.\. \(\d+ s so far\)$")


def test_gpus_auto_says_each_number_of_gpus_and_strategy_it_tries(tiny_config: str) -> None:
    status, out, err = _estimate("my-org/tiny", "--config", tiny_config, "--batch", "1x16", "--device", "cpu",
                                 "--gpus", "auto", "--budget", "3MiB")
    assert status == 0, err
    lines = err.splitlines()
    assert lines and all(PROGRESS.match(line) for line in lines), err
    assert lines[0].startswith("memlab estimate: reading the config of ")
    assert any(re.search(r"estimating plain with fsdp2 on \d+ GPUs? \.\.\.", line) for line in lines), err
    assert any("the dry run that ZeRO's activations come from" in line for line in lines), err
    assert "memlab estimate:" not in out and "fsdp2" in out and "zero3" in out  # stdout: the table alone


def test_json_stays_parseable_while_progress_goes_to_stderr(tiny_config: str) -> None:
    status, out, err = _estimate("my-org/tiny", "--config", tiny_config, "--batch", "1x16", "--device", "cpu",
                                 "--gpus", "2", "--strategy", "fsdp2", "--json")
    assert status == 0, err
    assert [row["strategy"] for row in json.loads(out)] == ["fsdp2"]
    assert any("estimating plain with fsdp2 on 2 GPUs" in line for line in err.splitlines()), err


def test_single_gpu_estimates_say_each_plan(tiny_config: str) -> None:
    status, out, err = _estimate("my-org/tiny", "--config", tiny_config, "--batch", "1x16", "--device", "cpu",
                                 "--try", "checkpointing=off,on", "precision=fp32,bf16")
    assert status == 0, err
    said = [line.split(" ... ")[0] for line in err.splitlines() if "estimating plan" in line]
    assert said == [f"memlab estimate: estimating plan {n} of 4: {label}"
                    for n, label in enumerate(["plain", "bf16", "ckpt", "ckpt bf16"], start=1)], err
    assert "4 plans" in out and "memlab estimate:" not in out


def test_the_sharded_search_tells_each_dry_run_before_it_starts(tiny_config: str) -> None:
    from memlab.estimation.estimate import load_config

    config = load_config(tiny_config)
    said: list[str] = []
    request = ShardedRequest(config, SHAPES, Plan(), 1, budget=parse_budget("3MiB"), device="cpu")
    found = smallest_gpus(request, strategies=["fsdp2"], say=said.append)
    assert found["fsdp2"] is not None
    probes = [int(re.search(r"on (\d+) GPU", text).group(1)) for text in said]  # type: ignore[union-attr]
    assert found["fsdp2"].gpus in probes and len(probes) <= 4  # bisected: about log2 of the 11 candidates
    said.clear()
    rows = sharded_trials(config, SHAPES, [Plan()], gpus=2, device="cpu", say=said.append)
    assert [name for _, name, _ in rows] == ["fsdp2", "zero2", "zero3"]
    assert said == ["estimating plain with fsdp2 on 2 GPUs"]  # ZeRO reuses FSDP2's dry run: nothing more to say
