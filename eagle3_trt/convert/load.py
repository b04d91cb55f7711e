"""Checkpoint directories -> the reference runtime's models: every file the runtime reads is read here.

``core`` is model math on tensors (``TargetModel.from_state_dict``, ``Eagle3Draft.from_checkpoint``,
``SpeculativeEngine(target, draft, ...)``); this module reads the directories (config.json, weights,
ModelOpt quantization configs, FP8 KV scales, the tokenizer, the eos and pad ids) and builds them.
"""

from __future__ import annotations

import re
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import AutoTokenizer

from eagle3_trt.convert.dequantize import load_checkpoint_dequantized
from eagle3_trt.convert.draft_format import DraftCheckpoint, head_hooks, load_draft
from eagle3_trt.convert.target import read_target
from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.core.engine import SpeculativeEngine
from eagle3_trt.core.quant_sim import input_scales_of, install_activation_fake_quant, quant_algo_of
from eagle3_trt.core.target import TargetModel
from eagle3_trt.core.tensor_parallel import TPGroup, slicer, take_stored
from eagle3_trt.formats.checkpoint_io import iter_tensors, read_json, weight_files
from eagle3_trt.formats.families import default_aux_layers_of
from eagle3_trt.formats.generation import eos_token_ids, pad_token_id
from eagle3_trt.formats.hf_config import max_positions_of
from eagle3_trt.formats.tp_layout import refuse_unsplittable
from eagle3_trt.speculative.registry import method_class


def load_target(path: Path, *, device: Any = "cpu", dtype: torch.dtype = torch.float32, aux_layer_ids: Any = None, tp: TPGroup | None = None) -> TargetModel:
    """A Hugging Face checkpoint directory: BF16/FP16/FP32, or a ModelOpt FP8/NVFP4 export
    (weights dequantized, activations fake-quantized: see ``core.quant_sim.install_activation_fake_quant``).
    ``tp``: this rank's slices only (core/tensor_parallel.py), read as slices from safetensors files."""
    path = Path(path)
    cfg = read_json(path / "config.json")
    split = tp is not None and tp.world > 1
    if split:
        assert tp is not None
        refuse_unsplittable(cfg, tp.world)
    if cfg.get("quantization_config") or (path / "hf_quant_config.json").is_file():
        take = partial(take_stored, slicer(cfg, tp.world, tp.rank)) if split and tp is not None else None
        cfg, sd, quant = load_checkpoint_dequantized(path, dtype=dtype, take=take)
        return TargetModel.from_state_dict(cfg, sd, device=device, dtype=dtype, aux_layer_ids=aux_layer_ids, quant=quant, tp=tp)
    if split:
        assert tp is not None
        sd = read_slices(path, slicer(cfg, tp.world, tp.rank))
    else:
        sd = {k: t for f in weight_files(path) for k, t in iter_tensors(f)}
    return TargetModel.from_state_dict(cfg, sd, device=device, dtype=dtype, aux_layer_ids=aux_layer_ids, tp=tp)


def read_slices(path: Path, of: Any) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint, each as ``of(name, shape)`` slices it: a rank reads its part
    of a safetensors file and no more (a pickled .bin is read whole, then sliced)."""
    out: dict[str, torch.Tensor] = {}
    for f in weight_files(path):
        if f.suffix != ".safetensors":
            for k, t in iter_tensors(f):
                s = of(k, tuple(t.shape))
                out[k] = t if s is None else s.take(t)
            continue
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():
                part = h.get_slice(k)
                shape = tuple(part.get_shape())
                s = of(k, shape)
                if s is None:
                    out[k] = h.get_tensor(k)
                elif s.zero:
                    out[k] = s.take(h.get_tensor(k))
                else:
                    idx = [slice(None)] * len(shape)
                    idx[s.dim if len(shape) > 1 else 0] = slice(s.lo, s.hi)
                    out[k] = part[tuple(idx)].contiguous()
    return out


def read_kv_scales(ckpt_dir: Path) -> dict[int, tuple[float, float]]:
    """layer -> (k_scale, v_scale) of an FP8 KV cache, read from the checkpoint's ``*.k_scale`` / ``*.v_scale``."""
    found: dict[int, dict[str, float]] = {}
    pat = re.compile(r"layers\.(\d+)\..*\.([kv])_scale$")
    for f in weight_files(Path(ckpt_dir)):
        if f.suffix != ".safetensors":
            continue
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():  # safe_open handles are not iterable
                m = pat.search(k)
                if m:
                    found.setdefault(int(m.group(1)), {})[m.group(2)] = float(h.get_tensor(k).float().reshape(-1)[0])
    return {i: (v["k"], v["v"]) for i, v in found.items() if "k" in v and "v" in v}


def kv_cache_fp8(ckpt_dir: Path) -> bool:
    hq = Path(ckpt_dir) / "hf_quant_config.json"
    if not hq.is_file():
        return False
    q = read_json(hq)
    q = q.get("quantization", q)
    return str(q.get("kv_cache_quant_algo") or "").upper() == "FP8"


