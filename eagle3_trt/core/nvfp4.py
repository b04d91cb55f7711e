"""Pure-torch NVFP4 fake quantization for CPU tensors.

NVFP4: E2M1 values in 16-element blocks, each block scaled by an E4M3 factor under a
per-tensor FP32 global scale. ModelOpt's own op for this has only CUDA/Triton kernels;
``modelopt_compat.install_cpu_workarounds`` routes CPU calls here during calibration, and
the reference runtime (core/target.py) uses the same functions to emulate NVFP4 activations.
No ModelOpt import: this is the arithmetic only (the E2M1 codes are shared with MXFP4, convert/mxfp4.py).
"""

from __future__ import annotations

import torch

E2M1_MAX = 6.0
E4M3_MAX = 448.0
_E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_E2M1_MIDPOINTS = (_E2M1_GRID[1:] + _E2M1_GRID[:-1]) / 2
# the 16 E2M1 codes in order (bit 3 = sign): NVFP4 and MXFP4 checkpoints store these, two per byte
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., n/2] -> float32 [..., n] (low nibble first)."""
    lo = (packed & 0x0F).long()
    hi = (packed >> 4).long()
    codes = torch.stack([lo, hi], dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
    return E2M1_VALUES[codes]


def round_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 value (ties to the even code, as the hardware conversion does), sign kept."""
    mag = x.abs().clamp(max=E2M1_MAX)
    idx = torch.bucketize(mag, _E2M1_MIDPOINTS.to(mag.device, mag.dtype), right=False)
    # bucketize(right=False) sends an exact midpoint to the lower code; move odd codes up on ties.
    on_tie = torch.isin(mag, _E2M1_MIDPOINTS.to(mag.device, mag.dtype)) & (idx % 2 == 1)
    idx = idx + on_tie.to(idx.dtype)
    return torch.sign(x) * _E2M1_GRID.to(x.device, x.dtype)[idx]


def nvfp4_block_scales(x: torch.Tensor, global_amax: torch.Tensor, block_size: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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


def is_nvfp4(num_bits: object, exponent_bits: object, scale_num_bits: object, scale_exponent_bits: object) -> bool:
    """ModelOpt's quantizer attributes for NVFP4: E2M1 values (4 bits, 2 exponent) with E4M3 scales."""
    return (num_bits, exponent_bits, scale_num_bits, scale_exponent_bits) == (4, 2, 8, 4)
