"""Issue 48: a model whose layers repeat is dry-run at three layers and two, and the three carried to its depth
(memlab.estimation.depth.carry): the estimate must be the dry run of every layer's, field for field, with the same
timeline; where the step does not repeat layer by layer, every layer is dry-run instead, and the estimate is the
same again."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pytest
import torch
import transformers

import memlab.estimation.dryrun.single_gpu as single_gpu
from memlab import Plan
from memlab.estimation.configs import meta_model
from memlab.estimation.depth import carry as depth
from memlab.estimation.depth.carry import shallow_model

LAYERS = 5
SHAPES = {"input_ids": (2, 16), "labels": (2, 16)}
SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS, num_attention_heads=2,
             num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)


def _estimate(config: Any, plan: Plan, monkeypatch: pytest.MonkeyPatch, *, whole: bool = False,
              device: str = "cuda", **keywords: Any) -> tuple[Any, list[bool]]:
    """The estimate of ``plan``, and for each plan whether it was carried from three layers (empty: not tried)."""
    with monkeypatch.context() as patch:
        carried = counting_carried(patch)
        if whole:
            patch.setattr(single_gpu, "shallow_model", lambda _: None)
        trial = single_gpu.estimate_plans(config, SHAPES, [plan], device=device, budget="1GiB", **keywords)[0]
    return trial, carried


def counting_carried(patch: pytest.MonkeyPatch) -> list[bool]:
    """A list that gets, for each plan the dry run estimates under ``patch``, whether it was carried from three
    layers (:func:`memlab.estimation.depth.carry.carried_trial` gave a trial)."""
    carried: list[bool] = []
    real = depth.carried_trial

    def told(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        carried.append(result is not None)
        return result

    patch.setattr(single_gpu, "carried_trial", told)
    return carried


def _assert_same_estimate(carried: Any, whole: Any, *, series: bool = True) -> None:
    for field in dataclasses.fields(whole):
        if field.name != "timeline":
            assert getattr(carried, field.name) == getattr(whole, field.name), field.name
    assert carried.timeline.peak == whole.timeline.peak
    assert carried.timeline.phases == whole.timeline.phases
    if series:
        assert (carried.timeline.x, carried.timeline.series) == (whole.timeline.x, whole.timeline.series)


FAMILIES = {
    "llama": lambda: transformers.LlamaConfig(**SMALL),
    "gpt2": lambda: transformers.GPT2Config(n_layer=LAYERS, n_embd=32, n_head=2, vocab_size=128, n_positions=64,
                                            bos_token_id=0, eos_token_id=0),
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(**SMALL, head_dim=16, num_experts=4, num_experts_per_tok=2,
                                                     moe_intermediate_size=32),
    "phi": lambda: transformers.PhiConfig(**SMALL),
    "falcon": lambda: transformers.FalconConfig(num_hidden_layers=LAYERS, hidden_size=32, num_attention_heads=2,
                                                vocab_size=128, bos_token_id=0, eos_token_id=0),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_is_carried_to_the_estimate_of_every_layer(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    carried, tried = _estimate(FAMILIES[family](), Plan(), monkeypatch)
    whole, _ = _estimate(FAMILIES[family](), Plan(), monkeypatch, whole=True)
    assert tried == [True]
    assert carried.status == "ok" and carried.reserved_bytes is not None
    _assert_same_estimate(carried, whole)


LEVERS = {
    "checkpointing": Plan(checkpointing=True),
    "pure bf16": Plan(precision="bf16", weights="bf16"),
    "fp16": Plan(precision="fp16"),
    "lora": Plan(precision="bf16", weights="bf16", adapter="lora"),
    "micro-batches": Plan(micro_batch=1, accumulation=2),
    "chunked loss": Plan(loss="chunked"),
    "optimizer offload": Plan(offload="optimizer"),
    "activation offload": Plan(offload="activations"),
    "all offload": Plan(offload="all"),
    "optimizer in backward": Plan(optimizer_in_backward=True),
    "foreach adamw": Plan(optimizer="adamw_foreach"),
}


@pytest.mark.parametrize("lever", list(LEVERS))
def test_each_lever_is_carried_to_the_estimate_of_every_layer(lever: str, monkeypatch: pytest.MonkeyPatch) -> None:
    config = transformers.LlamaConfig(**SMALL)
    carried, tried = _estimate(config, LEVERS[lever], monkeypatch)
    whole, _ = _estimate(config, LEVERS[lever], monkeypatch, whole=True)
    assert tried == [True]
    _assert_same_estimate(carried, whole)


def test_qlora_is_carried_to_the_estimate_of_every_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same numbers; the timeline's points may differ where frees that follow each other come in another order
    (their order comes from Python's collection of peft's objects, and differs from one whole dry run to the
    next), so its peak and phases are compared, not every point."""
    config = transformers.LlamaConfig(**SMALL)
    plan = Plan(adapter="qlora", precision="bf16")
    carried, tried = _estimate(config, plan, monkeypatch)
    whole, _ = _estimate(config, plan, monkeypatch, whole=True)
    assert tried == [True]
    _assert_same_estimate(carried, whole, series=False)


