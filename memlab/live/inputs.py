"""A transformers model's inputs checked before it runs: the common slips in a batch (token ids as floats or as one
row without its batch dimension, ids outside the vocabulary, a causal LM's labels of another shape, an
encoder-decoder's batch without its target) said as one :class:`~memlab.errors.MemlabError` that says what to write,
rather than the library error the forward would raise in the middle of a trial.

Only a dict batch on a model with a transformers ``config`` is checked; values (the vocabulary range) only where the
tensors hold data (not a dry run's fake tensors).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from memlab.errors import MemlabError

__all__ = ["DECODER_KEYS", "check_inputs", "check_target"]

TOKEN_KEYS = ("input_ids", "decoder_input_ids")
DECODER_KEYS = ("decoder_input_ids", "decoder_inputs_embeds")


def check_inputs(model: nn.Module, batch: Any) -> None:
    """A clear error for a batch the model's forward would fail on: token ids that are not integers, one row
    without its batch dimension, ids outside the vocabulary, a causal language model's labels of another shape.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> model = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        ...                                      num_attention_heads=2, vocab_size=32))
        >>> check_inputs(model, {"input_ids": torch.ones(2, 4)})
        Traceback (most recent call last):
        ...
        memlab.errors.MemlabError: input_ids holds torch.float32 values, and token ids are integers; write \
batch['input_ids'] = input_ids.long()
    """
    if not isinstance(batch, Mapping) or getattr(model, "config", None) is None:
        return
    for key in TOKEN_KEYS:
        ids = batch.get(key)
        if not isinstance(ids, torch.Tensor):
            continue
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise MemlabError(f"{key} holds {ids.dtype} values, and token ids are integers; write "
                              f"batch[{key!r}] = {key}.long()")
        if ids.dim() == 1:
            raise MemlabError(f"{key} has shape {tuple(ids.shape)}: one sequence without its batch dimension; a "
                              f"batch is (rows, tokens): write batch[{key!r}] = {key}.unsqueeze(0) for one row "
                              "(and the same for its other tensors)")
        _check_vocabulary(model, key, ids)
    _check_causal_labels(model, batch)


def check_target(model: nn.Module, batch: Any) -> None:
    """For an encoder-decoder trained with its own loss: the batch needs its target (``labels``, or the decoder's
    inputs); a clear error otherwise.

    Example:
        >>> check_target(nn.Linear(2, 2), {"x": torch.ones(1, 2)})  # not an encoder-decoder: nothing to say
    """
    config = getattr(model, "config", None)
    if not isinstance(batch, Mapping) or not getattr(config, "is_encoder_decoder", False):
        return
    if "labels" in batch or any(key in batch for key in DECODER_KEYS):
        return
    raise MemlabError(
        f"{type(model).__name__} is an encoder-decoder: its loss needs the target sequence as well as input_ids; "
        "add the target token ids to the batch as labels, e.g. batch = {'input_ids': ids, 'labels': target_ids} "
        "(or pass loss_fn=lambda model, batch: <scalar loss>)"
    )


def _holds_data(tensor: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return not tensor.is_meta and not isinstance(tensor, FakeTensor)


def _check_vocabulary(model: nn.Module, key: str, ids: torch.Tensor) -> None:
    # A vision-language model may give its image tokens ids past the text vocabulary and replace them before the
    # embedding: only a text model's range is known here.
    if ids.numel() == 0 or not _holds_data(ids) or getattr(model.config, "vision_config", None) is not None:
        return
    get_embeddings = getattr(model, "get_input_embeddings", None)
    try:
        embeddings = get_embeddings() if callable(get_embeddings) else None
    except (NotImplementedError, AttributeError):
        embeddings = None
    size = getattr(embeddings, "num_embeddings", None)
    if not isinstance(size, int):
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0:
        raise MemlabError(
            f"{key} holds {low}, and token ids are 0 to {size - 1}; -100 marks positions without a loss in labels "
            f"only: write the padding token's id in {key} (tokenizer.pad_token_id) and keep -100 in labels"
        )
    if high >= size:
        raise MemlabError(
            f"{key} holds {high}, and {type(model).__name__} embeds {size} tokens (ids 0 to {size - 1}); tokenize "
            "with the model's own tokenizer, or resize its embeddings: model.resize_token_embeddings(len(tokenizer))"
        )


def _is_causal_lm(model: nn.Module) -> bool:
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return False
    name = type(model).__name__
    return name.endswith("ForCausalLM") or name.endswith("LMHeadModel")


def _check_causal_labels(model: nn.Module, batch: Mapping[str, Any]) -> None:
    ids, labels = batch.get("input_ids"), batch.get("labels")
    if not (isinstance(ids, torch.Tensor) and isinstance(labels, torch.Tensor)) or not _is_causal_lm(model):
        return
    if ids.dim() == 2 and labels.shape != ids.shape:
        raise MemlabError(
            f"labels has shape {tuple(labels.shape)} and input_ids {tuple(ids.shape)}; a causal language model's "
            "labels are its input_ids' tokens, shifted inside the model: write batch['labels'] = "
            "input_ids.clone(), with -100 where no loss is wanted (padding, the prompt)"
        )
