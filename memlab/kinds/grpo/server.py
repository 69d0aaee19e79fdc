"""A GRPOTrainer's vLLM server (``vllm_mode="server"``), answered for the server's own GPUs by vLLM's arithmetic.

The trainer generates on a server started apart, ``trl vllm-serve --model M --tensor-parallel-size T
--data-parallel-size D --gpu-memory-utilization U --max-model-len L`` (TRL's ``trl/scripts/vllm_serve.py``: each of the
``D`` data-parallel workers is one vLLM engine over ``T`` GPUs, so the server holds ``T x D`` GPUs; its defaults are
``T = D = 1``, ``U = 0.9``, ``dtype="auto"``, ``max_model_len`` the model's own). None of that is in the trainer's
``GRPOConfig`` (which names only the server's host and port), so memlab takes it as
:class:`~memlab.techniques.vllm.VLLMServer` (``memlab.estimate(trainer, vllm_server=...)``), TRL's defaults where it
is not given. What each of the server's GPUs holds, as vLLM sets it up at start-up (docs.vllm.ai,
"gpu_memory_utilization"; the engine's memory profiling at start-up):

- **the share**: ``U x`` the GPU's total memory, preallocated; vLLM refuses to start where the GPU's free memory
  (its total less the CUDA context) is below it.
- **the weights**: the served model's (the policy's base, as ``--model`` loads it: in vLLM's dtype, not quantized:
  TRL's server has no quantization option; LoRA adapters are merged into the weights TRL pushes) split over the
  ``T`` GPUs of an engine (vLLM's tensor parallelism shards every linear layer and the vocabulary).
- **the runtime**: vLLM's own activations (its profiling forward), CUDA graphs and sampler:
  :data:`~memlab.kinds.grpo.vllm.RUNTIME_ALLOWANCE`, an allowance, as for a colocated engine.
- **the KV cache**: what the share leaves, ``2 x layers x kv-heads x head-dim x bytes`` a token, the kv-heads split
  over the ``T`` GPUs (replicated where there are fewer heads than GPUs). vLLM refuses to start where it cannot hold
  one sequence of ``max_model_len`` tokens ("larger than the maximum number of tokens that can be stored in KV
  cache"), and otherwise runs as many of the trainer's sequences at once as it holds, the rest in turns.

Example:
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    ...                                      num_attention_heads=4, vocab_size=256))
    >>> server_memory(VLLMServer(tensor_parallel_size=2), model, trainer_gpu=None,
    ...               sequence_tokens=64, sequences=8).weights  # half of 115,008 weights, 2 bytes each
    115008
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from memlab.estimation.cuda.gpus import GpuKind, kind_or_default
from memlab.kinds.grpo.vllm import BLOCK_TOKENS, RUNTIME_ALLOWANCE, vllm_dtype
from memlab.sizes import format_bytes
from memlab.techniques.vllm import VLLMServer

__all__ = ["ServerMemory", "served_weight_bytes", "server_memory"]

_SOURCE = ("trl vllm-serve runs tensor_parallel_size x data_parallel_size GPUs, each engine's weights and KV heads "
           "split over its tensor-parallel GPUs; vLLM preallocates gpu_memory_utilization x each GPU's total memory "
           "and refuses to start where the KV cache left cannot hold one max_model_len sequence (docs.vllm.ai)")


@dataclass(frozen=True)
class ServerMemory:
    """What each of the server's GPUs holds (bytes), and how many of the trainer's sequences it generates at once.

    Attributes:
        gpu: the server's GPU kind.
        server: the settings it was computed from.
        share: ``gpu_memory_utilization x`` the GPU's memory, preallocated.
        weights: the served weights on one GPU (its tensor-parallel part).
        runtime: vLLM's activations, CUDA graphs and sampler (an allowance).
        kv_cache: what the share leaves for the KV cache (0 where nothing is left).
        kv_token: one token's KV cache on one GPU.
        max_model_len: the longest sequence the server accepts.
        model_len: the model's own longest (its ``max_position_embeddings``).
        sequence_tokens: one of the trainer's sequences (prompt + completion).
        sequences: the trainer's generation batch, spread over the server's engines.
        model_name: the served model's name, as ``--model`` takes it (the config's ``_name_or_path``, or MODEL).
    """

    gpu: GpuKind
    server: VLLMServer
    share: int
    weights: int
    runtime: int
    kv_cache: int
    kv_token: int
    max_model_len: int
    model_len: int
    sequence_tokens: int
    sequences: int
    model_name: str = "MODEL"

    @property
    def tokens_held(self) -> int:
        """The tokens the KV cache holds on each GPU (whole blocks of :data:`BLOCK_TOKENS`)."""
        return self.kv_cache // (self.kv_token * BLOCK_TOKENS) * BLOCK_TOKENS if self.kv_token else 0

    @property
    def at_once(self) -> int:
        """The trainer's sequences one engine generates at once (the rest wait their turn)."""
        per_sequence = math.ceil(self.sequence_tokens / BLOCK_TOKENS) * BLOCK_TOKENS
        per_engine = math.ceil(self.sequences / self.server.data_parallel_size)
        return min(per_engine, self.tokens_held // per_sequence)

    def refusal(self) -> str | None:
        """Why the server would not start (what to write instead), or None where it starts."""
        free = self.gpu.memory_bytes - self.gpu.context_bytes
        if self.share > free:
            most = math.floor(free / self.gpu.memory_bytes * 100) / 100
            return (f"trl vllm-serve --gpu-memory-utilization {self.server.gpu_memory_utilization} asks "
                    f"{format_bytes(self.share)} of each {self.gpu.name}, more than it has free after the CUDA context "
                    f"({format_bytes(free)}): vLLM would not start; write --gpu-memory-utilization {most} or less")
        if self.server.max_model_len is not None and self.server.max_model_len > self.model_len:
            return (f"trl vllm-serve --max-model-len {self.server.max_model_len} is longer than the model's "
                    f"max_position_embeddings={self.model_len}: vLLM would not start (it refuses a length over the "
                    f"model's own); write --max-model-len {self.model_len} or less")
        if self.sequence_tokens > self.max_model_len:
            return (f"the trainer's sequences take up to {self.sequence_tokens} tokens (prompt + "
                    f"max_completion_length), more than the server's max_model_len={self.max_model_len}: vLLM "
                    f"refuses such a request; write trl vllm-serve --max-model-len {self.sequence_tokens} or more, or "
                    "a shorter max_completion_length")
        if self.tokens_held < self.max_model_len:
            return (f"the vLLM server's KV cache holds {self.tokens_held:,} tokens on each {self.gpu.name} "
                    f"({format_bytes(self.kv_cache)} of its {format_bytes(self.share)} share left by the weights, "
                    f"{format_bytes(self.weights)}, and vLLM's runtime, {format_bytes(self.runtime)}), fewer than "
                    f"max_model_len={self.max_model_len:,}: vLLM would not start; write trl vllm-serve "
                    f"--max-model-len {math.ceil(self.sequence_tokens / BLOCK_TOKENS) * BLOCK_TOKENS} (the "
                    "trainer's longest sequence, in whole blocks), a larger --gpu-memory-utilization or "
                    "--tensor-parallel-size")
        return None

    def note(self) -> str:
        """What the server's GPUs hold, for the trial's notes."""
        server = self.server
        turns = ("all at once" if self.at_once >= math.ceil(self.sequences / server.data_parallel_size)
                 else f"{self.at_once} at once per engine, the rest in turns (slower)")
        return (f"vllm_mode='server': generation runs on the server's {server.gpus} {self.gpu.name} GPU"
                f"{'s' if server.gpus > 1 else ''} (tensor_parallel_size={server.tensor_parallel_size}, "
                f"data_parallel_size={server.data_parallel_size}, gpu_memory_utilization="
                f"{server.gpu_memory_utilization}); each holds its share {format_bytes(self.share)}: weights "
                f"{format_bytes(self.weights)}, vLLM's runtime {format_bytes(self.runtime)} (an allowance), KV cache "
                f"{format_bytes(self.kv_cache)} ({self.tokens_held:,} tokens; max_model_len {self.max_model_len:,}); "
                f"the trainer's {self.sequences} sequences of {self.sequence_tokens} tokens {turns}; this card holds "
                f"only the policy's training. The server: {server.command(self.model_name)}. Source: {_SOURCE}")


def served_weight_bytes(model: Any, dtype: torch.dtype) -> int:
    """The bytes of ``model``'s base weights as vLLM serves them: every parameter once (tied ones once), LoRA
    adapters left out (merged), quantized ones at their full element count, all in ``dtype``.

    Example:
        >>> from torch import nn
        >>> served_weight_bytes(nn.Linear(4, 4), torch.bfloat16)  # 16 weights and 4 biases, 2 bytes each
        40
    """
    elements: dict[int, int] = {}
    for name, parameter in model.named_parameters(remove_duplicate=True):
        if "lora_" in name:
            continue
        state = getattr(parameter, "quant_state", None)
        shape = getattr(state, "shape", None)
        elements[id(parameter)] = math.prod(shape) if shape is not None else parameter.numel()
    return sum(elements.values()) * dtype.itemsize


def server_memory(server: VLLMServer, model: Any, *, trainer_gpu: GpuKind | None, sequence_tokens: int,
                  sequences: int) -> ServerMemory:
    """What each GPU of ``server`` holds serving ``model`` for ``sequences`` sequences of ``sequence_tokens`` tokens;
    the server's GPU kind (resolved, as :func:`memlab.estimate` resolves it) or, where it names none, the trainer's.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        ...                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
        ...                                      max_position_embeddings=4096))
        >>> from memlab.estimation.cuda.gpus import GPUS
        >>> memory = server_memory(VLLMServer(gpu=GPUS["T4-16GB"]), model, trainer_gpu=None, sequence_tokens=320,
        ...                        sequences=8)
        >>> memory.refusal() is None, memory.at_once, memory.max_model_len
        (True, 8, 4096)
    """
    from memlab.inference.kv import kv_cache_bytes, kv_shape

    if server.gpu is not None and not isinstance(server.gpu, GpuKind):
        raise TypeError(f"server_memory takes a resolved GPU kind, not {server.gpu!r}: memlab.estimate resolves it")
    kind = kind_or_default(server.gpu if server.gpu is not None else trainer_gpu)
    config = model.config
    dtype = vllm_dtype(config)
    parallel = server.tensor_parallel_size
    _, kv_heads, _ = kv_shape(config)
    # vLLM splits the kv-heads over the tensor-parallel GPUs, and replicates them where there are fewer heads.
    kv_token = kv_cache_bytes(config, tokens=1, dtype=dtype) * max(1, kv_heads // parallel) // kv_heads
    share = int(server.gpu_memory_utilization * kind.memory_bytes)
    weights = math.ceil(served_weight_bytes(model, dtype) / parallel)
    kv_cache = max(0, share - weights - RUNTIME_ALLOWANCE)
    own = int(getattr(config, "max_position_embeddings", 0) or sequence_tokens)
    name = str(getattr(config, "_name_or_path", "") or "MODEL")
    return ServerMemory(kind, server, share, weights, RUNTIME_ALLOWANCE, kv_cache, kv_token,
                        server.max_model_len or own, own, sequence_tokens, sequences, name)
