"""GPU generations and the quantization formats each can run.

Figures are dense (non-sparse) peak numbers from NVIDIA's data sheets; the planner
and cost model use them, so every entry names its SXM variant.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_trt.errors import UserError


@dataclass(frozen=True)
class GpuSpec:
    name: str
    generation: str  # ampere | ada | hopper | blackwell
    sm: int  # compute capability * 10
    memory_gb: float  # HBM, decimal GB
    bandwidth_tbs: float  # HBM bandwidth, TB/s
    bf16_tflops: float
    fp8_tflops: float | None
    fp4_tflops: float | None
    nvlink_gbs: float  # per-GPU NVLink bandwidth, GB/s


GPUS: dict[str, GpuSpec] = {
    "a100": GpuSpec("a100", "ampere", 80, 80, 2.039, 312, None, None, 600),
    "l40s": GpuSpec("l40s", "ada", 89, 48, 0.864, 362, 733, None, 0),
    "h100": GpuSpec("h100", "hopper", 90, 80, 3.35, 989, 1979, None, 900),
    "h200": GpuSpec("h200", "hopper", 90, 141, 4.8, 989, 1979, None, 900),
    "b200": GpuSpec("b200", "blackwell", 100, 180, 8.0, 2250, 4500, 9000, 1800),
    "gb200": GpuSpec("gb200", "blackwell", 100, 186, 8.0, 2500, 5000, 10000, 1800),
}

# Minimum compute capability per weight format [TensorRT-LLM docs/source/features/quantization.md].
MIN_SM = {"bf16": 80, "fp8": 89, "nvfp4": 100}


def get_gpu(name: str) -> GpuSpec:
    key = name.lower().strip()
    if key not in GPUS:
        raise UserError("--target-gpu", f"unknown GPU {name!r}", f"choose one of {', '.join(GPUS)}")
    return GPUS[key]


def gpu_from_sm(sm: int) -> str:
    """Closest known GPU name for a compute capability read from a real device."""
    by_sm = {80: "a100", 89: "l40s", 90: "h100", 100: "b200", 103: "b200", 120: "b200"}
    return by_sm.get(sm, "h100" if 90 <= sm < 100 else "b200" if sm >= 100 else "a100")


def check_quant_for_gpu(quant: str, gpu: GpuSpec, where: str = "--quant") -> None:
    need = MIN_SM.get(quant)
    if need is None:
        raise UserError(where, f"unknown quant format {quant!r}", "choose fp8, nvfp4 or bf16")
    if gpu.sm < need:
        gens = {89: "Ada (SM89), Hopper (SM90) or Blackwell", 100: "Blackwell (SM100 or newer)", 80: "Ampere or newer"}
        alt = "fp8" if quant == "nvfp4" and gpu.sm >= 89 else "bf16"
        raise UserError(
            where,
            f"{quant} needs {gens[need]}, but {gpu.name} is {gpu.generation} (SM{gpu.sm})",
            f"use --quant {alt} for {gpu.name}, or --target-gpu b200 to build for Blackwell",
        )
