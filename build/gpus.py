"""GPU generations and the quantization formats each can run.

Figures are dense (non-sparse) peak numbers from NVIDIA's data sheets; the planner
and cost model use them, so every entry names its SXM variant.

Memory is what a user gets, not the marketing figure: the total that ``nvidia-smi`` prints
for the board (MiB), kept exactly in ``memory_mib`` and shown in decimal GB in ``memory_gb``.
"H100 80GB" is 81559 MiB = 85.52 GB, "H200 141GB" 143771 MiB = 150.75 GB, "B200 180GB"
183359 MiB = 192.27 GB, GB200 189471 MiB = 198.68 GB (nvidia-smi logs of those boards in
public repositories). CUDA itself reports a few hundred MiB less (the driver's reserve), which
the planner's runtime reserve covers.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_trt.errors import UserError


@dataclass(frozen=True)
class GpuSpec:
    name: str
    generation: str  # ampere | ada | hopper | blackwell
    sm: int  # compute capability * 10
    memory_gb: float  # HBM as nvidia-smi reports it, in decimal GB (memory_mib * 2**20 / 1e9)
    bandwidth_tbs: float  # HBM bandwidth, TB/s
    bf16_tflops: float
    fp8_tflops: float | None
    fp4_tflops: float | None
    nvlink_gbs: float  # per-GPU NVLink bandwidth, GB/s
    memory_mib: int = 0  # nvidia-smi "memory.total" in MiB; the exact source of memory_gb

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 2**20 if self.memory_mib else int(round(self.memory_gb * 1e9))


def _spec(name: str, generation: str, sm: int, memory_mib: int, bandwidth_tbs: float, bf16: float,
          fp8: float | None, fp4: float | None, nvlink_gbs: float) -> GpuSpec:
    return GpuSpec(name, generation, sm, memory_mib * 2**20 / 1e9, bandwidth_tbs, bf16, fp8, fp4, nvlink_gbs, memory_mib)


GPUS: dict[str, GpuSpec] = {
    "a100": _spec("a100", "ampere", 80, 81920, 2.039, 312, None, None, 600),  # A100 SXM4 80GB
    "l40s": _spec("l40s", "ada", 89, 46068, 0.864, 362, 733, None, 0),
    "h100": _spec("h100", "hopper", 90, 81559, 3.35, 989, 1979, None, 900),  # H100 SXM5 80GB HBM3
    "h200": _spec("h200", "hopper", 90, 143771, 4.8, 989, 1979, None, 900),
    "b200": _spec("b200", "blackwell", 100, 183359, 8.0, 2250, 4500, 9000, 1800),
    "gb200": _spec("gb200", "blackwell", 100, 189471, 8.0, 2500, 5000, 10000, 1800),
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
            f"use quant {alt} for {gpu.name}, or target a Blackwell GPU (b200)",
        )
