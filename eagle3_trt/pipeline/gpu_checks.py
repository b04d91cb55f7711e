"""Which GPU is here, and can it run a bundle's formats.

``detect_gpu`` reads the first CUDA device through torch (imported only when called, so CPU-only
CI never pays for it); ``check_formats`` compares a bundle's weight and KV-cache formats with a
compute capability, by the rules of ``build.gpus`` (the one table). A CPU-only build names its GPU with ``--target-gpu`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_trt.errors import UserError
from eagle3_trt.pipeline.gpus import GPUS, fallback_quant, format_error, gpu_from_sm


@dataclass(frozen=True)
class DetectedGpu:
    device_name: str  # as CUDA reports it, e.g. "NVIDIA H100 80GB HBM3"
    key: str  # the toolkit's GPU name (gpus.GPUS key), e.g. "h100"
    sm: int  # compute capability * 10
    count: int  # visible CUDA devices
    memory_bytes: int  # of device 0, as CUDA reports it


def gpu_key(device_name: str, sm: int) -> str:
    """Map a CUDA device name to a gpus.GPUS key; unknown boards fall back by compute capability."""
    flat = device_name.lower().replace(" ", "").replace("-", "")
    for key in ("gb200", "b200", "h200", "h100", "a100", "l40s"):  # gb200 before b200: substring
        if key in flat and key in GPUS:
            return key
    return gpu_from_sm(sm)


def detect_gpus() -> DetectedGpu | None:
    """The first visible CUDA device, or None without torch, CUDA or a device."""
    try:
        import torch  # local: optional; without it there is no GPU to detect
    except ImportError:
        return None
    try:
        if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
            return None
        major, minor = torch.cuda.get_device_capability(0)
        name = torch.cuda.get_device_name(0)
        props = torch.cuda.get_device_properties(0)
        count = torch.cuda.device_count()
    except (RuntimeError, AssertionError):  # a broken driver reads as "no GPU", not as a crash
        return None
    sm = major * 10 + minor
    return DetectedGpu(name, gpu_key(name, sm), sm, count, int(props.total_memory))


def detect_gpu() -> tuple[str, int] | None:
    """(GPU key such as "h100", SM) of the first CUDA device, or None. Used at bundle build time."""
    d = detect_gpus()
    return (d.key, d.sm) if d else None


def check_formats(quant: dict, sm: int, gpu_label: str, where: str = "manifest.json:quant") -> None:
    """Refuse weight/KV formats the GPU cannot run (rules: ``build.gpus.MIN_SM`` / ``KV_MIN_SM``)."""
    roles = [(role, quant[role], False) for role in ("target", "draft") if quant.get(role) is not None]
    for role, fmt, kv in roles + [("kv_cache", quant.get("kv_cache", "auto"), True)]:
        try:
            why = format_error(fmt, sm, kv)
        except UserError as e:
            raise UserError(f"{where}.{role}", e.what, e.hint) from None
        if not why:
            continue
        if kv:
            raise UserError(f"{where}.kv_cache", f"{fmt} KV cache {why}, but {gpu_label} is SM{sm}", "rebuild with --kv-cache auto")
        if fmt == "bf16":
            hint = "TensorRT-LLM's PyTorch runtime needs an Ampere or newer GPU"
        else:
            hint = f"rebuild the bundle for this GPU (eagle3-trt engine --quant {fallback_quant(fmt, sm)} --target-gpu {gpu_from_sm(sm)})"
        raise UserError(f"{where}.{role}", f"{role} weights are {fmt}, which {why}, but {gpu_label} is SM{sm}", hint)
