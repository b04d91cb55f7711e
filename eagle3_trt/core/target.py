"""The target model for the reference runtime: a Hugging Face decoder that also returns aux hidden states.

The model is the stock transformers class of the target's family (``LlamaForCausalLM``,
``Qwen3ForCausalLM``, ...: formats/families.py) built from the checkpoint's config (so it computes
exactly what transformers computes), driven through ``model.model`` with an explicit 4-D additive
attention mask and explicit position ids. That one calling convention covers everything the
runtime needs on both transformers generations it meets (4.57 in TensorRT-LLM containers, 5.x
elsewhere): left-padded batches, tree attention, and "holes" left in the KV cache by rejected
draft tokens (rejected columns stay in the cache but are masked out; the tail is cropped with
``DynamicCache.crop``).

Aux hidden states are captured with forward hooks on the decoder layers: TensorRT-LLM's
``eagle3_layers_to_capture`` id i means the *output* of decoder layer i (0-based), which in
``output_hidden_states`` terms is index i + 1.

Quantized bundles: weights arrive dequantized (``convert.dequantize.load_checkpoint_dequantized``,
called by ``convert.load.load_target``);
activations of the quantized Linear layers are fake-quantized here with the exported static
``input_scale`` (FP8: per-tensor E4M3 cast; NVFP4: E2M1 in 16-element blocks with E4M3 block
scales under the exported global scale). See ``install_activation_fake_quant`` for how close
that is to TensorRT-LLM's kernels.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import transformers

from eagle3_trt.core import hf_compat, rope
from eagle3_trt.core.nvfp4 import E2M1_MAX, E4M3_MAX, nvfp4_fake_quant
from eagle3_trt.errors import UserError
from eagle3_trt.formats import rope_params
from eagle3_trt.formats.families import family_of_config

FP8_MAX = 448.0
# Tensors a ModelOpt export carries next to the weights; the HF module has no slot for them.
QUANT_SUFFIXES = (".input_scale", ".weight_scale", ".weight_scale_2", ".k_scale", ".v_scale", ".output_scale")


def quant_algo_of(quant: dict[str, Any] | None) -> str | None:
    """Activation format ('fp8' | 'nvfp4' | None) from either hf_quant_config layout or the dequantizer's info."""
    if not quant:
        return None
    q = quant.get("quantization", quant)
    algo = q.get("quant_algo") if isinstance(q, dict) else None
    if algo is None:
        return None
    algo = str(algo).upper()
    if algo.startswith("NVFP4"):
        return "nvfp4"
    if algo.startswith("FP8") or algo.startswith("W4A8"):  # W4A8 recipes run FP8 activations
        return "fp8"
    return algo.lower()


