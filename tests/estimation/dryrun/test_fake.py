"""The dry run's fast paths give what the slow ones give: FakeMode's cache key is FakeTensorMode's, metadata queries
are answered as FakeTensorMode answers them, and a tracker that follows the fake mode counts what a tracker mode
counts."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode, _CacheKeyState

from memlab.estimation.dryrun.fake import FakeMode
from memlab.measure.tracker import MemoryTracker


def _keys(mode: FakeMode, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    mine = mode._cache_key(_CacheKeyState(None), func, args, kwargs)
    # FakeTensorMode's own key for the same mode: its method, which it also calls for nested arguments
    mode._prep_args_for_hash = types.MethodType(FakeTensorMode._prep_args_for_hash, mode)  # type: ignore[method-assign]
    try:
        theirs = mode._cache_key(_CacheKeyState(None), func, args, kwargs)
    finally:
        del mode._prep_args_for_hash
    return mine.key, theirs.key


def test_cache_key_is_fake_tensor_modes_own() -> None:
    mode = FakeMode()
    with mode:
        plain = torch.empty(3, 4)
        channels_last = torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last)
        five = torch.empty(2, 3, 4, 5, 6, dtype=torch.bfloat16)[:, 1]
        trained = torch.empty(8, requires_grad=True)
        cases: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
            ((plain, 1, 2.0, None, torch.float32, True), {}),
            ((channels_last, [plain.t(), five], (1, (2, 3))), {"dim": 1, "keepdim": True, "out": trained}),
            ((torch.Size([2, 3]), torch.empty(0), plain[1:], torch.strided, torch.channels_last, "x",
              torch.device("cpu"), torch.empty(2, 2, 2, 2)[:, :, :1]), {"dtype": torch.bfloat16}),
        ]
    for args, kwargs in cases:
        mine, theirs = _keys(mode, torch.ops.aten.add.Tensor, args, kwargs)
        assert mine == theirs


def test_an_argument_the_fast_key_leaves_to_fake_tensor_mode_is_still_keyed_alike() -> None:
    mode = FakeMode()
    other = FakeMode()
    with other:
        foreign = torch.empty(4)
    with mode:
        tensor = torch.empty(4)
    mine, theirs = _keys(mode, torch.ops.aten.add.Tensor, (tensor, 3 + 1j, [..., torch.float16]), {})
    assert mine == theirs
    # a fake tensor of another mode bypasses the cache, as in FakeTensorMode
    with pytest.raises(Exception, match="not our fake"):
        _keys(mode, torch.ops.aten.add.Tensor, (foreign,), {})


def test_metadata_queries_are_answered_as_fake_tensor_mode_answers_them() -> None:
    mode = FakeMode()
    with mode:
        tensor = torch.empty(2, 3, device="cuda" if not torch.cuda.is_available() else "cpu").t()
        device = torch.ops.prim.device.default(tensor)
        sizes = torch.ops.aten.size.default(tensor)
        strides = torch.ops.aten.stride.default(tensor)
    assert (device, list(sizes), list(strides)) == (tensor.device, [3, 2], [1, 3])


def _step(tracker: MemoryTracker) -> tuple[int, dict[str, int], int]:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    batch = torch.randn(8, 16)
    with tracker:
        with tracker.phase("activations"):
            loss = model(batch).pow(2).mean()
        loss.backward()
    return tracker.peak_bytes, dict(tracker.breakdown), tracker.live_bytes


def test_a_tracker_that_follows_the_fake_mode_counts_what_a_tracker_mode_counts() -> None:
    mode = FakeMode()
    mode.followable = True
    with mode:
        following = MemoryTracker(device="meta")
        followed = _step(following)
        assert following._host is None and not mode.followers and not mode.unfollowed  # it left when it exited
        with MemoryTracker(device="meta"):  # one mode already above the fake mode: the next is a mode again
            as_mode = MemoryTracker(device="meta")
            counted = _step(as_mode)
    with FakeMode():  # not followable: a mode, as everywhere but the one-GPU dry run
        plain = _step(MemoryTracker(device="meta"))
    assert followed == counted == plain and followed[0] > 0


def test_a_tensor_subclass_operator_tells_the_dry_run_to_run_again_with_tracker_modes() -> None:
    from torch.testing._internal.two_tensor import TwoTensor

    mode = FakeMode()
    mode.followable = True
    with mode:
        pair = TwoTensor(torch.empty(4), torch.empty(4))
        with MemoryTracker(device="meta") as tracker:
            assert tracker._host is mode
            pair * 2
    assert mode.unfollowed


def test_a_model_that_calls_a_compiled_function_estimates_as_without_it() -> None:
    """FakeMode's dispatch is not wrapped in Dynamo's disable (it runs for every operator): a function compiled with
    ``torch.compile`` inside the model still runs under it, and the estimate is the uncompiled model's."""
    from memlab import Plan, estimate

    class Scaled(nn.Module):
        def __init__(self, compiled: bool) -> None:
            super().__init__()
            self.linear = nn.Linear(16, 16)
            scale = lambda x: torch.relu(x) * 2  # noqa: E731
            self.scale = torch.compile(scale, backend="eager") if compiled else scale

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.scale(self.linear(x))

    trials = [estimate(Scaled(compiled), torch.randn(4, 16), Plan(), loss_fn=lambda m, b: m(b).sum(), device="cuda")
              for compiled in (True, False)]
    assert trials[0].status == "ok" and trials[0].peak_bytes == trials[1].peak_bytes > 0
    assert trials[0].reserved_bytes == trials[1].reserved_bytes


