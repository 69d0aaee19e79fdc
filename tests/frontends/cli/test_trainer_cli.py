"""``memlab estimate MODEL --trainer grpo|dpo ...`` (issue 68): a TRL trainer's step from a config in one command.

The command's answer on a tiny config.json is the one ``memlab.estimate(memlab.trainer_on_meta(trl.GRPOTrainer,
...))`` gives in Python with the same settings (the same word-level tokenizer and prompts: equal bytes); ``--json``
carries each phase's peak and the phase that holds it; each bad input is one error that says what to write, exit 2.
Nothing is downloaded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")
import peft  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402

import memlab  # noqa: E402
from memlab.estimation.estimate import load_config  # noqa: E402
from memlab.frontends.cli.main import main  # noqa: E402
from memlab.frontends.cli.trainer import word_tokenizer  # noqa: E402

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
          "max_position_embeddings": 128, "pad_token_id": 0, "tie_word_embeddings": False}
GRPO = ["--trainer", "grpo", "--num-generations", "4", "--max-completion-length", "32", "--prompt-length", "16",
        "--per-device-train-batch-size", "4", "--gradient-accumulation-steps", "2", "--beta", "0", "--lora", "4",
        "--gpu", "H100-80GB"]


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("MEMLAB_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    return str(path)


def ask(capsys: pytest.CaptureFixture[str], *words: str) -> tuple[int, str, str]:
    try:
        status = main(["estimate", *words, "--no-cache"])
    except SystemExit as exit_:  # argparse's own errors
        status = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return status, out, err


def python_answer(path: str, folder: Path) -> memlab.Trial:
    """The same question in Python: the trainer built around the meta policy, as docs/trainer.md writes it."""
    return memlab.estimate(python_trainer(path, folder), gpu="H100-80GB")


def python_trainer(path: str, folder: Path) -> Any:
    """The trainer of :data:`GRPO` built in Python around the meta policy."""
    import torch

    policy = memlab.model_on_meta(load_config(path), dtype=torch.bfloat16)
    prompts = [{"prompt": " ".join(f"w{(i + j) % 1000}" for j in range(16))} for i in range(8)]
    args = trl.GRPOConfig(output_dir=str(folder), report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
                          max_steps=1, seed=0, bf16=True, per_device_train_batch_size=4,
                          gradient_accumulation_steps=2, beta=0.0, num_generations=4, max_completion_length=32)
    trainer = memlab.trainer_on_meta(trl.GRPOTrainer, model=policy, args=args,
                                     reward_funcs=lambda completions, **_: [0.0] * len(completions),
                                     train_dataset=Dataset.from_list(prompts), processing_class=word_tokenizer(256),
                                     peft_config=peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    return trainer


def test_the_grpo_answer_is_pythons_and_json_carries_the_phases(
        config: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = ask(capsys, config, *GRPO, "--json")
    assert status == 0, err
    data = json.loads(out)
    row = data["trials"][0]
    expected = python_answer(config, tmp_path / "python")
    assert expected.status == row["status"] == "ok", expected.error
    # The same tokenizer, prompts and settings: the same dry run, byte for byte.
    assert row["peak_bytes"] == expected.peak_bytes and row["reserved_bytes"] == expected.reserved_bytes
    assert row["fits"] is True and data["trainer"]["kind"] == "grpo" and data["trainer"]["num_generations"] == 4
    assert {"generation", "forward", "backward"} <= data["phases"].keys()
    assert max(data["phases"].values()) == expected.peak_bytes
    assert data["peak_phase"] == expected.timeline.peak.phase and data["peak_phase"] in data["phases"]


@pytest.mark.slow
def test_the_table_says_the_question_and_the_phase_of_the_peak(
        config: str, capsys: pytest.CaptureFixture[str]) -> None:
    # a CPU estimate: on a GPU a 1 MiB budget is under the CUDA context, an answer given before any dry run
    status, out, err = ask(capsys, config, *GRPO[:-2], "--device", "cpu", "--budget", "1MiB")
    assert status == 1, err  # over a 1 MiB budget: does not fit, as for a plain step
    text = " ".join(out.split())
    assert "LlamaForCausalLM" in text and "GRPO, 4 generations of up to 32 tokens after 16-token prompts" in text
    assert "LoRA r4" in text and "Verdict:" in text and "does not fit" in text
    assert "Peak: in the backward phase (each phase's highest: generation" in text


def test_a_dpo_question_is_answered(config: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = ask(capsys, config, "--trainer", "dpo", "--max-length", "64", "--prompt-length", "24",
                           "--per-device-train-batch-size", "2", "--lora", "4", "--gpu", "H100-80GB", "--json")
    assert status == 0, err
    data = json.loads(out)
    assert data["trials"][0]["status"] == "ok" and data["trainer"]["max_length"] == 64
    assert data["peak_phase"] in data["phases"]


@pytest.mark.parametrize(("words", "said"), [
    (["--trainer", "ppo"], "--trainer must be one of sft, dpo, grpo; got 'ppo'"),
    (["--trainer", "grpo", "--max-completion-length", "200", "--prompt-length", "16"],
     "more than the model's 128 positions; write --max-completion-length 112 or less"),
    (["--trainer", "dpo", "--num-generations", "4", "--lora", "4"],
     "--num-generations is a setting of --trainer grpo, not --trainer dpo"),
    (["--trainer", "grpo", "--max-length", "64"],
     "--max-length is a setting of --trainer sft or --trainer dpo, not --trainer grpo"),
    (["--trainer", "dpo", "--packing", "--lora", "4"], "--packing is a setting of --trainer sft, not --trainer dpo"),
    (["--packing"], "--packing is a setting of a TRL trainer; add --trainer sft"),
    (["--trainer", "sft", "--max-length", "64", "--completion-only-loss", "on"],
     "needs prompt and completion examples; add --prompt-length"),
    (["--trainer", "sft", "--optim", "adamw_8bti"],
     "'adamw_8bti' is not an optimizer transformers knows; did you mean"),
    (["--trainer", "sft", "--optim", "sgd"], "--optim sgd is not an optimizer memlab estimates; write one of"),
    (["--trainer", "sft", "--load-in-4bit"], "--load-in-4bit loads a quantized base, which trains adapters only; add "
     "--lora 16"),
    (["--trainer", "sft", "--bf16", "on", "--fp16", "on"], "ask two autocast dtypes; write one of them"),
    (["--trainer", "sft", "--max-length", "64", "--load-in-4bit", "--lora", "4", "--llm-int8-skip-modules",
      "model+lm_head"],
     "a 4-bit load quantizes no layer of this LlamaForCausalLM"),
    (["--num-generations", "4"], "--num-generations is a setting of a TRL trainer; add --trainer grpo"),
    (["--trainer", "dpo", "--max-length", "64"],  # the option said as written ("----lora" before)
     "needs adapters (its reference model is then the policy with its adapters off); add --lora 16"),
    (["--trainer", "grpo", "--gpu", "A100-40GB", "--device", "cpu"],
     "--gpu names the GPU an estimate is for, and --device cpu asks for the CPU; drop --device cpu"),
    (["--trainer", "grpo", "--try", "micro_batch=2"],
     "write --per-device-train-batch-size N --gradient-accumulation-steps M instead"),
    (["--trainer", "dpo", "--max-length", "64", "--lora", "4", "--try", "accumulation=2"],
     "write --per-device-train-batch-size N --gradient-accumulation-steps M instead"),
    (["--trainer", "grpo", "--try", "adapter=qlora"],
     "--try adapter=qlora is how the trainer's model is loaded: write --load-in-4bit --bnb-4bit-quant-type nf4 "
     "--lora 16"),
    (["--trainer", "grpo", "--try", "adapter=lora"], "which --lora sets; write --lora 16"),
    (["--trainer", "grpo", "--try", "precompute_ref=on"], "is a setting of --trainer dpo"),
    (["--trainer", "grpo", "--try", "vllm_memory=0.3"], "write --vllm-gpu-memory-utilization 0.3"),
    (["--trainer", "grpo", "--batch", "1x512"], "--batch is not answered with --trainer grpo"),  # the default, typed
    (["--trainer", "grpo", "--vllm-tensor-parallel-size", "2"], "add --vllm-gpu-memory-utilization 0.3"),
    (["--trainer", "sft", "--accelerate-config", "a.yaml"], "add --gpus 8 --strategy zero3"),
    (["--trainer", "grpo", *GRPO[2:], "--gpus", "3", "--strategy", "zero3", "--vllm-gpu-memory-utilization", "0.3",
      "--vllm-tensor-parallel-size", "2"], "vllm_tensor_parallel_size=2 does not divide the 3 training processes"),
    (["--trainer", "sft", "--gpus", "auto", "--strategy", "zero3", "--device", "cpu"], "--gpus auto needs a budget"),
    (["--trainer", "sft", "--gpus", "4"], "--gpus 4 needs a strategy; add --strategy fsdp2, zero2 or zero3"),
    (["--trainer", "sft", "--strategy", "zero2"], "--strategy zero2 shards over several GPUs; add --gpus 8"),
    (["--trainer", "sft", "--gpus", "two", "--strategy", "zero2"], "is not a number of GPUs"),
    (["--trainer", "grpo", "--num-generations", "3", "--per-device-train-batch-size", "4", "--max-completion-length",
      "32"], "TRL refuses"),
    (["--trainer", "grpo", "--vllm-enable-sleep-mode"], "add --vllm-gpu-memory-utilization 0.3"),
    (["--trainer", "grpo", *GRPO[2:], "--vllm-gpu-memory-utilization", "0.0000001"],
     "vLLM would not start"),
    (["--trainer", "grpo", "--vllm-server-tensor-parallel-size", "2"], "add --vllm-mode server"),
    (["--trainer", "grpo", "--vllm-mode", "served"], "write --vllm-mode server"),
    (["--trainer", "grpo", "--vllm-mode", "server", "--vllm-gpu-memory-utilization", "0.3"],
     "write --vllm-server-gpu-memory-utilization 0.9"),
    (["--trainer", "grpo", *GRPO[2:], "--vllm-mode", "server", "--vllm-server-gpu", "H99"], "H99"),
    (["--trainer", "grpo", *GRPO[2:], "--vllm-mode", "server", "--vllm-server-max-model-len", "4096"],
     "write --max-model-len 128 or less"),
    (["--trainer", "grpo", *GRPO[2:], "--vllm-mode", "server", "--vllm-server-max-model-len", "32"],
     "write trl vllm-serve --max-model-len 48 or more"),
])
def test_each_bad_input_is_one_error_saying_what_to_write(
        config: str, capsys: pytest.CaptureFixture[str], words: list[str], said: str) -> None:
    status, out, err = ask(capsys, config, *words)
    assert status == 2, (out, err)
    lines = [line for line in err.splitlines() if line.startswith("memlab estimate")]
    assert lines and said in " ".join(err.split()), err
    assert "Traceback" not in err and out == ""


def test_trl_not_installed_says_what_to_install(
        config: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "trl", None)
    status, out, err = ask(capsys, config, "--trainer", "grpo", "--lora", "4")
    assert status == 2 and "needs TRL and peft, and trl is not installed; write pip install trl peft" in err, err


def test_the_word_tokenizer_stays_inside_the_vocabulary() -> None:
    tokenizer = word_tokenizer(40)
    ids: Any = tokenizer(" ".join(f"w{i}" for i in range(1000)))["input_ids"]
    assert max(ids) < 40 and len(ids) == 1000


def test_a_colocated_vllm_share_is_counted(config: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = ask(capsys, config, *GRPO, "--vllm-gpu-memory-utilization", "0.3", "--vllm-enable-sleep-mode",
                           "--json")
    assert status == 0, err
    data = json.loads(out)
    notes = " ".join(data["trials"][0]["notes"])
    assert "vllm_gpu_memory_utilization=0.3" in notes and "vllm_enable_sleep_mode=True" in notes
    assert data["peak_phase"] == "generation" and data["trainer"]["use_vllm"] is True


def test_a_served_trainer_is_answered_for_the_servers_gpus(config: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = ask(capsys, config, *GRPO, "--vllm-mode", "server", "--vllm-server-gpu", "L4-24GB",
                           "--vllm-server-tensor-parallel-size", "2", "--vllm-server-gpu-memory-utilization", "0.5",
                           "--json")
    assert status == 0, err
    data = json.loads(out)
    notes = " ".join(data["trials"][0]["notes"])
    assert "the server's 2 L4-24GB GPUs (tensor_parallel_size=2, data_parallel_size=1, gpu_memory_utilization=0.5)" in (
        notes)
    assert "max_model_len 128" in notes and "this card holds only the policy's training" in notes
    assert data["trainer"]["use_vllm"] is True and data["trainer"]["vllm_mode"] == "server"
    status, text, err = ask(capsys, config, *GRPO, "--vllm-mode", "server")
    assert status == 0 and "generating on a vLLM server" in " ".join(text.split()), (text, err)


def test_a_sharded_grpo_question_with_a_server_is_pythons_per_gpu(
        config: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 85: --trainer grpo --gpus N --strategy S, the vLLM server's GPUs beside the training's
    words = [*GRPO, "--gpus", "4", "--strategy", "zero3", "--vllm-mode", "server"]
    status, out, err = ask(capsys, config, *words, "--json")
    assert status == 0, err
    row = json.loads(out)["trials"][0]
    trainer = cli_trainer(config, words, tmp_path)
    expected = memlab.estimate(trainer, gpu="H100-80GB", gpus=4, strategy="zero3", vllm_server=memlab.VLLMServer())
    assert expected.status == row["status"] == "ok", expected.error
    assert row["peak_bytes"] == expected.peak_bytes and row["label"].endswith("zero3 x4")
    assert json.loads(out)["phases"].keys() == {"weight sync", "generation", "training"}
    status, text, err = ask(capsys, config, *words)
    said = " ".join(text.split())
    assert status == 0, err
    assert "per GPU of 4 under DeepSpeed ZeRO-3 (and 1 more serving vLLM: 5 GPUs in all)" in said
    assert "Peak: in the training phase (each phase's highest: weight sync" in said
    assert "the server's 1 H100-80GB GPU" in said and "the trainer's 32 sequences" in said
    # The commands that start the run answered: accelerate's launch reading the config written, and the server.
    written = tmp_path / "accelerate.yaml"
    status, text, err = ask(capsys, config, *words, "--accelerate-config", str(written))
    said = " ".join(text.split())
    assert status == 0, err
    assert (f"Launch: CUDA_VISIBLE_DEVICES=0,1,2,3 accelerate launch --config_file {written} --num_processes 4 "
            "train.py (written to") in said
    assert f"Serve: CUDA_VISIBLE_DEVICES=4 trl vllm-serve --model {config}" in said
    from memlab.export.accelerate import sharding_from_accelerate

    assert sharding_from_accelerate(str(written)) == {"gpus": 4, "strategy": "zero3", "offload": "none"}


def test_gpus_auto_answers_the_fewest_gpus_that_fit_as_python_finds_them(
        config: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 85: --gpus auto with --trainer, the strategy assumed (ZeRO-3) where none is given and said
    words = [*DPO, "--device", "cpu"]
    trainer = cli_trainer(config, words, tmp_path)
    peaks = {n: memlab.estimate(trainer, gpus=n, strategy="zero3", device="cpu").peak_bytes for n in (2, 4, 8)}
    assert peaks[2] > peaks[4] > peaks[8], peaks
    budget = f"{(peaks[4] + peaks[8]) // 2}B"  # 8 GPUs fit, 4 do not
    status, out, err = ask(capsys, config, *words, "--gpus", "auto", "--budget", budget, "--json")
    assert status == 0, err
    row = json.loads(out)["trials"][0]
    assert row["label"].endswith("zero3 x8") and row["peak_bytes"] == peaks[8] and row["fits"] is True
    status, text, err = ask(capsys, config, *words, "--gpus", "auto", "--budget", budget)
    said = " ".join(text.split())
    assert status == 0, err
    assert ("per GPU of the fewest GPUs that fit (--gpus auto, powers of two): 8 under DeepSpeed ZeRO-3 (assumed: "
            "--strategy sets another)") in said
    assert "--num_processes 8" in said
    status, text, err = ask(capsys, config, *words, "--gpus", "auto", "--budget", "1MiB")
    assert status == 1 and "does not fit on up to 1024 GPUs under DeepSpeed ZeRO-3" in " ".join(text.split()), err


# --- --try and the suggestions where nothing fits (the trainer's own plan with levers replaced) ----------------------

DPO = ["--trainer", "dpo", "--max-length", "64", "--prompt-length", "24", "--per-device-train-batch-size", "2",
       "--lora", "4"]


def cli_trainer(config: str, words: list[str], folder: Path) -> Any:
    """The trainer the CLI builds for ``words`` (memlab.trainer_on_meta around the meta policy)."""
    import argparse

    from memlab.frontends.cli.estimate.command import add_arguments
    from memlab.frontends.cli.trainer import build_trainer

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return build_trainer(parser.parse_args([config, *words]), load_config(config), config, str(folder))[0]


@pytest.mark.parametrize("kind", ["grpo", "dpo"])
@pytest.mark.slow
def test_try_estimates_each_plan_as_python_does(
        config: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    words = GRPO if kind == "grpo" else [*DPO, "--gpu", "H100-80GB"]
    status, out, err = ask(capsys, config, *words, "--try", "checkpointing=off,on", "--json")
    assert status == 0, err
    rows = json.loads(out)["trials"]
    trainer = python_trainer(config, tmp_path / "python") if kind == "grpo" else cli_trainer(config, DPO, tmp_path)
    own = memlab.Plan.from_trainer(trainer)
    expected = [memlab.estimate(trainer, own.replace(checkpointing=value), gpu="H100-80GB") for value in (False, True)]
    assert len(rows) == 2
    for row, trial in zip(rows, expected, strict=True):
        assert trial.status == row["status"] == "ok", trial.error
        assert row["peak_bytes"] == trial.peak_bytes and row["card_bytes"] == trial.card_bytes
    assert rows[0]["peak_bytes"] != rows[1]["peak_bytes"]  # checkpointing off and on: two plans
    status, out, err = ask(capsys, config, *words, "--try", "checkpointing=off,on")
    assert status == 0 and "2 of the 2 plans fit" in " ".join(out.split()), err


def cpu_peak(capsys: pytest.CaptureFixture[str], config: str, words: list[str]) -> int:
    status, out, err = ask(capsys, config, *words, "--device", "cpu", "--json")
    assert status == 0, err
    return int(json.loads(out)["trials"][0]["peak_bytes"])


def check_commands_fit(capsys: pytest.CaptureFixture[str], config: str, words: list[str], budget: int,
                       changes: bool) -> list[str]:
    """Nothing asked fits ``budget``: the suggestions are printed, in the JSON too, and each command fits."""
    import shlex

    asked = [*words, "--device", "cpu", "--budget", f"{budget}B"]
    status, text, err = ask(capsys, config, *asked)
    assert status == 1, err
    assert "Next:" in text and ("these changes do, each changing the training" in text) == changes, text
    status, out, err = ask(capsys, config, *asked, "--json")
    assert status == 1, err
    suggestions = json.loads(out)["suggestions"]
    assert suggestions and all(row["fits"] for row in suggestions)
    assert all((row["changes_training"] is not None) == changes for row in suggestions)
    commands = [row["command"] for row in suggestions]
    for command in commands:
        assert command in text  # each on a line of its own
        assert command.startswith(f"memlab estimate {config} --trainer") and f"--budget {budget}B" in command
        status, out, err = ask(capsys, *shlex.split(command)[2:])
        assert status == 0, (command, out, err)
        assert "fits the budget" in out
    return commands


@pytest.mark.slow
def test_where_nothing_fits_lever_suggestions_are_commands_that_fit(
        config: str, capsys: pytest.CaptureFixture[str]) -> None:
    words = GRPO[:-2]  # without --gpu: a CPU estimate, judged on its peak (a card's context dwarfs a tiny model)
    budget = int(0.8 * cpu_peak(capsys, config, words))
    commands = check_commands_fit(capsys, config, words, budget, changes=False)
    # the batch split said with the trainer's own options, never --try micro_batch=
    assert all("micro_batch" not in command and "accumulation=" not in command for command in commands)


@pytest.mark.slow
def test_where_nothing_fits_a_dpo_step_gets_lever_suggestions(
        config: str, capsys: pytest.CaptureFixture[str]) -> None:
    budget = int(0.8 * cpu_peak(capsys, config, DPO))
    check_commands_fit(capsys, config, DPO, budget, changes=False)


@pytest.mark.slow
def test_where_no_lever_fits_a_grpo_config_change_is_suggested(
        config: str, capsys: pytest.CaptureFixture[str]) -> None:
    words = ["--trainer", "grpo", "--num-generations", "4", "--max-completion-length", "96", "--prompt-length", "16",
             "--per-device-train-batch-size", "1", "--gradient-accumulation-steps", "4", "--beta", "0", "--lora", "4"]
    budget = int(0.79 * cpu_peak(capsys, config, words))
    commands = check_commands_fit(capsys, config, words, budget, changes=True)
    # the completion lengths the CLI tries are multiples of 64 tokens
    assert any("--max-completion-length 64 " in command for command in commands), commands


# --- SFT, quantized loads and TRL's optimizer and offload flags (issue 83) -------------------------------------------

SFT_QLORA = ["--trainer", "sft", "--max-length", "48", "--packing", "--per-device-train-batch-size", "2",
             "--lora", "4", "--load-in-4bit", "--bnb-4bit-quant-type", "nf4", "--bnb-4bit-use-double-quant",
             "--bnb-4bit-compute-dtype", "float16", "--dtype", "float16", "--optim", "paged_adamw_8bit",
             "--gpu", "T4-16GB"]


def python_sft_trainer(path: str, folder: Path) -> Any:
    """:data:`SFT_QLORA` built in Python as docs/trainer.md writes it: the policy loaded 4-bit on the meta device."""
    import torch
    from transformers import BitsAndBytesConfig

    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                      bnb_4bit_compute_dtype=torch.float16)
    policy = memlab.model_on_meta(load_config(path), dtype=torch.float16, quantization_config=quantization)
    texts = [{"text": " ".join(f"w{(i + j) % 1000}" for j in range(48))} for i in range(8)]
    args = trl.SFTConfig(output_dir=str(folder), report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
                         max_steps=1, seed=0, per_device_train_batch_size=2, max_length=48, packing=True,
                         optim="paged_adamw_8bit")
    return memlab.trainer_on_meta(trl.SFTTrainer, model=policy, args=args, train_dataset=Dataset.from_list(texts),
                                  processing_class=word_tokenizer(256),
                                  peft_config=peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))


def test_a_qlora_sft_question_is_pythons(config: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = ask(capsys, config, *SFT_QLORA, "--json")
    assert status == 0, err
    data = json.loads(out)
    row = data["trials"][0]
    expected = memlab.estimate(python_sft_trainer(config, tmp_path), gpu="T4-16GB")
    assert expected.status == row["status"] == "ok", expected.error
    assert row["peak_bytes"] == expected.peak_bytes and row["reserved_bytes"] == expected.reserved_bytes
    assert row["adapter"] == "qlora" and row["optimizer"] == "paged_adamw8bit"
    assert data["trainer"]["kind"] == "sft" and data["trainer"]["packing"] is True
    status, out, err = ask(capsys, config, *SFT_QLORA)
    assert status == 0, err
    header = " ".join(out.split())
    assert "SFT, text of up to 48 tokens, packed" in header and "QLoRA r4 on a 4-bit NF4 base" in header
    assert "paged_adamw_8bit" in header and "lora down_proj" not in header  # the targets said once: all-linear
    unquantized = ["--trainer", "sft", "--max-length", "48", "--packing", "--per-device-train-batch-size", "2",
                   "--lora", "4", "--dtype", "float16", "--gpu", "T4-16GB", "--json"]
    plain = ask(capsys, config, *unquantized)
    assert json.loads(plain[1])["trials"][0]["params_bytes"] > 1.5 * row["params_bytes"]  # the base in 4 bits


def test_a_sharded_sft_question_is_pythons_per_gpu(config: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 85: --gpus N --strategy S with --trainer: memlab.estimate(trainer, gpus=N, strategy=S) per GPU
    status, out, err = ask(capsys, config, *SFT_QLORA[:-2], "--gpus", "4", "--strategy", "zero3", "--gpu",
                           "A100-40GB", "--json")
    assert status == 0, err
    row = json.loads(out)["trials"][0]
    expected = memlab.estimate(python_sft_trainer(config, tmp_path), gpu="A100-40GB", gpus=4, strategy="zero3")
    assert expected.status == row["status"] == "ok", expected.error
    assert row["peak_bytes"] == expected.peak_bytes and row["label"].endswith("zero3 x4")
    # the load beside the step (issue 85): bitsandbytes makes the 4-bit base whole on each GPU as it loads
    assert row["load"] == {"gpu_bytes": expected.load_bytes, "host_node_bytes": expected.load_host_bytes}
    status, out, err = ask(capsys, config, *SFT_QLORA[:-2], "--gpus", "4", "--strategy", "zero3", "--gpu",
                           "A100-40GB", "--budget", "1MiB")
    assert status == 1, err
    text = " ".join(out.split())
    assert "per GPU of 4 under DeepSpeed ZeRO-3, for an A100-40GB" in text
    assert "Next: nothing is suggested per GPU yet; ask again with more --gpus than 4" in text
    assert "Load: " in text and " per GPU while the model loads and is wrapped, below the step's peak (" in text
    assert "host memory per node while loading: only the mapped checkpoint" in text
    assert "The load (from_pretrained, then ZeRO-3 wrapping): " in text  # the note that says how


@pytest.mark.slow
def test_a_load_above_the_steps_peak_is_said_to_be_the_runs(capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 85: GPT-2's 4-bit base made whole on each of 8 GPUs (its embeddings stay 16-bit) outweighs a step of
    # 16 tokens that holds an eighth of it: the answer says the load is the run's peak
    words = ["gpt2", "--trainer", "sft", "--max-length", "16", "--per-device-train-batch-size", "1", "--lora", "4",
             "--load-in-4bit", "--gpus", "8", "--strategy", "fsdp2"]
    status, out, err = ask(capsys, *words, "--json")
    assert status == 0, err
    row = json.loads(out)["trials"][0]
    assert row["load"]["gpu_bytes"] > row["peak_bytes"]
    status, out, err = ask(capsys, *words)
    text = " ".join(out.split())
    assert "above the step's peak" in text and "the load is the run's peak per GPU;" in text
    assert "The load (from_pretrained, then FSDP2 wrapping): " in text and "the load is this run's peak" in text


def test_the_trainer_question_is_quiet(config: str, capsys: pytest.CaptureFixture[str]) -> None:
    """memlab's own progress only: no progress bar, no library warning of the stand-in trainer memlab builds, no
    TRL warning about its own stand-in data (the completions start after a space)."""
    status, out, err = ask(capsys, config, "--trainer", "dpo", "--max-length", "64", "--lora", "4",
                           "--load-in-4bit", "--activation-offloading", "--gpu", "H100-80GB")
    assert status == 0, err
    assert all(line.startswith("memlab estimate:") for line in err.splitlines()), err
    assert "offload-activations" in out and "activations offloaded" in " ".join(out.split())
    assert max(len(line) for line in out.splitlines()) <= 120, out


# --- the advice where nothing asked fits (issue 84, items 1 and 2) ---------------------------------------------------


@pytest.mark.slow
def test_where_the_batch_does_not_fit_its_split_comes_first(
        config: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The trainer's own batch split, as its own options, before any lever: a DPO question of 8 rows per device that
    fits as 2 x 4 was told that no lever fits (llama-3-8b on a 24 GB card)."""
    words = ["--trainer", "dpo", "--max-length", "64", "--prompt-length", "24", "--per-device-train-batch-size", "8",
             "--lora", "4", "--device", "cpu"]
    one_row = ["--per-device-train-batch-size", "1", "--gradient-accumulation-steps", "8"]
    single = cpu_peak(capsys, config, [*words[:6], *one_row, *words[8:-2]])
    # room for one row per micro-batch with the search's margin, not for two: only the whole split fits
    status, out, err = ask(capsys, config, *words, "--budget", f"{int(1.15 * single)}B", "--json")
    assert status == 1, err
    suggestions = json.loads(out)["suggestions"]
    assert suggestions and suggestions[0]["changes_training"] is None, suggestions
    first = suggestions[0]["command"]
    assert " ".join(one_row) in first, first
    assert "--try" not in first  # the split alone: every other lever as the trainer has it
    status, out, err = ask(capsys, *first.split()[2:])
    assert status == 0 and "fits the budget" in out, (first, out, err)


