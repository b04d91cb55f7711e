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
scales under the exported global scale). See ``core.quant_sim.install_activation_fake_quant`` for how close
that is to TensorRT-LLM's kernels.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

import torch
import transformers

from eagle3_trt.core import hf_compat, rope
from eagle3_trt.core.attention import GQA_ATTENTION, attention_implementation, column_windows
from eagle3_trt.core.kv_cache import fq_cache_class, prealloc_cache_class
from eagle3_trt.core.quant_sim import input_scales_of, install_activation_fake_quant, quant_algo_of, split_quant_tensors
from eagle3_trt.core.tensor_parallel import TPGroup, install_all_reduce
from eagle3_trt.errors import UserError
from eagle3_trt.formats import rope_block, rope_params
from eagle3_trt.formats.families import Family, family_of_config
from eagle3_trt.formats.tp_layout import local_config

# imported from here by the runtime (column_windows) and the tests (the attention's name)
__all__ = ["GQA_ATTENTION", "TargetModel", "attention_implementation", "column_windows"]


def _trtllm_rope(rotary: Any, cfg: dict[str, Any], family: Family | None = None) -> None:
    """Give the target TensorRT-LLM's rotary tables wherever the config scales rope: transformers' function
    can differ from TensorRT-LLM's (yarn, longrope: see core/rope.py's docstring), and so can the parameters
    it reads (transformers 5 lets ``rope_type`` win over ``type`` where TensorRT-LLM lets ``type`` win,
    hf_compat.scaling_kind; TensorRT-LLM takes a top-level original_max_position_embeddings first). Plain
    rope keeps transformers' own table, equal to TensorRT-LLM's to float rounding. ``rope_type = "default"``
    stops transformers' per-forward frequency switching (``dynamic_rope_update``) so the tables stay as
    TensorRT-LLM builds them."""
    p = rope_params.from_raw_config(cfg, family=family)
    blocks = [b for b in (cfg.get("rope_scaling"), cfg.get("rope_parameters")) if isinstance(b, dict)]
    hf_scales = any(str(b.get(k) or "default").lower() != "default" for b in blocks for k in ("type", "rope_type"))
    if p.kind == "none" and not hf_scales:
        return
    inv, scale = rope.tables(p)
    inv = inv.to(rotary.inv_freq.device)
    rotary.register_buffer("inv_freq", inv, persistent=False)
    rotary.original_inv_freq = inv
    rotary.attention_scaling = scale
    rotary.rope_type = "default"


def _partial_rotary(model: Any, p: rope_params.RopeParams) -> None:
    """TensorRT-LLM's partial rotary (the first ``p.dim`` channels of each head rotate) on a transformers
    decoder whose attention rotates the whole head: q/k projections (and Qwen3's per-channel q/k norms)
    are permuted into ``rope.partial_layout`` once, and ``rotary_emb`` gives the matching table
    (``rope.PartialRotary``). V, o_proj and every layer output are untouched, so logits and aux states
    are those of the partial-rotary model."""
    assert p.head_dim is not None
    order = rope.partial_layout(p.dim, p.head_dim)
    for layer in model.model.layers:
        attn = layer.self_attn
        for name in ("q_proj", "k_proj"):
            lin = getattr(attn, name)
            w = lin.weight.data
            lin.weight.data = w.view(-1, p.head_dim, w.shape[-1])[:, order].reshape(w.shape).contiguous()
            if lin.bias is not None:
                lin.bias.data = lin.bias.data.view(-1, p.head_dim)[:, order].reshape(-1).contiguous()
        for name in ("q_norm", "k_norm"):
            norm = getattr(attn, name, None)
            if norm is not None:
                norm.weight.data = norm.weight.data[order].contiguous()
    model.model.rotary_emb = rope.PartialRotary(p).to(model.model.embed_tokens.weight.device)


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
        self.tp: TPGroup | None = None  # the tensor-parallel group this target is a slice of (None: whole)

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
        tp: TPGroup | None = None,
    ) -> TargetModel:
        """``tp``: ``state_dict`` holds this rank's slices (core/tensor_parallel.py), the model is built
        from the slice's config and its row-parallel outputs are summed over the ranks."""
        cfg = {k: v for k, v in config.items() if k not in ("quantization_config",)}
        family = family_of_config(cfg, "target config")
        model_cfg = local_config(cfg, tp.world, tp.rank) if tp is not None and tp.world > 1 else cfg
        # a deep copy: transformers 5 rewrites the rope block it is given in place (moves top-level keys into it,
        # picks rope_type over type), and the rope tables below must read the config as TensorRT-LLM does. The
        # copy carries the one rope block a bundle ships (formats/rope_block.py): every key explicit, so transformers
        # 4.57 loads a llama3 config whose original_max_position_embeddings sits at the top level only (it raises
        # KeyError on the file as is) and both generations build the function TensorRT-LLM serves.
        hf_cfg = getattr(transformers, family.hf_config_class).from_dict(copy.deepcopy(rope_block.normalised(model_cfg, where="target config", family=family)))
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
        rp = rope_params.from_raw_config(cfg, "target config", family)
        if rp.partial:
            _partial_rotary(model, rp)
        else:
            _trtllm_rope(model.model.rotary_emb, cfg, family)
        handles = install_activation_fake_quant(model, input_scales_of(quant, scales), quant_algo_of(quant))
        if tp is not None and tp.world > 1:
            install_all_reduce(model, tp)
        tm = cls(model, aux_layer_ids, cfg)
        tm.tp = tp
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
            return fq_cache_class()(self.kv_scales)
        return hf_compat.dynamic_cache_class()()

    def preallocated_cache(self, parts: list[tuple[list[torch.Tensor], list[torch.Tensor]]], capacity: int) -> Any:
        """A cache of ``capacity`` columns holding, per group of rows, per-layer (keys, values)
        [b, Hkv, L_g, D], groups stacked in order and left-padded to the longest L_g."""
        return prealloc_cache_class()(parts, capacity, self.kv_scales)

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
