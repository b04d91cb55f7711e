"""The transformers adapter: every difference between the two transformers generations this
toolkit meets lives here, each with the versions it covers and why.

The generations: **4.57** (4.57.3 is what TensorRT-LLM 1.2's containers ship; ``make test-compat``
runs the suite on it) and **5.x** (what a plain ``pip install`` gets; ``make test``). Code outside
this module calls transformers only through APIs that are the same in both, or through the
functions below.

transformers' model classes (and torch) take seconds to import; config readers (validate, plan,
recommend, the CLI's start-up) use the config helpers of this module, so the functions that need
torch or the model classes import them where they run.
"""

from __future__ import annotations

from typing import Any

# ---------------------------------------------------------------------------------------------
# config.json field spellings
# ---------------------------------------------------------------------------------------------
# transformers 5 writes ``rope_parameters`` (rope_theta and the scaling in one dict) and ``dtype``;
# transformers 4.57 only reads ``rope_theta``, ``rope_scaling`` and ``torch_dtype``
# (transformers/configuration_utils.py and models/llama/configuration_llama.py of each release).
# A Llama-3 config exported on a plain machine without the legacy keys would load in the
# container with the default rope_theta of 10000 instead of 500000: no error, just wrong
# attention. Every config this toolkit writes carries both spellings (``with_legacy_fields``).


def rope_of(cfg: dict[str, Any]) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling or None) from either spelling; theta defaults to HF's 10000."""
    params = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta", params.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling")
    if scaling is None and params and params.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) == "default":
        scaling = None
    return float(theta), scaling


def dtype_of(cfg: dict[str, Any]) -> str | None:
    """The checkpoint dtype: ``torch_dtype`` (4.57 and older) or ``dtype`` (5.x)."""
    return cfg.get("torch_dtype") or cfg.get("dtype")


def with_legacy_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """A copy of cfg that both transformers generations read the same way."""
    out = dict(cfg)
    theta, scaling = rope_of(cfg)
    out["rope_theta"] = theta
    if scaling is not None:
        out["rope_scaling"] = scaling
    dt = dtype_of(cfg)
    if dt is not None:
        out["torch_dtype"] = dt
    return out


# ---------------------------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------------------------
def register_attention(name: str, fn) -> bool:
    """Register ``fn`` as transformers attention ``name``; False where that is not possible.

    ``AttentionInterface`` exists from transformers 4.48 on (both generations here have it);
    ``fn`` also relies on ``scaled_dot_product_attention(enable_gqa=...)``, which torch has from
    2.5 on: probed with a 1-token call so an older torch falls back to plain ``sdpa``.
    """
    import torch

    try:
        from transformers import AttentionInterface

        torch.nn.functional.scaled_dot_product_attention(*(torch.zeros(1, h, 1, 2) for h in (2, 1, 1)), enable_gqa=True)
        AttentionInterface.register(name, fn)
    except (ImportError, TypeError, RuntimeError, AttributeError):
        return False
    return True


def sdpa_attention(module, query, key, value, attention_mask, **kwargs) -> torch.Tensor:  # noqa: F821
    """transformers' own SDPA attention output [B, S, H, D] (``sdpa_attention_forward`` lives in
    ``transformers.integrations.sdpa_attention`` with the same signature in 4.57 and 5.x)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)[0]


# ---------------------------------------------------------------------------------------------
# KV caches
# ---------------------------------------------------------------------------------------------
def mask_query_length(query) -> int:
    """The query length a ``Cache.get_mask_sizes`` override is asked about: transformers 5 passes
    the query length (an int), 4.57 the ``cache_position`` tensor of the new tokens."""
    return int(query) if isinstance(query, int) else int(query.shape[-1])


def cache_layers(cache) -> list | None:
    """The per-layer (keys, values) holders of an HF ``DynamicCache``, or None.

    From transformers 4.56 on (so 4.57 and 5.x) a ``DynamicCache`` keeps one ``DynamicLayer`` per
    decoder layer in ``cache.layers``, each with ``keys`` and ``values`` tensors; older releases
    kept ``key_cache`` / ``value_cache`` lists, which callers treat as "not available".
    """
    layers = getattr(cache, "layers", None)
    if layers is None or not all(hasattr(lay, "keys") and hasattr(lay, "values") for lay in layers):
        return None
    return list(layers)


def dynamic_cache_class():
    """transformers' ``DynamicCache`` (constructible without arguments in 4.57 and 5.x; 5.x also
    accepts a config, which this toolkit does not pass so that both behave alike)."""
    from transformers import DynamicCache

    return DynamicCache


# ---------------------------------------------------------------------------------------------
# tokenizers
# ---------------------------------------------------------------------------------------------
def chat_template_ids(tokenizer, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    """Token ids of ``messages`` through the tokenizer's chat template.

    ``apply_chat_template(tokenize=True)`` returns a plain list of ids in 4.57 and a
    ``BatchEncoding`` (a dict with ``input_ids``) in 5.x.
    """
    out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)
