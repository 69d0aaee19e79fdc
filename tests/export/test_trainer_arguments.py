"""``plan.to_training_arguments(trl=ConfigClass)`` (issue 59): keyword arguments the TRL config class itself takes,
so that ``DPOConfig(**kwargs)`` and ``GRPOConfig(**kwargs)`` build and read back as the plan; a lever the config has
no keyword for is one MemlabError saying what to write. No model runs here."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

trl = pytest.importorskip("trl")

import memlab  # noqa: E402
from memlab import MemlabError  # noqa: E402

PLANS = [
    memlab.Plan(micro_batch=2, accumulation=4),
    memlab.Plan(micro_batch=4, accumulation=2, checkpointing=True, optimizer="adamw8bit"),
    memlab.Plan(micro_batch=2, accumulation=1, checkpointing=True, offload="activations", optimizer="adafactor"),
]


def build(config: Any, plan: memlab.Plan, tmp_path: Any, spelling: Any) -> Any:
    kwargs = plan.to_training_arguments(trl=spelling)
    extra = {"num_generations": 2} if config is trl.GRPOConfig else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return config(output_dir=str(tmp_path), report_to=[], use_cpu=True, **extra, **kwargs)


@pytest.mark.parametrize("config", ["DPOConfig", "GRPOConfig"])
def test_a_plan_exports_to_its_trl_config_and_reads_back(tmp_path: Any, config: str) -> None:
    cls = getattr(trl, config)
    for plan in PLANS:
        for spelling in (cls, config):  # the class, or its name
            args = build(cls, plan, tmp_path, spelling)
            assert memlab.Plan.from_training_arguments(args) == plan, (config, plan.label())
    grpo = build(trl.GRPOConfig, PLANS[0], tmp_path, "GRPOConfig")  # one optimizer step's generations at once
    assert (grpo.generation_batch_size, grpo.steps_per_generation) == (8, 4)
    dpo = memlab.Plan(micro_batch=2, offload="activations").to_training_arguments(trl=trl.DPOConfig)
    assert dpo["activation_offloading"] is True  # DPOConfig has TRL's own activation offloading


def test_what_a_grpo_config_cannot_carry_is_refused_saying_what_to_write() -> None:
    with pytest.raises(MemlabError, match=r"GRPOConfig has no activation_offloading .* write checkpointing=True"):
        memlab.Plan(micro_batch=2, offload="activations").to_training_arguments(trl=trl.GRPOConfig)
    with pytest.raises(MemlabError, match=r"GRPOTrainer refuses Liger's fused linear cross-entropy .*loss='full'"):
        memlab.Plan(micro_batch=2, loss="chunked").to_training_arguments(trl="GRPOConfig")
    with pytest.raises(MemlabError, match=r"trl has no 'GRPOConfigs'; write a TRL config's name"):
        memlab.Plan().to_training_arguments(trl="GRPOConfigs")
    with pytest.raises(MemlabError, match=r"is not a config class; write trl=True"):
        memlab.Plan().to_training_arguments(trl=dict)
    # trl=True stays what it was: TRL's activation_offloading keyword, for the configs that have it.
    assert memlab.Plan(micro_batch=2).to_training_arguments(trl=True)["activation_offloading"] is False


@pytest.mark.parametrize("name", ["gradient_checkpointing", "activation_checkpointing"])
def test_checkpointing_keywords_that_are_no_dict_are_one_error_saying_what_to_write(name: str) -> None:
    from types import SimpleNamespace

    args = SimpleNamespace(**{name: True, f"{name}_kwargs": "use_reentrant=False"})
    with pytest.raises(MemlabError, match=f"{name}_kwargs='use_reentrant=False' is not a dict.*write for example"):
        memlab.Plan.from_training_arguments(args)

