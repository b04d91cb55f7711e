"""Turn a ModelOpt unified HF checkpoint (FP8 or NVFP4) back into dense tensors.

Used by the reference runtime (so measured acceptance reflects the quantized weights) and
by tests that bound the quantization error. Layouts, as ModelOpt exports them:
- MXFP4 (gpt-oss experts as shipped, ``quant_method: mxfp4``): ``<proj>_blocks``/``<proj>_scales``,
  dequantized by convert/mxfp4.py into the dense ``<proj>`` transformers' GptOssExperts holds.
- FP8: ``weight`` float8_e4m3fn, ``weight_scale`` FP32 per tensor; W = w * weight_scale.
- NVFP4: ``weight`` uint8 [out, in/2], two E2M1 codes per byte (low nibble = even column),
  ``weight_scale`` float8_e4m3fn [out, in/16], ``weight_scale_2`` FP32 per tensor;
  W = e2m1(code) * weight_scale * weight_scale_2.
``input_scale`` / ``k_scale`` / ``v_scale`` are activation and KV scales; they are returned
separately so a runtime can fake-quantize activations if it wants to.
"""

from __future__ import annotations

from pathlib import Path

import torch

from eagle3_trt.convert import mxfp4
from eagle3_trt.core.nvfp4 import unpack_e2m1
from eagle3_trt.formats.checkpoint_io import iter_tensors, read_json, weight_files

SCALE_SUFFIXES = ("weight_scale", "weight_scale_2", "input_scale", "k_scale", "v_scale", "pre_quant_scale")


def dequant_fp8(weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    return weight.float() * weight_scale.float()


def dequant_nvfp4(weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor) -> torch.Tensor:
    vals = unpack_e2m1(weight)
    block = vals.shape[-1] // weight_scale.shape[-1]
    scales = weight_scale.float().repeat_interleave(block, dim=-1) * weight_scale_2.float()
    return vals * scales


def quant_algo(ckpt_dir: Path) -> str | None:
    """The checkpoint's quant_algo ("FP8", "NVFP4", ...) or None for an unquantized one."""
    ckpt_dir = Path(ckpt_dir)
    hq = ckpt_dir / "hf_quant_config.json"
    if hq.is_file():
        return read_json(hq).get("quantization", {}).get("quant_algo")
    qc = read_json(ckpt_dir / "config.json").get("quantization_config")
    if not isinstance(qc, dict):
        return None
    # ModelOpt writes quant_algo; a checkpoint shipped quantized (gpt-oss) names its quant_method
    algo = qc.get("quant_algo") or qc.get("quant_method")
    return str(algo).upper() if algo else None


def load_checkpoint_dequantized(ckpt_dir: Path, dtype: torch.dtype = torch.bfloat16, take=None):
    """(config without quantization_config, dense state_dict in dtype, quant info or None).

    ``take(name, tensor)``: the part of each stored tensor to keep, applied as it is read (a
    tensor-parallel rank keeps its slices, core/tensor_parallel.take_stored), so no more than one
    whole tensor is held at a time."""
    ckpt_dir = Path(ckpt_dir)
    cfg = dict(read_json(ckpt_dir / "config.json"))
    cfg.pop("quantization_config", None)
    raw: dict[str, torch.Tensor] = {}
    for f in weight_files(ckpt_dir):
        raw.update((k, t if take is None else take(k, t)) for k, t in iter_tensors(f))
    algo = quant_algo(ckpt_dir)
    raw = mxfp4.dense_experts(raw)  # gpt-oss experts as shipped -> dense [E, in, out] (weights only); others unchanged
    out: dict[str, torch.Tensor] = {}
    act_scales: dict[str, float] = {}
    for name, t in raw.items():
        mod, _, leaf = name.rpartition(".")
        if leaf in SCALE_SUFFIXES:
            if leaf == "input_scale":
                act_scales[mod] = float(t.float().reshape(-1)[0])
            continue
        if leaf == "weight" and t.dtype == torch.float8_e4m3fn:
            out[name] = dequant_fp8(t, raw[f"{mod}.weight_scale"]).to(dtype)
        elif leaf == "weight" and t.dtype == torch.uint8 and f"{mod}.weight_scale_2" in raw:
            out[name] = dequant_nvfp4(t, raw[f"{mod}.weight_scale"], raw[f"{mod}.weight_scale_2"]).to(dtype)
        elif t.is_floating_point():
            out[name] = t.to(dtype)
        else:
            out[name] = t
    info = {"quant_algo": algo, "input_scales": act_scales} if algo else None
    return cfg, out, info
