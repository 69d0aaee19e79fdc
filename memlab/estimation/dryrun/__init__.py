"""The one-device dry run: memlab's own runner and training step on PyTorch's fake tensors.

Models a step on one device (CPU or one GPU) without its memory or its weights: the fake mode, model and batch
(:mod:`.fake`, with the values an image batch needs kept on the CPU: :mod:`.fake_values`), the user's load
(:mod:`.load`: dtype, bitsandbytes 4-bit and 8-bit), adapters on fake tensors (:mod:`.adapters`), the mask decisions
transformers makes from values fake tensors hide (:mod:`.masks`), what has no rule, said in notes (:mod:`.unknown`),
a CUDA trial's reserved peak (:mod:`.reserved`), and the estimates of training and inference plans
(:mod:`.single_gpu`).

Assumes that shapes, dtypes and the order of allocations decide the memory (no values: where a value would decide, a
rule stands in and a note says so), and that a GPU's kernels are emulated by ``cuda/`` when this machine has none.
Builds on ``cuda/`` and ``depth/``; the sharded estimates (``sharded/``) and the entry build on it.
"""
