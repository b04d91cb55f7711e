"""The decoder-layer config the peer-corpus tests give speculators' draft classes (EAGLE-3 heads
and the other methods' heads speculators builds, on the tiny target's sizes): one place, so both corpora build the same layer."""

from __future__ import annotations

from typing import Any


def speculators_layer_config(cls: Any, vocab_size: int, hidden_size: int, layers: int, **extra: Any) -> Any:
    """``cls`` (LlamaConfig, Qwen3Config) as the tests' tiny heads use it, on speculators' dense-mask path
    (flex attention is its GPU default)."""
    layer = cls(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        **extra,
    )
    layer._attn_implementation = "eager"
    return layer