def split_quant_tensors(sd: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(weights, quantization scalars) of a (dequantized) state dict."""
    weights: dict[str, torch.Tensor] = {}
    scales: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        (scales if k.endswith(QUANT_SUFFIXES) else weights)[k] = v
    return weights, scales


def _fp8_fake_quant(x: torch.Tensor, scale: float) -> torch.Tensor:
    q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return (q.float() * scale).to(x.dtype)


def input_scales_of(quant: dict[str, Any] | None, scales: dict[str, torch.Tensor]) -> dict[str, float]:
    """Module name -> static input scale, from the dequantizer's info and/or leftover tensors."""
    out = {k[: -len(".input_scale")]: float(v.float().reshape(-1)[0]) for k, v in scales.items() if k.endswith(".input_scale")}
    out.update({str(k): float(v) for k, v in ((quant or {}).get("input_scales") or {}).items()})
    return out


def install_activation_fake_quant(module: torch.nn.Module, input_scales: dict[str, float], algo: str | None, prefix: str = "") -> list[Any]:
    """Fake-quantize the inputs of every Linear that has an exported ``input_scale``; returns the hook handles.

    Fidelity to the quantized pair as TensorRT-LLM runs it: weights are bit-exact after
    dequantization; FP8 activations go through the same per-tensor static E4M3 cast the FP8 GEMMs
    use, and NVFP4 activations through the same block quantization (E2M1 in 16-element blocks,
    E4M3 block scales under the exported global scale); an FP8 KV cache is emulated by
    ``TargetModel.new_cache``. What remains different is accumulation order and precision (fp32 or
    bf16 here, fp32 accumulators in the kernels) and kernel-specific details (e.g. whether the
    context-phase attention reads the quantized or the fresh K/V). Measured alpha is therefore the
    quantized pair's alpha up to rounding effects that can flip individual near-tie argmaxes but
    not the aggregate; the BF16-vs-quantized delta it reports is the real one to that precision.
    """
    if algo not in ("fp8", "nvfp4"):
        return []
    handles = []
    for name, mod in module.named_modules():
        if not isinstance(mod, torch.nn.Linear):
            continue
        s = input_scales.get(f"{prefix}{name}")
        if s is None or s <= 0:
            continue
        if algo == "fp8":
            handles.append(mod.register_forward_pre_hook(lambda m, args, s=s: (_fp8_fake_quant(args[0], s), *args[1:])))
        else:
            amax = torch.tensor(s * E2M1_MAX * E4M3_MAX)
            if mod.in_features % 16:
                continue
            handles.append(mod.register_forward_pre_hook(lambda m, args, a=amax: (nvfp4_fake_quant(args[0], 16, a.to(args[0].device)), *args[1:])))
    return handles


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


@functools.cache
def _prealloc_cache_class() -> type[Any]:
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
            B = sum(ks[0].shape[0] for ks, _ in parts)
            L = max(ks[0].shape[2] for ks, _ in parts)
            if capacity < L:
                raise ValueError(f"capacity {capacity} < cached length {L}")
            self._k: list[torch.Tensor] = []
            self._v: list[torch.Tensor] = []
            self._n: list[int] = []
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
                self._k.append(kb)
                self._v.append(vb)
                self._n.append(L)

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            sc = self.kv_scales.get(layer_idx)
            if sc is not None:
                key_states, value_states = _fp8_fake_quant(key_states, sc[0]), _fp8_fake_quant(value_states, sc[1])
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
def _fq_cache_class() -> type[Any]:
    class FakeQuantKVCache(hf_compat.dynamic_cache_class()):  # type: ignore[misc]  # DynamicCache, as in _prealloc_cache_class
        """DynamicCache whose stored K/V go through the FP8 per-tensor cast the FP8 KV cache applies."""

        def __init__(self, kv_scales: dict[int, tuple[float, float]] | None = None):
            super().__init__()
            self.kv_scales = dict(kv_scales or {})

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            sc = self.kv_scales.get(layer_idx)
            if sc is not None:
                key_states, value_states = _fp8_fake_quant(key_states, sc[0]), _fp8_fake_quant(value_states, sc[1])
            out: tuple[torch.Tensor, torch.Tensor] = super().update(key_states, value_states, layer_idx, *args, **kwargs)
            return out

    return FakeQuantKVCache


def _trtllm_rope(rotary: Any, cfg: dict[str, Any]) -> None:
    """Give the target TensorRT-LLM's rotary tables where transformers' function differs from it
    (yarn, longrope: see core/rope.py's docstring); other types keep transformers' own tables, which
    equal TensorRT-LLM's to float rounding. ``rope_type = "default"`` stops transformers' per-forward
    frequency switching (``dynamic_rope_update``) so the tables stay as TensorRT-LLM builds them."""
    p = rope_params.from_raw_config(cfg)
    if p.kind not in rope_params.HF_DIFFERS:
        return
    inv, scale = rope.tables(p)
    inv = inv.to(rotary.inv_freq.device)
    rotary.register_buffer("inv_freq", inv, persistent=False)
    rotary.original_inv_freq = inv
    rotary.attention_scaling = scale
    rotary.rope_type = "default"


class TargetModel:
    """The family's HF causal LM + aux-layer capture, called with explicit masks, positions and cache.

    Everything below ``from_state_dict`` is family-generic: every family in formats/families.py is a
    transformers decoder with ``model.layers`` whose outputs are TensorRT-LLM's capture points."""

    def __init__(self, hf_model: Any, aux_layer_ids: Iterable[int] | None, config: dict[str, Any]):
        self.family = family_of_config(config, "target config")
        self.hf = hf_model.eval()
        for p in self.hf.parameters():  # frozen: decoding and draft training only read the target
            p.requires_grad_(False)
        self.config = config
        self.num_layers = int(hf_model.config.num_hidden_layers)
        self._captured: dict[int, torch.Tensor] = {}
        self.aux_layer_ids = aux_layer_ids or ()
        # every layer gets a (cheap) hook so the captured set can change (diagnostics probe others)
        for i, layer in enumerate(self.hf.model.layers):
            layer.register_forward_hook(self._hook(i))
        p = next(self.hf.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.kv_scales: dict[int, tuple[float, float]] = {}  # FP8 KV cache emulation (see new_cache)
        # sliding-window layers (gpt-oss: layer_types "sliding_attention", window sliding_window)
        types = getattr(hf_model.config, "layer_types", None) or ()
        self.sliding_window = int(getattr(hf_model.config, "sliding_window", 0) or 0) if "sliding_attention" in types else 0
        self.fake_quant_handles: list[Any] = []  # activation fake-quant hooks of a quantized checkpoint

    @property
    def aux_layer_ids(self) -> tuple[int, ...]:
        return self._aux

    @aux_layer_ids.setter
    def aux_layer_ids(self, ids: Iterable[int]) -> None:
        aux = tuple(int(i) for i in ids)
        bad = [i for i in aux if not 0 <= i < self.num_layers]
        if bad:
            raise UserError(
                "aux_layer_ids",
                f"{bad} outside the target's decoder layers 0..{self.num_layers - 1}",
                "ids are TensorRT-LLM's eagle3_layers_to_capture: outputs of layer i, 0-based",
            )
        self._aux = aux

    def _hook(self, i: int) -> Callable[[Any, Any, Any], None]:
        def fn(_mod: Any, _args: Any, out: Any) -> None:
            if i in self._aux:
                self._captured[i] = out[0] if isinstance(out, tuple) else out

        return fn

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def from_state_dict(
        cls,
        config: dict[str, Any],
        state_dict: dict[str, torch.Tensor],
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        aux_layer_ids: Iterable[int] | None = None,
        quant: dict[str, Any] | None = None,
    ) -> TargetModel:
        cfg = {k: v for k, v in config.items() if k not in ("quantization_config",)}
        family = family_of_config(cfg, "target config")
        hf_cfg = getattr(transformers, family.hf_config_class).from_dict(cfg)
        hf_cfg._attn_implementation = family.attn_implementation or attention_implementation()
        weights, scales = split_quant_tensors(state_dict)
        # Build on the meta device (no random init of billions of weights), then assign the
        # checkpoint tensors; the rotary buffers are not in the checkpoint and are rebuilt.
        with torch.device("meta"):
            model = getattr(transformers, family.hf_class)(hf_cfg)
        if "lm_head.weight" not in weights:
            if not hf_cfg.tie_word_embeddings:
                raise UserError("target", "checkpoint has no lm_head.weight and tie_word_embeddings is false", "the target checkpoint is incomplete")
            weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
        weights = {k: v.to(device=device, dtype=dtype) for k, v in weights.items()}
        missing, unexpected = model.load_state_dict(weights, strict=False, assign=True)
        missing = [k for k in missing if "rotary_emb" not in k]
        if missing or unexpected:
            raise UserError(
                "target",
                f"weights do not match a {family.hf_class} of this config (missing {missing[:3]}, unexpected {unexpected[:3]})",
                "the target checkpoint and its config.json disagree",
            )
        if hf_cfg.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
        model.model.rotary_emb = type(model.model.rotary_emb)(config=hf_cfg, device=device)
        left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
        if left:
            raise RuntimeError(f"tensors left on the meta device after loading: {left[:5]}")
        model.to(device=device)
        for b in model.model.rotary_emb.buffers():  # keep rotary frequencies in fp32 like HF does
            b.data = b.data.float()
        _trtllm_rope(model.model.rotary_emb, cfg)
        handles = install_activation_fake_quant(model, input_scales_of(quant, scales), quant_algo_of(quant))
        tm = cls(model, aux_layer_ids, cfg)
        tm.fake_quant_handles = handles
        return tm

    # ---- forward ----------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return int(self.hf.config.vocab_size)

    @property
    def hidden_size(self) -> int:
        return int(self.hf.config.hidden_size)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.hf.model.embed_tokens(ids)
        return out

    def new_cache(self) -> Any:
        """An empty KV cache; with ``kv_scales`` set (FP8 KV bundles), K/V are fake-quantized as stored.

        The scales apply to post-RoPE K and to V, as TensorRT-LLM's FP8 KV cache does. Passes
        without a cache (the estimator's drafting runs over stored aux states) are unaffected.
        """
        if self.kv_scales:
            return _fq_cache_class()(self.kv_scales)
        return hf_compat.dynamic_cache_class()()

    def preallocated_cache(self, parts: list[tuple[list[torch.Tensor], list[torch.Tensor]]], capacity: int) -> Any:
        """A cache of ``capacity`` columns holding, per group of rows, per-layer (keys, values)
        [b, Hkv, L_g, D], groups stacked in order and left-padded to the longest L_g."""
        return _prealloc_cache_class()(parts, capacity, self.kv_scales)

    @torch.no_grad()
    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, allowed: torch.Tensor, cache: Any = None, logits_at: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass over ``input_ids`` [B, S].

        ``allowed`` [B, S, C+S] (bool): which cached + new columns each query may attend to.
        ``logits_at`` [B, M] (long): positions within S to compute logits for (all when None).
        Returns (logits [B, M or S, V] in fp32, aux hidden [B, S, n_aux*H] in the model dtype).
        """
        h, aux = self._run(input_ids, position_ids, allowed, cache)
        if logits_at is not None:
            h = torch.gather(h, 1, logits_at.to(self.device)[..., None].expand(-1, -1, h.shape[-1]))
        return self.hf.lm_head(h).float(), aux

    @torch.no_grad()
    def teacher_forced(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One causal pass without a cache over right-padded rows [B, S] (what draft training reads).

        Returns (aux hidden [B, S, n_aux*H], the final-norm output [B, S, H]: ``lm_head`` of it
        is the target's logits). Right padding never changes earlier positions under a causal
        mask, so padded rows need no other mask.
        """
        B, S = input_ids.shape
        allowed = torch.tril(torch.ones(S, S, dtype=torch.bool))[None].expand(B, S, S)
        h, aux = self._run(input_ids, torch.arange(S)[None].expand(B, S), allowed, None)
        return aux, h

    def _run(self, input_ids: torch.Tensor, position_ids: torch.Tensor, allowed: torch.Tensor, cache: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(final-norm hidden states, concatenated aux states) of one pass."""
        allowed = allowed.to(self.device)
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        attn_mask: torch.Tensor | dict[str, torch.Tensor] = mask[:, None]
        if self.sliding_window:
            # transformers takes an explicit 4D mask as it is, for every layer kind, so the window is
            # applied here. A query's allowed columns are its ancestors, whose positions run 0..p in
            # column order (the cache appends in position order, draft tokens after their parents):
            # keys with p - p_k < W (transformers' sliding_window_overlay, TensorRT-LLM's
            # attention_window_size) are its last W allowed columns
            later = allowed.flip(-1).cumsum(-1).flip(-1)
            win = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
            win.masked_fill_(~(allowed & (later <= self.sliding_window)), torch.finfo(self.dtype).min)
            attn_mask = {"full_attention": mask[:, None], "sliding_attention": win[:, None]}
        self._captured.clear()
        out = self.hf.model(
            input_ids=input_ids.to(self.device),
            attention_mask=attn_mask,
            position_ids=position_ids.to(self.device),
            past_key_values=cache,
            use_cache=cache is not None,
        )
        h = out.last_hidden_state
        aux = torch.cat([self._captured[i] for i in self.aux_layer_ids], dim=-1) if self.aux_layer_ids else h[..., :0]
        self._captured.clear()
        return h, aux
