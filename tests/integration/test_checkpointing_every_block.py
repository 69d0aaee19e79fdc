"""``checkpointing=k`` with ``k`` the model's number of blocks is ``checkpointing=True``, on every family the tests
build (issue 61, item 13): the same blocks checkpointed, the same estimate and the same measured peak; a ``k`` above
the number of blocks is refused with one MemlabError that says what to write."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from models import lm_batch, mlp_batch, mlp_loss, tiny_bert, tiny_gpt2, tiny_llama, tiny_mlp, tiny_t5

import memlab
from memlab import Plan
from memlab.errors import MemlabError
from memlab.techniques.checkpointing import checkpoint_blocks, checkpointed_blocks, enable_checkpointing


def _bert_batch() -> dict[str, torch.Tensor]:
    return {"input_ids": lm_batch()["input_ids"], "labels": torch.randint(0, 3, (8,))}


FAMILIES: dict[str, tuple[Callable[[], Any], Callable[[], Any], Any]] = {
    "gpt2": (lambda: tiny_gpt2(layers=4), lm_batch, None),
    "llama": (lambda: tiny_llama(layers=4), lm_batch, None),
    "t5": (tiny_t5, lm_batch, None),
    "bert": (tiny_bert, _bert_batch, None),
    "mlp": (tiny_mlp, mlp_batch, mlp_loss),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_block_by_number_is_checkpointing_true(family: str) -> None:
    build, make_batch, loss_fn = FAMILIES[family]
    model, batch = build(), make_batch()
    count = len(checkpoint_blocks(model))
    assert count > 1
    undo = enable_checkpointing(model, True)
    every = checkpointed_blocks(model)
    undo()
    undo = enable_checkpointing(model, count)
    assert checkpointed_blocks(model) == every == list(range(count))
    undo()
    by_true = memlab.estimate(model, batch, Plan(checkpointing=True), loss_fn=loss_fn)
    by_count = memlab.estimate(model, batch, Plan(checkpointing=count), loss_fn=loss_fn)
    assert by_true.status == by_count.status == "ok", (by_true.error, by_count.error)
    assert (by_count.peak_bytes, by_count.breakdown) == (by_true.peak_bytes, by_true.breakdown)
    measured = [memlab.measure(model, batch, Plan(checkpointing=value), loss_fn=loss_fn, steps=1, warmup=0)
                for value in (True, count)]
    assert measured[0].peak_bytes == measured[1].peak_bytes


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_more_blocks_than_the_model_has_are_refused(family: str) -> None:
    build, make_batch, loss_fn = FAMILIES[family]
    model, batch = build(), make_batch()
    count = len(checkpoint_blocks(model))
    plan = Plan(checkpointing=count + 1)
    what = f"has {count} blocks to checkpoint; write checkpointing=True (every block) or a number of blocks from 1 to"
    with pytest.raises(MemlabError, match=rf"checkpointing={count + 1}, but \w+ {re.escape(what)}"):
        memlab.apply(model, plan, loss_fn=loss_fn)
    for trial in (memlab.estimate(model, batch, plan, loss_fn=loss_fn),
                  memlab.measure(model, batch, plan, loss_fn=loss_fn, steps=1, warmup=0)):
        assert trial.status == "error"
        assert trial.error is not None and trial.error.count("MemlabError") == 1 and what in trial.error
