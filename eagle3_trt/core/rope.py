"""Rotary position embeddings (neox layout) computed as TensorRT-LLM computes them.

Every rope scaling type TensorRT-LLM accepts for a Llama-family model (``RotaryScalingType``:
none, linear, dynamic, llama3, yarn, longrope; mrope is multimodal-only and refused by validate)
is reproduced from NVIDIA/TensorRT-LLM's ``RopeEmbeddingUtils`` (tensorrt_llm/functional.py, 2026
version, search-index id 57079567367) as dispatched by ``RopeParams.create_rope_const_params``
(tensorrt_llm/_torch/attention/backends/interface.py @ 1262edbc3809b30af94c3cf2ec2736a14642b821).
The parameters come from ``eagle3_trt.formats.rope_params.from_config`` (TensorRT-LLM's defaults).

Where TensorRT-LLM differs from transformers' ``ROPE_INIT_FUNCTIONS``, TensorRT-LLM wins (it is
what serves the head); tests/test_rope_types.py pins both the agreements and the differences:

- partial rotary (``RopeParams.dim`` < head_dim): the first ``dim`` channels rotate, GPT-NeoX halves within
  them, the rest pass through unscaled (``partial_layout`` / ``PartialRotary``); transformers' Llama and Qwen3
  classes rotate the whole head.
- llama3 / yarn / longrope without ``original_max_position_embeddings``: TensorRT-LLM uses 1024,
  transformers ``max_position_embeddings``.
- yarn attention factor: TensorRT-LLM ``get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)``
  with mscale 1 and mscale_all_dim 0 by default, and never reads ``attention_factor``; transformers
  uses ``attention_factor`` if given, the mscale ratio only when both mscale and mscale_all_dim are
  non-zero, else ``get_mscale(factor)``. The two agree when neither mscale key nor attention_factor is set.
- longrope: TensorRT-LLM picks long_factor unless the config's own ``max_seq_len`` is at most
  ``original_max_position_embeddings`` (transformers switches per forward on the sequence length),
  and scales cos/sin by ``sqrt(1 + ln(s) / ln(orig))`` with s = max_position_embeddings / orig
  (transformers uses ``factor`` for s when the config has one, and ``attention_factor`` if given).
- dynamic: TensorRT-LLM's fused kernels use plain rope up to ``max_position_embeddings`` and an NTK
  base rescaled by the current sequence length beyond (its python table, used by unfused backends,
  is Hunyuan's alpha-NTK, identical to plain rope for alpha 1). transformers agrees up to
  ``max_position_embeddings``. validate refuses alpha != 1 and contexts past that point, so here
  dynamic is plain rope.
"""

from __future__ import annotations

import math

import torch

from eagle3_trt.formats.rope_params import RopeParams


def _plain(dim: int, theta: float) -> torch.Tensor:
    # float64 then float32: the computation the reference runtime has always used for plain rope
    # (the embedded pair's measurements were taken with it; it equals TensorRT-LLM's to fp32 rounding).
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def tables(p: RopeParams) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [dim/2] float32, cos/sin scale) of TensorRT-LLM's table for ``p``."""
    freqs = _plain(p.dim, p.theta)
    if p.kind in ("none", "dynamic"):
        if p.kind == "dynamic" and p.alpha != 1.0:
            raise ValueError("dynamic rope with alpha != 1 is refused by validate")
        return freqs.float(), 1.0
    if p.kind == "linear":
        return (freqs / p.factor).float(), 1.0
    if p.kind == "llama3":
        # RopeEmbeddingUtils.apply_llama3_scaling
        low, high, orig = p.low_freq_factor, p.high_freq_factor, float(p.original_max_positions)
        low_wl, high_wl = orig / low, orig / high
        wavelen = 2 * math.pi / freqs
        smooth = (orig / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > low_wl, freqs / p.factor, freqs)
        mid = (wavelen <= low_wl) & (wavelen >= high_wl)
        return torch.where(mid, (1 - smooth) * freqs / p.factor + smooth * freqs, scaled).float(), 1.0
    if p.kind == "yarn":
        return _yarn(p)
    if p.kind == "longrope":
        # RopeEmbeddingUtils.create_sinusoidal_positions_long_rope
        inv = 1.0 / (p.theta ** (torch.arange(0, p.dim, 2, dtype=torch.float32) / p.dim))
        use_long = p.max_seq_len is None or p.max_seq_len > p.original_max_positions
        factor = torch.tensor(p.long_factor if use_long else p.short_factor, dtype=torch.float32)
        s = p.max_positions / p.original_max_positions
        scale = 1.0 if s <= 1.0 else math.sqrt(1.0 + math.log(s) / math.log(p.original_max_positions))
        return inv / factor, scale
    raise ValueError(f"rope type {p.kind!r} is not implemented in the reference runtime")


