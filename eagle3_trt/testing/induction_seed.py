"""Seed a freshly initialised Llama target with an induction circuit before it is trained (issue 29).

Trained from random weights for the 30 CPU-minutes `make tiny-pairs` allows, the embedded target never
learned to copy: it sat on the induction-head plateau (Olsson et al., 2022, "In-context learning and
induction heads") for every schedule tried, with 0 of 24 held-out pasted blocks repeated. So the first
two layers start as the circuit those heads implement, written into the weights, and training (half of
its text asks for copies) keeps and refines it alongside everything else it learns:

- layer 0, query heads 0 and 1: attend to the token 1 and 2 positions back, by position alone (the
  queries and keys are a constant rotated by RoPE; the weights over frequencies solve a small linear
  program that maximises the margin of the wanted offset over every other offset in the context),
  and write those tokens' codes into two residual slots, P1 and P2;
- layer 1, query head 0: matches (this token, the one before) against (P1, P2) of every earlier
  position, i.e. finds where the last two tokens occurred before, and copies the token that followed
  there into the residual slot O; the content match uses only RoPE's slowest frequency pairs, which
  turn by well under a radian across the context, so a match thousands of tokens back still counts;
- the unembedding reads O, so the copied token's logit rises.

Residual layout (hidden 192): T (the token's code, 48 dims) | C (a constant, 1 dim, what the
positional queries and keys are made of) | P1, P2 (16 dims each: a projection of the codes, what the
match compares) | O (48 dims) | the rest left to training. The other heads, the MLPs and layers 2+
keep their random initialisation. Only the layout and scales below are chosen by hand; everything is
a standard `LlamaForCausalLM` that TensorRT-LLM serves like any other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import linprog


@dataclass(frozen=True)
class SeedLayout:
    code: int  # T and O: the token code (the embedded pair: 2,048 tokens in 48 dims, random unit codes)
    match: int  # P1, P2: the projection of the code the layer-1 match compares (16)
    slow_pairs: int  # RoPE pairs (the slowest) each of P1 and P2 occupies in layer 1's key (8: match / 2)
    position_margin: float = 14.0  # layer 0: logit margin of the wanted offset over any other
    match_logit: float = 12.0  # layer 1: logit of one matched token of the two (two: twice this)
    copy_logit: float = 14.0  # unembedding: the copied token's logit from O


def layout_for(hidden_size: int, head_dim: int) -> SeedLayout:
    """A quarter of the residual for each token-code slot, a twelfth (at most a quarter of a head) for
    each match slot: hidden 192, head_dim 64 gives code 48, match 16, 8 slow pairs."""
    match = max(2, min(hidden_size // 12, head_dim // 4) // 2 * 2)
    return SeedLayout(code=hidden_size // 4, match=match, slow_pairs=match // 2)


def offset_weights(theta: float, head_dim: int, context: int) -> np.ndarray:
    """Weights w_j over RoPE's frequency pairs such that sum_j w_j cos((d - 1) theta_j), the score of a
    key d positions back, beats every other d in [0, context) by the largest margin (sum |w_j| = 1).
    Returned scaled so that the margin is 1."""
    half = head_dim // 2
    freqs = theta ** (-np.arange(half) * 2.0 / head_dim)
    d = np.array([x for x in range(context) if x != 1], dtype=np.float64)
    gap = 1.0 - np.cos(np.outer(d - 1.0, freqs))  # (len(d), half): score(1) - score(d) per unit weight
    # variables: w+ (half), w- (half), t; maximise t: gap @ (w+ - w-) >= t, sum(w+ + w-) = 1
    n = half
    c = np.zeros(2 * n + 1)
    c[-1] = -1.0
    a_ub = np.hstack([-gap, gap, np.ones((len(d), 1))])
    b_ub = np.zeros(len(d))
    a_eq = np.hstack([np.ones(n), np.ones(n), [0.0]])[None]
    res = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=[1.0], bounds=[(0, None)] * (2 * n) + [(None, None)], method="highs")
    if not res.success or res.x[-1] <= 0:
        raise ValueError(f"no positional weighting separates offset 1 (theta {theta}, context {context})")
    w = res.x[:n] - res.x[n : 2 * n]
    return w / res.x[-1]


def _codes(vocab: int, dim: int, g: torch.Generator) -> torch.Tensor:
    c = torch.randn(vocab, dim, generator=g)
    return c / c.norm(dim=1, keepdim=True)


@torch.no_grad()
def seed_induction(model, seed: int, layout: SeedLayout | None = None) -> None:
    """Write the circuit into a freshly initialised LlamaForCausalLM (float32) in place (the model
    card describes it from ``layout_for``, the same layout)."""
    cfg = model.config
    hd, d_model = cfg.head_dim, cfg.hidden_size
    layout = layout or layout_for(d_model, hd)
    half = hd // 2
    ct, m = layout.code, layout.match
    T = slice(0, ct)
    C = ct
    P1 = slice(ct + 1, ct + 1 + m)
    P2 = slice(ct + 1 + m, ct + 1 + 2 * m)
    O = slice(ct + 1 + 2 * m, ct + 1 + 2 * m + ct)
    if O.stop > d_model or cfg.num_hidden_layers < 2 or cfg.num_attention_heads < 2 or 2 * layout.slow_pairs * 2 > hd or m != 2 * layout.slow_pairs:
        raise ValueError("the induction seed needs hidden >= 2*code+2*match+1, 2 layers, 2 heads, match = 2*slow_pairs")
    theta = float(cfg.rope_parameters["rope_theta"]) if getattr(cfg, "rope_parameters", None) else float(cfg.rope_theta)
    g = torch.Generator().manual_seed(seed + 1009)
    u = _codes(cfg.vocab_size, ct, g)  # token codes
    # (m, ct): orthonormal rows scaled so that a projected code keeps norm ~1 (the match compares these)
    r1 = torch.linalg.qr(torch.randn(ct, m, generator=g))[0].T * math.sqrt(ct / m)
    scale = 1.0 / math.sqrt(hd)

    emb = model.model.embed_tokens.weight
    emb[:, : O.stop] = 0.0
    emb[:, T] = u
    emb[:, C] = 1.0
    # residual after layer 0: T, C, P1, P2 each of norm ~1 (+ small noise) -> RMSNorm multiplies by sqrt(d_model / 4)
    n0 = math.sqrt(d_model / 2.0)  # normalised scale of a unit slot at layer 0's input (T and C present)
    n1 = math.sqrt(d_model / 4.0)  # at layer 1's input (T, C, P1, P2)

    # layer 0: positional heads 0 (offset 1) and 1 (offset 2); V carries r1 @ code
    a0 = model.model.layers[0].self_attn
    w = torch.tensor(offset_weights(theta, hd, cfg.max_position_embeddings), dtype=torch.float32)
    freqs = theta ** (-torch.arange(half, dtype=torch.float64) * 2.0 / hd)
    k_gain = math.sqrt(layout.position_margin / scale) / n0
    a0.k_proj.weight.zero_()
    a0.v_proj.weight.zero_()
    a0.k_proj.weight[:half, C] = k_gain * torch.cos(freqs).float()  # key: constant e^{i theta_j}, so the score peaks at d = 1
    a0.k_proj.weight[half:, C] = k_gain * torch.sin(freqs).float()
    qw = a0.q_proj.weight
    qw[: 2 * hd].zero_()
    for h, shift in ((0, 0.0), (1, 1.0)):  # head 1 scores cos((d - 2) theta_j): its query turned by -theta_j
        qw[h * hd : h * hd + half, C] = k_gain * w * torch.cos(-shift * freqs).float()
        qw[h * hd + half : (h + 1) * hd, C] = k_gain * w * torch.sin(-shift * freqs).float()
    a0.v_proj.weight[:m, T] = r1 / n0
    ow = a0.o_proj.weight
    ow[:, : 2 * hd] = 0.0
    ow[P1, 0:m] = torch.eye(m)
    ow[P2, hd : hd + m] = torch.eye(m)

    # layer 1: head 0 matches (code of this token, P1 here) with (P1, P2) of earlier keys, copies their code to O
    a1 = model.model.layers[1].self_attn
    sp = layout.slow_pairs
    slow_p1 = [*range(half - sp, half), *range(hd - sp, hd)]  # the slowest pairs, both coordinates
    slow_p2 = [*range(half - 2 * sp, half - sp), *range(hd - 2 * sp, hd - sp)]
    g1 = math.sqrt(layout.match_logit / scale) / n1
    kw = a1.k_proj.weight
    kw.zero_()
    kw[slow_p1, P1] = g1 * torch.eye(m)
    kw[slow_p2, P2] = g1 * torch.eye(m)
    qw = a1.q_proj.weight
    qw[:hd].zero_()
    qw[slow_p1, T] = g1 * r1
    qw[slow_p2, P1] = g1 * torch.eye(m)
    vw = a1.v_proj.weight
    vw.zero_()
    vw[:ct, T] = torch.eye(ct) / n1
    ow = a1.o_proj.weight
    ow[:, :hd] = 0.0
    ow[O, :ct] = torch.eye(ct)

    # unembedding: O (norm ~1 among T, C, P1, P2, O) -> the copied token's logit
    n_out = math.sqrt(d_model / 5.0)
    model.lm_head.weight[:, : O.stop] = 0.0
    model.lm_head.weight[:, O] = u * (layout.copy_logit / n_out)
