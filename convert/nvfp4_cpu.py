"""Pure-torch NVFP4 fake quantization for CPU tensors.

ModelOpt's dynamic block quantization op (used by every NVFP4 forward after
``mtq.quantize``) only has CUDA/Triton kernels and asserts on CPU tensors. This module
wraps that op: CPU inputs in NVFP4 format (E2M1 values, 16-element blocks, E4M3 block
scales under a per-tensor FP32 global scale) are fake-quantized here; everything else
goes to ModelOpt's own implementation unchanged.
"""

from __future__ import annotations

import torch

E2M1_MAX = 6.0
E4M3_MAX = 448.0
_E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_E2M1_MIDPOINTS = (_E2M1_GRID[1:] + _E2M1_GRID[:-1]) / 2


def round_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 value (ties to the even code, as the hardware conversion does), sign kept."""
    mag = x.abs().clamp(max=E2M1_MAX)
    idx = torch.bucketize(mag, _E2M1_MIDPOINTS.to(mag.device, mag.dtype), right=False)
    # bucketize(right=False) sends an exact midpoint to the lower code; move odd codes up on ties.
    on_tie = torch.isin(mag, _E2M1_MIDPOINTS.to(mag.device, mag.dtype)) & (idx % 2 == 1)
    idx = idx + on_tie.to(idx.dtype)
    return torch.sign(x) * _E2M1_GRID.to(x.device, x.dtype)[idx]


def nvfp4_block_scales(x: torch.Tensor, global_amax: torch.Tensor, block_size: int = 16):
    """(blocks [N, block], per-block scale [N, 1] as E4M3-representable FP32, global scale)."""
    blocks = x.float().reshape(-1, block_size)
    global_scale = global_amax.float().reshape(()) / (E2M1_MAX * E4M3_MAX)
    block_amax = blocks.abs().amax(dim=-1, keepdim=True)
    if global_scale == 0:
        return blocks, torch.zeros_like(block_amax), global_scale
    scale_e4m3 = (block_amax / E2M1_MAX / global_scale).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    return blocks, scale_e4m3.float() * global_scale, global_scale


def nvfp4_fake_quant(x: torch.Tensor, block_size: int, global_amax: torch.Tensor) -> torch.Tensor:
    if x.shape[-1] % block_size:
        raise ValueError(f"last dim {x.shape[-1]} is not a multiple of the NVFP4 block size {block_size}")
    blocks, scale, _ = nvfp4_block_scales(x, global_amax, block_size)
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.where(scale == 0, torch.zeros_like(blocks), round_to_e2m1(blocks / safe) * scale)
    return q.reshape(x.shape).to(x.dtype)


def _is_nvfp4(num_bits, exponent_bits, scale_num_bits, scale_exponent_bits) -> bool:
    return (num_bits, exponent_bits, scale_num_bits, scale_exponent_bits) == (4, 2, 8, 4)


def install() -> bool:
    """Route CPU NVFP4 fake quantization to the fallback. Idempotent; False if ModelOpt lacks the op."""
    from modelopt.torch.quantization import tensor_quant as tq

    orig = getattr(tq, "dynamic_block_quantize_op", None)
    if orig is None:
        return False
    if getattr(orig, "_eagle3_trt_cpu_fallback", False):
        return True

    def op(inputs, block_size, amax, num_bits, exponent_bits, scale_num_bits, scale_exponent_bits):
        if not inputs.is_cuda and _is_nvfp4(num_bits, exponent_bits, scale_num_bits, scale_exponent_bits):
            if amax is None:
                amax = inputs.detach().abs().amax()
            return nvfp4_fake_quant(inputs, block_size, amax)
        return orig(inputs, block_size, amax, num_bits, exponent_bits, scale_num_bits, scale_exponent_bits)

    op._eagle3_trt_cpu_fallback = True  # type: ignore[attr-defined]
    tq.dynamic_block_quantize_op = op
    _guard_fp4_capability_probe()
    return True


def _guard_fp4_capability_probe() -> None:
    """ModelOpt 0.37's NVFP4 weight export asks ``torch.cuda.get_device_capability(0)`` without
    checking for a GPU first, which raises on a CPU-only torch; answer "no FP4 GEMMs" there."""
    import torch

    try:
        from modelopt.torch.quantization.qtensor import nvfp4_tensor
    except ImportError:
        return
    probe = getattr(nvfp4_tensor, "fp4_compatible", None)
    if probe is None or getattr(probe, "_eagle3_trt_guarded", False):
        return

    def guarded() -> bool:
        return torch.cuda.is_available() and probe()

    guarded._eagle3_trt_guarded = True  # type: ignore[attr-defined]
    nvfp4_tensor.fp4_compatible = guarded
