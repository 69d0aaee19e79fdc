"""Plan validation, labels, parse_budget, format_bytes and parse_grid (pure logic, no torch)."""

from __future__ import annotations

import re

import pytest

from memlab.errors import MemlabError
from memlab.plan import OFFLOADS, OPTIMIZERS, PLAN_FIELDS, PRECISIONS, Plan, format_bytes, parse_budget, parse_grid

# --- Plan --------------------------------------------------------------------------------------------------------


def test_default_plan_is_plain_and_hashable() -> None:
    plan = Plan()
    assert (plan.micro_batch, plan.accumulation, plan.checkpointing) == (None, 1, False)
    assert (plan.precision, plan.optimizer, plan.offload) == ("fp32", "adamw", "none")
    assert plan.label() == "plain"
    assert {plan, Plan()} == {Plan()}
    assert (plan.weights, plan.adapter, plan.lora_rank, plan.loss) == ("fp32", "none", 16, "full")
    assert PLAN_FIELDS == (
        "micro_batch", "accumulation", "checkpointing", "precision", "weights", "optimizer", "offload", "adapter",
        "lora_rank", "lora_targets", "lora_alpha", "lora_dropout", "loss", "optimizer_in_backward", "attention",
        "expandable_segments",
        "compile", "fp8", "vllm_memory", "vllm_sleep", "precompute_ref",
    )


def test_fine_tuning_levers_label_validate_and_keep_grids_free_of_duplicates() -> None:
    assert Plan(weights="bf16").label() == "bf16-weights"
    assert Plan(adapter="lora").label() == "lora"
    assert Plan(adapter="qlora", lora_rank=8, precision="bf16").label() == "bf16 qlora r8"
    # Without an adapter the rank means nothing: one plan, one label.
    assert Plan(lora_rank=8) == Plan() and Plan(lora_rank=8).label() == "plain"
    with pytest.raises(MemlabError, match="lora_rank=0 is not allowed; write a whole number >= 1"):
        Plan(adapter="lora", lora_rank=0)
    with pytest.raises(MemlabError, match="adapter='dora' is not known; write one of none, lora, qlora"):
        Plan(adapter="dora")
    with pytest.raises(MemlabError, match="weights='fp16' is not known; write one of fp32, bf16"):
        Plan(weights="fp16")


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("offload", OFFLOADS)
def test_every_known_setting_is_accepted(precision: str, optimizer: str, offload: str) -> None:
    plan = Plan(
        micro_batch=2, accumulation=3, checkpointing=True, precision=precision, optimizer=optimizer, offload=offload
    )
    assert plan.rows_per_step(100) == 6


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"micro_batch": 0}, "micro_batch=0"),
        ({"micro_batch": -1}, "micro_batch=-1"),
        ({"micro_batch": 2.0}, "micro_batch=2.0"),
        ({"micro_batch": True}, "micro_batch=True"),
        ({"micro_batch": "4"}, "micro_batch='4'"),
        ({"accumulation": 0}, "accumulation=0"),
        ({"accumulation": None}, "accumulation=None"),
        ({"accumulation": False}, "accumulation=False"),
        ({"checkpointing": "on"}, "checkpointing='on'"),
        ({"checkpointing": -1}, "checkpointing=-1"),  # a count of blocks (1 is one block) is allowed
        ({"precision": "fp8"}, "precision='fp8'"),
        ({"precision": "BF16"}, "precision='BF16'"),
        ({"optimizer": "sgd"}, "optimizer='sgd'"),
        ({"offload": "gpu"}, "offload='gpu'"),
    ],
)
def test_bad_settings_raise_memlab_error_that_says_what_to_write(changes: dict, fragment: str) -> None:
    with pytest.raises(MemlabError, match="write") as info:
        Plan(**changes)
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_unknown_setting_lists_the_known_ones() -> None:
    with pytest.raises(MemlabError, match="fp32, bf16, fp16"):
        Plan(precision="half")


def test_replace_validates_and_keeps_the_original() -> None:
    plan = Plan(micro_batch=4)
    assert plan.replace(accumulation=2) == Plan(micro_batch=4, accumulation=2)
    assert plan.accumulation == 1
    with pytest.raises(MemlabError):
        plan.replace(accumulation=0)


def test_plan_is_frozen() -> None:
    with pytest.raises(AttributeError):
        Plan().accumulation = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("offload", "optimizer_side", "activation_side"),
    [("none", False, False), ("optimizer", True, False), ("activations", False, True), ("all", True, True)],
)
def test_offload_properties(offload: str, optimizer_side: bool, activation_side: bool) -> None:
    plan = Plan(offload=offload)
    assert plan.offloads_optimizer is optimizer_side
    assert plan.offloads_activations is activation_side


