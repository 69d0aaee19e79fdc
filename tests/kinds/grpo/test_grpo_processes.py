"""Issue 85: a GRPOTrainer asked for more or fewer processes than it was built in, its batches checked as TRL 1.16's
GRPOConfig checks them for that many (memlab.kinds.grpo.source.check_processes): one error before anything runs,
saying which numbers to write."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

trl = pytest.importorskip("trl")
from test_grpo_step import grpo  # noqa: E402

import memlab  # noqa: E402
from memlab import MemlabError  # noqa: E402
from memlab.kinds.grpo.source import check_processes  # noqa: E402


def _args(**settings: Any) -> SimpleNamespace:
    fields = dict(per_device_train_batch_size=1, steps_per_generation=1, num_generations=8, do_eval=False,
                  eval_strategy="no", per_device_eval_batch_size=8, num_generations_eval=None)
    return SimpleNamespace(**{**fields, **settings})


def test_the_generation_batch_of_the_processes_asked_holds_whole_prompt_groups() -> None:
    check_processes(_args(), 8)  # 1 x 8 x 1 completions: one prompt's 8
    check_processes(_args(per_device_train_batch_size=2, steps_per_generation=2), 2)
    with pytest.raises(MemlabError, match=r"on 6 GPUs generates per_device_train_batch_size 1 x 6 processes x "
                                          r"steps_per_generation 1 = 6 completions .* num_generations=8 does not "
                                          r"divide.*write per_device_train_batch_size=4, steps_per_generation=4, "
                                          r"num_generations=6, or gpus=8 \(a script that sets generation_batch_size "
                                          r"instead of steps_per_generation: a multiple of 24\)"):
        check_processes(_args(), 6)
    evaluating = _args(per_device_train_batch_size=2, do_eval=True, eval_strategy=SimpleNamespace(value="steps"),
                       per_device_eval_batch_size=3, num_generations_eval=4)
    with pytest.raises(MemlabError, match=r"evaluates per_device_eval_batch_size 3 x 2 processes = 6 .*"
                                          r"num_generations_eval=4 .*write per_device_eval_batch_size=4, or gpus=4"):
        check_processes(evaluating, 2)
    check_processes(evaluating, 4)


def test_a_grpo_trainer_built_for_two_processes_and_asked_for_three_is_refused_before_it_runs(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Built as a launched rank of two processes builds it (TRL checks 2 x 2 x 1 = 4 completions against 4 generations).
    monkeypatch.setattr(trl.GRPOConfig, "world_size", property(lambda self: 2))
    trainer = grpo(tmp_path, per_device_train_batch_size=2, num_generations=4)
    trainer.args.deepspeed = {"zero_optimization": {"stage": 3}}
    before = dict(vars(trainer.args))
    with pytest.raises(MemlabError, match=r"on 3 GPUs generates per_device_train_batch_size 2 x 3 processes x "
                                          r"steps_per_generation 1 = 6 completions .*or gpus=4"):
        memlab.estimate(trainer, gpus=3, device="cpu")
    assert dict(vars(trainer.args)) == before