def test_weights_over_the_budget_are_said_before_any_dry_run(
        config: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A question whose weights alone (as loaded) are over the budget stops at once, saying so and what changes it
    (a 4-bit base, with the command that asks it): the T4's 8B GRPO question searched levers for 4 minutes."""
    def never(*args: Any, **keywords: Any) -> None:
        raise AssertionError("a dry run was made for a foregone answer")

    monkeypatch.setattr(memlab, "estimate", never)
    words = ["--trainer", "grpo", "--num-generations", "4", "--max-completion-length", "32", "--lora", "4",
             "--device", "cpu", "--budget", "150KiB"]
    status, out, err = ask(capsys, config, *words)
    assert status == 1, err
    said = " ".join(out.split())
    assert "Verdict: does not fit: the weights alone, as loaded (bfloat16), are" in said, out
    assert "no lever of the step changes the weights, so none was searched" in said
    assert "a 4-bit base (QLoRA): its weights are" in said and "--load-in-4bit" in said
    command = next(line.strip() for line in out.splitlines() if "--load-in-4bit" in line)
    assert max(len(line) for line in out.splitlines() if line.strip() != command) <= 120, out
    status, out, err = ask(capsys, config, *words, "--json")
    data = json.loads(out)
    assert status == 1 and data["fits"] is False and data["weights_bytes"] > 150 * 1024 > data["four_bit_weights_bytes"]
