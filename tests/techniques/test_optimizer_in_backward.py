"""optimizer_in_backward: each weight steps in its own post-accumulate-grad hook, so gradients never all exist."""

from __future__ import annotations

import copy

import pytest
import torch
from models import assert_same, fingerprint, lm_batch, mlp_batch, mlp_loss, tiny_llama, tiny_mlp

import memlab
from memlab.errors import MemlabError
from memlab.plan import Plan, parse_grid
from memlab.search.memory import MemoryModel
from memlab.search.space import candidate_plans, needs_at_least
from memlab.techniques.core.registry import REGISTRY, refusals
from memlab.techniques.optimizer_in_backward import OptimizerInBackward

IN_BACKWARD = Plan(optimizer_in_backward=True)


def _grad_bytes(model: torch.nn.Module) -> tuple[int, int]:
    sizes = [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]
    return sum(sizes), max(sizes)


def test_measured_peak_and_grads_drop_to_about_the_largest_gradient() -> None:
    model = tiny_mlp(blocks=4, width=64)
    batch = mlp_batch(rows=4, width=64)
    before = fingerprint(model)
    plain, in_backward = memlab.compare(
        model, batch, [Plan(), IN_BACKWARD], loss_fn=mlp_loss, steps=1, noise=0, progress=False
    ).trials
    assert plain.status == in_backward.status == "ok"
    assert in_backward.label == "opt-in-bwd"
    total, largest = _grad_bytes(model)
    assert in_backward.peak_bytes < plain.peak_bytes
    assert in_backward.breakdown["grads"] <= largest
    # Plain's peak comes as the last gradient (the first layer's, the largest) is being made: all the others exist.
    assert plain.breakdown["grads"] - in_backward.breakdown["grads"] == pytest.approx(total - largest, rel=0.05)
    # The model comes back bit-exact: weights, grads, hooks (the post-accumulate-grad ones included).
    assert_same(before, fingerprint(model))
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())


@pytest.mark.parametrize("optimizer", ["adamw", "adafactor"])
def test_one_step_updates_the_weights_as_the_plain_step_does(optimizer: str) -> None:
    model = tiny_llama(layers=1)
    twin = copy.deepcopy(model)
    batch = lm_batch(rows=2, length=8)
    with memlab.apply(model, Plan(optimizer=optimizer), lr=1e-2) as plain:
        plain_loss = plain.step(batch)
    with memlab.apply(twin, Plan(optimizer=optimizer, optimizer_in_backward=True), lr=1e-2) as in_backward:
        assert isinstance(in_backward.optimizer, OptimizerInBackward)
        assert in_backward_loss_is(in_backward.step(batch), plain_loss)
        assert all(p.grad is None for p in twin.parameters())
    for (name, expected), (_, got) in zip(model.named_parameters(), twin.named_parameters(), strict=True):
        torch.testing.assert_close(got, expected, msg=name)
    assert all(not p._post_accumulate_grad_hooks for p in twin.parameters())


def in_backward_loss_is(loss: float, expected: float) -> bool:
    return abs(loss - expected) <= 1e-6 * max(1.0, abs(expected))


# The per-parameter optimizers step in backward, never through the wrapper's step(): torch's scheduler says so once.
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_a_scheduler_drives_every_per_parameter_optimizer_and_state_round_trips() -> None:
    model = tiny_mlp(blocks=1, width=8)
    batch = mlp_batch(rows=4, width=8)
    with memlab.apply(model, IN_BACKWARD, loss_fn=mlp_loss, lr=1e-2) as applied:
        optimizer = applied.optimizer
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)
        assert {g["lr"] for inner in optimizer.optimizers.values() for g in inner.param_groups} == {5e-3}
        applied.step(batch)
        scheduler.step()
        saved = copy.deepcopy(optimizer.state_dict())
        assert len(saved["state"]) == len(list(model.parameters()))
        optimizer.load_state_dict(saved)
        inner = next(iter(optimizer.optimizers.values()))
        assert inner.state is optimizer.state and inner.param_groups[0] in optimizer.param_groups
        applied.step(batch)


