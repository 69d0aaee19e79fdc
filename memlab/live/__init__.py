"""What memlab knows of the user's live objects, below every layer that uses them: batches and the loss
(:mod:`memlab.live.batch`), a model's structure and parameters (:mod:`memlab.live.structure`), the device it lives
on (:mod:`memlab.live.device`), how training spreads over GPUs (:mod:`memlab.live.sharding`), and the installed
stack: memlab's floors and the private PyTorch names it relies on (:mod:`memlab.live.compat`); and the one way
memlab sets attributes on any of these for a while and puts them back (:mod:`memlab.live.patching`).

Nothing here imports another part of memlab but :mod:`memlab.errors`, so techniques, the measure layer, the runner,
estimation and the exports all read from it without reading each other.
"""