def test_addmm_into_another_dtype_is_made_as_the_kernel_makes_it() -> None:
    """TRL's fused LM head accumulates bf16 products in fp32 (``torch.addmm(acc, a, b, out_dtype=float32, out=acc)``
    on CUDA); torch 2.11's fake mode decomposed it as the plain addmm and failed on an H100 (a TypeError)."""
    with FakeMode():
        acc = torch.zeros(4, 8)
        a, b = torch.ones(4, 16, dtype=torch.bfloat16), torch.ones(16, 8, dtype=torch.bfloat16)
        into = torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
        made = torch.addmm(acc, a, b, out_dtype=torch.float32)
    assert into is acc
    assert (made.shape, made.dtype) == ((4, 8), torch.float32) and made is not acc


_FILLED = {  # a step whose backward runs a formula of FILLED_IN_PLACE: its input is (64, 1000) floats
    "gather": lambda x: x.gather(1, torch.zeros(64, 1, dtype=torch.long)),
    "index_select": lambda x: x.index_select(0, torch.zeros(3, dtype=torch.long)),
    "index": lambda x: x[torch.zeros(3, dtype=torch.long)],
    "cummax": lambda x: x.cummax(1)[0],
}


@pytest.mark.parametrize("name", sorted(_FILLED))
def test_a_formula_that_fills_zeros_fills_them_in_place_as_the_real_kernels_do(name: str) -> None:
    """gather's backward makes its gradient as zeros and fills them with scatter_add_ on real tensors, with the
    out-of-place scatter_add on fake ones (PyTorch's areAnyTensorSubclassLike): the dry run held the zeros and their
    filled copy at once, a whole input more than the GPU (TRL's log-probs over float32 logits: 0.43 GiB)."""
    size = 64 * 1000 * 4
    with FakeMode() as mode:
        x = torch.empty(64, 1000, requires_grad=True)
        picked = _FILLED[name](x)
        tracker = MemoryTracker(device="meta")
        mode.observer = tracker.observe
        picked.sum().backward()
    assert size <= tracker.peak_bytes < 1.01 * size  # x's gradient alone


def test_a_scatter_add_outside_a_formula_still_makes_its_own_tensor() -> None:
    with FakeMode() as mode:
        zeros, index, ones = torch.zeros(8, 100), torch.zeros(8, 1, dtype=torch.long), torch.ones(8, 1)
        tracker = MemoryTracker(device="meta")
        mode.observer = tracker.observe
        filled = zeros.scatter_add(1, index, ones)
        assert filled is not zeros and tracker.live_bytes == 8 * 100 * 4


def _tied_qwen3() -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=8192, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)


def _row_log_probs_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """trl 1.12's log-probs of the given tokens: the float32 logits divided by the temperature, gathered, less their
    logsumexp row by row (its selective_log_softmax)."""
    ids = batch["input_ids"]
    logits = model(input_ids=ids).logits.float() / 1.0
    picked = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return (torch.stack([torch.logsumexp(row, dim=-1) for row in logits]) - picked).mean()


def test_a_tied_qwen3_gathering_its_log_probs_is_estimated_as_its_unobserved_step_allocates() -> None:
    """A tiny Qwen3 from its config with tied embeddings, its loss gathering log-probs from the float32 logits as
    trl 1.12's GRPO did: the estimate's peak is what the CPU allocator reports for the same step run for real with
    no mode on the stack (torch.profiler's memory events), and its weights are the tied model's, the embedding once.
    Before the gather's backward was filled in place the estimate was 1.25 times the step's peak."""
    from transformers import AutoModelForCausalLM

    import memlab
    from memlab.measure.compiled import CpuAllocatorPeak

    torch.manual_seed(0)
    batch = {"input_ids": torch.randint(0, 8192, (4, 32))}
    trial = memlab.estimate(_tied_qwen3(), batch, memlab.Plan(), loss_fn=_row_log_probs_loss, device="cpu")
    assert trial.status == "ok", trial.error
    model = AutoModelForCausalLM.from_config(_tied_qwen3())
    assert model.lm_head.weight is model.model.embed_tokens.weight
    weights = sum(4 * t.numel() for t in (*model.parameters(), *model.buffers()))  # the tied weight once
    assert trial.breakdown["params"] == weights
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def step() -> None:
        _row_log_probs_loss(model, batch).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # the optimizer's state made, as the estimate's steady step has it
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                if torch.is_tensor(t))
    with CpuAllocatorPeak(weights + state + batch["input_ids"].numel() * 8) as peak:
        step()
    if not peak.peak_allocated:
        pytest.skip("this torch's profiler gives no allocation events")
    assert trial.peak_bytes == pytest.approx(peak.peak_allocated, rel=0.01)
