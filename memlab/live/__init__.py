"""What memlab knows of the user's live objects, below every layer that uses them: batches and the loss
(:mod:`memlab.live.batch`, a trainer's loss with its trainer: :class:`~memlab.live.batch.TrainerLoss`), a model's
structure and parameters (:mod:`memlab.live.structure`) and the values a trial may change on it
(:mod:`memlab.live.module_state`), which storages are host memory (:mod:`memlab.live.host`), a model's fake copies
(:mod:`memlab.live.rebind`), the device it lives on (:mod:`memlab.live.device`), how training spreads over GPUs
(:mod:`memlab.live.sharding`), and the installed stack: memlab's floors and the private PyTorch names it relies on
(:mod:`memlab.live.compat`); the one way memlab sets attributes on any of these for a while and puts them back
(:mod:`memlab.live.patching`), and the libraries' warnings kept quiet while plans run (:mod:`memlab.live.quiet`).

Nothing here imports another part of memlab but :mod:`memlab.errors` and :mod:`memlab.seams`, so techniques, the
measure layer, the runner, the trainer, estimation and the exports all read from it without reading each other.
"""
