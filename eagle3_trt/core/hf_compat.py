"""The transformers adapter, runtime half: attention, KV caches and tokenizers, where the two
transformers generations this toolkit meets differ, each with the versions it covers and why.

The generations: **4.57** (4.57.3 is what TensorRT-LLM 1.2's containers ship; ``make test-compat``
runs the suite on it) and **5.x** (what a plain ``pip install`` gets; ``make test``). The config
half (field spellings of ``config.json``) is ``eagle3_trt.formats.hf_compat``.

transformers' model classes (and torch) take seconds to import; the functions that need them
import them where they run, so importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: torch is imported where a function runs (see above)
    import torch


# ---------------------------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------------------------
def register_attention(name: str, fn: Callable[..., Any]) -> bool:
    """Register ``fn`` as transformers attention ``name``; False where that is not possible.

    ``AttentionInterface`` exists from transformers 4.48 on (both generations here have it);
    ``fn`` also relies on ``scaled_dot_product_attention(enable_gqa=...)``, which torch has from
    2.5 on: probed with a 1-token call so an older torch falls back to plain ``sdpa``.
    """
    import torch  # ~2 s; see the module docstring

    try:
        from transformers import AttentionInterface  # the ImportError is the answer for a transformers without it

        q, k, v = (torch.zeros(1, h, 1, 2) for h in (2, 1, 1))
        torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        AttentionInterface.register(name, fn)
    except (ImportError, TypeError, RuntimeError, AttributeError):
        return False
    return True


def sdpa_attention(
    module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None, **kwargs: Any
) -> torch.Tensor:
    """transformers' own SDPA attention output [B, S, H, D] (``sdpa_attention_forward`` lives in
    ``transformers.integrations.sdpa_attention`` with the same signature in 4.57 and 5.x)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward  # seconds; only when attention runs

    out: torch.Tensor = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)[0]
    return out


# ---------------------------------------------------------------------------------------------
# KV caches
# ---------------------------------------------------------------------------------------------
def mask_query_length(query: int | torch.Tensor) -> int:
    """The query length a ``Cache.get_mask_sizes`` override is asked about: transformers 5 passes
    the query length (an int), 4.57 the ``cache_position`` tensor of the new tokens."""
    return int(query) if isinstance(query, int) else int(query.shape[-1])


def cache_layers(cache: Any) -> list[Any] | None:
    """The per-layer (keys, values) holders of an HF ``DynamicCache``, or None.

    From transformers 4.56 on (so 4.57 and 5.x) a ``DynamicCache`` keeps one ``DynamicLayer`` per
    decoder layer in ``cache.layers``, each with ``keys`` and ``values`` tensors; older releases
    kept ``key_cache`` / ``value_cache`` lists, which callers treat as "not available".
    """
    layers = getattr(cache, "layers", None)
    if layers is None or not all(hasattr(lay, "keys") and hasattr(lay, "values") for lay in layers):
        return None
    return list(layers)


def dynamic_cache_class() -> type[Any]:
    """transformers' ``DynamicCache`` (constructible without arguments in 4.57 and 5.x; 5.x also
    accepts a config, which this toolkit does not pass so that both behave alike)."""
    from transformers import DynamicCache  # seconds; only when a cache is built

    return DynamicCache


# ---------------------------------------------------------------------------------------------
# tokenizers
# ---------------------------------------------------------------------------------------------
def chat_template_ids(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool) -> list[int]:
    """Token ids of ``messages`` through the tokenizer's chat template.

    ``apply_chat_template(tokenize=True)`` returns a plain list of ids in 4.57 and a
    ``BatchEncoding`` (a dict with ``input_ids``) in 5.x.
    """
    out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)
