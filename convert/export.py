"""Write unified Hugging Face checkpoints that TensorRT-LLM's PyTorch runtime loads.

Target: ModelOpt's ``export_hf_checkpoint`` (safetensors, ``hf_quant_config.json``, inline
``quantization_config``), then the config gets the legacy field spellings (config_compat) and
the tokenizer files. Draft: the flat SafeAILab layout (``fc``, ``midlayer.*``, ``norm``,
``lm_head``, ``d2t``); quantized drafts go through ModelOpt's transformers exporter so FP8/NVFP4
tensors, scales and the q/k/v shared input scale match what a quantized target gets.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import types
from pathlib import Path

import torch

from eagle3_trt.convert.config_compat import with_legacy_fields
from eagle3_trt.convert.draft_format import DraftCheckpoint, trtllm_config
from eagle3_trt.errors import UserError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "generation_config.json")


def copy_tokenizer(src: Path, dst: Path) -> list[str]:
    dst.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in TOKENIZER_FILES:
        if (Path(src) / name).is_file():
            shutil.copy2(Path(src) / name, dst / name)
            copied.append(name)
    return copied


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def export_target(model, out_dir: Path, source_dir: Path) -> None:
    from modelopt.torch.export import export_hf_checkpoint

    out_dir.mkdir(parents=True, exist_ok=True)
    export_hf_checkpoint(model, export_dir=str(out_dir))
    cfg_path = out_dir / "config.json"
    _write_json(cfg_path, with_legacy_fields(json.loads(cfg_path.read_text())))
    copy_tokenizer(source_dir, out_dir)


def export_draft_bf16(ckpt: DraftCheckpoint, out_dir: Path) -> None:
    """Normalized tensors as BF16 safetensors (d2t/t2d keep their integer/bool dtypes)."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for k, t in ckpt.tensors.items():
        tensors[k] = (t.to(torch.bfloat16) if t.is_floating_point() else t).contiguous()
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    _write_json(out_dir / "config.json", trtllm_config(ckpt.config, ckpt.raw_config))


def _transformers_exporter():
    from modelopt.torch.export import unified_export_hf as ueh

    fn = getattr(ueh, "_export_transformers_checkpoint", None) or getattr(ueh, "_export_hf_checkpoint", None)
    if fn is None:
        raise UserError("--quantize-draft", "this ModelOpt version has no transformers exporter for a bare module", "upgrade nvidia-modelopt, or leave the draft in BF16 (the default)")
    return fn


def export_draft_quantized(draft_module, ckpt: DraftCheckpoint, out_dir: Path) -> dict:
    """Export a ModelOpt-quantized Eagle3Draft; returns the hf_quant_config written."""
    from safetensors.torch import save_file

    export = _transformers_exporter()
    frozen = draft_module.config
    # ModelOpt's exporter flips config.use_cache around its dummy forward; give it a mutable view.
    draft_module.config = types.SimpleNamespace(**dataclasses.asdict(frozen), use_cache=False)
    # The exporter runs one forward to find layers that share an input: ModelOpt >= 0.4x calls
    # get_dummy_inputs(), 0.37 (TensorRT-LLM containers) calls model(torch.ones(1, 2, long)).
    forward = draft_module.forward

    def probe_tolerant(*args, **kwargs):
        if len(args) == 1 and not kwargs and torch.is_tensor(args[0]) and not args[0].is_floating_point():
            return forward(**draft_module.get_dummy_inputs())
        return forward(*args, **kwargs)

    draft_module.forward = probe_tolerant
    try:
        state, hf_quant = export(draft_module, torch.bfloat16)
    finally:
        draft_module.config = frozen
        del draft_module.forward
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    if "t2d" in ckpt.tensors:
        tensors["t2d"] = ckpt.tensors["t2d"]
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    cfg = trtllm_config(ckpt.config, ckpt.raw_config)
    q = hf_quant["quantization"]
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": q.get("quant_algo"),
                                  "kv_cache_quant_algo": q.get("kv_cache_quant_algo"),
                                  "exclude_modules": q.get("exclude_modules", []),
                                  "producer": hf_quant.get("producer")}
    for k in ("group_size",):
        if k in q:
            cfg["quantization_config"][k] = q[k]
    _write_json(out_dir / "config.json", cfg)
    _write_json(out_dir / "hf_quant_config.json", hf_quant)
    return hf_quant
