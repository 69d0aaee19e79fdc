"""Every export of a plan with ``expandable_segments=True`` writes the line that sets them before CUDA starts
(DESIGN.md 2.4): the plain code as its first comments, the accelerate script as the lines that set the environment
before torch is imported (and the shell line for the launcher), DeepSpeed in its ``_comment``, the Trainer's
arguments in a warning; what the plan trains is exported as without them."""

from __future__ import annotations

import os
import warnings

import pytest

from memlab import Plan
from memlab.errors import MemlabWarning
from memlab.export.accelerate import accelerate_script
from memlab.live.device import ENVIRONMENT_LINE, PYTHON_LINE

PLAN = Plan(micro_batch=2, accumulation=4, checkpointing=True, precision="bf16", expandable_segments=True)
WITHOUT = PLAN.replace(expandable_segments=False)


def _before_torch(script: str) -> list[str]:
    lines = script.splitlines()
    return lines[: lines.index("import torch")]


def test_the_code_says_first_how_to_set_them() -> None:
    code = PLAN.to_code()
    head = _before_torch(code)
    assert f"#   {ENVIRONMENT_LINE}" in head and f"#   {PYTHON_LINE}" in head
    assert all(line.startswith("#") for line in head), "the snippet's model is on its GPU already: said, not set"
    assert ENVIRONMENT_LINE not in WITHOUT.to_code()
    plain = WITHOUT.to_code()
    assert code.splitlines()[len(head):] == plain.splitlines()[len(_before_torch(plain)):], "the same loop"
    compile(code, "<plan>", "exec")


@pytest.mark.parametrize("strategy", ["fsdp2", "fsdp1", "zero2", "zero3"])
def test_the_accelerate_script_sets_them_before_torch_and_the_launcher_line_says_so(
        strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    script = accelerate_script(PLAN, strategy=strategy)
    head = _before_torch(script)
    assert any(ENVIRONMENT_LINE in line for line in head)
    # set first, so that monkeypatch puts back its absence too (delenv of an absent name records nothing, and the
    # script's line would stay in this process's environment for the tests after)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "")
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    exec("\n".join(head), {})  # the script's own lines, run as it runs them
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert script.splitlines()[len(head):] == accelerate_script(WITHOUT, strategy=strategy).splitlines()[1:]
    assert "PYTORCH_CUDA_ALLOC_CONF" not in accelerate_script(WITHOUT, strategy=strategy)
    compile(script, "train.py", "exec")
    assert PLAN.to_accelerate_config(gpus=2, strategy=strategy) == WITHOUT.to_accelerate_config(gpus=2,
                                                                                                  strategy=strategy)


def test_deepspeed_says_the_line_in_its_comment() -> None:
    config = PLAN.to_deepspeed()
    assert ENVIRONMENT_LINE in config["_comment"]
    assert {k: v for k, v in config.items() if k != "_comment"} == {
        k: v for k, v in WITHOUT.to_deepspeed().items() if k != "_comment"}


def test_the_trainers_arguments_warn_with_the_line(recwarn: pytest.WarningsRecorder) -> None:
    with pytest.warns(MemlabWarning, match="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True") as caught:
        kwargs = PLAN.to_training_arguments()
    assert PYTHON_LINE in str(caught[0].message)
    with pytest.warns(MemlabWarning, match="expandable_segments:True"):
        trl_kwargs = PLAN.to_training_arguments(trl=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MemlabWarning)
        assert kwargs == WITHOUT.to_training_arguments() and trl_kwargs == WITHOUT.to_training_arguments(trl=True)


def test_peft_config_is_the_adapters_alone() -> None:
    lora = Plan(adapter="lora", expandable_segments=True)
    assert lora.to_peft_config() == lora.replace(expandable_segments=False).to_peft_config()
