"""``Plan(compile=...)`` as a lever: its field, label, ``--try`` value, conflict and every export (issue 60)."""

from __future__ import annotations

import pytest

from memlab import Plan
from memlab.errors import MemlabError
from memlab.plan import LEVERS, parse_grid
from memlab.techniques.compile import ESTIMATED_EAGER
from memlab.techniques.core.registry import REGISTRY, STEP_ORDER


def test_compile_is_a_bool_lever_labelled_and_tried() -> None:
    assert Plan().compile is False and LEVERS["compile"].type == "bool"
    assert Plan(compile=True).label() == "compiled"
    assert Plan(micro_batch=2, compile=True, precision="bf16").label() == "mb2x1 bf16 compiled"
    assert Plan(compile=True).describe() == "compile"
    assert [plan.compile for plan in parse_grid("compile=on,off")] == [True, False]
    assert STEP_ORDER[-1] == "compile"  # on the forward every other lever has changed
    with pytest.raises(MemlabError, match="compile='yes' is not allowed; write True or False"):
        Plan(compile="yes")


def test_compile_with_the_chunked_loss_is_refused_saying_what_to_write() -> None:
    with pytest.raises(MemlabError, match="write loss='full' .* or compile=False"):
        Plan(compile=True, loss="chunked")


def test_the_trainer_export_compiles_and_reads_back() -> None:
    from transformers import TrainingArguments

    kwargs = Plan(micro_batch=4, compile=True, precision="bf16").to_training_arguments()
    assert kwargs["torch_compile"] is True
    assert "torch_compile" not in Plan().to_training_arguments()
    args = TrainingArguments(output_dir="out", report_to=[], use_cpu=True, **kwargs)
    assert Plan.from_training_arguments(args) == Plan(micro_batch=4, compile=True, precision="bf16")


def test_the_code_export_compiles_the_model_after_the_other_model_lines() -> None:
    code = Plan(compile=True, checkpointing=True).to_code()
    assert "model.compile()" in code
    assert code.index("model.compile()") > code.index("gradient_checkpointing_enable")
    assert "compile()" not in Plan(checkpointing=True).to_code()


def test_the_accelerate_export_sets_its_dynamo_backend() -> None:
    for strategy in ("fsdp2", "zero2", "zero3"):
        config = Plan(compile=True).to_accelerate_config(gpus=2, strategy=strategy)
        assert config["dynamo_config"] == {"dynamo_backend": "INDUCTOR"}, strategy
        assert "dynamo_config" not in Plan().to_accelerate_config(gpus=2, strategy=strategy)


def test_deepspeed_says_where_compile_goes() -> None:
    config = Plan(compile=True).to_deepspeed()
    assert "torch_compile" in config.get("_comment", "")
    assert REGISTRY["compile"].refusal(Plan(compile=True), "deepspeed") == ""


def test_the_estimate_note_says_it_is_of_the_eager_step() -> None:
    assert "eager step" in ESTIMATED_EAGER
