"""Dry runs on fake tensors: the memory of a step predicted without the hardware and without the weights.

``memlab.estimate`` is :func:`estimate`. The modules, in the order a dry run flows through them, each with what it
models and the device it is for: [any] every estimate; [CPU] a CPU estimate; [CUDA] a CUDA estimate (with no GPU
reachable, its kernels emulated on the CPU's: [CUDA on CPU]); [sharded] per GPU of several.

- ``estimate``        the entry point: a live model, a Trainer, a config or a name; one GPU or sharded    [any]
- ``configs``         which model: a config by name, its model built on ``meta``, the batch's shapes       [any]
- ``fake``            the one fake mode, the fake model and batch, the device the estimate answers for    [any]
- ``load``            the user's load (dtype, BitsAndBytesConfig) made on the fake model (one GPU) [any]
- ``masks``           the attention-mask decisions transformers makes from values fake tensors hide       [any]
- ``unknown``         attention implementations and custom operators without a rule, said in notes        [any]
- ``single_gpu``      one device: training or inference plans through memlab's own runners             [CPU, CUDA]
- ``adapters``        LoRA / QLoRA on the fake model, bitsandbytes' bytes exactly               [CPU, CUDA, sharded]
- ``gpus``            the GPU kind a CUDA estimate answers for: compute capability, CUDA context          [CUDA]
- ``cuda_kernels``    whether CUDA's kernels are emulated, and the modes the step runs under       [CUDA on CPU]
- ``cuda_autocast``   CUDA autocast's dtypes, under CPU autocast                                   [CUDA on CPU]
- ``cuda_dropout``    CUDA's fused dropout: a one-byte mask kept for backward                      [CUDA on CPU]
- ``cuda_attention``  CUDA's attention backends (flash, memory-efficient, math) and what they keep [CUDA on CPU]
- ``reserved``        a trial's allocations, in order, replayed for the reserved peak; cuBLAS workspaces  [CUDA]
- ``cuda_allocator``  PyTorch's caching allocator modelled: allocations and frees in, reserved bytes out  [CUDA]
- ``sharded``         per-GPU estimates, and the fewest GPUs that fit                                  [sharded]
- ``strategies``      the strategies, GPU counts and DeepSpeed's buckets, without torch                [sharded]
- ``fsdp2``           FSDP2 run on fake tensors over a fake process group                              [sharded]
- ``zero``            DeepSpeed ZeRO-2 / ZeRO-3 from their formulas and FSDP2's activations            [sharded]
- ``cuda_context``    the GPU kind's CUDA context: with the reserve, what the card shows         [CUDA, sharded]
"""

from memlab.estimation.configs import load_config
from memlab.estimation.estimate import estimate

__all__ = ["estimate", "load_config"]
