"""Dry runs on fake tensors: the memory of a step predicted without the hardware and without the weights.

``memlab.estimate`` is :func:`estimate`. The package, by what each part models, each with the device it is for:
[any] every estimate; [CPU] a CPU estimate; [CUDA] a CUDA estimate (with no GPU reachable, its kernels emulated on
the CPU's: [CUDA on CPU]); [sharded] per GPU of several.

- ``estimate``, ``request``  the entry and its routes: a live model, a Trainer, a config or a name; one GPU,
  sharded or inference                                                                                 [any]
- ``configs``     which model: a config by name, its model built on ``meta``, the batch's shapes          [any]
- ``dryrun/``     the one-device dry run on fake tensors: the fake mode, model and batch, the user's load, adapters,
  the mask decisions, what has no rule, the reserved peak, the training and inference estimates   [CPU, CUDA]
- ``depth/``      a model whose layers repeat, dry-run at a few layers and carried to all of them   [CPU, CUDA]
- ``cuda/``       CUDA without CUDA: the GPU kinds and their context, the device an estimate answers for, autocast,
  dropout and attention as CUDA's kernels keep them, the caching allocator                     [CUDA on CPU]
- ``sharded/``    per-GPU estimates: FSDP2 run on fake tensors, FSDP1 from it, ZeRO-2/3 by their formulas, composed
  from the one-GPU run, and the fewest GPUs that fit                                                [sharded]

The imports run one way, down this list: the entry imports the parts; ``sharded/`` builds on ``dryrun/``, which
builds on ``depth/``, which builds on ``cuda/``; every part may read ``configs``. Each subpackage's ``__init__``
says what it models and what it assumes.
"""

from memlab.estimation.configs import load_config
from memlab.estimation.estimate import estimate

__all__ = ["estimate", "load_config"]
