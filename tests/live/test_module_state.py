"""Restore is general (whatever a library sets during a trial goes away) and snapshots copy only what can change."""

from __future__ import annotations

import pytest
import torch
from models import assert_same, fingerprint, lm_batch, mlp_batch, mlp_loss, tiny_llama, tiny_mlp

import memlab
from memlab.live.module_state import ModelValues


def _hidden_states_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**batch, output_hidden_states=True).loss


def test_output_hidden_states_still_works_after_a_compare_that_asked_for_them() -> None:
    model = tiny_llama(layers=2)
    batch = lm_batch(rows=2, length=8)
    before = fingerprint(model)
    memlab.compare(model, batch, [memlab.Plan()], loss_fn=_hidden_states_loss, steps=1, noise=0, progress=False)
    assert_same(before, fingerprint(model))
    with torch.no_grad():
        hidden = model(**batch, output_hidden_states=True).hidden_states
    assert len(hidden) == model.config.num_hidden_layers + 1


def test_output_hidden_states_still_works_after_apply_and_undo() -> None:
    model = tiny_llama(layers=2)
    batch = lm_batch(rows=2, length=8)
    applied = memlab.apply(model, memlab.Plan(checkpointing=True), loss_fn=_hidden_states_loss)
    applied.step(batch)
    applied.undo()
    with torch.no_grad():
        assert len(model(**batch, output_hidden_states=True).hidden_states) == 3


def test_what_a_library_sets_lazily_is_gone_and_what_the_user_set_stays() -> None:
    model = tiny_mlp(blocks=2)
    model.user_note = note = ["kept"]  # set by the user before: kept, the same object
    calls: list[int] = []
    handle = model[0].register_forward_hook(lambda module, args, output: calls.append(1))

    def library_loss(m: torch.nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        first = m[0][0]  # the first Linear
        if not getattr(first, "_library_ready", False):  # what a library does on its first forward
            first._library_ready = True
            first.register_forward_pre_hook(lambda module, args: None)
            first.weight._library_marker = "set during the trial"
        return mlp_loss(m, b)

    before = fingerprint(model)
    memlab.compare(model, mlp_batch(), [memlab.Plan(), memlab.Plan(checkpointing=True)], loss_fn=library_loss,
                   steps=1, noise=0, progress=False)
    assert_same(before, fingerprint(model))
    assert not hasattr(model[0][0], "_library_ready") and not hasattr(model[0][0].weight, "_library_marker")
    assert len(model[0][0]._forward_pre_hooks) == 0
    assert model.user_note is note
    calls.clear()
    model(mlp_batch()[0])
    assert calls == [1]  # the user's hook still fires...
    handle.remove()
    model(mlp_batch()[0])
    assert calls == [1]  # ...and its handle still removes it


def test_a_config_flag_changed_during_a_trial_comes_back() -> None:
    model = tiny_llama()
    assert model.config.use_cache is True

    def loss_that_turns_the_cache_off(m: torch.nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
        m.config.use_cache = False
        return m(**b).loss

    memlab.measure(model, lm_batch(rows=2), memlab.Plan(), loss_fn=loss_that_turns_the_cache_off, steps=1, noise=0)
    assert model.config.use_cache is True


def _frozen_base() -> torch.nn.Module:
    model = tiny_llama(layers=2, width=64)
    model.requires_grad_(False)
    model.lm_head.requires_grad_(True)  # the only trained weight
    model.model.embed_tokens.weight.requires_grad_(False)
    return model


def test_a_snapshot_copies_only_trainable_parameters_and_buffers() -> None:
    model = _frozen_base()
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    everything = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    values = ModelValues.capture(model)
    assert values.host_bytes == trainable + buffers
    assert values.host_bytes < everything / 2 or tied


def test_a_compare_on_a_frozen_base_copies_little_and_restores_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    from memlab.options import RunOptions
    from memlab.runner.trial import TrialRunner

    model = _frozen_base()
    captures: list[int] = []
    real_capture = ModelValues.capture.__func__  # type: ignore[attr-defined]

    def counting_capture(cls: type[ModelValues], m: torch.nn.Module, **keywords: bool) -> ModelValues:
        captures.append(1)
        return real_capture(cls, m, **keywords)

    monkeypatch.setattr(ModelValues, "capture", classmethod(counting_capture))
    before = fingerprint(model)
    runner = TrialRunner(model, lm_batch(rows=2), RunOptions(steps=1, noise=0, progress=False))
    with runner.session():
        trials = [runner.run(plan) for plan in (memlab.Plan(), memlab.Plan(checkpointing=True))]
        copied = runner.snapshot_bytes
    assert [t.status for t in trials] == ["ok", "ok"]
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert captures == [1] and copied == trainable + buffers  # once per session, never the frozen weights
    assert_same(before, fingerprint(model))
