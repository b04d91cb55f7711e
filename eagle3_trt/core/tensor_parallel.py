"""Megatron-style tensor parallelism of a dense target over a ``torch.distributed`` group.

Each rank holds a slice of every decoder layer: q/k/v and gate/up split by output rows
(column-parallel), o_proj and down_proj by input columns (row-parallel), their outputs summed over
the ranks by an all-reduce (Shoeybi et al., Megatron-LM, section 3). Attention heads go with their
KV head: KV heads are split evenly when the ranks divide them, else each KV head is replicated on
the ranks that share it and its query heads are split among those (the Megatron-LM rule for
``tp > num_key_value_heads``), so a rank's slice is again a plain GQA attention. Embedding, norms and
lm_head are replicated: every rank runs the same decoding loop on the same (all-reduced) hidden
states and takes the same decisions, so every speculation method on top (core/method_api.py) runs
unchanged and the draft is simply replicated.

Each rank builds the family's transformers class from a *local* config (its own head counts and
intermediate size), so the stock attention and MLP compute its slice.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from eagle3_trt.errors import RankFailed
from eagle3_trt.formats.tp_layout import even_split, head_ranges, heads_of

# parameter name -> its split; the projections every dense family of formats/families.py names alike
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(self_attn|mlp)\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)\.(weight|bias)$")
_ROW_PARALLEL = ("o_proj", "down_proj")


@dataclass(frozen=True)
class TPGroup:
    """This process's place in a tensor-parallel run (the default process group)."""

    rank: int
    world: int

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over the ranks in place; a lost peer is one ``RankFailed`` line, not a gloo/nccl traceback."""
        try:
            dist.all_reduce(t)
        except RuntimeError as e:  # torch's DistBackendError / DistNetworkError are RuntimeErrors
            raise RankFailed(f"rank {self.rank}: a tensor-parallel peer is gone ({str(e).splitlines()[0][:160]})") from None
        return t


@dataclass(frozen=True)
class Slice:
    """Rows (dim 0) or columns (dim 1) [lo, hi) of a tensor; ``zero``: a row-parallel bias added by rank 0 only."""

    dim: int
    lo: int
    hi: int
    zero: bool = False

    def take(self, t: torch.Tensor) -> torch.Tensor:
        if self.zero:
            return torch.zeros_like(t)
        return t.narrow(self.dim if t.dim() > 1 else 0, self.lo, self.hi - self.lo).contiguous()


def slicer(cfg: dict[str, Any], world: int, rank: int) -> Callable[[str, tuple[int, ...]], Slice | None]:
    """``(name, shape) -> Slice`` of ``rank``'s part of a full-model parameter (None: replicated)."""
    n_heads, n_kv, head_dim = heads_of(cfg)
    (q0, q1), (k0, k1) = head_ranges(n_heads, n_kv, world, rank)
    i0, i1 = even_split(int(cfg["intermediate_size"]), world, rank)
    rows = {
        "q_proj": (q0 * head_dim, q1 * head_dim),
        "k_proj": (k0 * head_dim, k1 * head_dim),
        "v_proj": (k0 * head_dim, k1 * head_dim),
        "o_proj": (q0 * head_dim, q1 * head_dim),
        "gate_proj": (i0, i1),
        "up_proj": (i0, i1),
        "down_proj": (i0, i1),
    }

    def of(name: str, shape: tuple[int, ...]) -> Slice | None:
        m = _LAYER.match(name)
        if m is None:
            return None
        proj, kind = m.group(3), m.group(4)
        lo, hi = rows[proj]
        if proj in _ROW_PARALLEL:
            return Slice(0, 0, shape[0], zero=rank != 0) if kind == "bias" else Slice(1, lo, hi)
        return Slice(0, lo, hi)

    return of


# NVFP4 as ModelOpt stores it: two E2M1 values per uint8 along the input dimension, one E4M3 scale per 16 of them
_NVFP4_PER_BYTE, _NVFP4_BLOCK = 2, 16


def take_stored(of: Callable[[str, tuple[int, ...]], Slice | None], name: str, t: torch.Tensor) -> torch.Tensor:
    """``rank``'s part of a checkpoint tensor as stored, before dequantization: dense and FP8 weights
    (same shape as the dense one) are sliced as they are; an NVFP4 weight's packed columns and its
    block scales' columns by the packing; per-tensor scales are kept whole."""
    mod, _, leaf = name.rpartition(".")
    if leaf in ("weight", "bias"):
        s = of(name, tuple(t.shape))
        if s is None:
            return t
        if leaf == "weight" and t.dtype == torch.uint8 and s.dim == 1:
            return t[:, s.lo // _NVFP4_PER_BYTE : s.hi // _NVFP4_PER_BYTE].contiguous()
        return s.take(t)
    if leaf == "weight_scale" and t.dim() == 2:  # NVFP4 block scales [out, in / 16]
        s = of(f"{mod}.weight", ())
        if s is None:
            return t
        if s.dim == 1:
            return t[:, s.lo // _NVFP4_BLOCK : s.hi // _NVFP4_BLOCK].contiguous()
        return t[s.lo : s.hi].contiguous()
    return t


def shard_state_dict(cfg: dict[str, Any], sd: dict[str, torch.Tensor], world: int, rank: int) -> dict[str, torch.Tensor]:
    """``rank``'s slices of a full state dict (what a checkpoint read whole gives; convert/load.py reads slices directly)."""
    of = slicer(cfg, world, rank)
    out = {}
    for k, t in sd.items():
        s = of(k, tuple(t.shape))
        out[k] = t if s is None else s.take(t)
    return out


def install_all_reduce(model: Any, group: TPGroup) -> list[Any]:
    """Sum each decoder layer's row-parallel outputs (o_proj, down_proj) over the ranks."""

    def hook(_mod: Any, _args: Any, out: torch.Tensor) -> torch.Tensor:
        return group.all_reduce(out)

    handles = []
    for layer in model.model.layers:
        handles.append(layer.self_attn.o_proj.register_forward_hook(hook))
        handles.append(layer.mlp.down_proj.register_forward_hook(hook))
    return handles
