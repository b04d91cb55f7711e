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


def _spec(
    name: str, generation: str, sm: int, memory_mib: int, bandwidth_tbs: float, bf16: float, fp8: float | None, fp4: float | None, nvlink_gbs: float
) -> GpuSpec:
    return GpuSpec(name, generation, sm, memory_mib * 2**20 / 1e9, bandwidth_tbs, bf16, fp8, fp4, nvlink_gbs, memory_mib)


GPUS: dict[str, GpuSpec] = {
    "a100": _spec("a100", "ampere", 80, 81920, 2.039, 312, None, None, 600),  # A100 SXM4 80GB
    "l40s": _spec("l40s", "ada", 89, 46068, 0.864, 362, 733, None, 0),
    "h100": _spec("h100", "hopper", 90, 81559, 3.35, 989, 1979, None, 900),  # H100 SXM5 80GB HBM3
    "h200": _spec("h200", "hopper", 90, 143771, 4.8, 989, 1979, None, 900),
    "b200": _spec("b200", "blackwell", 100, 183359, 8.0, 2250, 4500, 9000, 1800),
    "gb200": _spec("gb200", "blackwell", 100, 189471, 8.0, 2500, 5000, 10000, 1800),
}

# ---------------------------------------------------------------------------------------------
# GPU capability rules: the one table. Compute capability x 10 ("SM") that each format needs, from
# TensorRT-LLM's "Hardware Support Matrix" (docs/source/features/quantization.md, e.g. release 1.1):
# FP8 (per tensor) weights/activations run on Ada (SM89), Hopper and Blackwell; NVFP4 on Blackwell
# (SM100/103/120); the FP8 KV cache also on Ampere (the attention kernels convert FP8 K/V on load;
# the matrix marks "FP8 KV Cache" Y for Ampere), the NVFP4 KV cache on Blackwell SM100/103 only
# (newer releases' matrix). BF16 needs Ampere (SM80) or newer.
# ---------------------------------------------------------------------------------------------
# "native" keeps a target's shipped format; the one such format today is gpt-oss's MXFP4 experts, which
# TensorRT-LLM runs on Hopper (W4A16_MXFP4) and Blackwell (its gpt-oss deployment guide covers
# H100/H200 and B200/GB200, docs/source/deployment-guide/ quick-start recipe for gpt-oss)
MIN_SM = {"bf16": 80, "fp8": 89, "nvfp4": 100, "native": 90}  # per weight format
KV_MIN_SM = {"auto": 0, "bf16": 0, "fp8": 80, "nvfp4": 100}  # per KV-cache format ("auto" = the model dtype)
GENERATION_NAMES = {
    0: "any GPU",
    80: "Ampere (SM80) or newer",
    89: "Ada (SM89), Hopper (SM90) or Blackwell",
    90: "Hopper (SM90) or Blackwell",
    100: "Blackwell (SM100 or newer)",
}
# Closest known board per compute capability read from a real device (sm_120 is consumer Blackwell).
GPU_BY_SM = {80: "a100", 89: "l40s", 90: "h100", 100: "b200", 103: "b200", 120: "b200"}


def get_gpu(name: str) -> GpuSpec:
    key = name.lower().strip()
    if key not in GPUS:
        raise UserError("--target-gpu", f"unknown GPU {name!r}", f"choose one of {', '.join(GPUS)}")
    return GPUS[key]


def gpu_from_sm(sm: int) -> str:
    """Closest known GPU name for a compute capability read from a real device."""
    return GPU_BY_SM.get(sm, "h100" if 90 <= sm < 100 else "b200" if sm >= 100 else "a100")


def format_error(fmt: str, sm: int, kv: bool = False) -> str | None:
    """What a weight format (or with ``kv``, a KV-cache format) needs ("needs ...") when compute
    capability ``sm`` cannot run it, else None. Raises for an unknown format."""
    table = KV_MIN_SM if kv else MIN_SM
    need = table.get(fmt)
    if need is None:
        what = "KV cache format" if kv else "weight format"
        raise UserError("--kv-cache" if kv else "--quant", f"unknown {what} {fmt!r}", f"choose one of {', '.join(table)}")
    return None if sm >= need else f"needs {GENERATION_NAMES[need]}"


def fallback_quant(fmt: str, sm: int) -> str:
    """The weight format to suggest instead of ``fmt`` at compute capability ``sm``."""
    return "fp8" if fmt == "nvfp4" and sm >= MIN_SM["fp8"] else "bf16"


def check_quant_for_gpu(quant: str, gpu: GpuSpec, where: str = "--quant") -> None:
    hint = (
        "TensorRT-LLM runs a target in its shipped format (gpt-oss MXFP4) on Hopper and Blackwell: --target-gpu h100, h200 or b200"
        if quant == "native"
        else f"use quant {fallback_quant(quant, gpu.sm)} for {gpu.name}, or target a Blackwell GPU (b200)"
    )
    _check(quant, gpu, where, False, hint)


def check_kv_for_gpu(kv: str, gpu: GpuSpec, where: str = "--kv-cache") -> None:
    _check(kv, gpu, where, True, "use --kv-cache auto")


def _check(fmt: str, gpu: GpuSpec, where: str, kv: bool, hint: str) -> None:
    try:
        why = format_error(fmt, gpu.sm, kv)
    except UserError as e:
        raise UserError(where, e.what, e.hint) from None
    if why:
        raise UserError(where, f"{fmt}{' KV cache' if kv else ''} {why}, but {gpu.name} is {gpu.generation} (SM{gpu.sm})", hint)