def test_rows_per_step_defaults_micro_batch_to_the_batch() -> None:
    assert Plan().rows_per_step(8) == 8
    assert Plan(accumulation=4).rows_per_step(8) == 32
    assert Plan(micro_batch=2, accumulation=4).rows_per_step(8) == 8
    assert Plan(micro_batch=16).rows_per_step(8) == 16


@pytest.mark.parametrize(
    ("plan", "label"),
    [
        (Plan(), "plain"),
        (Plan(micro_batch=2, accumulation=4, precision="bf16"), "mb2x4 bf16"),
        (Plan(micro_batch=4), "mb4x1"),
        (Plan(accumulation=2), "accum2"),
        (Plan(checkpointing=True), "ckpt"),
        (Plan(precision="fp16", optimizer="adamw8bit"), "fp16 adamw8bit"),
        (Plan(offload="optimizer"), "offload-optimizer"),
        (
            Plan(
                micro_batch=1,
                accumulation=8,
                checkpointing=True,
                precision="fp16",
                optimizer="adamw8bit",
                offload="all",
            ),
            "mb1x8 ckpt fp16 adamw8bit offload-all",
        ),
    ],
)
def test_label_shows_only_what_differs_from_plain(plan: Plan, label: str) -> None:
    assert plan.label() == label


def test_labels_of_distinct_plans_differ() -> None:
    plans = parse_grid(
        [
            "micro_batch=all,1,2",
            "accumulation=1,2",
            "checkpointing=off,on",
            "precision=fp32,bf16,fp16",
            "optimizer=adamw,adamw8bit",
            "offload=none,optimizer,activations,all",
        ]
    )
    assert len(plans) == 3 * 2 * 2 * 3 * 2 * 4
    assert len({plan.label() for plan in plans}) == len(plans)


# --- parse_budget ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, None),
        (1000, 1000),
        ("1000B", 1000),
        ("8GiB", 8 * 1024**3),
        ("8 GiB", 8 * 1024**3),
        ("8gib", 8 * 1024**3),
        ("8G", 8 * 1024**3),
        ("8GB", 8 * 10**9),
        ("500MB", 500 * 10**6),
        ("500MiB", 500 * 1024**2),
        ("500M", 500 * 1024**2),
        ("1.5G", 1610612736),
        ("64KiB", 65536),
        ("64K", 65536),
        ("64KB", 64000),
        ("2TiB", 2 * 1024**4),
        ("1TB", 10**12),
        (" 2 GiB ", 2 * 1024**3),
        (2.5e9, 2_500_000_000),
    ],
)
def test_parse_budget_reads_sizes(text: int | float | str | None, expected: int | None) -> None:
    assert parse_budget(text) == expected  # type: ignore[arg-type]  # a float (2.5e9) is read too


@pytest.mark.parametrize("text", ["lots", "8 GiBs", "GiB", "-1GiB", "8 PB", "1e9", "", "8 G B"])
def test_parse_budget_rejects_what_it_cannot_read(text: str) -> None:
    with pytest.raises(MemlabError, match="8GiB"):
        parse_budget(text)


@pytest.mark.parametrize("value", [0, -5, "0GiB", 0.0, -1.0, "0.5B"])
def test_parse_budget_rejects_non_positive(value: int | float | str) -> None:
    with pytest.raises(MemlabError, match="not positive"):
        parse_budget(value)


@pytest.mark.parametrize("text", ["1.5", "24", " 8 "])
def test_a_size_without_a_unit_asks_for_one(text: str) -> None:
    with pytest.raises(MemlabError, match="has no unit; write the unit"):
        parse_budget(text)


@pytest.mark.parametrize(
    ("text", "suggestion"),
    [
        ("25769803776", "24GiB"),  # bytes: the size it most likely means, not "25769803776GiB"
        ("1610612736", "1.5GiB"),
        ("81920", "80GiB"),  # MiB, as nvidia-smi prints it
        ("24", "24GiB"),
    ],
)
def test_a_number_without_a_unit_suggests_the_size_it_likely_means(text: str, suggestion: str) -> None:
    with pytest.raises(MemlabError, match="has no unit") as error:
        parse_budget(text)
    message = str(error.value)
    assert re.search(rf"\b{re.escape(suggestion)}\b", message), message
    assert f"{text}GiB" not in message or text == "24", message
    if int(text) >= 1024:
        assert f"{text}B for bytes" in message, message


def test_a_misspelt_plan_setting_is_a_memlab_error() -> None:
    with pytest.raises(MemlabError, match="'micro_batch_size' is not a plan setting; did you mean micro_batch\\?"):
        Plan(micro_batch_size=2)  # type: ignore[call-arg]
    with pytest.raises(MemlabError, match="at most"):
        Plan(*[None] * len(PLAN_FIELDS), "extra")  # one more than the plan's settings
    assert Plan(2, 4) == Plan(micro_batch=2, accumulation=4)


