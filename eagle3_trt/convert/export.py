"""Write unified Hugging Face checkpoints that TensorRT-LLM's PyTorch runtime loads.

Target: ModelOpt's ``export_hf_checkpoint`` (safetensors, ``hf_quant_config.json``, inline
``quantization_config``), then the config gets the one rope block (formats/rope_block.py: every
target config a bundle ships, whatever ``--quant``, goes through ``target_config``) and the tokenizer files. Draft: the flat SafeAILab layout (``fc``, ``midlayer.*``, ``norm``,
``lm_head``, ``d2t``); quantized drafts go through ModelOpt's transformers exporter so FP8/NVFP4
tensors, scales and the q/k/v shared input scale match what a quantized target gets.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from eagle3_trt.atomic import make_dirs, write_json
from eagle3_trt.convert import modelopt_compat
from eagle3_trt.convert.draft_format import DraftCheckpoint, served_tensors
from eagle3_trt.convert.streaming import stream_convert
from eagle3_trt.formats.checkpoint_io import read_json
from eagle3_trt.formats.draft_config import DraftConfig, trtllm_config
from eagle3_trt.formats.families import family_of_config
from eagle3_trt.formats.rope_block import normalised

FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "generation_config.json")


def copy_tokenizer(src: Path, dst: Path) -> list[str]:
    make_dirs(dst)
    copied = []
    for name in TOKENIZER_FILES:
        if (Path(src) / name).is_file():
            shutil.copy2(Path(src) / name, dst / name)
            copied.append(name)
    return copied


def target_config(cfg: dict, source_dir: Path) -> dict:
    """A bundle target's config.json: ``cfg`` (what the exporter wrote, or the source's own) with the source
    config's rope block (``rope_block.normalised``). Taken from the source, what was validated, not from
    the exporter's file: transformers 5 rewrites the rope while saving (fills original_max_position_embeddings
    from max_position_embeddings where the source had it at the top level only)."""
    source_path = Path(source_dir) / "config.json"
    source = read_json(source_path)
    return normalised(cfg, source, str(source_path), family_of_config(source, str(source_path)))


def export_target(model, out_dir: Path, source_dir: Path) -> None:
    make_dirs(out_dir)
    modelopt_compat.export_hf_checkpoint(model, out_dir)
    cfg_path = out_dir / "config.json"
    write_json(cfg_path, target_config(json.loads(cfg_path.read_text()), source_dir))
    copy_tokenizer(source_dir, out_dir)


def export_target_bf16(source_dir: Path, out_dir: Path) -> None:
    """An unquantized target without loading it: every tensor streamed shard by shard, floating-point
    ones cast to BF16 (``streaming.stream_convert``: memory stays at one 64 MiB chunk whatever the
    checkpoint size, so a 140 GB target costs disk bandwidth, not RAM). Quantized targets go through
    ModelOpt instead (``export_target``), which needs the model loaded for calibration anyway."""
    stream_convert(Path(source_dir), Path(out_dir), lambda name: name, cast=lambda name, dtype: "bfloat16" if dtype in FLOAT_DTYPES else None)
    cfg = target_config(read_json(Path(source_dir) / "config.json"), source_dir)
    for key in ("torch_dtype", "dtype"):  # transformers 4.x writes torch_dtype, 5.x dtype
        if key in cfg:
            cfg[key] = "bfloat16"
    write_json(Path(out_dir) / "config.json", cfg)
    copy_tokenizer(Path(source_dir), Path(out_dir))


def export_target_native(source_dir: Path, out_dir: Path) -> None:
    """An already-quantized target kept as shipped (``--quant native``, e.g. gpt-oss's MXFP4 experts):
    every tensor streamed unchanged, the config as it is (TensorRT-LLM reads its quantization_config) but for
    the rope block, normalised as every bundle's is."""
    stream_convert(Path(source_dir), Path(out_dir), lambda name: name, cast=lambda name, dtype: None)
    write_json(Path(out_dir) / "config.json", target_config(read_json(Path(source_dir) / "config.json"), source_dir))
    copy_tokenizer(Path(source_dir), Path(out_dir))


def export_draft_bf16(ckpt: DraftCheckpoint, out_dir: Path, token_ids: dict) -> None:
    """The tensors TensorRT-LLM loads (``served_tensors``) as BF16 safetensors (d2t keeps its integer dtype);
    ``token_ids``: the target's bos/eos (``draft_config.target_token_ids``)."""
    make_dirs(out_dir)
    tensors = {}
    for k, t in served_tensors(ckpt).items():
        tensors[k] = (t.to(torch.bfloat16) if t.is_floating_point() else t).contiguous()
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    write_draft_config(ckpt.config, token_ids, out_dir)


def write_draft_config(cfg: DraftConfig, token_ids: dict, out_dir: Path, quantization_config: dict | None = None) -> None:
    """The bundle's draft/config.json. Real builds and dry runs both write it here, from the config
    ``draft_format.config_for_max_seq_len`` gives, so a dry-run bundle shows the config a build ships;
    ``token_ids``: the target's bos/eos (``draft_config.target_token_ids``)."""
    cfg_json = trtllm_config(cfg, token_ids)
    if quantization_config is not None:
        cfg_json["quantization_config"] = quantization_config
    make_dirs(out_dir)
    write_json(out_dir / "config.json", cfg_json)


def export_draft_quantized(draft_module, ckpt: DraftCheckpoint, out_dir: Path, token_ids: dict) -> dict:
    """Export a ModelOpt-quantized Eagle3Draft; returns the hf_quant_config written. The module holds
    only what TensorRT-LLM loads (t2d, which it ignores, is not shipped)."""
    state, hf_quant = modelopt_compat.export_bare_module(draft_module, torch.bfloat16)
    make_dirs(out_dir)
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    q = hf_quant["quantization"]
    qcfg = {
        "quant_method": "modelopt",
        "quant_algo": q.get("quant_algo"),
        "kv_cache_quant_algo": q.get("kv_cache_quant_algo"),
        "exclude_modules": q.get("exclude_modules", []),
        "producer": hf_quant.get("producer"),
    }
    for k in ("group_size",):
        if k in q:
            qcfg[k] = q[k]
    write_draft_config(ckpt.config, token_ids, out_dir, quantization_config=qcfg)
    write_json(out_dir / "hf_quant_config.json", hf_quant)
    return hf_quant
