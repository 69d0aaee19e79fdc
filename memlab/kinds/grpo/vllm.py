"""A GRPOTrainer that generates with vLLM (``use_vllm=True``): the engine's share of the card, by vLLM's arithmetic.

memlab does not run vLLM (nor does it need a GPU to estimate it): the colocated engine's memory is what vLLM
documents and TRL 1.16 sets up (``trl/generation/vllm_generation.py``):

- **the share**: ``vllm_gpu_memory_utilization x`` the card's total memory. vLLM's ``gpu_memory_utilization`` is
  the fraction of the GPU's *total* memory its engine may use, per instance: its weights, its activations (a
  profiling forward of ``max_num_batched_tokens``), CUDA graphs, and the KV cache, which takes what the others
  leave and is preallocated at start-up (docs.vllm.ai, "gpu_memory_utilization"; vLLM also refuses to start where
  the card's free memory is below the share). So the share is held whole from the trainer's ``__init__`` on.
- **its content**: the weights in vLLM's dtype (``dtype="auto"``, which TRL keeps: the config's dtype, float16 for
  a float32 config; packed 4-bit weights as stored, TRL loading a QLoRA policy's base with bitsandbytes) and the
  KV cache, ``2 x layers x kv-heads x head-dim x bytes`` a token, in blocks of 16 tokens.
  A share that cannot hold the weights and one sequence of ``prompt + max_completion_length`` tokens does not start
  (vLLM's "No available memory for the cache blocks"); one that cannot hold the whole generation batch
  (``max_num_seqs = per_device_train_batch_size x steps_per_generation``) runs fewer sequences at once (slower).
- **sleep mode** (``vllm_enable_sleep_mode=True``): TRL puts the engine to sleep at level 2 after creating it and
  after every generation, and wakes its weights, then its KV cache, before each one. vLLM's level 2 discards the
  weights and the KV cache (level 1 would back the weights up in CPU memory), so while the policy trains the share
  is released and nothing of it moves to the host; the weights are pushed again from the policy at wake-up.
- **server mode** (``vllm_mode="server"``): the engine runs on the server's own GPUs; this card holds only training.

The trainer's settings as the levers read them (:class:`~memlab.techniques.vllm.VLLMSettings`) and ``memlab.apply``'s
refusal to change them on a built trainer belong to the levers' module, :mod:`memlab.techniques.vllm`.

Example:
    >>> SLEEP_LEVEL, BLOCK_TOKENS
    (2, 16)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from memlab.sizes import format_bytes
from memlab.techniques.vllm import VLLMSettings

__all__ = ["BLOCK_TOKENS", "RUNTIME_ALLOWANCE", "SLEEP_LEVEL", "UTILIZATIONS", "VLLMShare", "engine_device",
           "utilization_candidates", "vllm_share"]

SLEEP_LEVEL = 2
"""The level TRL 1.16 puts vLLM to sleep at (``llm.sleep(level=2)`` in ``VLLMGeneration``): weights and KV cache
discarded, nothing backed up on the host."""

BLOCK_TOKENS = 16
"""vLLM's default KV cache block: a sequence takes whole blocks of this many tokens."""

RUNTIME_ALLOWANCE = 2**30
"""What ``fit`` leaves in a share beyond the weights and the KV cache for vLLM's own activations (its profiling
forward of ``max_num_batched_tokens=4096`` tokens, which TRL sets), CUDA graphs and sampler: an allowance, not
modelled (vLLM logs these at start-up; they are a few hundred MiB to about 1 GiB for models up to 8B)."""

