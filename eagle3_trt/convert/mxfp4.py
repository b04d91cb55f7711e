"""MXFP4 (OCP Microscaling FP4) as gpt-oss checkpoints ship their MoE experts.

openai/gpt-oss-{20b,120b} keep attention, router, embedding and lm_head in BF16 and store each expert
matrix as two tensors (``quantization_config.quant_method: "mxfp4"``):

- ``<experts>.<proj>_blocks`` uint8 [E, out, in/32, 16]: 32 E2M1 codes per block, two per byte, the
  low nibble first;
- ``<experts>.<proj>_scales`` uint8 [E, out, in/32]: one E8M0 exponent per block, biased by 127
  (scale = 2 ** (s - 127)).

W[e, o, i] = e2m1(code) * scale. transformers' dense ``GptOssExperts`` holds ``gate_up_proj`` as
[E, hidden, 2 * intermediate] and ``down_proj`` as [E, intermediate, hidden] (it computes x @ W), so
the dense tensor is the dequantized one transposed; gate and up stay interleaved (gate on even
columns) in both layouts. The same layout is what TensorRT-LLM's ``GptOssForCausalLM.load_hf_weights``
reads (tensorrt_llm/_torch/models/modeling_gpt_oss.py @ 050b6cb92871a4ed73486c5e5a573d4198d1a6d9) and
what transformers' CPU fallback dequantizes (``convert_moe_packed_tensors`` in
transformers/integrations/mxfp4.py, 4.57 and 5.x); tests/test_mxfp4.py checks this module against it.

MXFP4 runs on neither this machine's CPU nor in the reference runtime: the runtime measures the
target with its experts dequantized exactly (every E2M1 x 2^k value is a BF16 value), activations in
BF16/FP32, which is TensorRT-LLM's W4A16 MXFP4 path on Hopper; Blackwell kernels that also quantize
activations are not emulated (the alpha report says so).
"""

from __future__ import annotations

import torch

from eagle3_trt.core.nvfp4 import E2M1_MAX, E2M1_VALUES, unpack_e2m1
from eagle3_trt.errors import UserError
from eagle3_trt.formats.families import MX_BLOCK as BLOCK  # weights per E8M0 scale

E8M0_BIAS = 127
E8M0_NAN = 255  # the one E8M0 code that is not a power of two
BLOCKS_SUFFIX, SCALES_SUFFIX = "_blocks", "_scales"
# the expert matrices gpt-oss ships in MXFP4 (their biases stay BF16)
EXPERT_PROJS = ("gate_up_proj", "down_proj")
# what openai/gpt-oss-20b's config.json says (build/model_configs/gpt-oss-20b/target/config.json)
QUANTIZATION_CONFIG = {
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
    "quant_method": "mxfp4",
}


def dequantize(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 blocks [E, out, in/32, 16] + uint8 scales [E, out, in/32] -> dense [E, in, out] in ``dtype``."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales are uint8, got {blocks.dtype} and {scales.dtype}")
    if tuple(blocks.shape[:-1]) != tuple(scales.shape) or blocks.shape[-1] != BLOCK // 2:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} do not match scales {tuple(scales.shape)}")
    vals = unpack_e2m1(blocks)  # [E, out, G, 32], float32
    vals = torch.ldexp(vals, scales.to(torch.int32).unsqueeze(-1) - E8M0_BIAS)
    dense = vals.reshape(*blocks.shape[:-2], blocks.shape[-2] * BLOCK)  # [E, out, in]
    return dense.transpose(-1, -2).contiguous().to(dtype)


def quantize(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """dense [E, in, out] -> (blocks, scales) in the shipped layout; round to the nearest E2M1 value
    under the smallest power-of-two scale that keeps each 32-block's largest magnitude <= 6."""
    w = dense.detach().float().transpose(-1, -2)  # [E, out, in]
    if w.shape[-1] % BLOCK:
        raise ValueError(f"MXFP4 needs the input width to be a multiple of {BLOCK}, got {w.shape[-1]}")
    g = w.reshape(*w.shape[:-1], w.shape[-1] // BLOCK, BLOCK)
    amax = g.abs().amax(-1)
    exp = torch.where(amax > 0, torch.ceil(torch.log2(amax / E2M1_MAX)), torch.full_like(amax, -E8M0_BIAS))
    exp = exp.clamp(-E8M0_BIAS, E8M0_BIAS)
    x = torch.ldexp(g, -exp.to(torch.int32).unsqueeze(-1))
    codes = (x.unsqueeze(-1) - E2M1_VALUES).abs().argmin(-1).to(torch.uint8)  # nearest of the 16 codes
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed.contiguous(), (exp + E8M0_BIAS).to(torch.uint8).contiguous()


def dense_experts(tensors: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """A state dict with every ``<proj>_blocks``/``<proj>_scales`` pair replaced by the dense ``<proj>``
    transformers' ``GptOssExperts`` loads; other tensors are passed through. A pair that cannot be
    dequantized (no scales, shapes or dtypes that disagree, a NaN exponent) is a one-line UserError."""
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if name.endswith(SCALES_SUFFIX) and name[: -len(SCALES_SUFFIX)] + BLOCKS_SUFFIX in tensors:
            continue
        if name.endswith(BLOCKS_SUFFIX):
            base = name[: -len(BLOCKS_SUFFIX)]
            scales = tensors.get(base + SCALES_SUFFIX)
            if scales is None:
                raise UserError(f"target:{name}", f"has no {base + SCALES_SUFFIX}", "the MXFP4 checkpoint is incomplete")
            if scales.dtype == torch.uint8 and bool((scales == E8M0_NAN).any()):
                raise UserError(
                    f"target:{base + SCALES_SUFFIX}",
                    f"{int((scales == E8M0_NAN).sum())} blocks have the E8M0 NaN exponent ({E8M0_NAN})",
                    "the checkpoint is corrupt: re-download it",
                )
            try:
                out[base] = dequantize(t, scales, dtype)
            except ValueError as e:
                raise UserError(f"target:{name}", str(e), "the MXFP4 checkpoint is corrupt or not in gpt-oss's layout") from None
        else:
            out[name] = t
    return out


def mxfp4_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse: a dense gpt-oss state dict with its expert matrices in the shipped MXFP4 layout
    (how the embedded tiny gpt-oss target is written, so it loads as openai's checkpoints do)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if name.rpartition(".")[2] in EXPERT_PROJS and ".mlp.experts." in name:
            out[name + BLOCKS_SUFFIX], out[name + SCALES_SUFFIX] = quantize(t)
        else:
            out[name] = t
    return out