@pytest.mark.slow
def test_mixed_precision_with_checkpointing_is_carried_to_the_estimate_of_every_layer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The most common plan: checkpointing keeps autocast's bf16 copies of the weights out of the saved tensors, so
    they are freed together as the forward's autocast ends, in the order of autocast's cache (a hash map of the
    weights' addresses): every layer's mixed with the others'. The numbers are a whole dry run's; the timeline's
    points within that batch of frees come in the cache's order, which differs from one whole dry run to the next,
    so its peak and phases are compared."""
    config = transformers.LlamaConfig(**SMALL)
    for plan in (Plan(precision="bf16", checkpointing=True), Plan(precision="fp16", checkpointing=True),
                 Plan(precision="bf16", checkpointing=True, adapter="lora")):
        carried, tried = _estimate(config, plan, monkeypatch)
        whole, _ = _estimate(config, plan, monkeypatch, whole=True)
        assert tried == [True], plan.label()
        _assert_same_estimate(carried, whole, series=False)


def _call_checkpointed(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """transformers 5.17's ``GradientCheckpointingLayer.__call__`` (5.24 checkpoints ``forward``), on torch 2.11's
    checkpoint: the checkpoint wraps the layer's whole call, so what it makes first (torch 2.11: an empty tensor
    that needs a gradient, and another that keeps the inputs; torch 2.13 makes none) is made in the runner, before
    the layer's hooks say it runs."""
    if self.gradient_checkpointing and self.training:
        made = torch.empty((0,), requires_grad=True), torch.empty((0,))  # noqa: F841 - torch 2.11's, as it makes them
        return self._gradient_checkpointing_func(functools.partial(torch.nn.Module.__call__, self, **kwargs), *args)
    return torch.nn.Module.__call__(self, *args, **kwargs)


@pytest.mark.parametrize("plan", [Plan(checkpointing=True), Plan(precision="bf16", checkpointing=True)],
                         ids=["checkpointing", "bf16 checkpointing"])
