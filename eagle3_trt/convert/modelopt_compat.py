"""The ModelOpt adapter: every probe, private-API use and monkeypatch the project needs, in one place.

Two ModelOpt generations are supported:

- **0.37** (``nvidia-modelopt==0.37.0``): what the TensorRT-LLM 1.2 containers ship (``make test-compat``).
- **0.4x** (tested on 0.47.0): what ``make test`` installs.

Everything else in the project calls the functions below and never touches ``modelopt`` itself;
a new ModelOpt generation means editing this file only. Each workaround says which versions need
it and why, so it can be deleted when the oldest supported version no longer does.

``modelopt`` is imported inside the functions: it is heavy (it pulls in its CUDA extension
loaders), and a bundle that skips quantization (``--quant bf16``, ``--dry-run``) never needs it.
"""

from __future__ import annotations

import copy
import dataclasses
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from eagle3_trt.core.nvfp4 import is_nvfp4, nvfp4_fake_quant
from eagle3_trt.errors import UserError

# Marks set on the functions we install, so installing twice is a no-op.
_FALLBACK_MARK = "_eagle3_trt_cpu_fallback"
_GUARD_MARK = "_eagle3_trt_guarded"


# ---------------------------------------------------------------------------------------------
# Quantization
# ---------------------------------------------------------------------------------------------
def quantization():
    """``modelopt.torch.quantization`` with the CPU workarounds installed (idempotent)."""
    import modelopt.torch.quantization as mtq  # heavy optional dependency, only when quantizing

    install_cpu_workarounds()
    return mtq


def format_config(fmt: str) -> dict:
    """A deep copy of ModelOpt's own default config for ``fmt`` (fp8 or nvfp4): its numerics, not ours."""
    mtq = quantization()
    base = {"fp8": mtq.FP8_DEFAULT_CFG, "nvfp4": mtq.NVFP4_DEFAULT_CFG}.get(fmt)
    if base is None:
        raise UserError("--quant", f"no ModelOpt config for {fmt!r}", "choose fp8 or nvfp4")
    return copy.deepcopy(base)


def with_fp8_kv_cache(cfg: dict) -> dict:
    """``cfg`` plus ModelOpt's FP8 KV-cache quantizers (``FP8_KV_CFG``).

    0.4x: ``quant_cfg`` is a list of ``{"quantizer_name", ...}`` entries and ModelOpt provides
    ``update_quant_cfg_with_kv_cache_quant`` (modelopt/torch/quantization/utils/core_utils.py),
    which appends the KV entries and sets a default algorithm. 0.37 has neither: ``quant_cfg`` is a
    ``{pattern: attributes}`` dict and the KV entries are merged into it key by key.
    """
    mtq = quantization()
    kv = copy.deepcopy(mtq.FP8_KV_CFG["quant_cfg"])
    if hasattr(mtq, "update_quant_cfg_with_kv_cache_quant"):
        return mtq.update_quant_cfg_with_kv_cache_quant(cfg, kv)
    _merge(cfg, kv)
    return cfg


def disable_quantizers(cfg: dict, patterns: Sequence[str]) -> None:
    """Append "disabled" entries for the quantizer name patterns to ``cfg``, in place.

    Later entries win in both generations, so these override anything the defaults enabled.
    """
    _merge(cfg, [{"quantizer_name": p, "enable": False} for p in patterns])


def _merge(cfg: dict, entries: list | dict) -> None:
    """Add quantizer entries to ``cfg['quant_cfg']`` in whichever form this ModelOpt uses.

    ``entries`` is a list of 0.4x entries (``{"quantizer_name": p, "enable": ..., "cfg": {...}}``)
    or a 0.37 ``{pattern: attributes}`` dict; each is converted to the config's own form.
    """
    qc = cfg["quant_cfg"]
    if isinstance(qc, list):  # 0.4x
        if isinstance(entries, list):
            qc.extend(entries)
        else:
            qc.extend({"quantizer_name": k, **(v if "enable" in v else {"cfg": v})} for k, v in entries.items())
        return
    # 0.37: a dict keyed by pattern; a later assignment replaces an earlier one.
    if isinstance(entries, dict):
        items = list(entries.items())
    else:
        items = [(e["quantizer_name"], {k: v for k, v in e.items() if k != "quantizer_name"}) for e in entries]
    for k, v in items:
        qc[k] = v.get("cfg", v) if isinstance(v, dict) and "cfg" in v else v


def quantize(model, cfg: dict, forward_loop: Callable[[torch.nn.Module], None]):
    """``mtq.quantize`` (same signature in both generations); returns the model, quantized in place."""
    return quantization().quantize(model, cfg, forward_loop=forward_loop)


# ---------------------------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------------------------
def export_hf_checkpoint(model, out_dir: Path) -> None:
    """ModelOpt's public unified HF exporter (safetensors + ``hf_quant_config.json``); same in both."""
    from modelopt.torch.export import export_hf_checkpoint as export  # heavy optional dependency

    install_cpu_workarounds()
    export(model, export_dir=str(out_dir))