def test_parse_budget_rejects_bool() -> None:
    with pytest.raises(MemlabError, match="budget="):
        parse_budget(True)


def test_parse_budget_rejects_a_fraction_of_a_byte() -> None:
    with pytest.raises(MemlabError):
        parse_budget(0.5)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_parse_budget_rejects_nan_and_inf_with_memlab_error(value: float) -> None:
    with pytest.raises(MemlabError):
        parse_budget(value)


# --- format_bytes ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "-"),
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (5 * 1024**2, "5.0 MiB"),
        (3 * 1024**3, "3.00 GiB"),
        (1.25 * 1024**3, "1.25 GiB"),
        (2 * 1024**4, "2.00 TiB"),
        (-2048, "-2.0 KiB"),
    ],
)
def test_format_bytes(value: float | None, text: str) -> None:
    assert format_bytes(value) == text


def test_format_bytes_round_trips_through_parse_budget_closely() -> None:
    for size in (1024, 3 * 1024**2, 7 * 1024**3):
        assert parse_budget(format_bytes(size).replace(" ", "")) == size


# --- parse_grid --------------------------------------------------------------------------------------------------


def test_parse_grid_in_the_given_order() -> None:
    plans = parse_grid(["precision=fp32,bf16", "checkpointing=off,on"])
    assert [p.label() for p in plans] == ["plain", "ckpt", "bf16", "ckpt bf16"]


def test_parse_grid_values_are_parsed_per_field() -> None:
    plans = parse_grid(["micro_batch=all,4", "accumulation=2", "checkpointing=yes", "offload=all"])
    assert plans == [
        Plan(micro_batch=None, accumulation=2, checkpointing=True, offload="all"),
        Plan(micro_batch=4, accumulation=2, checkpointing=True, offload="all"),
    ]


@pytest.mark.parametrize("word", ["on", "ON", "true", "yes", "all"])
def test_parse_grid_true_words(word: str) -> None:
    assert parse_grid([f"checkpointing={word}"]) == [Plan(checkpointing=True)]


def test_a_number_of_blocks_is_a_count_not_a_switch() -> None:
    assert [plan.checkpointing for plan in parse_grid(["checkpointing=1,8"])] == [1, 8]


@pytest.mark.parametrize("word", ["off", "false", "no", "0"])
def test_parse_grid_false_words(word: str) -> None:
    assert parse_grid([f"checkpointing={word}"]) == [Plan()]


def test_parse_grid_accepts_dashes_spaces_and_a_base() -> None:
    base = Plan(precision="bf16")
    plans = parse_grid([" micro-batch = 2, 4 "], base=base)
    assert plans == [Plan(micro_batch=2, precision="bf16"), Plan(micro_batch=4, precision="bf16")]


def test_parse_grid_from_a_mapping_takes_values_as_they_are() -> None:
    plans = parse_grid({"checkpointing": [False, True], "micro_batch": [None, 2]})
    assert plans == [Plan(), Plan(micro_batch=2), Plan(checkpointing=True), Plan(checkpointing=True, micro_batch=2)]


def test_parse_grid_drops_duplicates_and_defaults_to_the_base() -> None:
    assert parse_grid(["precision=bf16,bf16,fp32"]) == [Plan(precision="bf16"), Plan()]
    assert parse_grid([]) == [Plan()]
    assert parse_grid([], base=Plan(accumulation=2)) == [Plan(accumulation=2)]


@pytest.mark.parametrize(
    ("items", "match"),
    [
        (["precision"], "KEY=V1,V2"),
        (["precision="], "KEY=V1,V2"),
        (["speed=fast"], "not a plan setting"),
        (["precision=fp32", "precision=bf16"], "given twice"),
        (["checkpointing=maybe"], "off, all, or a number of blocks"),
        (["micro_batch=two"], "whole number"),
        (["accumulation=all"], "whole number"),
        (["precision=fp8"], "precision='fp8'"),
        (["accumulation=0"], "accumulation=0"),
    ],
)
def test_parse_grid_errors_say_what_to_write(items: list[str], match: str) -> None:
    with pytest.raises(MemlabError, match=match):
        parse_grid(items)


def test_parse_grid_mapping_rejects_unknown_fields() -> None:
    with pytest.raises(MemlabError, match="not a plan setting"):
        parse_grid({"speed": ["fast"]})


def test_parse_grid_rejects_an_item_with_only_commas() -> None:
    with pytest.raises(MemlabError):
        parse_grid(["precision=,"])


def test_parse_grid_accepts_a_single_item_string() -> None:
    assert parse_grid("precision=fp32,bf16") == [Plan(), Plan(precision="bf16")]


def test_parse_grid_mapping_with_a_single_str_value() -> None:
    assert parse_grid({"precision": "bf16"}) == [Plan(precision="bf16")]
