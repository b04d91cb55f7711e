"""The EAGLE-3 draft head as a PyTorch module, with TensorRT-LLM's one-model semantics.

One decoder layer over [input_layernorm(token embedding) ; hidden_norm(hidden)] (2H inputs to
q/k/v), residual taken from the un-normed hidden, RMSNorm + lm_head over the draft vocabulary,
and d2t to map draft ids to target ids. Step 1 feeds fc(concat of the target's aux hidden
states); steps 2..K feed the draft's own pre-norm output back in. Module and parameter names
match the checkpoint layout (fc, midlayer.*, norm, lm_head) so ModelOpt quantizes and exports
the same names TensorRT-LLM loads.

The variants TensorRT-LLM's loader honours (tensorrt_llm/_torch/models/modeling_speculative.py @
00679c66c3e38f6d2651ad0a5bef0f94d862e36c) are computed as there; the config flags are described in
``formats.draft_config`` (NESTED_FLAGS / TOP_LEVEL_FLAGS):

- ``fuse`` = ``Eagle3ForCausalLM.apply_eagle3_fc``: only when the aux width differs from hidden_size,
  [fc_norm per chunk | input_norm over the whole width] then fc.
- ``eh_proj_before_attn``: ``h = eh_proj(cat[enorm(e), h])`` before the layer at every step; the
  layer is then "regular" (no input_layernorm, H-wide q/k/v input).
- ``return_hidden_post_norm`` / ``norm_output``: the hidden state returned (and fed back) is
  ``norm(h)``; logits are ``lm_head`` of it.
- own ``embed_tokens`` exactly when target_hidden_size != hidden_size.
- ``num_hidden_layers`` > 1: ``Eagle3DraftModel``'s ``midlayer.{i}``. Layer 0 is the layer above; layers
  i >= 1 are "regular" (``next_layer_regular``, default true): residual = h, ``hidden_norm(h)`` into
  H-wide q/k/v, then the MLP, over the previous layer's full output (TensorRT-LLM adds the residual a
  layer returns back before the next one). The layers' KV caches travel as one (k, v) pair, concatenated
  along the head dimension, so callers slice and extend it along positions as for one layer.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from eagle3_trt.core import rope
from eagle3_trt.formats.draft_config import DraftConfig

# per-layer draft KV cache: (keys, values) [B, Hkv, L, D]
KV = tuple[torch.Tensor, torch.Tensor]


class DraftWeights(Protocol):
    """What ``Eagle3Draft.from_checkpoint`` reads: a normalized head (``convert.draft_format.DraftCheckpoint``)."""

    config: DraftConfig
    tensors: dict[str, Any]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


class DraftAttention(nn.Module):
    def __init__(self, c: DraftConfig, regular: bool):
        super().__init__()
        self.h, self.kv, self.d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        width = c.hidden_size if regular else 2 * c.hidden_size  # Eagle3Attention: 2H unless regular
        self.q_proj = nn.Linear(width, self.h * self.d, bias=c.attention_bias)
        self.k_proj = nn.Linear(width, self.kv * self.d, bias=c.attention_bias)
        self.v_proj = nn.Linear(width, self.kv * self.d, bias=c.attention_bias)
        self.o_proj = nn.Linear(self.h * self.d, c.hidden_size, bias=c.attention_bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, past: KV | None, mask: torch.Tensor | None) -> tuple[torch.Tensor, KV]:
        B, S, _ = x.shape
        q = self.q_proj(x).view(B, S, self.h, self.d).transpose(1, 2)
        k = self.k_proj(x).view(B, S, self.kv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.kv, self.d).transpose(1, 2)
        q, k = rope.apply(q, cos, sin), rope.apply(k, cos, sin)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        rep = self.h // self.kv
        kk, vv = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        if mask is None and past is not None and S > 1:
            # new tokens see the whole past and are causal among themselves (SDPA's is_causal would
            # align the triangle to the top-left and hide most of the past)
            P = k.shape[2] - S
            mask = torch.ones(S, P + S, dtype=torch.bool, device=q.device).tril(P)[None]
        if mask is None:
            out = F.scaled_dot_product_attention(q, kk, vv, is_causal=past is None and S > 1)
        else:
            out = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask[:, None])
        return self.o_proj(out.transpose(1, 2).reshape(B, S, self.h * self.d)), (k, v)


class DraftMLP(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class DraftLayer(nn.Module):
    def __init__(self, c: DraftConfig, regular: bool):
        super().__init__()
        # Eagle3DecoderLayer._next_layer_regular: (next_layer_regular and not the first layer) or eh_proj_before_attn
        self.regular = regular
        if not self.regular:
            self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = DraftAttention(c, regular)
        self.mlp = DraftMLP(c)

    def forward(
        self, embeds: torch.Tensor, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, past: KV | None, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, KV]:
        residual = hidden
        if self.regular:
            x = self.hidden_norm(hidden)
        else:
            x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        attn, kv = self.self_attn(x, cos, sin, past, mask)
        h = residual + attn
        h = h + self.mlp(self.post_attention_layernorm(h))
        return h, kv


class Eagle3Draft(nn.Module):
    # buffers and attributes set in __init__ / by the loader, typed here (nn.Module's own typing says Tensor | Module)
    d2t: torch.Tensor
    rope_freqs: torch.Tensor
    fake_quant_handles: list[Any]  # activation fake-quant hooks of a quantized head (convert.load)

    def __init__(self, c: DraftConfig, fc_bias: bool | None = None):
        super().__init__()
        self.config = c
        A, T, H = max(c.num_aux_layers, 1), c.target_hidden_size, c.hidden_size
        self.fc = nn.Linear(A * T, H, bias=c.fc_bias if fc_bias is None else fc_bias)
        if c.fc_norm:  # wins over norm_before_fc (apply_eagle3_fc)
            self.fc_norm = nn.ModuleList([RMSNorm(T, c.rms_norm_eps) for _ in range(A)])
        elif c.norm_before_fc:
            self.input_norm = RMSNorm(A * T, c.rms_norm_eps)
        if c.eh_proj_before_attn:
            self.enorm = RMSNorm(H, c.rms_norm_eps)
            self.eh_proj = nn.Linear(2 * H, H, bias=c.eh_proj_bias)
        if c.own_embedding:
            self.embed_tokens = nn.Embedding(c.vocab_size, H)
        self.midlayer: DraftLayer | nn.ModuleList
        if c.num_hidden_layers > 1:
            self.midlayer = nn.ModuleList([DraftLayer(c, regular=i > 0) for i in range(c.num_hidden_layers)])
        else:
            self.midlayer = DraftLayer(c, regular=c.eh_proj_before_attn)
        self.norm = RMSNorm(H, c.rms_norm_eps)
        self.lm_head = nn.Linear(H, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.int64), persistent=True)
        freqs, self.rope_scale = rope.tables(c.rope())
        self.register_buffer("rope_freqs", freqs, persistent=False)

    @classmethod
    def from_checkpoint(cls, ckpt: DraftWeights, dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu") -> Eagle3Draft:
        """Build from a normalized DraftCheckpoint (convert.draft_format.load_draft).

        Tensors TensorRT-LLM would not load for this config (an fc.bias without ``bias: true``, an
        embed_tokens when the hidden sizes match, norms of a variant that is off) are not loaded here either.
        """
        m = cls(ckpt.config)
        wanted = set(m.state_dict())
        sd = {k: v for k, v in ckpt.tensors.items() if k in wanted}
        if "d2t" not in sd or ckpt.config.draft_vocab_size == ckpt.config.vocab_size:
            # TensorRT-LLM creates d2t only for a reduced draft vocabulary; otherwise ids map 1:1
            sd["d2t"] = torch.zeros(ckpt.config.draft_vocab_size, dtype=torch.int64)
        if "lm_head.weight" not in sd:
            raise ValueError("draft has no lm_head; validate refuses such heads")
        sd["d2t"] = sd["d2t"].to(torch.int64)
        m.load_state_dict(sd, strict=True)
        return m.to(device=device, dtype=dtype).eval()

    def fuse(self, aux_hidden: torch.Tensor) -> torch.Tensor:
        """[B, S, n_aux*T] concatenated target aux hidden states -> [B, S, H]
        (``Eagle3ForCausalLM.apply_eagle3_fc``: nothing at all when the width already is H)."""
        if aux_hidden.shape[-1] == self.config.hidden_size:
            return aux_hidden
        if hasattr(self, "fc_norm"):
            chunks = aux_hidden.chunk(len(self.fc_norm), dim=-1)
            aux_hidden = torch.cat([n(c) for n, c in zip(self.fc_norm, chunks)], dim=-1)
        elif hasattr(self, "input_norm"):
            aux_hidden = self.input_norm(aux_hidden)
        out: torch.Tensor = self.fc(aux_hidden)
        return out

    @property
    def first_layer(self) -> DraftLayer:
        """midlayer, or midlayer.0 of a multi-layer head: the layer that reads cat(embeds, hidden)."""
        layer = self.midlayer[0] if isinstance(self.midlayer, nn.ModuleList) else self.midlayer
        assert isinstance(layer, DraftLayer)
        return layer

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    def get_dummy_inputs(self) -> dict[str, Any]:
        """Inputs for one tiny forward; ModelOpt's exporter runs it to find layers sharing an input."""
        c, dev, dt = self.config, self.device, self.fc.weight.dtype
        return {
            "embeds": torch.zeros(1, 2, c.hidden_size, device=dev, dtype=dt),
            "hidden": None,
            "positions": torch.arange(2, device=dev)[None],
            "aux": torch.ones(1, 2, self.fc.in_features, device=dev, dtype=dt),
        }

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor | None,
        positions: torch.Tensor,
        past: KV | None = None,
        mask: torch.Tensor | None = None,
        aux: torch.Tensor | None = None,
        with_logits: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None, KV]:
        """One draft pass. Returns (hidden to feed back [B,S,H], draft logits [B,S,D], (k, v)).

        The hidden state returned is what TensorRT-LLM feeds to the next draft step: the pre-norm
        output, or the post-norm one with ``return_hidden_post_norm``/``norm_output``.
        ``aux`` (concatenated target aux states) is fused (``fuse``) when given instead of ``hidden``.
        ``with_logits=False`` skips the head (logits None) for passes that only build context.
        """
        if aux is not None:
            hidden = self.fuse(aux)
        if hidden is None:
            raise ValueError("a draft pass needs the hidden state or the target's aux states")
        if hasattr(self, "eh_proj"):
            hidden = self.eh_proj(torch.cat([self.enorm(embeds), hidden], dim=-1))
        cos, sin = rope.cos_sin(positions, self.rope_freqs, embeds.dtype, self.rope_scale)
        if isinstance(self.midlayer, nn.ModuleList):
            h, kv = self._layers(self.midlayer, embeds, hidden, cos, sin, past, mask)
        else:
            h, kv = self.midlayer(embeds, hidden, cos, sin, past, mask)
        if self.config.return_hidden_post_norm:
            h = self.norm(h)
        return h, (self.logits(h) if with_logits else None), kv

    def _layers(
        self, layers: nn.ModuleList, embeds: torch.Tensor, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, past: KV | None, mask: torch.Tensor | None
    ) -> tuple[torch.Tensor, KV]:
        """Eagle3DraftModel.forward's loop over midlayer.{i}; each layer's KV is its slice of the heads dimension."""
        n_kv = self.config.num_key_value_heads
        ks, vs = [], []
        for i, layer in enumerate(layers):
            lp = None if past is None else (past[0][:, i * n_kv : (i + 1) * n_kv], past[1][:, i * n_kv : (i + 1) * n_kv])
            h, (k, v) = layer(embeds, h, cos, sin, lp, mask)
            ks.append(k)
            vs.append(v)
        return h, (torch.cat(ks, dim=1), torch.cat(vs, dim=1))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits of hidden states as ``forward`` returns them."""
        out: torch.Tensor = self.lm_head(h if self.config.return_hidden_post_norm else self.norm(h))
        return out

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]
