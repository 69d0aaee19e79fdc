"""The FSDP2 dry run's linear shortcuts (memlab.estimation.sharded.fsdp2.speed) give PyTorch's own results: the trial
and every module-level snapshot FSDPMemTracker took, for plans whose optimizer steps with foreach operators (AdamW's
scalar lists among them); and the foreach split picks what PyTorch's ``tree_map_only`` picks."""

from __future__ import annotations

import collections
import contextlib
from typing import Any

import pytest
from transformers import LlamaConfig

from memlab import Plan
from memlab.estimation.sharded.fsdp2 import ShardedRequest, fsdp2_dry_run
from memlab.estimation.sharded.fsdp2 import run as fsdp2

CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=2, vocab_size=256)
BATCH = {"input_ids": (1, 32), "labels": (1, 32)}


@pytest.mark.parametrize(("plan", "gpus", "device"), [
    (Plan(), 4, "cuda"), (Plan(precision="bf16", checkpointing=True), 2, "cuda"), (Plan(), 3, "cpu")])
def test_the_shortcuts_give_pytorchs_own_trial_and_snapshots(monkeypatch: pytest.MonkeyPatch, plan: Plan,
                                                             gpus: int, device: str) -> None:
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    fast = fsdp2_dry_run(ShardedRequest(LlamaConfig(**CONFIG), BATCH, plan, gpus, device=device, budget=10**9))
    monkeypatch.setattr(fsdp2, "fsdp_mem_tracker", FSDPMemTracker)
    monkeypatch.setattr(fsdp2, "strided_flag_once", contextlib.nullcontext)
    monkeypatch.setattr(fsdp2, "foreach_split_once", contextlib.nullcontext)
    own = fsdp2_dry_run(ShardedRequest(LlamaConfig(**CONFIG), BATCH, plan, gpus, device=device, budget=10**9))
    assert fast[0].status == "ok" and len(fast[1]) > 10
    assert fast == own


def _element_picker(index: int) -> Any:
    return lambda x: x.children[index]  # as DTensor's _translate_list_op_schema writes it


def test_the_foreach_split_picks_what_pytorch_picks_and_gives_each_element_its_scalar() -> None:
    from torch.distributed.tensor._op_schema import TupleStrategy
    from torch.distributed.tensor._ops import single_dim_strategy
    from torch.utils._pytree import tree_map_only

    from memlab.estimation.sharded.fsdp2.speed import foreach_split_once

    params, grads = TupleStrategy(["p0", "p1", "p2"]), TupleStrategy(["g0", "g1", "g2"])
    scalars, other = [0.5, 0.25, 0.125], [7, 8]  # one per tensor; a list of another length stays whole
    tree = ((params, grads, scalars, other, (params, 3)), {"alpha": 2.0, "lists": [grads]})
    leaf = lambda x: isinstance(x, TupleStrategy)  # noqa: E731 - as DTensor passes it
    with foreach_split_once():
        split = single_dim_strategy.tree_map_only
        for index in range(3):
            own = tree_map_only(TupleStrategy, _element_picker(index), tree, is_leaf=leaf)
            picked = split(TupleStrategy, _element_picker(index), tree, is_leaf=leaf)
            assert picked[0][2] == scalars[index]
            assert picked[0][:2] + picked[0][3:] == own[0][:2] + own[0][3:] and picked[1] == own[1]
        # Any other function, or a container pytree knows and a plain map does not: PyTorch's own result.
        assert split(TupleStrategy, lambda x: x.children[0], tree, is_leaf=leaf) == \
            tree_map_only(TupleStrategy, lambda x: x.children[0], tree, is_leaf=leaf)
        ordered = (collections.OrderedDict(a=params), {})
        assert split(TupleStrategy, _element_picker(1), ordered, is_leaf=leaf) == (collections.OrderedDict(a="p1"), {})
    assert single_dim_strategy.tree_map_only is not split
