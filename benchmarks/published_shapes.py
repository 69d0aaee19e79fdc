"""The shapes of the published runs' models that memlab has no built-in name for, built from their configs (no
download): what :mod:`benchmarks.sharded_vs_published` estimates them from.

Example:
    >>> llama3_70b().num_hidden_layers, qwen_7b().intermediate_size
    (80, 11008)
"""

from __future__ import annotations

from typing import Any


def llama31_8b() -> Any:
    """Llama 3.1 8B's shape (torchtitan's ``llama3`` flavor 8B): vocab 128,256, 32 layers, hidden 4,096, FFN 14,336,
    32 heads, 8 KV heads, untied output."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=128_256, hidden_size=4096, intermediate_size=14_336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131_072,
                       rms_norm_eps=1e-5, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 500_000.0})


def llama3_70b() -> Any:
    """Llama 3 70B's shape: vocab 128,256, 80 layers, hidden 8,192, FFN 28,672, 64 heads, 8 KV heads."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=128_256, hidden_size=8192, intermediate_size=28_672, num_hidden_layers=80,
                       num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=8192,
                       rms_norm_eps=1e-5, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 500_000.0})


def qwen_7b() -> Any:
    """Qwen-7B (Qwen 1, remote code) as a Qwen2 of its shape: vocab 151,936, 32 layers, hidden 4,096, FFN 11,008
    (its ``intermediate_size`` 22,016 is both halves), 32 heads, bias on the QKV projection, untied output."""
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=151_936, hidden_size=4096, intermediate_size=11_008, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=8192,
                       tie_word_embeddings=False)


def yi_34b() -> Any:
    """Yi 34B's shape (a Llama): vocab 64,000, 60 layers, hidden 7,168, FFN 20,480, 56 heads, 8 KV heads."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=64_000, hidden_size=7168, intermediate_size=20_480, num_hidden_layers=60,
                       num_attention_heads=56, num_key_value_heads=8, max_position_embeddings=4096,
                       rms_norm_eps=1e-5, tie_word_embeddings=False)


def qwen_72b() -> Any:
    """Qwen-72B (Qwen 1) as a Qwen2 of its shape: vocab 152,064, 80 layers, hidden 8,192, FFN 24,576, 64 heads."""
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=152_064, hidden_size=8192, intermediate_size=24_576, num_hidden_layers=80,
                       num_attention_heads=64, num_key_value_heads=64, max_position_embeddings=8192,
                       tie_word_embeddings=False)
