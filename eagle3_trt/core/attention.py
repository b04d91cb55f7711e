"""The target's attention: transformers' SDPA without the per-head K/V copy on CPU, and per-row column windows."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from eagle3_trt.core import hf_compat

GQA_ATTENTION = "eagle3_sdpa_gqa"
# (lo, hi, c0) attention windows over batch rows, set by ``column_windows``
_COLUMN_WINDOWS: contextvars.ContextVar[tuple[tuple[int, int, int], ...] | None] = contextvars.ContextVar("eagle3_column_windows", default=None)


def _sdpa_gqa(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, on CPU without the K/V expansion per query head, and with
    ``column_windows`` applied.

    transformers' ``sdpa`` path copies K and V to every query head (``repeat_kv``) whenever an
    explicit mask is passed, which this runtime always does; on a CPU, for long contexts and
    batches, that copy of the whole cache per layer and pass costs more than the attention.
    ``enable_gqa`` computes the same thing from the grouped heads (bit-identical on CPU: tested).
    On CUDA, ``enable_gqa`` with a mask falls back to PyTorch's math kernel, so there the
    expansion (and the fused kernels it allows) stays.
    """

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if mask is not None and q.device.type == "cpu":
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling, enable_gqa=q.shape[1] != k.shape[1]
            )
            return out.transpose(1, 2).contiguous()
        return hf_compat.sdpa_attention(module, q, k, v, mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs)

    windows = _COLUMN_WINDOWS.get()
    if attention_mask is None or windows is None:
        return attend(query, key, value, attention_mask), None
    mask = attention_mask[:, :, :, : key.shape[-2]]
    return torch.cat([attend(query[lo:hi], key[lo:hi, :, c0:], value[lo:hi, :, c0:], mask[lo:hi, :, :, c0:]) for lo, hi, c0 in windows]), None


@contextlib.contextmanager
def column_windows(windows: Iterable[tuple[int, int, int]]) -> Iterator[None]:
    """Inside this block, batch rows [lo, hi) attend only over cache columns >= c0, per (lo, hi, c0).

    For a left-padded batch of very different prompt lengths: the skipped columns are padding
    that the mask hides from those rows anyway, so the result is the same (up to the kernel's
    summation blocking) while the attention work follows each row's own length instead of the
    longest one. The windows must cover the batch rows in order. Ignored (full width, still
    correct) where the GQA attention is not available.
    """
    token = _COLUMN_WINDOWS.set(tuple((int(a), int(b), int(c)) for a, b, c in windows))
    try:
        yield
    finally:
        _COLUMN_WINDOWS.reset(token)


def attention_implementation() -> str:
    """The attention the target runs with: GQA-aware SDPA where torch (>= 2.5) and transformers allow."""
    return GQA_ATTENTION if hf_compat.register_attention(GQA_ATTENTION, _sdpa_gqa) else "sdpa"
