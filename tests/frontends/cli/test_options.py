"""The trainer question's options (memlab.frontends.cli.options, issue 87): every kind's and each kind's own, asked of
the kinds' CLI facets, in the order the help lists them and a repeated command writes them (as before the kinds
declared them), each with the --trainer words that take it; a kind listed later adds its options where it says."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from memlab.frontends.cli.options import COMMON_OPTIONS, cli_kinds, option_kinds, option_order, trainer_options
from memlab.frontends.cli.trainer import add_trainer_arguments, levers_asked
from memlab.live.trainer_kinds import CliOption, CliWords, TrainerCli, TrainerKind, cli_kind, declared

# The order of the trainer options in `memlab estimate --help` and in the commands it suggests, before issue 87.
ORDER_BEFORE = ["num_generations", "max_completion_length", "max_length", "prompt_length", "packing", "padding_free",
                "completion_only_loss", "per_device_train_batch_size", "gradient_accumulation_steps", "beta", "lora",
                "gradient_checkpointing", "optim", "activation_offloading", "use_liger_kernel", "bf16", "fp16",
                "vllm_gpu_memory_utilization", "vllm_enable_sleep_mode"]
# Issue 85's, after them: a colocated engine over several ranks, a served GRPOTrainer's mode and its trl vllm-serve
# server's settings.
SERVER = ["vllm_tensor_parallel_size", "vllm_mode", "vllm_server_gpu", "vllm_server_tensor_parallel_size",
          "vllm_server_data_parallel_size", "vllm_server_gpu_memory_utilization", "vllm_server_max_model_len"]


def _nothing(*_: Any) -> Any:
    return {}


def test_the_options_keep_their_order_and_their_kinds() -> None:
    assert option_order() == [*ORDER_BEFORE, *SERVER] and list(trainer_options()) == [*ORDER_BEFORE, *SERVER]
    kinds = option_kinds()
    assert kinds["beta"] == ("dpo", "grpo") and kinds["max_length"] == ("sft", "dpo")
    assert kinds["num_generations"] == ("grpo",) and kinds["packing"] == ("sft",)
    assert all(kinds[option.name] == ("sft", "dpo", "grpo") for option in COMMON_OPTIONS)
    assert [kind.cli.word for kind in cli_kinds() if kind.cli] == ["sft", "dpo", "grpo"]
    assert cli_kind("grpo").name == "GRPOTrainer"
    assert levers_asked() == {
        "precompute_ref": "--trainer dpo --lora 16 --try precompute_ref=off,on",
        "vllm_memory": "--trainer grpo --vllm-gpu-memory-utilization 0.3",
        "vllm_sleep": "--trainer grpo --vllm-gpu-memory-utilization 0.3 --vllm-enable-sleep-mode"}


def test_a_kind_listed_later_adds_its_options_where_it_says() -> None:
    question: Callable[[dict[str, Any]], CliWords] = lambda settings: CliWords("rows")  # noqa: E731
    toy = TrainerKind("ToyTrainer", "toy.", "ToyConfig", "toy", cli=TrainerCli(
        "toy", settings=_nothing, examples=_nothing, question=question,
        options=(CliOption("toy_rows", "TOY: rows", metavar="ROWS", example="4", before="lora"),
                 CliOption("toy_fast", "TOY: fast", value="flag"))))
    with declared(toy):
        order = option_order()
        # before --lora, where --beta is too: the kind listed last first
        assert order.index("toy_rows") == order.index("beta") - 1 == order.index("lora") - 2
        assert order[order.index("fp16") + 1] == "toy_fast" and option_kinds()["toy_rows"] == ("toy",)
        parser = argparse.ArgumentParser(prog="memlab estimate")
        add_trainer_arguments(parser)
        args = parser.parse_args(["--trainer", "toy", "--toy-rows", "8", "--toy-fast"])
        assert (args.trainer, args.toy_rows, args.toy_fast) == ("toy", 8, True)
        assert "ToyTrainer" in parser.format_help()
    assert "toy_rows" not in option_order()  # gone with the block