def test_estimated_on_fakes_it_is_lower() -> None:
    from transformers import LlamaConfig

    # Layers wide enough for their gradients to outweigh a short sequence's activations.
    config = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=2,
                         num_key_value_heads=2, vocab_size=256, max_position_embeddings=64)
    shapes = {"input_ids": (2, 32), "labels": (2, 32)}
    plain = memlab.estimate(config, shapes, Plan(), device="cpu")
    in_backward = memlab.estimate(config, shapes, IN_BACKWARD, device="cpu")
    assert plain.status == in_backward.status == "ok"
    assert in_backward.peak_bytes < plain.peak_bytes
    assert in_backward.breakdown["grads"] < plain.breakdown["grads"]


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"accumulation": 2}, "optimizer_in_backward steps in backward, so it cannot accumulate; write accumulation=1"),
        ({"micro_batch": 2, "accumulation": 4}, "cannot accumulate"),
        ({"offload": "optimizer"}, "cannot offload the optimizer (offload='optimizer'); write offload='none'"),
        ({"offload": "all"}, "cannot offload the optimizer"),
        ({"precision": "fp16"}, "GradScaler cannot unscale them all first; write precision='bf16'"),
    ],
)
def test_refused_combinations_raise_one_sentence_before_the_model_is_touched(changes: dict, words: str) -> None:
    with pytest.raises(MemlabError, match=words.replace("(", r"\(").replace(")", r"\)")) as raised:
        Plan(optimizer_in_backward=True, **changes)
    assert str(raised.value).count(";") == 1 and "\n" not in str(raised.value)
    with pytest.raises(MemlabError, match="cannot"):
        Plan(**changes).replace(optimizer_in_backward=True)
    Plan(optimizer_in_backward=True, offload="activations", precision="bf16", micro_batch=2)  # these go with it


def test_try_grid_and_fit_space_accept_it() -> None:
    plans = parse_grid(["optimizer_in_backward=off,on"])
    assert [p.label() for p in plans] == ["plain", "opt-in-bwd"]
    # Combinations that cannot go together are left out of a grid, and of the search's candidates.
    labels = [p.label() for p in parse_grid(["optimizer_in_backward=off,on", "accumulation=1,2"])]
    assert labels == ["plain", "accum2", "opt-in-bwd"]
    candidates = candidate_plans(4, {"micro_batch": [4, 2], "optimizer_in_backward": [False, True]}, batch_rows=4)
    assert [p.label() for p in candidates] == ["plain", "opt-in-bwd", "mb2x2"]
    with pytest.raises(MemlabError, match="cannot accumulate"):
        parse_grid(["optimizer_in_backward=on", "accumulation=2"])


def test_the_search_may_assume_it_needs_no_more_memory() -> None:
    assert needs_at_least(Plan(), IN_BACKWARD, 4) and not needs_at_least(IN_BACKWARD, Plan(), 4)
    lever = REGISTRY["optimizer_in_backward"]
    assert lever.family and lever.least_grads == {True: 0.0} and not lever.speed
    # The plain plan's measured gradients are not borrowed (another family): none need be held at its peak.
    breakdown = {"params": 4, "grads": 4, "optimizer": 8, "activations": 2}
    trial = memlab.Trial(Plan(), "ok", 18, breakdown, 1.0, 4.0, None, "cpu")
    model = MemoryModel([trial], trainable_bytes=4, batch_size=4)
    assert model.predict(IN_BACKWARD) == 14 < model.predict(Plan()) == 18


def test_exports_carry_it_in_code_and_say_what_to_do_elsewhere() -> None:
    code = IN_BACKWARD.to_code()
    assert "register_post_accumulate_grad_hook(step_in_backward)" in code
    compile(code, "<plan>", "exec")
    adafactor = Plan(optimizer="adafactor", optimizer_in_backward=True).to_code()
    assert "Adafactor([p], lr=lr, scale_parameter=False, relative_step=False)" in adafactor
    with pytest.raises(MemlabError, match="not expressible in TrainingArguments; use the code export"):
        IN_BACKWARD.to_training_arguments()
    with pytest.raises(MemlabError, match="DeepSpeed"):
        IN_BACKWARD.to_deepspeed()
    with pytest.raises(MemlabError, match="accelerate"):
        IN_BACKWARD.to_accelerate_config(gpus=2)
    assert refusals(IN_BACKWARD, "peft") == [] and refusals(IN_BACKWARD, "code") == []


def test_a_sharded_estimate_refuses_it_with_what_to_write() -> None:
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         vocab_size=64)
    with pytest.raises(MemlabError, match="optimizer_in_backward is not estimated sharded.*gpus=1"):
        memlab.estimate(config, {"input_ids": (1, 8), "labels": (1, 8)}, Plan(optimizer_in_backward=True),
                        device="cpu", gpus=2, strategy="fsdp2")
