"""memlab.trainer.source.accelerate_outputs_fp32: accelerate's fp32-output wrapper on a model's forward for one
call under mixed precision, put back after (also on error), the model's own instance forward kept."""

from __future__ import annotations

from types import MethodType
from typing import Any

import pytest
import torch
from torch import nn

pytest.importorskip("accelerate")
from accelerate.utils import convert_outputs_to_fp32  # noqa: E402

from memlab.trainer.source import accelerate_outputs_fp32  # noqa: E402


def bf16() -> Any:
    return torch.autocast("cpu", dtype=torch.bfloat16)


def test_outputs_copied_to_fp32_under_autocast_and_forward_put_back() -> None:
    model = nn.Linear(4, 4)
    with bf16():
        assert model(torch.ones(1, 4)).dtype == torch.bfloat16
        with accelerate_outputs_fp32(model):
            assert model(torch.ones(1, 4)).dtype == torch.float32
    assert "forward" not in vars(model)


def test_no_wrapper_without_autocast() -> None:
    model = nn.Linear(4, 4)
    with accelerate_outputs_fp32(model):
        assert "forward" not in vars(model)
        assert model(torch.ones(1, 4)).dtype == torch.float32


def test_own_instance_forward_kept_under_the_wrapper_and_put_back_on_error() -> None:
    model = nn.Linear(4, 4)
    calls: list[int] = []

    def own(x: torch.Tensor) -> torch.Tensor:  # an instance forward, as memlab's compile lever puts one
        calls.append(1)
        return nn.Linear.forward(model, x)

    model.forward = own  # type: ignore[method-assign]
    with pytest.raises(ValueError), bf16(), accelerate_outputs_fp32(model):
        assert model(torch.ones(1, 4)).dtype == torch.float32 and calls == [1]
        raise ValueError("a failing step")
    assert vars(model)["forward"] is own


@pytest.mark.parametrize("bound", [False, True])
def test_a_forward_accelerate_already_wraps_is_left_alone(bound: bool) -> None:
    model = nn.Linear(4, 4)
    # accelerate's prepare_model: a bound method re-bound around its function, anything else wrapped as is
    prepared = (MethodType(convert_outputs_to_fp32(model.forward.__func__), model) if bound
                else convert_outputs_to_fp32(model.forward))
    model.forward = prepared  # type: ignore[method-assign]
    with bf16(), accelerate_outputs_fp32(model):
        assert vars(model)["forward"] is prepared
    assert vars(model)["forward"] is prepared
