"""Fake quantization of a dequantized target, so it computes what the quantized pair computes in TensorRT-LLM.

Weights arrive dequantized; activations of the quantized Linear layers (and, for FP8 KV bundles,
the stored K/V: core/kv_cache.py) are cast through the exported static scales here.
"""

from __future__ import annotations

from typing import Any

import torch

from eagle3_trt.core.nvfp4 import E2M1_MAX, E4M3_MAX, nvfp4_fake_quant

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


def fp8_fake_quant(x: torch.Tensor, scale: float) -> torch.Tensor:
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
            handles.append(mod.register_forward_pre_hook(lambda m, args, s=s: (fp8_fake_quant(args[0], s), *args[1:])))
        else:
            amax = torch.tensor(s * E2M1_MAX * E4M3_MAX)
            if mod.in_features % 16:
                continue
            handles.append(mod.register_forward_pre_hook(lambda m, args, a=amax: (nvfp4_fake_quant(args[0], 16, a.to(args[0].device)), *args[1:])))
    return handles
