"""Depth carried: a model whose layers repeat, dry-run at a few layers and carried to all of them.

Models what a dry run tells the allocator's model and the step's tracker, as events each with the layer it belongs
to (:mod:`.log`); those events played at any depth, the first, middle and last layers as templates (:mod:`.extend`);
told again to a fresh allocator model and ledger for the reserved and allocated peaks, the breakdown and the
timeline (:mod:`.replay`); and the training plans of a config carried from three layers to all, checked against a
dry run of two (:mod:`.carry`).

Assumes a transformers config that builds its layers as one block repeated (the same modules, shapes and settings
in every layer) and a step that repeats layer by layer: the three-layer log carried to two layers must tell its
consumers exactly what a real two-layer dry run told them, else the plan is dry-run at its full depth. Builds on
``cuda/`` (the allocator's model) and the configs; the dry runs (``dryrun/``, ``sharded/``) call it.
"""
