"""optimizer="adamw_foreach": the AdamW a plain loop builds on CUDA, so that a user's own loop is estimated as it is.

Its update holds ``torch._foreach_sqrt`` of the second moments, a temporary as large as the trained weights, where
the fused AdamW (memlab's "adamw", the Trainer's default) holds none; a CPU run and a CUDA dry run both see it.
"""

from __future__ import annotations

import torch
from models import assert_same, fingerprint
from transformers import LlamaConfig, LlamaForCausalLM

import memlab
from memlab import Plan
from memlab.export import deepspeed_config, pytorch_code, training_arguments
from memlab.export.trainer_arguments import plan_from_training_arguments
from memlab.search.space import default_space, needs_at_least
from memlab.techniques.core.registry import REGISTRY
from memlab.techniques.optimizer import FOREACH_ON_CPU


def _config() -> LlamaConfig:
    # Wide enough that the weights outweigh a short batch's activations: the step's update is the peak.
    return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=256)


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids}


def _parameter_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _assert_one_temporary_more(fused: memlab.Trial, foreach: memlab.Trial, weights: int) -> None:
    assert fused.status == foreach.status == "ok", (fused.error, foreach.error)
    # Same state; the foreach update's square roots (counted under "other") come on top at its peak.
    assert foreach.breakdown["optimizer"] == fused.breakdown["optimizer"]
    assert foreach.breakdown["other"] >= weights
    # The fused plan's peak sits a little above its own step (in backward), so the gap is a little under the
    # temporaries' size.
    assert 0.95 * weights <= foreach.peak_bytes - fused.peak_bytes <= weights


def test_a_cuda_estimate_counts_the_foreach_update_s_temporaries() -> None:
    config, batch = _config(), _batch()
    fused, foreach = (memlab.estimate(config, batch, plan, device="cuda")
                      for plan in (Plan(), Plan(optimizer="adamw_foreach")))
    _assert_one_temporary_more(fused, foreach, _parameter_bytes(LlamaForCausalLM(config)))
    assert foreach.estimated and foreach.device.startswith("cuda")
    assert FOREACH_ON_CPU not in foreach.notes  # the dry run answers for CUDA, where foreach is the default


def test_a_cpu_run_holds_the_same_temporaries_and_leaves_the_model_as_it_was() -> None:
    torch.manual_seed(0)
    model, batch = LlamaForCausalLM(_config()), _batch()
    before = fingerprint(model)
    fused, foreach = memlab.compare(model, batch, [Plan(), Plan(optimizer="adamw_foreach")], steps=1, noise=0,
                                    progress=False).trials
    _assert_one_temporary_more(fused, foreach, _parameter_bytes(model))
    assert FOREACH_ON_CPU in foreach.notes
    assert_same(before, fingerprint(model))


def test_fit_never_searches_or_suggests_it_and_ranks_it_above_the_fused_adamw() -> None:
    for device in ("cpu", "cuda"):
        assert "adamw_foreach" not in default_space(8, device)["optimizer"]
    assert "adamw_foreach" not in REGISTRY["optimizer"].suggest
    # Named in a space, it is ruled out wherever the fused AdamW does not fit (same state, one temporary more).
    assert needs_at_least(Plan(optimizer="adamw_foreach"), Plan(), 4)
    assert not needs_at_least(Plan(), Plan(optimizer="adamw_foreach"), 4)


def test_its_exports_build_torch_s_foreach_adamw_and_the_trainer_s_name_reads_back() -> None:
    plan = Plan(micro_batch=2, accumulation=2, optimizer="adamw_foreach")
    arguments = training_arguments(plan, legacy_names=False)
    assert arguments["optim"] == "adamw_torch"  # torch's AdamW with its defaults: foreach on CUDA
    assert plan_from_training_arguments(type("Args", (), arguments)()) == plan
    code = pytorch_code(plan)
    assert "optimizer = torch.optim.AdamW(params, lr=lr, foreach=True)" in code
    compile(code, "<plan>", "exec")
    assert "torch.optim.AdamW (foreach=True)" in deepspeed_config(plan)["_comment"]
    assert "foreach=True" in pytorch_code(plan.replace(optimizer_in_backward=True, accumulation=1))