UTILIZATIONS = (0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
"""The ``vllm_gpu_memory_utilization`` values ``fit`` tries (TRL's default is 0.3; its examples use 0.1 to 0.9)."""

_SOURCE = ("vLLM's gpu_memory_utilization is a fraction of the card's total memory, preallocated for the engine's "
           "weights, activations and KV cache (docs.vllm.ai); TRL 1.16 creates the engine in the trainer's __init__ "
           "and puts it to sleep at level 2 (weights and KV cache discarded) after each generation when "
           "vllm_enable_sleep_mode=True")


@dataclass(frozen=True)
class VLLMShare:
    """What a colocated vLLM engine holds on the card (bytes).

    Attributes:
        card: the card's total memory (the GPU kind the estimate answers for).
        share: ``utilization x card``: held from the trainer's ``__init__`` on, whole while the engine is awake.
        weights: vLLM's copy of the weights (its dtype).
        kv_sequence: the KV cache of one sequence of ``prompt + completion`` tokens (whole blocks).
        kv_batch: the KV cache of the generation batch at once (``max_num_seqs`` such sequences).
        asleep: what stays on the card while the engine sleeps (counted: 0; vLLM's CUDA graphs are not modelled).
        host: what sleeping keeps on the host (level 2: nothing; level 1 would keep the weights).
        settings: the settings it was computed from.
    """

    card: int
    share: int
    weights: int
    kv_sequence: int
    kv_batch: int
    asleep: int
    host: int
    settings: VLLMSettings

    @property
    def during_training(self) -> int:
        """What the engine holds on the card while the policy trains: the share, or what sleep keeps."""
        return self.asleep if self.settings.sleep else self.share

    @property
    def least(self) -> float:
        """The smallest utilization whose share holds the weights, the generation batch's KV cache and
        :data:`RUNTIME_ALLOWANCE`."""
        return (self.weights + self.kv_batch + RUNTIME_ALLOWANCE) / self.card

    def refusal(self) -> str | None:
        """Why vLLM would not start with this share (what utilization to write), or None where it starts."""
        if self.share >= self.weights + self.kv_sequence:
            return None
        least = math.ceil((self.weights + self.kv_batch) / self.card * 100) / 100
        return (f"vllm_gpu_memory_utilization={self.settings.utilization} gives vLLM {format_bytes(self.share)} of "
                f"this card of {format_bytes(self.card)}, less than its weights ({format_bytes(self.weights)}) and the "
                f"KV cache of one sequence ({format_bytes(self.kv_sequence)}): vLLM would not start ('No available "
                f"memory for the cache blocks'); write GRPOConfig(vllm_gpu_memory_utilization={min(least, 1.0)}) "
                "or more, which also holds the generation batch's KV cache")

    def note(self, gpu_name: str) -> str:
        """The arithmetic and its source, for the trial's notes."""
        utilization = self.settings.utilization
        if self.settings.sleep:
            held = (f"vllm_enable_sleep_mode=True: awake only while it generates; asleep (level {SLEEP_LEVEL}) during "
                    f"the reference / old-policy log-probs and training, where it holds {format_bytes(self.asleep)} "
                    f"(vLLM's CUDA graphs, which it keeps, are not counted) and keeps {format_bytes(self.host)} on the "
                    "host")
        else:
            held = "resident through the whole step (vllm_enable_sleep_mode=False), training included"
        fewer = "" if self.share >= self.weights + self.kv_batch else (
            f"; the share holds fewer than the generation batch's sequences at once (its KV cache needs "
            f"{format_bytes(self.kv_batch)}): vLLM then generates them in turns, slower")
        parallel = self.settings.tensor_parallel
        split = (f" (its part on each of the {parallel} ranks of its tensor-parallel group, which generates their "
                 "prompts together, its kv-heads split too)") if parallel > 1 else ""
        return (f"colocated vLLM engine: vllm_gpu_memory_utilization={utilization} x the {gpu_name}'s "
                f"{format_bytes(self.card)} = {format_bytes(self.share)} under other, its weights "
                f"{format_bytes(self.weights)} in vLLM's dtype{split} and its KV cache the rest "
                f"({format_bytes(self.kv_batch)} for the generation batch); {held}{fewer}. Source: {_SOURCE}")


def vllm_dtype(config: Any) -> torch.dtype:
    """The dtype vLLM loads a model in with ``dtype="auto"`` (TRL passes no dtype): the config's, float16 for a
    float32 config (vLLM's "common practice"; bfloat16 for Gemma).

    Example:
        >>> from transformers import LlamaConfig
        >>> vllm_dtype(LlamaConfig(dtype="float32")), vllm_dtype(LlamaConfig(dtype="bfloat16"))
        (torch.float16, torch.bfloat16)
    """
    # transformers 5 names it dtype (reading torch_dtype there logs a deprecation); earlier releases torch_dtype.
    dtype = getattr(config, "dtype" if hasattr(config, "dtype") else "torch_dtype", None) or torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, torch.float32)
    if dtype == torch.float32:
        return torch.bfloat16 if str(getattr(config, "model_type", "")).startswith("gemma") else torch.float16
    return dtype if isinstance(dtype, torch.dtype) else torch.float16