def _yarn(p: RopeParams) -> tuple[torch.Tensor, float]:
    """RopeEmbeddingUtils.create_sinusoidal_positions_yarn (float32 throughout, as there)."""
    dim, base, s = p.dim, p.theta, p.factor

    def correction_dim(rot: float) -> float:
        return (dim * math.log(p.original_max_positions / (rot * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(p.beta_fast)), 0)
    high: float = min(math.ceil(correction_dim(p.beta_slow)), dim - 1)
    if low == high:
        high += 0.001  # TensorRT-LLM's singularity guard
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extra, inter = 1.0 / pos_freqs, 1.0 / (s * pos_freqs)
    mask = 1 - ramp
    inv = inter * (1 - mask) + extra * mask

    def get_mscale(scale: float, m: float) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    return inv, float(get_mscale(s, p.mscale) / get_mscale(s, p.mscale_all_dim))


def cos_sin(positions: torch.Tensor, freqs: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [B, S] -> cos, sin [B, 1, S, head_dim] (times ``scale``: yarn/longrope's mscale)."""
    ang = positions.to(torch.float32)[..., None] * freqs.to(positions.device)[None, None, :]
    emb = torch.cat([ang, ang], dim=-1)[:, None]
    cos, sin = emb.cos(), emb.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype), sin.to(dtype)


def partial_layout(dim: int, head_dim: int) -> torch.Tensor:
    """The channel order that makes a whole-head GPT-NeoX rotation (transformers' ``rotate_half``, which
    pairs channel j with j + head_dim/2) compute TensorRT-LLM's partial one: pairs (i, i + dim/2) over the
    first ``dim`` channels, the other channels passed through (``RotaryEmbedding.apply_rotary_pos_emb``,
    tensorrt_llm/_torch/modules/rotary_embedding.py @ 4a05fb8b574f92a6a38c0db87073dc7845557f3a; the fused
    kernels rotate while ``QK_VEC_SIZE * tidx < rotary_embedding_dim``). Channel j of the new order holds
    channel ``order[j]``: the rotated halves land on j < dim/2 and j - head_dim/2 < dim/2, the passed-through
    channels on the slots whose frequency ``PartialRotary`` sets to 0 (cos 1, sin 0: unchanged)."""
    half, r = head_dim // 2, dim // 2
    rest = list(range(dim, head_dim))
    order = list(range(r)) + rest[: half - r] + list(range(r, dim)) + rest[half - r :]
    return torch.tensor(order, dtype=torch.long)


class PartialRotary(torch.nn.Module):
    """A drop-in for a transformers decoder's ``rotary_emb`` (``forward(x, position_ids) -> (cos, sin)``
    [B, S, head_dim]) giving TensorRT-LLM's partial-rotary table in ``partial_layout``'s channel order:
    the rotated slots carry ``tables(p)`` (its yarn/longrope scale too), the passed-through ones cos 1,
    sin 0 (TensorRT-LLM neither rotates nor scales them). q and k must be in that order (the target
    permutes its q/k projections once at load: attention scores are sums over channels, so a common
    permutation of q and k changes nothing else)."""

    def __init__(self, p: RopeParams):
        super().__init__()
        if p.head_dim is None:
            raise ValueError("PartialRotary needs a partial-rotary RopeParams")
        inv, scale = tables(p)
        pad = p.head_dim // 2 - inv.numel()
        self.register_buffer("inv_freq", torch.cat([inv.float(), torch.zeros(pad)]), persistent=False)
        self.register_buffer("scale", torch.cat([torch.full((inv.numel(),), float(scale)), torch.ones(pad)]), persistent=False)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inv, sc = self.get_buffer("inv_freq"), self.get_buffer("scale")
        ang = position_ids.to(torch.float32)[..., None] * inv.to(position_ids.device)
        emb = torch.cat([ang, ang], dim=-1)
        s = torch.cat([sc, sc]).to(position_ids.device)
        return (emb.cos() * s).to(x.dtype), (emb.sin() * s).to(x.dtype)


def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin
