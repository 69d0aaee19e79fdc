"""Inference memory: how large a batch the trained model can serve or evaluate with, and what bf16, fp16, 8-bit or
4-bit weights and the KV cache cost, on the same core as training (same probes, same restore, same report).

- :class:`~memlab.plan.InferencePlan` (weights' dtype, quantization, batch size, new tokens, KV cache) and ``--try``
  grids over it are data, in :mod:`memlab.plan` beside the training Plan (the report reads them back).
- :mod:`memlab.inference.run`: measuring it on the live model, on the one runner of training trials with an
  inference workload (:func:`measure_inference`, :func:`compare_inference`; importing it registers
  :class:`InferenceRunner` for an InferencePlan, so ``memlab.measure`` and ``memlab.compare`` run it there).
- :mod:`memlab.inference.step`: one request under ``torch.inference_mode()``: a forward, or a generation.
- :mod:`memlab.inference.fit`: :func:`fit_inference`, the largest batch (or the fastest setting) within a budget.
- :mod:`memlab.inference.kv`: the KV cache's bytes from a config (:func:`kv_cache_bytes`) and from its tensors.
- :mod:`memlab.inference.weights`: casting and bitsandbytes quantization (int8, NF4), undone bit-exact.
- ``memlab.estimate(model_or_config, shapes, InferencePlan(...))`` predicts it on fake tensors
  (:func:`memlab.estimation.estimate.estimate_inference`).

Example:
    >>> import torch, memlab
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    ...                      num_key_value_heads=2, vocab_size=128)
    >>> model = LlamaForCausalLM(config)
    >>> batch = {"input_ids": torch.randint(0, 128, (2, 16))}
    >>> trial = memlab.measure(model, batch, memlab.InferencePlan(weights="bf16", new_tokens=4), steps=1, noise=0)
    >>> trial.context_tokens, trial.kv_cache_end_bytes == kv_cache_bytes(config, tokens=19, batch=2, dtype="bf16")
    (19, True)
"""

from __future__ import annotations

from memlab.inference.fit import LargestBatchReport, fit_inference
from memlab.inference.kv import kv_cache_bytes
from memlab.inference.run import InferenceRunner, compare_inference, measure_inference
from memlab.plan import InferencePlan, parse_inference_grid

__all__ = [
    "InferencePlan",
    "InferenceRunner",
    "LargestBatchReport",
    "compare_inference",
    "fit_inference",
    "kv_cache_bytes",
    "measure_inference",
    "parse_inference_grid",
]