def load_engine(
    target_dir: Path | str,
    draft_dir: Path | str,
    *,
    max_draft_len: int = 3,
    aux_layer_ids: Any = None,
    quantized: bool = False,
    tokenizer_dir: Path | str | None = None,
    max_seq_len: int | None = None,
    device: Any = "cpu",
    dtype: torch.dtype | None = None,
    tp: TPGroup | None = None,
) -> SpeculativeEngine:
    """A target and a draft checkpoint directory as a ``SpeculativeEngine``.

    ``tp``: the target split over a tensor-parallel group (this rank's slice), the draft whole on every rank.

    ``quantized=True``: ModelOpt unified checkpoints as exported by the build stage; each dir's
    own quantization config (hf_quant_config.json / config.json) says what to dequantize, and
    activations and the FP8 KV cache are fake-quantized as the GPU would compute them.
    ``quantized=False``: BF16 (or FP16/FP32) Hugging Face checkpoints, run as they are (the
    tokenizer is the target's). ``aux_layer_ids`` None: the draft config's, else TensorRT-LLM's
    default rule. ``max_seq_len`` None: the target's ``max_position_embeddings``.
    """
    if not quantized:
        eng = engine_for_checkpoint(
            Path(target_dir), load_draft(Path(draft_dir)), device=device, dtype=dtype, max_draft_len=max_draft_len, aux_layer_ids=aux_layer_ids, tp=tp
        )
        if max_seq_len:
            eng.max_seq_len = int(max_seq_len)
        return eng
    dtype = _default_dtype(device, dtype)
    tdir, ddir = Path(target_dir), Path(draft_dir)
    meta = load_draft(ddir)
    aux = aux_layer_ids or meta.config.aux_layer_ids or default_aux_layers_of(read_json(tdir / "config.json"))
    target = load_target(tdir, device=device, dtype=dtype, aux_layer_ids=tuple(aux), tp=tp)
    cfg = target.config
    if kv_cache_fp8(tdir):
        target.kv_scales = read_kv_scales(tdir)
    if meta.method is not None:  # a method's own head (registry.method_for_head), shipped unquantized in its own format
        draft, embed = _build_draft(meta, dtype, device)
    else:
        _dcfg, dsd, dquant = load_checkpoint_dequantized(ddir, dtype=dtype)
        dense = {k2: v for k2, v in dsd.items() if not k2.endswith((".input_scale", ".weight_scale", ".weight_scale_2", ".k_scale", ".v_scale"))}
        # A packed NVFP4 fc.weight halves in_features in the raw file; count aux layers on the dense one.
        n_aux = dense["fc.weight"].shape[1] // meta.config.target_hidden_size
        ckpt = DraftCheckpoint(path=ddir, config=replace(meta.config, num_aux_layers=n_aux), tensors=dense, raw_config=meta.raw_config)
        draft, embed = _build_draft(ckpt, dtype, device)
        draft.fake_quant_handles = install_activation_fake_quant(draft, input_scales_of(dquant, dsd), quant_algo_of(dquant))
    tok_dir = Path(tokenizer_dir) if tokenizer_dir is not None and Path(tokenizer_dir).is_dir() else tdir
    return SpeculativeEngine(
        target,
        draft,
        _load_tokenizer(tok_dir),
        max_draft_len=max_draft_len,
        eos_token_ids=eos_token_ids(tdir, tok_dir),
        max_seq_len=int(max_seq_len or max_positions_of(cfg)),
        draft_embed=embed,
        pad_token_id=pad_token_id(tdir),
        method=_method_of(meta),
    )


def engine_for_checkpoint(
    target_dir: Path,
    ckpt: DraftCheckpoint,
    *,
    device: Any = "cpu",
    dtype: torch.dtype | None = None,
    max_draft_len: int = 3,
    aux_layer_ids: Any = None,
    tp: TPGroup | None = None,
) -> SpeculativeEngine:
    """A BF16 (or FP16/FP32) target directory and a draft checkpoint already read (the builder's,
    validated and loaded once)."""
    dtype = _default_dtype(device, dtype)
    info = read_target(target_dir)
    aux = tuple(aux_layer_ids or ckpt.config.aux_layer_ids or info.default_aux_layers())
    target = load_target(target_dir, device=device, dtype=dtype, aux_layer_ids=aux, tp=tp)
    draft, embed = _build_draft(ckpt, dtype, device)
    return SpeculativeEngine(
        target,
        draft,
        _load_tokenizer(target_dir),
        max_draft_len=max_draft_len,
        eos_token_ids=eos_token_ids(target_dir),
        max_seq_len=info.max_position_embeddings,
        draft_embed=embed,
        pad_token_id=pad_token_id(target_dir),
        method=_method_of(ckpt),
    )


def _default_dtype(device: Any, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return dtype
    return torch.bfloat16 if str(device).startswith("cuda") else torch.float32


def _build_draft(ckpt: DraftCheckpoint, dtype: torch.dtype, device: Any) -> tuple[Eagle3Draft, torch.nn.Embedding | None]:
    """The draft and the embedding table it reads: its own exactly when TensorRT-LLM gives it one
    (target_hidden_size != hidden_size, ``DraftConfig.own_embedding``), else None (the target's).
    A method's own head (``ckpt.method``) is built by that method's ``head`` hooks (with the embedding that method gives it)."""
    hooks = head_hooks(ckpt)
    if hooks is not None:
        built: tuple[Eagle3Draft, torch.nn.Embedding | None] = hooks.build(ckpt, dtype, device)
        return built
    draft = Eagle3Draft.from_checkpoint(ckpt, dtype=dtype, device=device)
    return draft, getattr(draft, "embed_tokens", None)


def _method_of(ckpt: DraftCheckpoint) -> Any:
    """The method a method's own head drafts with (None: an EAGLE-3 head, the engine's chain); a
    bundle's options may still pick another (runtime/loader.py)."""
    return None if ckpt.method is None else method_class(ckpt.method)()


def _load_tokenizer(path: Path) -> Any:
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer.model").is_file():
        return None
    return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
