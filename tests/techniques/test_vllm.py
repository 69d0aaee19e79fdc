"""The colocated vLLM engine's levers (issue 59): ``Plan(vllm_memory=..., vllm_sleep=...)`` export to a GRPOConfig's
keywords and read back; every other export says they belong to GRPOConfig; a step without an engine refuses them."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import memlab
from memlab import MemlabError, Plan
from memlab.plan import LEVERS, parse_grid

trl = pytest.importorskip("trl")


def _config(tmp_path: Any, **kwargs: Any) -> Any:
    return trl.GRPOConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, num_generations=2, **kwargs)


@pytest.mark.parametrize("levers", [dict(vllm_memory=0.2, vllm_sleep=True), dict(vllm_memory=0.45),
                                    dict(vllm_sleep=False)])
def test_a_grpoconfig_export_writes_the_engine_and_reads_back_the_same_plan(tmp_path: Any,
                                                                            levers: dict[str, Any]) -> None:
    plan = Plan(micro_batch=2, accumulation=2, precision="bf16", **levers)
    kwargs = plan.to_training_arguments(trl=trl.GRPOConfig)
    assert kwargs["use_vllm"] is True and kwargs["vllm_mode"] == "colocate"
    if "vllm_memory" in levers:
        assert kwargs["vllm_gpu_memory_utilization"] == levers["vllm_memory"]
    if "vllm_sleep" in levers:
        assert kwargs["vllm_enable_sleep_mode"] is levers["vllm_sleep"]
    config = _config(tmp_path, **kwargs)
    back = Plan.from_training_arguments(config)
    # A lever the plan left to the trainer reads back as the config's (TRL's default share 0.3, sleep off).
    assert back == plan.replace(vllm_memory=levers.get("vllm_memory", 0.3), vllm_sleep=levers.get("vllm_sleep", False))
    assert Plan.from_training_arguments(_config(tmp_path, **back.to_training_arguments(trl=trl.GRPOConfig))) == back


def test_a_config_without_a_colocated_engine_reads_as_none(tmp_path: Any) -> None:
    assert Plan.from_training_arguments(_config(tmp_path)).vllm_memory is None
    served = Plan.from_training_arguments(_config(tmp_path, use_vllm=True, vllm_mode="server"))
    assert (served.vllm_memory, served.vllm_sleep) == (None, None)
    assert "use_vllm" not in Plan(micro_batch=2).to_training_arguments(trl=trl.GRPOConfig)


def test_other_exports_say_the_levers_belong_to_grpoconfig() -> None:
    plan = Plan(micro_batch=2, vllm_memory=0.2, vllm_sleep=True)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        kwargs = plan.to_training_arguments()
    assert not any("vllm" in key for key in kwargs)
    assert any("plan.to_training_arguments(trl=trl.GRPOConfig)" in str(w.message) for w in said)
    assert "GRPOConfig" in plan.to_deepspeed()["_comment"]
    assert "plan.to_training_arguments(trl=trl.GRPOConfig)" in plan.to_code()
    with pytest.raises(MemlabError, match="trl=True names no config class"):
        plan.to_training_arguments(trl=True)
    with pytest.raises(MemlabError, match="DPOConfig takes no use_vllm"):
        plan.to_training_arguments(trl=trl.DPOConfig)


def test_values_labels_and_try_grids() -> None:
    assert Plan().vllm_memory is None and Plan().vllm_sleep is None
    assert Plan(vllm_memory=0).vllm_memory is None  # the panel's 0 (its number box cannot hold None)
    assert Plan(vllm_memory=0.2, vllm_sleep=False).label() == "vllm0.2 vllm-sleep=False"
    assert Plan(vllm_sleep=True).label() == "vllm-sleep=True"
    for bad, said in ((dict(vllm_memory=1.5), "write a value in (0, 1]"),
                      (dict(vllm_sleep="yes"), "write True or False"), (dict(vllm_memory="a lot"), "write a number")):
        with pytest.raises(MemlabError, match=said.replace("(", r"\(").replace("]", r"\]")):
            Plan(**bad)
    # A switch with None: front ends offer the trainer's own, on and off (the panel's drop-down, --try's words).
    assert LEVERS["vllm_memory"].type == "float" and LEVERS["vllm_sleep"].choices == ("on", "off")
    assert (Plan(vllm_sleep="on").vllm_sleep, Plan(vllm_sleep="off").vllm_sleep) == (True, False)
    assert parse_grid("vllm_sleep=model,on") == [Plan(), Plan(vllm_sleep=True)]
    grid = parse_grid("vllm_memory=0.1,0.2 vllm_sleep=on,off")
    assert {(plan.vllm_memory, plan.vllm_sleep) for plan in grid} == {(0.1, True), (0.1, False), (0.2, True),
                                                                         (0.2, False)}


def test_a_step_without_an_engine_refuses_them_before_anything_runs() -> None:
    model, batch = torch.nn.Linear(4, 1), torch.randn(8, 4)
    weights = model.weight.detach().clone()

    def loss(m: Any, b: Any) -> Any:
        return m(b).mean()

    calls = (lambda: memlab.measure(model, batch, Plan(vllm_sleep=True), loss_fn=loss, steps=1, noise=0,
                                    progress=False),
             lambda: memlab.compare(model, batch, [Plan(), Plan(vllm_memory=0.2)], loss_fn=loss, steps=1, noise=0,
                                    progress=False),
             lambda: memlab.estimate(model, batch, Plan(vllm_memory=0.2), loss_fn=loss),
             lambda: memlab.estimate(model, batch, Plan(vllm_memory=0.2), loss_fn=loss, gpus=2, strategy="fsdp2",
                                     gpu="H100-80GB"))
    for call in calls:
        with pytest.raises(MemlabError, match=r"sets a vLLM engine, and this step has none.*trl=trl.GRPOConfig"):
            call()
    assert torch.equal(model.weight, weights)
