"""Rotary position embeddings (neox layout) with the rope_scaling types Llama checkpoints use."""

from __future__ import annotations

import math

import torch


def inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if not scaling:
        return freqs.float()
    kind = scaling.get("rope_type", scaling.get("type"))
    factor = float(scaling.get("factor", 1.0))
    if kind == "linear":
        return (freqs / factor).float()
    if kind == "llama3":
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        orig = float(scaling.get("original_max_position_embeddings", 8192))
        low_wl, high_wl = orig / low, orig / high
        wavelen = 2 * math.pi / freqs
        smooth = (orig / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > low_wl, freqs / factor, freqs)
        mid = (wavelen <= low_wl) & (wavelen >= high_wl)
        return torch.where(mid, (1 - smooth) * freqs / factor + smooth * freqs, scaled).float()
    if kind in (None, "default"):
        return freqs.float()
    raise ValueError(f"rope type {kind!r} is not implemented in the reference runtime")


def cos_sin(positions: torch.Tensor, freqs: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [B, S] -> cos, sin [B, 1, S, head_dim]."""
    ang = positions.to(torch.float32)[..., None] * freqs.to(positions.device)[None, None, :]
    emb = torch.cat([ang, ang], dim=-1)[:, None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin
