"""MemoryTracker: exact byte counts on CPU and meta, views, baselines, breakdowns, budgets and clean OOMs."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn

from memlab.errors import MemlabError
from memlab.measure import CATEGORIES, MemoryTracker, is_oom_error, release_error, release_memory


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def _param_bytes(model: nn.Module) -> int:
    return sum(4 * p.numel() for p in model.parameters())


def test_known_allocation_counts_under_its_phase_and_free_lowers_live() -> None:
    tracker = MemoryTracker()
    with tracker, tracker.phase("activations"):
        x = torch.empty(1000)
        assert tracker.live_bytes == 4000
        assert tracker.live_breakdown()["activations"] == 4000
        del x
        assert tracker.live_bytes == 0
    assert tracker.peak_bytes == 4000
    assert tracker.breakdown == {**dict.fromkeys(CATEGORIES, 0), "activations": 4000}


def test_allocations_outside_a_phase_count_as_other_and_phases_nest() -> None:
    tracker = MemoryTracker()
    with tracker:
        a = torch.zeros(10)
        with tracker.phase("activations"):
            b = torch.ones(20)
            with tracker.phase("optimizer"):
                c = torch.zeros_like(b)
            d = b * 2
        e = torch.tensor([1.0, 2.0])  # built outside the dispatcher, then lifted: still a new allocation
    assert tracker.live_breakdown() == {
        "params": 0,
        "grads": 0,
        "optimizer": 80,
        "activations": 160,
        "other": 48,
    }
    del a, b, c, d, e


def test_views_and_in_place_ops_are_not_counted_twice() -> None:
    tracker = MemoryTracker()
    with tracker:
        x = torch.empty(1000)
        views = [x[10:], x.view(10, 100), x.view(10, 100).t(), *x.split(100), x.detach(), x.unsqueeze(0)]
        x.add_(1.0)
        x.mul_(2.0).clamp_(0, 1)
        assert tracker.live_bytes == 4000
        del x
        assert tracker.live_bytes == 4000  # the views keep the storage alive
        del views
    assert tracker.live_bytes == 0
    assert tracker.peak_bytes == 4000


def test_out_variant_that_grows_a_tracked_storage_is_followed() -> None:
    tracker = MemoryTracker()
    with tracker:
        out = torch.empty(0)
        torch.add(torch.ones(100), 1.0, out=out)
    assert tracker.peak_bytes == 400 + 400  # ``out`` grew to 100 floats beside the ones(100) temporary
    assert tracker.live_bytes == 400
    del out


def test_tensors_alive_before_tracking_are_not_counted_when_only_viewed() -> None:
    outside = torch.empty(1000)
    tracker = MemoryTracker()
    with tracker:
        view = outside[:10]
        outside.add_(1.0)
    assert tracker.live_bytes == 0
    del view


def test_baseline_counts_each_storage_once_first_category_wins() -> None:
    embedding, head = nn.Embedding(10, 8), nn.Linear(8, 10, bias=False)
    head.weight = embedding.weight  # tied: one storage behind two modules
    params: list[torch.Tensor | None] = [embedding.weight, head.weight, None]
    batch = torch.ones(3, 8)
    tracker = MemoryTracker(baseline={"params": params, "other": [batch, embedding.weight]})
    assert tracker.live_breakdown()["params"] == 10 * 8 * 4
    assert tracker.live_breakdown()["other"] == 3 * 8 * 4
    assert tracker.peak_bytes == tracker.live_bytes == 10 * 8 * 4 + 3 * 8 * 4


def test_baseline_ignores_tensors_on_other_devices() -> None:
    tensors = [torch.empty(10), torch.empty(20, device="meta")]
    assert MemoryTracker(baseline={"params": tensors}).live_bytes == 40
    assert MemoryTracker(baseline={"params": tensors}, device="meta").live_bytes == 80


def test_mlp_breakdown_sums_to_peak_and_params_are_exact() -> None:
    model = _mlp()
    x = torch.randn(16, 32)
    tracker = MemoryTracker(baseline={"params": model.parameters(), "other": [x]})
    with tracker:
        with tracker.phase("activations"):
            loss = model(x).square().mean()
            loss.backward()
        tracker.mark([p.grad for p in model.parameters()], "grads")
        live = tracker.live_breakdown()
    assert sum(tracker.breakdown.values()) == tracker.peak_bytes
    assert set(tracker.breakdown) == set(CATEGORIES)
    assert tracker.breakdown["params"] == _param_bytes(model)
    assert tracker.breakdown["other"] == x.nbytes
    assert tracker.breakdown["activations"] > 0
    assert live["grads"] == _param_bytes(model)
    assert tracker.peak_bytes >= 2 * _param_bytes(model) + x.nbytes
    del loss


def test_gradients_marked_by_hooks_show_as_grads_at_the_peak() -> None:
    model = _mlp()
    x = torch.randn(16, 32)
    tracker = MemoryTracker(baseline={"params": model.parameters()})
    handles = [
        p.register_post_accumulate_grad_hook(lambda p: tracker.mark([p.grad], "grads"))
        for p in model.parameters()
    ]
    try:
        with tracker, tracker.phase("activations"):
            model(x).square().mean().backward()
    finally:
        for handle in handles:
            handle.remove()
    assert tracker.live_breakdown()["grads"] == _param_bytes(model)
    assert tracker.live_breakdown()["activations"] == 0
    assert 0 < tracker.breakdown["grads"] <= _param_bytes(model)
    assert sum(tracker.breakdown.values()) == tracker.peak_bytes


def test_budget_raises_an_oom_that_counts_the_allocation() -> None:
    tracker = MemoryTracker(budget=10_000)
    with pytest.raises(torch.OutOfMemoryError, match="out of memory") as caught:
        with tracker:
            keep = torch.empty(2000)
            torch.empty(1000)
    assert is_oom_error(caught.value)
    assert tracker.peak_bytes == 12_000 > 10_000
    assert sum(tracker.breakdown.values()) == tracker.peak_bytes
    # The allocation that broke the budget was freed at once; the traceback does not keep it.
    assert tracker.live_bytes == 8000
    del keep


def test_budget_under_the_baseline_fails_on_enter() -> None:
    weight = torch.empty(100)
    with pytest.raises(torch.OutOfMemoryError):
        with MemoryTracker(baseline={"params": [weight]}, budget=100):
            pass


def test_budget_exceeded_inside_backward_is_an_oom_error() -> None:
    model = _mlp()
    x = torch.randn(64, 32)
    probe = MemoryTracker(baseline={"params": model.parameters()})
    with probe:
        loss = model(x).square().mean()
        after_forward = probe.live_bytes
        loss.backward()
    del loss
    model.zero_grad(set_to_none=True)
    assert probe.peak_bytes > after_forward

    budget = (after_forward + probe.peak_bytes) // 2
    tracker = MemoryTracker(baseline={"params": model.parameters()}, budget=budget)
    with tracker:
        loss = model(x).square().mean()
        with pytest.raises(BaseException) as caught:
            loss.backward()
    # The autograd engine hands the error over unwrapped: the caller sees torch.OutOfMemoryError itself.
    assert type(caught.value) is torch.OutOfMemoryError
    assert is_oom_error(caught.value)
    assert tracker.peak_bytes > budget
    model.zero_grad(set_to_none=True)
    del loss


def _live_tensor_count() -> int:
    gc.collect()
    # type() rather than isinstance(): some module-level shims warn when their __class__ is read.
    return sum(1 for obj in gc.get_objects() if issubclass(type(obj), torch.Tensor))


def test_thirty_budget_ooms_in_a_row_leave_nothing_behind() -> None:
    model = _mlp()
    x = torch.randn(64, 32)
    probe = MemoryTracker(baseline={"params": model.parameters()})
    with probe:
        model(x).square().mean().backward()
    model.zero_grad(set_to_none=True)
    budget = probe.peak_bytes - 1

    def step(tracker: MemoryTracker, in_backward: bool) -> None:
        with tracker:
            hidden = model[0](x)  # a local that the failed step's frame keeps alive
            loss = model[1:](hidden).square().mean()
            if in_backward:
                loss.backward()
            else:
                torch.empty(budget // 4 + 1)

    witness = MemoryTracker()  # an outer tracker sees every allocation the steps make
    tensors_before = _live_tensor_count()
    errors: list[BaseException] = []
    with witness:
        for attempt in range(30):
            try:
                step(MemoryTracker(baseline={"params": model.parameters()}, budget=budget), attempt % 2 == 0)
            except torch.OutOfMemoryError as error:
                errors.append(error)  # kept, as a notebook keeps the last error
            model.zero_grad(set_to_none=True)
        assert len(errors) == 30
        assert all(is_oom_error(kept) for kept in errors)
        assert witness.live_bytes > 0  # the tracebacks hold the failed steps' frames...
        for kept in errors:
            release_error(kept)
        release_memory()
        assert witness.live_bytes == 0  # ...until they are released
    assert _live_tensor_count() == tensors_before


def test_meta_device_counts_a_linear_forward_and_backward() -> None:
    model = nn.Linear(256, 128, device="meta")
    x = torch.randn(8, 256, device="meta")
    tracker = MemoryTracker(baseline={"params": model.parameters(), "other": [x]}, device="meta")
    with tracker:
        with tracker.phase("activations"):
            model(x).sum().backward()
        tracker.mark([p.grad for p in model.parameters()], "grads")
    params = (256 * 128 + 128) * 4
    assert tracker.breakdown["params"] == params
    assert tracker.breakdown["other"] == 8 * 256 * 4
    assert tracker.breakdown["activations"] >= 8 * 128 * 4
    assert tracker.live_breakdown()["grads"] == params
    assert sum(tracker.breakdown.values()) == tracker.peak_bytes


def test_meta_device_counts_fake_tensors() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        model = nn.Linear(64, 32)
        x = torch.randn(4, 64)
        tracker = MemoryTracker(baseline={"params": model.parameters()}, device="meta")
        with tracker, tracker.phase("activations"):
            model(x).sum().backward()
    assert tracker.breakdown["params"] == (64 * 32 + 32) * 4
    assert tracker.breakdown["activations"] > 0
    assert tracker.live_breakdown()["activations"] == (64 * 32 + 32) * 4  # what is left: the gradients


def test_cpu_tracker_ignores_meta_tensors_and_sparse_tensors_do_not_break_it() -> None:
    tracker = MemoryTracker()
    with tracker:
        meta = torch.empty(100, device="meta")
        sparse = torch.zeros(4, 4).to_sparse()
    assert tracker.live_bytes == 0
    del meta, sparse


def test_on_sample_gets_each_new_peak() -> None:
    samples: list[int] = []
    tracker = MemoryTracker(on_sample=samples.append)
    with tracker:
        a = torch.empty(10)
        b = torch.empty(20)
    assert samples[:2] == [40, 120]
    del a, b


def test_frees_after_exit_are_harmless_and_the_tracker_does_not_keep_storages_alive() -> None:
    tracker = MemoryTracker()
    with tracker:
        x = torch.empty(100)
    ref = weakref.ref(x.untyped_storage())
    peak = tracker.peak_bytes
    del x
    assert ref() is None
    assert tracker.live_bytes == 0
    assert tracker.peak_bytes == peak
    del tracker
    gc.collect()


def test_unknown_category_is_refused() -> None:
    tracker = MemoryTracker()
    with pytest.raises(MemlabError, match="activations"):
        with tracker.phase("activation"):
            pass
    with pytest.raises(MemlabError):
        MemoryTracker(baseline={"weights": []})


def test_a_gathers_backward_under_the_tracker_holds_what_it_holds_without_it() -> None:
    """Under any dispatch mode PyTorch's gather_backward fills its zeros with the out-of-place scatter_add (a tensor
    is "subclass-like" then): the tracker runs its in-place twin, so the step it watches allocates as it does
    unwatched, with the same gradient."""
    torch.manual_seed(0)
    x = torch.randn(256, 256, requires_grad=True)
    index = torch.randint(0, 256, (256, 4))
    x.gather(1, index).square().sum().backward()
    unwatched, x.grad = x.grad, None
    picked = x.gather(1, index).square()
    with MemoryTracker() as tracker:
        picked.sum().backward()
    assert torch.equal(x.grad, unwatched)
    # the gradient of x and the incoming one, not the zeros and their filled copy as well
    assert tracker.peak_bytes < 256 * 256 * 4 + 2 * 256 * 4 * 4 + 64
