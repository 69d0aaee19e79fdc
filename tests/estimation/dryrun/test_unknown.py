"""Where the fake step cannot know, a CUDA estimate says so in its notes instead of quietly taking the CPU's
behaviour: an attention implementation memlab has no rule for, an operator outside PyTorch's own, and a
scaled_dot_product_attention call its backend rules do not cover."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM

import memlab
from memlab import Plan
from memlab.estimation.cuda.attention import sdpa_gaps

BATCH = {"input_ids": (2, 16), "labels": (2, 16)}


def _config(**keywords: object) -> LlamaConfig:
    return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=256, **keywords)


def _unsure(trial: memlab.Trial) -> list[str]:
    return [note for note in trial.notes if "no rule" in note or "outside PyTorch" in note or "do not cover" in note]


# --- attention implementations ---------------------------------------------------------------------------------------


def test_a_known_implementation_says_nothing_more() -> None:
    for implementation in ("sdpa", "eager"):
        trial = memlab.estimate(_config(attn_implementation=implementation), BATCH, Plan(precision="bf16"),
                                device="cuda")
        assert trial.status == "ok" and _unsure(trial) == [], trial.notes


@pytest.mark.parametrize("implementation", ["flash_attention_2", "flex_attention"])
def test_an_implementation_without_a_rule_is_estimated_as_sdpa_and_says_so(implementation: str) -> None:
    config = _config(attn_implementation=implementation)
    trial = memlab.estimate(config, BATCH, Plan(precision="bf16"), device="cuda")
    sdpa = memlab.estimate(_config(attn_implementation="sdpa"), BATCH, Plan(precision="bf16"), device="cuda")
    # flash-attention is not installed here and flex attention crashes on fake tensors: before, no estimate at all.
    assert trial.status == "ok", trial.error
    assert trial.peak_bytes == sdpa.peak_bytes
    assert _unsure(trial) == [f"memlab has no rule for attn_implementation='{implementation}': its attention is "
                              "estimated as 'sdpa' (CUDA's scaled_dot_product_attention kernels, emulated)"]
    assert config._attn_implementation == implementation  # the caller's config is not touched


def test_a_registered_implementation_of_a_live_model_is_not_run_on_cpu_kernels() -> None:
    called = []

    def attention(*args: object, **kwargs: object) -> object:
        called.append(True)
        raise AssertionError("the registered attention ran on the CPU's kernels")

    AttentionInterface.register("memlab_test_attention", attention)
    try:
        model = LlamaForCausalLM(_config(attn_implementation="memlab_test_attention"))
        trial = memlab.estimate(model, BATCH, Plan(), device="cuda")
        cpu = memlab.estimate(model, BATCH, Plan(), device="cpu")
    finally:
        del AttentionInterface._global_mapping["memlab_test_attention"]
    assert trial.status == cpu.status == "ok" and not called
    assert "attn_implementation='memlab_test_attention'" in _unsure(trial)[0]
    assert _unsure(cpu) == ["memlab has no rule for attn_implementation='memlab_test_attention': its attention is "
                            "estimated as 'sdpa' (the CPU's scaled_dot_product_attention)"]
    assert model.config._attn_implementation == "memlab_test_attention"  # the live model keeps its own


def test_a_sharded_estimate_says_it_too() -> None:
    trial = memlab.estimate(_config(attn_implementation="flex_attention"), BATCH, Plan(), gpus=2, strategy="fsdp2")
    assert trial.status == "ok", trial.error
    assert any("attn_implementation='flex_attention'" in note for note in trial.notes)


# --- operators outside PyTorch's own ---------------------------------------------------------------------------------


@torch.library.custom_op("memlab_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _twice_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


twice.register_autograd(lambda ctx, grad: grad * 2)


class Twice(nn.Module):
    def __init__(self, custom: bool) -> None:
        super().__init__()
        self.linear, self.custom = nn.Linear(16, 16), custom

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.linear(x)
        return twice(hidden) if self.custom else hidden * 2


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_a_custom_op_is_named_as_run_by_its_fake_rule(device: str) -> None:
    loss = lambda model, batch: model(batch).sum()  # noqa: E731
    custom = memlab.estimate(Twice(custom=True), torch.randn(4, 16), Plan(), loss_fn=loss, device=device)
    plain = memlab.estimate(Twice(custom=False), torch.randn(4, 16), Plan(), loss_fn=loss, device=device)
    assert custom.status == plain.status == "ok", (custom.error, plain.error)
    assert _unsure(custom) == ["operators outside PyTorch's own ran by their fake rules (memlab_test::twice): their "
                               "outputs are counted, what their kernels allocate inside is not"]
    assert _unsure(plain) == []


# --- scaled_dot_product_attention calls the rules do not cover -------------------------------------------------------


class Attention(nn.Module):
    """One attention call on (2, 4, 8, 16) heads, with whatever the test asks of it."""

    def __init__(self, mask: bool = False, math_only: bool = False, unbatched: bool = False) -> None:
        super().__init__()
        self.project = nn.Linear(16, 16)
        self.mask, self.math_only, self.unbatched = mask, math_only, unbatched

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.project(x)
        q = q[0] if self.unbatched else q
        mask = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool).tril() if self.mask else None
        if self.math_only:
            with sdpa_kernel(SDPBackend.MATH):
                return F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        return F.scaled_dot_product_attention(q, q, q, attn_mask=mask)


@pytest.mark.parametrize(("settings", "missing"), [
    ({}, None),
    ({"mask": True}, None),  # a boolean mask: its float copy is made as attention.cpp makes it (issue 57)
    ({"math_only": True}, None),  # sdpa_kernel's switches are PyTorch's rules too: the math backend
    ({"unbatched": True}, "inputs of 3 dimensions (the rules are for batch, heads, length, head dim)"),
])
def test_an_attention_call_the_rules_do_not_cover_names_the_missing_rule(settings: dict, missing: str | None) -> None:
    trial = memlab.estimate(Attention(**settings), torch.randn(2, 4, 8, 16), Plan(precision="bf16"),
                            loss_fn=lambda model, batch: model(batch).float().sum(), device="cuda")
    assert trial.status == "ok", trial.error
    [note] = [note for note in trial.notes if note.startswith("CUDA attention emulated")]
    if missing is None:
        assert "do not cover" not in note
        assert note.endswith("math backend" if settings.get("math_only") else "efficient backend" if settings.get(
            "mask") else "flash backend")
    else:
        assert "what the rules do not cover (their backend assumed): " + missing in note


def test_the_gaps_of_one_call() -> None:
    q = torch.empty(2, 4, 8, 64)
    assert sdpa_gaps(q, q, q) == []
    assert sdpa_gaps(q, q.transpose(-1, -2).contiguous().transpose(-1, -2), q) == []  # a rule: the math backend
    nested = torch.nested.nested_tensor([torch.empty(4, 3, 8), torch.empty(4, 5, 8)], layout=torch.jagged)
    assert sdpa_gaps(nested, nested, nested) == ["nested tensors (no rule for their ragged lengths)"]