def test_checkpointing_that_wraps_each_layers_call_is_carried(plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tensors the checkpoint makes in the runner before a layer runs are that layer's, not the one before's:
    with transformers 5.17's checkpointing (played here on any release) the layers 1 and 2 of the three-layer run
    are alike, and the plan is carried to a whole dry run's estimate."""
    from transformers.modeling_layers import GradientCheckpointingLayer
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    forward = LlamaDecoderLayer.forward
    if forward.__code__.co_name == "forward_with_checkpointing":  # 5.24's wrapper around the layer's forward
        monkeypatch.setattr(LlamaDecoderLayer, "forward", forward.__wrapped__)  # type: ignore[attr-defined]
    monkeypatch.setattr(GradientCheckpointingLayer, "__call__", _call_checkpointed)
    config = transformers.LlamaConfig(**SMALL)
    carried, tried = _estimate(config, plan, monkeypatch)
    whole, _ = _estimate(config, plan, monkeypatch, whole=True)
    assert tried == [True], plan.label()
    # autocast's casts are freed in its cache's order (test_mixed_precision_with_checkpointing_...): peak and phases
    _assert_same_estimate(carried, whole, series=plan.precision == "fp32")


def test_a_cpu_estimate_is_carried_too(monkeypatch: pytest.MonkeyPatch) -> None:
    config = transformers.LlamaConfig(**SMALL)
    carried, tried = _estimate(config, Plan(), monkeypatch, device="cpu")
    whole, _ = _estimate(config, Plan(), monkeypatch, device="cpu", whole=True)
    assert tried == [True] and carried.reserved_bytes is None
    _assert_same_estimate(carried, whole)


def _loss_that_touches_every_parameter(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    # Outside every layer, one small tensor per parameter: work that grows with the depth and is no layer's.
    return model(**batch).loss + sum(parameter.sum() for parameter in model.parameters()) * 0


def test_a_step_that_grows_with_the_depth_outside_the_layers_is_dry_run_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    config = transformers.LlamaConfig(**SMALL)
    carried, tried = _estimate(config, Plan(), monkeypatch, loss_fn=_loss_that_touches_every_parameter)
    whole, _ = _estimate(config, Plan(), monkeypatch, whole=True, loss_fn=_loss_that_touches_every_parameter)
    assert tried == [False]
    _assert_same_estimate(carried, whole)


def test_a_plan_that_checkpoints_some_blocks_is_dry_run_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    config = transformers.LlamaConfig(**SMALL)
    trial, tried = _estimate(config, Plan(checkpointing=2), monkeypatch)
    assert tried == [] and trial.status == "ok"
    assert any("checkpointing 2 of 5 blocks" in note for note in trial.notes), trial.notes


def test_adapters_on_some_blocks_named_by_index_are_dry_run_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every block of the three- and two-layer runs matches targets that name blocks 0 to 2, and the two runs agree:
    carried, all five blocks would be adapted (a larger peak than the model's, where blocks 3 and 4 have none)."""
    config = transformers.LlamaConfig(**SMALL)
    targets = tuple(f"layers.{index}.self_attn.{name}" for index in range(3) for name in ("q_proj", "v_proj"))
    plan = Plan(adapter="lora", precision="bf16", lora_targets=targets)
    trial, tried = _estimate(config, plan, monkeypatch)
    whole, _ = _estimate(config, plan, monkeypatch, whole=True)
    assert tried == [] and trial.status == "ok"
    _assert_same_estimate(trial, whole)
    everywhere, tried = _estimate(config, plan.replace(lora_targets=("q_proj", "v_proj")), monkeypatch)
    assert tried == [True] and everywhere.peak_bytes > whole.peak_bytes


def test_the_repeated_layers_are_found_where_they_are_one_block() -> None:
    llama = shallow_model(transformers.LlamaConfig(**SMALL))
    gpt2 = shallow_model(FAMILIES["gpt2"]())
    assert llama is not None and gpt2 is not None
    assert (llama.paths.container, llama.paths.runner, llama.depth) == ("model.layers", "model", LAYERS)
    assert (gpt2.paths.container, gpt2.paths.runner) == ("transformer.h", "transformer")
    layers = [shallow.with_layers(number).num_hidden_layers for shallow in (llama, gpt2) for number in (3, 2)]
    assert layers == [3, 2] * 2


def test_layers_that_differ_are_not_carried() -> None:
    """Sliding-window and full attention alternating (Gemma 2), a sliding window on the first layers only (Qwen 2),
    dense layers before mixture-of-experts ones (DeepSeek V3), three layers or fewer, and a live model."""
    sliding = dict(SMALL, use_sliding_window=True, sliding_window=8, max_window_layers=2)
    assert shallow_model(transformers.Gemma2Config(**SMALL, head_dim=16)) is None
    assert shallow_model(transformers.Qwen2Config(**sliding)) is None
    assert shallow_model(transformers.DeepseekV3Config(
        **SMALL, first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, n_group=1,
        topk_group=1)) is None
    assert shallow_model(transformers.LlamaConfig(**dict(SMALL, num_hidden_layers=3))) is None
    assert shallow_model(torch.nn.Linear(2, 2)) is None


def test_a_config_asked_again_after_a_change_is_looked_at_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its per-layer settings, and its attention implementation (which ``to_dict`` leaves out)."""
    config = transformers.LlamaConfig(**SMALL)
    assert shallow_model(config) is not None
    config._attn_implementation = "eager"
    carried, tried = _estimate(config, Plan(), monkeypatch)
    whole, _ = _estimate(config, Plan(), monkeypatch, whole=True)
    assert tried == [True]
    _assert_same_estimate(carried, whole)
    config.layer_types = ["full_attention"] * (LAYERS - 1) + ["sliding_attention"]
    assert shallow_model(config) is None


def test_memlabs_meta_model_is_carried_as_it_is_and_a_changed_one_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the command line hands a search (``--max-tokens``) and a sharded adapter estimate: memlab's own meta
    model of a config, estimated in fp32 as it is, not as the config's bf16 checkpoint would load."""
    config = transformers.LlamaConfig(**SMALL, dtype="bfloat16")
    carried, tried = _estimate(meta_model(config), Plan(), monkeypatch)
    whole, _ = _estimate(meta_model(config), Plan(), monkeypatch, whole=True)
    assert tried == [True]
    _assert_same_estimate(carried, whole)
    changed = meta_model(config)
    changed.model.layers[LAYERS - 1].mlp.act_fn = torch.nn.GELU()  # no tensor of its own: its class tells
    _, tried = _estimate(changed, Plan(), monkeypatch)
    assert tried == []