def export_bare_module(module: torch.nn.Module, dtype: torch.dtype) -> tuple[dict, dict]:
    """(state dict, hf_quant_config) of a quantized module that is not a ``transformers`` model.

    The public ``export_hf_checkpoint`` wants a ``PreTrainedModel`` (it calls ``save_pretrained``),
    so a bare module (the EAGLE-3 draft) goes through the private function behind it. Its name
    changed: ``_export_hf_checkpoint`` in 0.37, ``_export_transformers_checkpoint`` in 0.4x
    (modelopt/torch/export/unified_export_hf.py). Both return ``(state_dict, hf_quant_config)``.

    Two more differences are absorbed here, both around the one forward the exporter runs to find
    linears that share an input (q/k/v get one shared input scale):

    - 0.4x flips ``model.config.use_cache`` around that forward (``_disable_use_cache`` in
      modelopt/torch/utils/dataset_utils.py), which fails on a frozen dataclass config; the module
      gets a mutable copy for the duration.
    - 0.4x calls ``model(**model.get_dummy_inputs())`` for modules that define it; 0.37 always calls
      ``model(torch.ones([1, 2], dtype=torch.long))``, an input a draft head cannot take. A forward
      that sees exactly that call (one integer tensor, nothing else) runs the dummy inputs instead.

    ``module`` is restored (config and forward) before returning, also on error.
    """
    from modelopt.torch.export import unified_export_hf as ueh  # heavy optional dependency

    install_cpu_workarounds()
    export = getattr(ueh, "_export_transformers_checkpoint", None) or getattr(ueh, "_export_hf_checkpoint", None)
    if export is None:
        raise UserError(
            "--quantize-draft",
            "this ModelOpt version has no transformers exporter for a bare module",
            "use nvidia-modelopt 0.37 or 0.4x, or leave the draft in BF16 (the default)",
        )
    frozen: Any = module.config  # the draft's DraftConfig dataclass (nn.Module's typing says Tensor | Module)
    module.config = types.SimpleNamespace(**dataclasses.asdict(frozen), use_cache=False)  # type: ignore[assignment]
    forward = module.forward

    def probe_tolerant(*args, **kwargs):
        if len(args) == 1 and not kwargs and torch.is_tensor(args[0]) and not args[0].is_floating_point():
            return forward(**module.get_dummy_inputs())
        return forward(*args, **kwargs)

    module.forward = probe_tolerant
    try:
        return export(module, dtype)
    finally:
        module.config = frozen
        del module.forward


# ---------------------------------------------------------------------------------------------
# CPU workarounds (monkeypatches)
# ---------------------------------------------------------------------------------------------
def install_cpu_workarounds() -> bool:
    """Let NVFP4 fake quantization and export run on CPU torch. Idempotent.

    Both generations: ``tensor_quant.dynamic_block_quantize_op`` (every NVFP4 forward after
    ``mtq.quantize``) has only CUDA/Triton kernels and asserts on CPU tensors. It is wrapped: CPU
    inputs in NVFP4 format go to ``nvfp4_cpu.nvfp4_fake_quant`` (same E2M1/E4M3 arithmetic), every
    other call to ModelOpt's own op unchanged. Returns False when this ModelOpt has no such op.
    """
    from modelopt.torch.quantization import tensor_quant as tq  # heavy optional dependency

    orig = getattr(tq, "dynamic_block_quantize_op", None)
    if orig is None:
        return False
    if not getattr(orig, _FALLBACK_MARK, False):

        def op(inputs, block_size, amax, num_bits, exponent_bits, scale_num_bits, scale_exponent_bits):
            if not inputs.is_cuda and is_nvfp4(num_bits, exponent_bits, scale_num_bits, scale_exponent_bits):
                if amax is None:
                    amax = inputs.detach().abs().amax()
                return nvfp4_fake_quant(inputs, block_size, amax)
            return orig(inputs, block_size, amax, num_bits, exponent_bits, scale_num_bits, scale_exponent_bits)

        setattr(op, _FALLBACK_MARK, True)
        tq.dynamic_block_quantize_op = op
    _guard_fp4_capability_probe()
    return True


def _guard_fp4_capability_probe() -> None:
    """0.37: ``backends.utils.fp4_compatible`` calls ``torch.cuda.get_device_capability(0)`` with no
    ``torch.cuda.is_available()`` check, and the NVFP4 weight export (``qtensor/nvfp4_tensor.py``,
    which imports it by name) calls it first, so exporting raises on CPU torch; answer "no FP4 GEMMs"
    there. 0.4x checks for a GPU itself; the guard is then a no-op wrapper."""
    try:
        from modelopt.torch.quantization.qtensor import nvfp4_tensor  # heavy optional dependency
    except ImportError:
        return
    probe = getattr(nvfp4_tensor, "fp4_compatible", None)
    if probe is None or getattr(probe, _GUARD_MARK, False):
        return

    def guarded() -> bool:
        return torch.cuda.is_available() and probe()

    setattr(guarded, _GUARD_MARK, True)
    nvfp4_tensor.fp4_compatible = guarded
