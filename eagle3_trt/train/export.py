"""Write a trained head in the SafeAILab / TensorRT-LLM layout (what TensorRT-LLM loads natively).

config.json: flat ``LlamaForCausalLMEagle3`` Llama config with ``draft_vocab_size``,
``target_hidden_size`` and ``eagle_config.eagle_aux_hidden_state_layer_ids``;
model.safetensors: ``fc``, ``midlayer.*``, ``norm``, ``lm_head`` in bf16, ``d2t`` (int64) and
``t2d`` (bool) when the draft vocabulary is reduced (TensorRT-LLM creates d2t only then).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from eagle3_trt.atomic import staged_dir
from eagle3_trt.convert.draft_format import load_draft
from eagle3_trt.convert.target import TargetInfo
from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.errors import UserError
from eagle3_trt.formats.draft_config import DraftConfig, target_token_ids, trtllm_config
from eagle3_trt.train.draft_vocab import DraftVocab


def draft_config_for(info: TargetInfo, target_cfg: dict, draft_vocab_size: int, aux: tuple[int, ...], intermediate_size: int | None = None) -> DraftConfig:
    """A one-layer head shaped like the target's layers (hidden size must match: the draft
    shares the target's embedding table)."""
    return DraftConfig(
        hidden_size=info.hidden_size,
        intermediate_size=int(intermediate_size or info.intermediate_size),
        num_attention_heads=info.num_attention_heads,
        num_key_value_heads=info.num_key_value_heads,
        head_dim=info.head_dim,
        rms_norm_eps=float(target_cfg.get("rms_norm_eps", 1e-5)),
        rope_theta=info.rope_theta,
        rope_scaling=info.rope_scaling,
        max_position_embeddings=info.max_position_embeddings,
        vocab_size=info.vocab_size,
        draft_vocab_size=draft_vocab_size,
        target_hidden_size=info.hidden_size,
        aux_layer_ids=tuple(aux),
        num_aux_layers=len(aux),
        torch_dtype="bfloat16",
        source_format="safeailab",
    )


def draft_tensors(draft: Eagle3Draft, vocab: DraftVocab) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for k, v in draft.state_dict().items():
        if k == "d2t":
            continue
        out[k] = v.detach().to("cpu", torch.bfloat16).contiguous()
    if not vocab.full:
        out["d2t"] = vocab.d2t()
        out["t2d"] = vocab.t2d()
    return out


def export_draft(
    draft: Eagle3Draft, cfg: DraftConfig, vocab: DraftVocab, out_dir: Path, target_cfg: dict, extra_files: dict[str, str] | None = None, overwrite: bool = False
) -> Path:
    """Write <out_dir> atomically (``eagle3_trt.atomic.staged_dir``)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise UserError(out_dir, "output directory exists", "pass --overwrite or choose another -o")
    with staged_dir(out_dir) as tmp:
        save_file(draft_tensors(draft, vocab), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(trtllm_config(cfg, target_token_ids(target_cfg)), indent=2) + "\n")
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
    return out_dir


def export_files(out_dir: Path, config: dict, tensors: dict[str, torch.Tensor], extra_files: dict[str, str] | None = None, overwrite: bool = False) -> Path:
    """Write a head a method laid out itself (config.json, model.safetensors, as its
    training hook's ``files`` returns them) atomically, like ``export_draft``."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise UserError(out_dir, "output directory exists", "pass --overwrite or choose another -o")
    with staged_dir(out_dir) as tmp:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
    return out_dir


def save_draft(draft: Eagle3Draft, src_dir: Path, out_dir: Path) -> Path:
    """Write a draft trained in place (e.g. by ``trainer.distill_draft``) with the config (and
    bos/eos ids) of the checkpoint it was loaded from, in the SafeAILab layout (replacing ``out_dir``)."""
    src = load_draft(Path(src_dir))
    vocab = DraftVocab.from_d2t(draft.get_buffer("d2t").detach().cpu(), src.config.vocab_size)
    return export_draft(draft, src.config, vocab, Path(out_dir), src.raw_config, overwrite=True)
