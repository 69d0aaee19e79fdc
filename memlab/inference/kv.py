"""The KV cache: its size from a model's config (the formula), and its real tensors (measured).

A decoder keeps, for every layer, the keys and the values of every past token: ``2 x layers x kv-heads x head-dim
x tokens x rows x bytes per element``. With grouped-query attention (``num_key_value_heads`` below
``num_attention_heads``) only the kv-heads are kept. :func:`kv_cache_bytes` counts every layer as full attention; a
sliding-window layer (Mistral's ``sliding_window``) keeps at most about its window, which ``memlab.measure`` and
``memlab.estimate`` report and the formula does not.

Example:
    >>> from transformers import LlamaConfig
    >>> config = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    >>> kv_cache_bytes(config, tokens=16, batch=2, dtype="bf16")  # 2 x 2 layers x 2 heads x 16 dims x 16 x 2 x 2
    8192
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from memlab.errors import MemlabError, refuse_class
from memlab.measure.tracker import MemoryTracker

__all__ = [
    "DTYPE_BYTES",
    "cache_bytes",
    "cache_tensors",
    "cache_tokens",
    "can_grow",
    "grow_cache",
    "is_causal_lm",
    "has_no_kv_cache",
    "kv_cache_bytes",
    "kv_heads_of",
    "kv_shape",
    "learned_positions",
    "new_cache",
    "takes_logits_to_keep",
    "track_cache",
]

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
"""Bytes per element of the weight dtypes an InferencePlan names."""


def kv_shape(config: Any) -> tuple[int, int, int]:
    """``(layers, kv_heads, head_dim)`` of a transformers decoder config.

    ``head_dim`` is the config's own where it has one, else ``hidden_size // num_attention_heads``; kv-heads are
    :func:`kv_heads_of` (grouped-query and multi-query attention). A model stands for its config, a multimodal
    config (Llava's) for its language model's. An encoder-only config (BERT's) has no cache: a MemlabError.

    Example:
        >>> from transformers import GPT2Config, LlamaConfig, LlavaConfig
        >>> kv_shape(GPT2Config(n_layer=2, n_embd=64, n_head=4))
        (2, 4, 16)
        >>> kv_shape(LlavaConfig(text_config=LlamaConfig(hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
        ...                                              num_key_value_heads=2).to_dict()))
        (3, 2, 16)
    """
    if isinstance(config, nn.Module):  # a model: its config
        config = getattr(config, "config", config)
    get_text_config = getattr(config, "get_text_config", None)
    if callable(get_text_config):  # a multimodal config (Llava's): its language model's
        config = get_text_config(decoder=True)
    try:
        layers = int(config.num_hidden_layers)
        heads = int(config.num_attention_heads)
    except (AttributeError, TypeError):
        raise MemlabError(
            f"{type(config).__name__} has no num_hidden_layers / num_attention_heads; pass the config of a "
            "transformers decoder (model.config)"
        ) from None
    if has_no_kv_cache(config):
        raise MemlabError(
            f"{type(config).__name__} is an encoder-only model: it keeps no KV cache; pass the config of a decoder "
            "(a causal LM such as LlamaConfig), or measure the encoder with memlab.measure"
        )
    head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
    return layers, kv_heads_of(config, heads), int(head_dim)


def kv_heads_of(config: Any, heads: int) -> int:
    """The heads a layer keeps keys and values for: ``num_key_value_heads`` (grouped-query attention); Falcon's
    ``num_kv_heads`` with its new decoder architecture, one head with ``multi_query`` (Falcon-7B, StarCoder's
    GPTBigCode), as their attention modules build them; else every attention head.

    Example:
        >>> from transformers import FalconConfig
        >>> new = FalconConfig(new_decoder_architecture=True, num_kv_heads=8)
        >>> kv_heads_of(FalconConfig(), 71), kv_heads_of(new, 128)
        (1, 8)
    """
    grouped = getattr(config, "num_key_value_heads", None)
    if grouped:
        return int(grouped)
    if getattr(config, "new_decoder_architecture", False) and getattr(config, "num_kv_heads", None):
        return int(config.num_kv_heads)
    if getattr(config, "multi_query", False):
        return 1
    return heads


def has_no_kv_cache(config: Any) -> bool:
    """True for an encoder-only config (BERT's, RoBERTa's, DistilBERT's): a masked-LM family not set up as a
    decoder, or a family transformers has no causal LM for.

    Example:
        >>> from transformers import BertConfig, LlamaConfig
        >>> has_no_kv_cache(BertConfig()), has_no_kv_cache(BertConfig(is_decoder=True)), has_no_kv_cache(LlamaConfig())
        (True, False, False)
    """
    from transformers.models.auto import modeling_auto

    model_type = getattr(config, "model_type", "")
    if not model_type or getattr(config, "is_encoder_decoder", False) or getattr(config, "is_decoder", False):
        return False
    causal = model_type in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    masked = model_type in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    return masked or not causal


def kv_cache_bytes(config: Any, tokens: int, batch: int = 1, dtype: str | torch.dtype | int = "bf16") -> int:
    """The KV cache of ``tokens`` tokens per row for ``batch`` rows: ``2 x layers x kv-heads x head-dim x tokens x
    batch x bytes per element`` (see :func:`kv_shape`). ``dtype``: ``"fp32"``, ``"bf16"``, ``"fp16"``, a torch
    dtype, or bytes per element. Every layer is counted as full attention (sliding windows are not applied).

    Example:
        >>> from transformers import LlamaConfig
        >>> kv_cache_bytes(LlamaConfig(), tokens=4096, batch=1, dtype=torch.float16) / 2**30  # Llama 2 7B shape
        2.0
    """
    for name, value in (("tokens", tokens), ("batch", batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise MemlabError(f"{name}={value!r} is not allowed; write a whole number >= 0")
    refuse_class(config, "kv_cache_bytes")
    layers, kv_heads, head_dim = kv_shape(config)
    return 2 * layers * kv_heads * head_dim * tokens * batch * _element_bytes(dtype)


def _element_bytes(dtype: str | torch.dtype | int) -> int:
    if isinstance(dtype, torch.dtype):
        return dtype.itemsize
    if isinstance(dtype, int) and not isinstance(dtype, bool) and dtype > 0:
        return dtype
    if isinstance(dtype, str) and dtype in DTYPE_BYTES:
        return DTYPE_BYTES[dtype]
    raise MemlabError(f"dtype={dtype!r} is not known; write 'fp32', 'bf16', 'fp16', a torch dtype, or bytes")


def is_causal_lm(model: nn.Module) -> bool:
    """True for a transformers model that can generate text (a decoder with a KV cache), such as
    ``LlamaForCausalLM``; False for other modules.

    Example:
        >>> is_causal_lm(nn.Linear(2, 2))
        False
    """
    can_generate = getattr(model, "can_generate", None)
    config = getattr(model, "config", None)
    if not callable(can_generate) or config is None or getattr(config, "is_encoder_decoder", False):
        return False
    try:
        return bool(can_generate())
    except Exception:  # noqa: BLE001 - a model that cannot answer cannot generate
        return False


def learned_positions(model: nn.Module) -> int | None:
    """How many positions a model with learned position embeddings (GPT-2's ``wpe``, BERT's, OPT's) can embed
    (``config.max_position_embeddings``); None where positions are computed (rotary, ALiBi: any length runs) or
    the model has no config. A longer sequence fails in the forward (an index out of range); a fake-tensor
    estimate would not see it.

    Example:
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> learned_positions(GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, n_positions=64))), \
learned_positions(nn.Linear(2, 2))
        (64, None)
    """
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        return None
    get_input = getattr(model, "get_input_embeddings", None)
    try:
        tokens = get_input() if callable(get_input) else None
    except (NotImplementedError, AttributeError):
        tokens = None
    for module in model.modules():
        # OPT's table has 2 rows more than its positions (an offset); a token table is never taken for one
        if isinstance(module, nn.Embedding) and module is not tokens and limit <= module.num_embeddings <= limit + 2:
            return limit
    return None


def takes_logits_to_keep(model: nn.Module) -> bool:
    """Whether the model's forward takes ``logits_to_keep`` (then a prefill computes the last token's logits only,
    as ``generate`` asks).

    Example:
        >>> takes_logits_to_keep(nn.Linear(2, 2))
        False
    """
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def cache_keyword(model: nn.Module) -> str:
    """The keyword the model's forward takes its KV cache by, as the installed transformers names it: ``cache``
    (transformers 5.2x, where ``past_key_values`` is deprecated and warns in the user's notebook), else
    ``past_key_values``.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> import transformers
        >>> model = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        ...                                      num_attention_heads=2, vocab_size=32))
        >>> cache_keyword(model) in ("cache", "past_key_values")
        True
    """
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"


def new_cache(model: nn.Module) -> Any:
    """An empty ``DynamicCache`` for the model (its layers as the config says: sliding windows included).

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        ...                                      num_attention_heads=2, vocab_size=64))
        >>> cache_tokens(new_cache(model)), cache_bytes(new_cache(model))
        (0, 0)
    """
    from transformers import DynamicCache

    config: Any = getattr(model, "config", None)
    return DynamicCache(config=config)


def cache_tensors(cache: Any) -> Iterator[torch.Tensor]:
    """The keys and values the cache holds (every layer's), as tensors.

    Example:
        >>> list(cache_tensors(None))
        []
    """
    if cache is None:
        return
    for layer in getattr(cache, "layers", ()) or ():
        for name in ("keys", "values"):
            tensor = getattr(layer, name, None)
            if isinstance(tensor, torch.Tensor):
                yield tensor


def cache_bytes(cache: Any) -> int:
    """Bytes of the storages of the cache's tensors (each tensor once).

    Example:
        >>> cache_bytes(None)
        0
    """
    tensors = {id(tensor): tensor for tensor in cache_tensors(cache)}
    return sum(int(tensor.untyped_storage().nbytes()) for tensor in tensors.values())


def cache_tokens(cache: Any) -> int:
    """Tokens per row the cache holds (0 for an empty cache or none).

    Example:
        >>> cache_tokens(None)
        0
    """
    if cache is None:
        return 0
    try:
        return int(cache.get_seq_length())
    except Exception:  # noqa: BLE001 - an empty cache of some layouts cannot say
        return 0


def can_grow(cache: Any) -> bool:
    """Whether :func:`grow_cache` can grow ``cache``: a filled ``DynamicCache`` whose layers are all full or
    sliding-window ones (not static, quantized or linear-attention layers, nor a window that keeps its past).

    Example:
        >>> from transformers import DynamicCache
        >>> can_grow(DynamicCache())
        False
    """
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    layers = list(getattr(cache, "layers", ()) or ())
    return bool(layers) and all(
        (type(layer) is DynamicLayer or (type(layer) is DynamicSlidingWindowLayer and not layer.record_past))
        and isinstance(getattr(layer, "keys", None), torch.Tensor) for layer in layers)


def grow_cache(cache: Any, tokens: int) -> None:
    """Grow a ``DynamicCache`` (one :func:`can_grow` accepts) by ``tokens`` positions per row to what that many
    one-token decode steps would leave in it, without running them: what a dry run's generation skips, since its
    decode steps differ only in the cache's length. Each layer's keys, then its values, are replaced by tensors of
    the grown size, the new one made while the old is alive, as the step's ``torch.cat`` makes it: a full layer's
    of every position, a sliding window's of the window it keeps, on the storage a one-token step leaves (one
    position more than the window keeps). Hand-written because transformers has no way to extend a cache without
    running the model; :func:`can_grow` limits it to the two layer kinds whose storage it knows.

    Example:
        >>> from transformers import DynamicCache
        >>> cache = DynamicCache()
        >>> _ = cache.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), 0)
        >>> grow_cache(cache, 5)
        >>> cache_tokens(cache), cache_bytes(cache)
        (8, 512)
    """
    for layer in cache.layers:
        window = getattr(layer, "sliding_window", None)
        grown = layer.get_seq_length() + tokens
        kept = grown if window is None else min(grown, window - 1)
        stored = grown if window is None else min(grown - 1, window - 1) + 1
        for name in ("keys", "values"):
            old = getattr(layer, name)
            made = old.new_empty((*old.shape[:-2], stored, old.shape[-1]))
            setattr(layer, name, made[..., stored - kept:, :])
            del old, made
        if window is not None:
            layer.cumulative_length = grown


def track_cache(cache: Any, tracker: MemoryTracker | None) -> Callable[[], None]:
    """Charge what the cache allocates to the tracker's ``"kv_cache"`` category: its ``update`` (which every
    attention layer calls with the new keys and values) runs in that phase, and the tensors it keeps are filed
    there. Returns what takes the wrapper off again.

    Example:
        >>> track_cache(None, None)()
    """
    if cache is None or tracker is None:
        return lambda: None
    original = cache.update

    def update(*args: Any, **kwargs: Any) -> Any:
        with tracker.phase("kv_cache"):
            result = original(*args, **kwargs)
        tracker.mark(list(cache_tensors(cache)), "kv_cache")
        return result

    cache.update = update

    def untrack() -> None:
        cache.__dict__.pop("update", None)

    return untrack
