"""Write a trained head in the SafeAILab / TensorRT-LLM layout (what TensorRT-LLM loads natively).

config.json: flat ``LlamaForCausalLMEagle3`` Llama config with ``draft_vocab_size``,
``target_hidden_size`` and ``eagle_config.eagle_aux_hidden_state_layer_ids``;
model.safetensors: ``fc``, ``midlayer.*``, ``norm``, ``lm_head`` in bf16, ``d2t`` (int64) and
``t2d`` (bool) when the draft vocabulary is reduced (TensorRT-LLM creates d2t only then).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from eagle3_trt.convert.draft_format import DraftConfig, trtllm_config
from eagle3_trt.convert.target import TargetInfo
from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.train.draft_vocab import DraftVocab


def draft_config_for(info: TargetInfo, target_cfg: dict, draft_vocab_size: int, aux: tuple[int, ...],
                     intermediate_size: int | None = None) -> DraftConfig:
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


def export_draft(draft: Eagle3Draft, cfg: DraftConfig, vocab: DraftVocab, out_dir: Path, target_cfg: dict,
                 extra_files: dict[str, str] | None = None, overwrite: bool = False) -> Path:
    """Write <out_dir> atomically (temp dir beside it, renamed at the end)."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would survive the rename
    try:
        save_file(draft_tensors(draft, vocab), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        raw = {k: target_cfg[k] for k in ("bos_token_id", "eos_token_id") if k in target_cfg}
        (tmp / "config.json").write_text(json.dumps(trtllm_config(cfg, raw), indent=2) + "\n")
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        if out_dir.exists():
            if not overwrite:
                raise FileExistsError(out_dir)
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out_dir
