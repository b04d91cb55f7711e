"""KV caches of the target beyond transformers' DynamicCache: preallocated (no copy per append) and FP8-emulating.

Both subclass transformers' DynamicCache, resolved on first use (transformers imports lazily), hence the
cached class factories.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from eagle3_trt.core import hf_compat
from eagle3_trt.core.quant_sim import fp8_fake_quant


@functools.cache
def prealloc_cache_class() -> type[Any]:
    # the base is transformers' DynamicCache, resolved on first use (transformers imports lazily)
    class _Prealloc(hf_compat.dynamic_cache_class()):  # type: ignore[misc]
        """A DynamicCache whose per-layer K/V live in buffers with room to grow.

        ``DynamicCache`` concatenates on every append: a copy of the whole cache per layer and
        token, which dominates batched long-context decoding. Here appends write in place and
        attention reads a view of the filled columns. Built from the per-layer K/V of one or more
        groups of rows, stacked in order and left-padded to the longest (the caller's lists are
        emptied as they are copied, so the peak is about one copy); rows can be dropped
        (``keep_rows``) as sequences finish. FP8 KV emulation applies on write, as in
        ``TargetModel.new_cache``. No rollback: used for plain decoding (the alpha estimator).
        """

        def __init__(self, parts: list[tuple[list[torch.Tensor], list[torch.Tensor]]], capacity: int, kv_scales: dict[int, tuple[float, float]] | None = None):
            super().__init__()
            self.kv_scales = dict(kv_scales or {})
            self._k, self._v, self._n = _stack_left_padded(parts, capacity)

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            sc = self.kv_scales.get(layer_idx)
            if sc is not None:
                key_states, value_states = fp8_fake_quant(key_states, sc[0]), fp8_fake_quant(value_states, sc[1])
            n, s = self._n[layer_idx], key_states.shape[2]
            kb, vb = self._k[layer_idx], self._v[layer_idx]
            if n + s > kb.shape[2]:
                raise RuntimeError(f"KV cache full ({kb.shape[2]} columns)")
            kb[:, :, n : n + s] = key_states
            vb[:, :, n : n + s] = value_states
            self._n[layer_idx] = n + s
            return kb[:, :, : n + s], vb[:, :, : n + s]

        def get_seq_length(self, layer_idx: int | None = 0, *args: Any, **kwargs: Any) -> int:
            return self._n[layer_idx or 0] if self._n else 0

        def get_mask_sizes(self, query: int | torch.Tensor, layer_idx: int = 0, *args: Any, **kwargs: Any) -> tuple[int, int]:
            return self.get_seq_length(layer_idx) + hf_compat.mask_query_length(query), 0

        def __len__(self) -> int:
            return len(self._k)

        def crop(self, *args: Any, **kwargs: Any) -> None:
            raise NotImplementedError("the preallocated cache does not roll back")

        def reorder_cache(self, *args: Any, **kwargs: Any) -> None:
            raise NotImplementedError("use keep_rows")

        batch_select_indices = reorder_cache

        def keep_rows(self, rows: torch.Tensor) -> None:
            rows = rows.to(self._k[0].device)
            for i in range(len(self._k)):  # one layer at a time: the peak is one layer over the cache
                self._k[i], self._v[i] = self._k[i][rows], self._v[i][rows]

    return _Prealloc


@functools.cache
def fq_cache_class() -> type[Any]:
    class FakeQuantKVCache(hf_compat.dynamic_cache_class()):  # type: ignore[misc]  # DynamicCache, as in prealloc_cache_class
        """DynamicCache whose stored K/V go through the FP8 per-tensor cast the FP8 KV cache applies."""

        def __init__(self, kv_scales: dict[int, tuple[float, float]] | None = None):
            super().__init__()
            self.kv_scales = dict(kv_scales or {})

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            sc = self.kv_scales.get(layer_idx)
            if sc is not None:
                key_states, value_states = fp8_fake_quant(key_states, sc[0]), fp8_fake_quant(value_states, sc[1])
            out: tuple[torch.Tensor, torch.Tensor] = super().update(key_states, value_states, layer_idx, *args, **kwargs)
            return out

    return FakeQuantKVCache


def _stack_left_padded(parts: list[tuple[list[torch.Tensor], list[torch.Tensor]]], capacity: int) -> tuple[list[torch.Tensor], list[torch.Tensor], list[int]]:
    """Per layer: K and V buffers of ``capacity`` columns holding the groups' rows stacked in order,
    left-padded to the longest group, and the filled length. The caller's lists are emptied as
    they are copied, so the peak is about one copy."""
    B = sum(ks[0].shape[0] for ks, _ in parts)
    L = max(ks[0].shape[2] for ks, _ in parts)
    if capacity < L:
        raise ValueError(f"capacity {capacity} < cached length {L}")
    k_bufs: list[torch.Tensor] = []
    v_bufs: list[torch.Tensor] = []
    filled: list[int] = []
    for li in range(len(parts[0][0])):
        H, D = parts[0][0][li].shape[1], parts[0][0][li].shape[3]
        kb = parts[0][0][li].new_zeros(B, H, capacity, D)
        vb = torch.zeros_like(kb)
        r = 0
        for ks, vs in parts:
            b, Lg = ks[li].shape[0], ks[li].shape[2]
            kb[r : r + b, :, L - Lg : L], vb[r : r + b, :, L - Lg : L] = ks[li], vs[li]
            ks[li] = vs[li] = None  # type: ignore[call-overload]
            r += b
        k_bufs.append(kb)
        v_bufs.append(vb)
        filled.append(L)
    return k_bufs, v_bufs, filled
