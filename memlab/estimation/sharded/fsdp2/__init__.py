"""The FSDP2 dry run (:mod:`memlab.estimation.sharded.fsdp2.run`): a plan's training step sharded with
``fully_shard`` over a fake process group on fake tensors, tracked by ``FSDPMemTracker``, from five and four layers
where the model's layers repeat (:mod:`~memlab.estimation.sharded.fsdp2.depth`), with three of its costs made linear
(:mod:`~memlab.estimation.sharded.fsdp2.speed`), over the units accelerate makes
(:mod:`~memlab.estimation.sharded.fsdp2.units`). What every sharded dry run is asked is a
:class:`~memlab.estimation.sharded.fsdp2.run.ShardedRequest`.
"""

from __future__ import annotations

from memlab.estimation.sharded.fsdp2.run import (
    DETAIL,
    FSDP2_REFUSALS,
    FSDP_NOTE,
    ONE_STREAM_NOTE,
    ShardedRequest,
    ShardedTrial,
    fake_process_group,
    fsdp2_dry_run,
    sharded_trial,
)
from memlab.estimation.sharded.fsdp2.units import fsdp2_layout, shard_units

__all__ = [
    "DETAIL", "FSDP2_REFUSALS", "FSDP_NOTE", "ONE_STREAM_NOTE", "ShardedRequest", "ShardedTrial", "fake_process_group",
    "fsdp2_dry_run", "fsdp2_layout", "shard_units", "sharded_trial",
]
