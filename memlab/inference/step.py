"""One inference step on the live model: a forward, or a generation, under ``torch.inference_mode()``.

``new_tokens=0``: one forward over the batch (full logits, as an evaluation computes them); ``new_tokens=N``: greedy
generation as ``model.generate`` runs it: a prefill forward over the prompt (the last token's logits only, where the
model takes ``logits_to_keep``), then ``N - 1`` decode forwards of one token each with the KV cache, or of the whole
sequence so far without it. Under a tracker, what the cache's ``update`` allocates counts as ``"kv_cache"`` and the
forwards' other allocations as ``"activations"``. Floating-point inputs are given to the model in the weights' dtype
(a bf16 model takes bf16 inputs).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from memlab.inference.kv import (
    cache_bytes,
    cache_keyword,
    cache_tokens,
    can_grow,
    grow_cache,
    is_causal_lm,
    new_cache,
    takes_logits_to_keep,
    track_cache,
)
from memlab.inference.weights import DTYPES
from memlab.live.batch import Batch, map_tensors, take_rows
from memlab.live.inputs import DECODER_KEYS
from memlab.measure.tracker import MemoryTracker
from memlab.plan import InferencePlan
from memlab.runner.workload import RunContext

__all__ = ["InferenceStep", "StepResult", "decoder_inputs", "is_encoder_decoder", "model_inputs"]


@dataclass
class StepResult:
    """What one inference step did: seconds of its prefill and of each decode step (generation only), the KV
    cache it held at the end (bytes, tokens per row), and the decode steps a dry run did not run (their cache grown
    instead: :meth:`InferenceStep.skipped`).

    Example:
        >>> from memlab.measure.probes import probe_for
        >>> from memlab.runner.workload import RunContext
        >>> from memlab.options import RunOptions
        >>> model = nn.Linear(4, 2)
        >>> step = InferenceStep(RunContext(model, torch.randn(3, 4), RunOptions(), probe_for(model), rows=3))
        >>> step(InferencePlan())
        StepResult(prefill_s=None, decode_s=[], cache_bytes=0, cache_tokens=0, skipped_decode=0)
    """

    prefill_s: float | None = None
    decode_s: list[float] = field(default_factory=list)
    cache_bytes: int = 0
    cache_tokens: int = 0
    skipped_decode: int = 0


class InferenceStep:
    """Runs one step of an inference plan (its weights already on the model) on the context's model and batch (a
    dict with ``input_ids`` for a language model; ``labels`` are left out of the forward)."""

    def __init__(self, context: RunContext) -> None:
        self.model: nn.Module = context.model
        self.probe = context.probe
        self.clock = context.clock
        self.rows = context.rows
        self.inputs = model_inputs(context.batch)
        self.decoder_note: str | None = None
        if is_encoder_decoder(self.model) and isinstance(self.inputs, Mapping):
            self.inputs, self.decoder_note = decoder_inputs(self.model, self.inputs, context.batch)
        self.causal = is_causal_lm(self.model)
        self.logits_to_keep = self.causal and takes_logits_to_keep(self.model)
        self.cache_keyword = cache_keyword(self.model)
        ids = self.inputs.get("input_ids") if isinstance(self.inputs, Mapping) else None
        self.prompt_tokens = int(ids.shape[1]) if isinstance(ids, torch.Tensor) and ids.dim() == 2 else None

    def __call__(self, plan: InferencePlan, tracker: MemoryTracker | None = None) -> StepResult:
        """Run one step of ``plan`` (its weights already on the model) under ``torch.inference_mode()``; with a
        tracker, allocations are charged to their categories."""
        with torch.inference_mode():
            inputs = self._sized_inputs(plan)
            if plan.generates:
                return self._generate(plan, inputs, tracker)
            cache = new_cache(self.model) if self.causal and plan.kv_cache else None
            untrack = track_cache(cache, tracker)
            try:
                with _phase(tracker, "activations"), _section(tracker, "forward"):
                    output = self._forward(inputs, cache, plan.kv_cache, last_only=False)
                del output
                return StepResult(cache_bytes=cache_bytes(cache), cache_tokens=cache_tokens(cache))
            finally:
                untrack()

    def _generate(self, plan: InferencePlan, inputs: Any, tracker: MemoryTracker | None) -> StepResult:
        ids = inputs["input_ids"]
        mask = inputs.get("attention_mask")
        cache = new_cache(self.model) if plan.kv_cache else None
        untrack = track_cache(cache, tracker)
        try:
            self.probe.synchronize()
            started = self.clock()
            prompt = {"input_ids": ids} if mask is None else {"input_ids": ids, "attention_mask": mask}
            with _phase(tracker, "activations"), _section(tracker, "prefill"):
                logits = self._forward(prompt, cache, plan.kv_cache, last_only=True).logits
                next_token = logits[:, -1:].argmax(-1)
                del logits
            self.probe.synchronize()
            sequence = torch.cat([ids, next_token], dim=1)
            skipped = self.skipped(plan, ids, cache)
            result = StepResult(prefill_s=self.clock() - started, skipped_decode=skipped)
            for index in range(plan.new_tokens - 1 - skipped):
                if skipped and index == 1:  # the steps between the first and the last, as they would leave it
                    if cache is not None:
                        with _phase(tracker, "kv_cache"):
                            grow_cache(cache, skipped)
                    sequence = torch.cat([sequence, sequence.new_zeros((sequence.shape[0], skipped))], dim=1)
                    if mask is not None:
                        mask = torch.cat([mask, mask.new_ones((mask.shape[0], skipped))], dim=1)
                self.probe.synchronize()
                started = self.clock()
                if mask is not None:
                    mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
                step = {"input_ids": next_token if plan.kv_cache else sequence}
                if mask is not None:
                    step["attention_mask"] = mask
                with _phase(tracker, "activations"), _section(tracker, "decode"):
                    logits = self._forward(step, cache, plan.kv_cache, last_only=True).logits
                    next_token = logits[:, -1:].argmax(-1)
                    del logits
                sequence = torch.cat([sequence, next_token], dim=1)
                self.probe.synchronize()
                result.decode_s.append(self.clock() - started)
            result.cache_bytes, result.cache_tokens = cache_bytes(cache), cache_tokens(cache)
            return result
        finally:
            untrack()

    @staticmethod
    def skipped(plan: InferencePlan, ids: torch.Tensor, cache: Any) -> int:
        """The decode steps a dry run leaves out: on fake tensors, all but the first and the last (they differ only
        in the cache's length, which :func:`~memlab.inference.kv.grow_cache` sets), so that a generation's estimate
        costs the same at any length; none on real tensors, or where the cache cannot be grown."""
        from torch._subclasses.fake_tensor import is_fake

        skipped = plan.new_tokens - 3
        if skipped <= 0 or not is_fake(ids) or (cache is not None and not can_grow(cache)):
            return 0
        return skipped

    def _forward(self, inputs: Any, cache: Any, use_cache: bool, *, last_only: bool) -> Any:
        if self.causal:
            keywords = dict(inputs)
            keywords["use_cache"] = use_cache and cache is not None
            if cache is not None:
                keywords[self.cache_keyword] = cache
            if last_only and self.logits_to_keep:
                keywords["logits_to_keep"] = 1
            return self.model(**keywords)
        if isinstance(inputs, Mapping):
            return self.model(**inputs)
        if isinstance(inputs, torch.Tensor):
            return self.model(inputs)
        return self.model(*inputs)

    def _sized_inputs(self, plan: InferencePlan) -> Any:
        """The inputs with the plan's rows (repeated or cut), floating-point inputs in the weights' dtype."""
        inputs = self.inputs
        rows = plan.rows(self.rows)
        if rows != self.rows:
            inputs = take_rows(inputs, torch.arange(rows) % self.rows)
        dtype = DTYPES[plan.weights]
        return map_tensors(inputs, lambda t: t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t)



def _phase(tracker: MemoryTracker | None, category: str) -> contextlib.AbstractContextManager[Any]:
    return tracker.phase(category) if tracker is not None else contextlib.nullcontext()


def _section(tracker: MemoryTracker | None, name: str) -> contextlib.AbstractContextManager[Any]:
    return tracker.section(name) if tracker is not None else contextlib.nullcontext()


def is_encoder_decoder(model: nn.Module) -> bool:
    """True for a transformers encoder-decoder (T5, BART, Whisper...), whose forward needs the decoder's tokens.

    Example:
        >>> is_encoder_decoder(nn.Linear(2, 2))
        False
    """
    return bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))


def decoder_inputs(model: nn.Module, inputs: Mapping[str, Any], batch: Any) -> tuple[dict[str, Any], str | None]:
    """An encoder-decoder's forward inputs: where the batch has ``labels`` but no decoder inputs (a training batch),
    the decoder's tokens made from the labels as the model's own training forward makes them
    (``prepare_decoder_input_ids_from_labels``: shifted right, the start token first), and a note that says so;
    the inputs as they are otherwise (:meth:`InferenceWorkload.check` refuses a batch with neither).

    Example:
        >>> from transformers import T5Config, T5ForConditionalGeneration
        >>> model = T5ForConditionalGeneration(T5Config(vocab_size=32, d_model=8, d_kv=4, d_ff=8, num_layers=1,
        ...                                             num_heads=2, decoder_start_token_id=0))
        >>> batch = {"input_ids": torch.ones(1, 3, dtype=torch.long), "labels": torch.tensor([[5, 6]])}
        >>> inputs, note = decoder_inputs(model, model_inputs(batch), batch)
        >>> inputs["decoder_input_ids"].tolist(), note.split(":")[0]
        ([[0, 5]], "decoder_input_ids made from the batch's labels (shifted right)")
    """
    labels = batch.get("labels") if isinstance(batch, Mapping) else None
    prepare = getattr(model, "prepare_decoder_input_ids_from_labels", None)
    if any(key in inputs for key in DECODER_KEYS) or not isinstance(labels, torch.Tensor):
        return dict(inputs), None
    if callable(prepare):
        made = prepare(labels=labels)
    else:  # a model without the method (Whisper) shifts the labels in its forward as this does (shift_tokens_right)
        config = getattr(model, "config", None)
        start, pad = getattr(config, "decoder_start_token_id", None), getattr(config, "pad_token_id", None) or 0
        if start is None:
            return dict(inputs), None
        made = labels.new_full(labels.shape, pad)
        made[:, 1:] = labels[:, :-1]
        made[:, 0] = start
        made = made.masked_fill(made == -100, pad)
    note = ("decoder_input_ids made from the batch's labels (shifted right): as the model's training forward makes "
            "them, one forward over the whole target, as an evaluation runs it")
    return {**inputs, "decoder_input_ids": made}, note


def model_inputs(batch: Batch) -> Any:
    """The batch as the forward takes it: ``labels`` left out (inference computes no loss).

    Example:
        >>> model_inputs({"input_ids": 1, "labels": 2})
        {'input_ids': 1}
    """
    if isinstance(batch, Mapping):
        return {key: value for key, value in batch.items() if key != "labels"}
    return batch