def vllm_share(settings: VLLMSettings, model: Any, *, card: int, prompt: int, completion: int,
               sequences: int) -> VLLMShare:
    """The colocated engine's share of a ``card``-byte GPU for ``model`` generating ``sequences`` sequences of
    ``prompt + completion`` tokens at once.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        ...                                      num_attention_heads=2, vocab_size=256))
        >>> settings = VLLMSettings("colocate", 0.5, sleep=True)
        >>> share = vllm_share(settings, model, card=2**30, prompt=10, completion=6, sequences=4)
        >>> share.share, share.kv_sequence, share.during_training
        (536870912, 8192, 0)
    """
    from memlab.inference.kv import kv_cache_bytes, kv_shape

    dtype = vllm_dtype(model.config)
    # Packed 4-bit weights (bitsandbytes' uint8 storage) load into vLLM 4-bit too (TRL passes
    # quantization="bitsandbytes"): counted as stored; the others in vLLM's dtype.
    storages = {p.untyped_storage().data_ptr() if p.device.type != "meta" else id(p):
                p.numel() * (p.element_size() if p.dtype in (torch.uint8, torch.int8) else dtype.itemsize)
                for p in model.parameters()}
    # An engine over tensor_parallel GPUs (TRL groups that many ranks) splits the weights and the kv-heads over them
    # (the heads replicated where there are fewer) and generates the whole group's prompts.
    parallel = settings.tensor_parallel
    weights = math.ceil(sum(storages.values()) / parallel)
    tokens = math.ceil((prompt + completion) / BLOCK_TOKENS) * BLOCK_TOKENS
    _, kv_heads, _ = kv_shape(model.config)
    kv_sequence = kv_cache_bytes(model.config, tokens=tokens, batch=1, dtype=dtype) * max(1, kv_heads // parallel) \
        // kv_heads
    share = int(settings.utilization * card)
    host = weights if SLEEP_LEVEL == 1 and settings.sleep else 0
    return VLLMShare(card, share, weights, kv_sequence, kv_sequence * sequences * parallel, 0, host, settings)


def utilization_candidates(share: VLLMShare) -> list[float]:
    """The ``vllm_gpu_memory_utilization`` values ``fit`` estimates: the smallest that holds the weights, the
    generation batch's KV cache and vLLM's runtime allowance (:attr:`VLLMShare.least`, rounded up to a hundredth),
    the values TRL users write between it and the set one (:data:`UTILIZATIONS`), and the set one.

    Example:
        >>> settings = VLLMSettings("colocate", 0.5, sleep=False)
        >>> utilization_candidates(VLLMShare(10 * 2**30, 5 * 2**30, 2**29, 0, 2**28, 0, 0, settings))
        [0.18, 0.2, 0.25, 0.3, 0.4, 0.5]
    """
    least = math.ceil(share.least * 100 - 1e-9) / 100
    top = share.settings.utilization
    found = {round(value, 2) for value in UTILIZATIONS if least < value < top}
    return sorted({min(least, top), *found, top})


def engine_device(trainer: Any, device: Any) -> Any:
    """The device a GRPOTrainer's step is estimated for: ``device``, or CUDA where a colocated vLLM engine shares the
    card (the training shares it too; a CPU model is then estimated for the card).

    Example:
        >>> from types import SimpleNamespace
        >>> plain = SimpleNamespace(args=SimpleNamespace(use_vllm=False))
        >>> engine_device(plain, "cpu")
        'cpu'
        >>> shared = SimpleNamespace(args=SimpleNamespace(use_vllm=True, vllm_mode="colocate"))
        >>> engine_device(shared, "cpu"), engine_device(shared, None)
        ('cuda', 'cuda')
    """
    settings = VLLMSettings.of(trainer)
    if settings is not None and settings.colocated and (device is None or torch.device(device).type != "cuda"):
        return "cuda"
    return device
