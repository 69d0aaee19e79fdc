"""A DPOTrainer's ``precompute_ref`` lever (issue 59): ``Plan(precompute_ref=...)`` exports to a DPOConfig's
``precompute_ref_log_probs`` and reads back; the other exports say it belongs to DPOConfig; a model's own step
refuses it; the panel does not show it."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import memlab
from memlab import MemlabError, Plan
from memlab.frontends.levers import panel_lever_specs
from memlab.plan import LEVERS, parse_grid

trl = pytest.importorskip("trl")


def _config(tmp_path: Any, **kwargs: Any) -> Any:
    return trl.DPOConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, **kwargs)


@pytest.mark.parametrize("value", [True, False])
def test_a_dpoconfig_takes_the_lever_and_reads_it_back(tmp_path: Any, value: bool) -> None:
    plan = Plan(micro_batch=2, accumulation=2, precompute_ref=value)
    kwargs = plan.to_training_arguments(trl=trl.DPOConfig)
    assert kwargs["precompute_ref_log_probs"] is value
    back = Plan.from_training_arguments(_config(tmp_path, **kwargs))
    assert back.precompute_ref is (True if value else None)  # False is the config's default: the trainer's own
    assert Plan.from_training_arguments(_config(tmp_path)).precompute_ref is None
    assert "precompute_ref_log_probs" not in Plan(micro_batch=2).to_training_arguments(trl=trl.DPOConfig)


def test_other_exports_say_the_lever_belongs_to_dpoconfig() -> None:
    plan = Plan(micro_batch=2, precompute_ref=True)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        kwargs = plan.to_training_arguments()
    assert not any("precompute" in key for key in kwargs)
    assert any("plan.to_training_arguments(trl=trl.DPOConfig)" in str(w.message) for w in said)
    assert "plan.to_training_arguments(trl=trl.DPOConfig)" in plan.to_code()
    with pytest.raises(MemlabError, match="DPOConfig's precompute_ref_log_probs.*trl=True names no config class"):
        plan.to_training_arguments(trl=True)
    with pytest.raises(MemlabError, match="SFTConfig takes no precompute_ref_log_probs"):
        plan.to_training_arguments(trl=trl.SFTConfig)


def test_the_lever_labels_parses_and_is_hidden_from_the_panel() -> None:
    assert Plan().precompute_ref is None and Plan(precompute_ref=True).label() == "precompute-ref=True"
    assert LEVERS["precompute_ref"].choices == ("on", "off")
    assert parse_grid("precompute_ref=model,on") == [Plan(), Plan(precompute_ref=True)]
    with pytest.raises(MemlabError, match="write True or False"):
        Plan(precompute_ref="yes")
    assert "precompute_ref" in LEVERS and "precompute_ref" not in panel_lever_specs(Plan)


def test_a_models_own_step_refuses_it_before_anything_runs() -> None:
    model, batch = torch.nn.Linear(4, 1), torch.randn(8, 4)
    weights = model.weight.detach().clone()

    def loss(m: Any, b: Any) -> Any:
        return m(b).mean()

    calls = (lambda: memlab.measure(model, batch, Plan(precompute_ref=True), loss_fn=loss, steps=1, noise=0,
                                    progress=False),
             lambda: memlab.estimate(model, batch, Plan(precompute_ref=True), loss_fn=loss))
    for call in calls:
        with pytest.raises(MemlabError, match=r"has no DPOTrainer's reference.*trl=trl.DPOConfig"):
            call()
    assert torch.equal(model.weight, weights)
