"""Depth carried: a model whose layers repeat, dry-run at a few layers and carried to all of them.

Models what a dry run tells the allocator's model and the step's tracker, as events each with the layer it belongs
to (:mod:`.log`); those events played at any depth, the first, middle and last layers as templates (:mod:`.extend`);
told again to a fresh allocator model and ledger for the reserved and allocated peaks, the breakdown and the
timeline (:mod:`.replay`); and the training plans of a config carried from three layers to all, checked against a
dry run of two (:mod:`.carry`).

Assumes the model's layers are one block repeated (found by name and checked, else refused: the plan runs at full
depth) and that a layer's events do not depend on its depth beyond where it sits (first, middle, last). Builds on
``cuda/`` (the allocator's model) and the configs; the dry runs (``dryrun/``, ``sharded/``) call it.
"""
