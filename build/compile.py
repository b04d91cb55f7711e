"""``eagle3-trt compile BUNDLE``: prove a bundle on the GPU it will serve on.

Loads the bundle in TensorRT-LLM with EAGLE-3 one-model speculation and CUDA graphs (captured
during the load for the bundle's cuda_graph_config batch sizes), runs a smoke generation and a
short acceptance measurement from TensorRT-LLM's own per-request statistics
(``SamplingParams(return_perf_metrics=True)`` -> ``outputs[0].request_perf_metrics.speculative_decoding``),
and records the results, the GPU and the versions in manifest.json (atomic rewrite).

Every check that needs neither TensorRT-LLM nor a GPU runs first, in this order, so a wrong
bundle fails in seconds: manifest, GPU formats (detected GPU or ``--target-gpu``), TensorRT-LLM
version, option names (``trtllm_adapter.to_llm_kwargs``), parallel size vs visible GPUs.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from eagle3_trt.build import trtllm_adapter as adapter
from eagle3_trt.build.gpu_checks import DetectedGpu, check_formats, detect_gpu, detect_gpus  # noqa: F401 - detect_gpu is re-exported for the CLI
from eagle3_trt.build.gpus import get_gpu
from eagle3_trt.errors import UserError

MANIFEST = "manifest.json"
SMOKE_PROMPT = "What is the capital of France? Answer in one sentence."
PROMPTS_FILE = Path(__file__).resolve().parent.parent / "convert" / "data" / "calib_prompts.jsonl"


# ---------------------------------------------------------------------------------------------
# Manifest


def read_manifest(bundle: Path) -> dict:
    path = Path(bundle) / MANIFEST
    if not path.is_file():
        raise UserError(path, "file not found", "is this an engine bundle? build one with `eagle3-trt engine`")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(path, f"not valid JSON ({e})", "rebuild the bundle") from None
    if not isinstance(data, dict) or "quant" not in data:
        raise UserError(path, "not an engine bundle manifest (no 'quant')", "rebuild the bundle with `eagle3-trt engine`")
    return data


def record_compile(bundle: Path, record: dict[str, Any]) -> dict:
    """Store ``record`` as manifest["compile"] (and the TensorRT-LLM version under "versions").

    Rewrites the whole file atomically: a crash leaves the old manifest or the new one, never
    half of each; every other field is kept as it was.
    """
    path = Path(bundle) / MANIFEST
    data = read_manifest(bundle)
    data["compile"] = record
    versions = record.get("versions") or {}
    if versions.get("tensorrt_llm"):
        data.setdefault("versions", {})["tensorrt_llm"] = versions["tensorrt_llm"]
    adapter.atomic_write_text(path, json.dumps(data, indent=2, default=str) + "\n")
    return data


# ---------------------------------------------------------------------------------------------
# Checks that run anywhere


@dataclass(frozen=True)
class GpuChoice:
    label: str  # for messages: "NVIDIA H100 80GB HBM3 (detected)" or "h100 (--target-gpu)"
    sm: int
    detected: DetectedGpu | None


def choose_gpu(target_gpu: str | None, detected: DetectedGpu | None, manifest: dict) -> GpuChoice | None:
    """The GPU to check against: the real one if present, else --target-gpu, else the bundle's own."""
    if target_gpu is not None:
        spec = get_gpu(target_gpu)
        if detected is not None and detected.sm != spec.sm:
            raise UserError(
                "--target-gpu",
                f"this machine has {detected.device_name} (SM{detected.sm}), not {spec.name} (SM{spec.sm})",
                "leave out --target-gpu to compile for the GPU that is here",
            )
        return GpuChoice(f"{spec.name} (--target-gpu)", spec.sm, detected)
    if detected is not None:
        return GpuChoice(f"{detected.device_name} (detected)", detected.sm, detected)
    tg = manifest.get("target_gpu") or {}
    if "sm" in tg:
        return GpuChoice(f"{tg.get('name', '?')} (bundle's target_gpu)", int(tg["sm"]), None)
    return None


@dataclass
class Preflight:
    bundle: Path
    manifest: dict
    gpu: GpuChoice | None
    trtllm_version: str | None
    llm: adapter.LlmKwargs | None
    checks: list[str] = field(default_factory=list)


def preflight(bundle: Path, target_gpu: str | None = None, *, require_runtime: bool = True, detected: DetectedGpu | None = None) -> Preflight:
    """All checks before the load. ``require_runtime``: also insist on TensorRT-LLM and a GPU."""
    bundle = Path(bundle)
    m = read_manifest(bundle)
    pf = Preflight(bundle, m, None, None, None, ["manifest"])
    pf.gpu = choose_gpu(target_gpu, detected, m)
    if pf.gpu is not None:
        check_formats(m["quant"], pf.gpu.sm, pf.gpu.label)
        pf.checks.append(f"formats {m['quant'].get('target')}/{m['quant'].get('draft')}/KV {m['quant'].get('kv_cache')} on SM{pf.gpu.sm}")
    pf.trtllm_version = adapter.installed_version()
    if pf.trtllm_version is None:
        if require_runtime:
            raise UserError(
                "compile",
                "TensorRT-LLM is not installed here",
                "run inside a TensorRT-LLM container (nvcr.io/nvidia/tensorrt-llm/release:1.2.x or newer); "
                "use --check-only for the checks that need no GPU",
            )
    else:
        adapter.check_supported(pf.trtllm_version)
        pf.checks.append(f"tensorrt_llm {pf.trtllm_version}")
    if require_runtime and (pf.gpu is None or pf.gpu.detected is None):
        raise UserError("compile", "no CUDA GPU is visible", "run on the GPU machine; use --check-only with --target-gpu NAME on a CPU-only machine")
    dry = bool(m.get("dry_run"))
    if require_runtime and dry:
        raise UserError(f"{bundle / MANIFEST}:dry_run", "a dry-run bundle has configs only, no weights", "build it without DRY_RUN=1 / --dry-run first")
    pf.llm = adapter.to_llm_kwargs(bundle, version=pf.trtllm_version, use_installed=True, resolve_paths=True, check_files=not dry)
    pf.checks.append(f"option names ({pf.llm.names_checked_against})")
    world = int(pf.llm.kwargs.get("tensor_parallel_size", 1)) * int(pf.llm.kwargs.get("pipeline_parallel_size", 1))
    if pf.gpu is not None and pf.gpu.detected is not None and world > pf.gpu.detected.count:
        raise UserError(
            f"{bundle / adapter.OPTIONS_FILE}:tensor_parallel_size",
            f"the bundle needs {world} GPUs and {pf.gpu.detected.count} are visible",
            "set CUDA_VISIBLE_DEVICES to enough GPUs, or rebuild with a smaller --tp (eagle3-trt plan shows what fits)",
        )
    pf.checks.append(f"parallel size {world}")
    return pf


# ---------------------------------------------------------------------------------------------
# Acceptance from TensorRT-LLM's per-request metrics


@dataclass(frozen=True)
class RequestSpec:
    accepted: int  # total_accepted_draft_tokens
    drafted: int  # total_draft_tokens
    generated: int  # output tokens
    forwards: int | None  # target forwards incl. prefill (last_iter - first_iter + 1), if reported


def spec_from_output(output: Any) -> RequestSpec:
    """Read one RequestOutput's speculative-decoding counters (None-safe across releases)."""
    comp = output.outputs[0]
    pm = getattr(comp, "request_perf_metrics", None)
    sd = getattr(pm, "speculative_decoding", None) if pm is not None else None
    if sd is None:
        raise UserError(
            "compile",
            "TensorRT-LLM returned no speculative-decoding metrics",
            "this release may not support SamplingParams(return_perf_metrics=True) with EAGLE-3; report the version",
        )
    first, last = getattr(pm, "first_iter", None), getattr(pm, "last_iter", None)
    forwards = int(last) - int(first) + 1 if isinstance(first, int) and isinstance(last, int) and last >= first else None
    return RequestSpec(int(sd.total_accepted_draft_tokens), int(sd.total_draft_tokens), len(comp.token_ids), forwards)


def aggregate_acceptance(reqs: list[RequestSpec], k: int) -> dict[str, Any]:
    """alpha = accepted / drafted; acceptance length = generated tokens per target forward.

    Forwards come from the iteration counters when reported, else 1 (prefill) + drafted / K
    (each decode step proposes K tokens, TensorRT-LLM's accounting for a linear chain).
    """
    accepted = sum(r.accepted for r in reqs)
    drafted = sum(r.drafted for r in reqs)
    generated = sum(r.generated for r in reqs)
    forwards = sum(r.forwards if r.forwards is not None else 1 + r.drafted / k for r in reqs)
    return {
        "requests": len(reqs),
        "max_draft_len": k,
        "accepted_draft_tokens": accepted,
        "draft_tokens": drafted,
        "generated_tokens": generated,
        "alpha": round(accepted / drafted, 4) if drafted else None,
        "acceptance_length": round(generated / forwards, 3) if forwards else None,
        "source": "tensorrt_llm request_perf_metrics.speculative_decoding",
    }


def load_prompts(n: int) -> list[str]:
    prompts = []
    for line in PROMPTS_FILE.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            prompts.append(row["turns"][0] if "turns" in row else row["text"])
    return prompts[:n]


def _chat(tokenizer: Any, prompt: str) -> str:
    # The public EAGLE-3 drafts lose most of their acceptance without the chat template (FACTS §3).
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    return prompt


# ---------------------------------------------------------------------------------------------
# The GPU part


def _versions(trtllm: str | None) -> dict[str, str | None]:
    out: dict[str, str | None] = {"tensorrt_llm": trtllm}
    for name in ("torch", "transformers", "nvidia-modelopt"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    try:
        import torch  # noqa: PLC0415

        out["cuda"] = torch.version.cuda
    except ImportError:
        out["cuda"] = None
    return out


def compile_bundle(
    bundle: Path, target_gpu: str | None = None, *, prompts: int = 16, max_tokens: int = 128, log=lambda s: None
) -> dict:  # pragma: no cover - needs TensorRT-LLM and a GPU; tests/test_compile.py runs it where they exist
    """Preflight, load, smoke, measure, record. Returns the record written to the manifest."""
    detected = detect_gpus()
    pf = preflight(bundle, target_gpu, require_runtime=True, detected=detected)
    assert pf.llm is not None and pf.gpu is not None and pf.gpu.detected is not None
    det = pf.gpu.detected
    k = int(pf.llm.kwargs["speculative_config"]["max_draft_len"])
    record: dict[str, Any] = {
        "ok": False,
        "when_unix": int(time.time()),
        "gpu": {"name": det.device_name, "key": det.key, "sm": det.sm, "count": det.count, "memory_bytes": det.memory_bytes},
        "versions": _versions(pf.trtllm_version),
        "checks": pf.checks,
        "options": {k_: v for k_, v in pf.llm.kwargs.items() if k_ not in ("model", "tokenizer")},
        "timings": {},
    }
    from tensorrt_llm import SamplingParams  # noqa: PLC0415

    t0 = time.perf_counter()
    try:
        log(f"loading {bundle} with TensorRT-LLM {pf.trtllm_version} (EAGLE-3 one-model, K={k}, CUDA graphs)")
        llm = adapter.build_llm(pf.llm)
        record["timings"]["load_s"] = round(time.perf_counter() - t0, 1)
        try:
            from transformers import AutoTokenizer  # noqa: PLC0415

            # The HF tokenizer itself (not TensorRT-LLM's wrapper) for the chat template.
            tok = AutoTokenizer.from_pretrained(pf.llm.kwargs.get("tokenizer") or pf.llm.kwargs["model"])
            sp = SamplingParams(max_tokens=32, temperature=0.0, return_perf_metrics=True)
            t1 = time.perf_counter()
            smoke = llm.generate([_chat(tok, SMOKE_PROMPT)], sp)[0]
            record["timings"]["smoke_s"] = round(time.perf_counter() - t1, 2)
            text = smoke.outputs[0].text
            if not smoke.outputs[0].token_ids:
                raise UserError("compile", "the smoke generation returned no tokens", "check the bundle's target checkpoint")
            record["smoke"] = {"prompt": SMOKE_PROMPT, "text": text, "tokens": len(smoke.outputs[0].token_ids)}
            log(f"smoke: {text!r}")
            sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, return_perf_metrics=True)
            t2 = time.perf_counter()
            outs = llm.generate([_chat(tok, p) for p in load_prompts(prompts)], sp)
            dt = time.perf_counter() - t2
            acc = aggregate_acceptance([spec_from_output(o) for o in outs], k)
            acc["tokens_per_s"] = round(acc["generated_tokens"] / dt, 1) if dt > 0 else None
            record["acceptance"] = acc
            record["timings"]["alpha_s"] = round(dt, 2)
            record["ok"] = True
        finally:
            shutdown = getattr(llm, "shutdown", None)
            if shutdown:
                shutdown()
    except BaseException as e:
        record["error"] = f"{type(e).__name__}: {e}"[:2000]
        record_compile(bundle, record)
        raise
    record["timings"]["total_s"] = round(time.perf_counter() - t0, 1)
    record_compile(bundle, record)
    return record


def preflight_summary(pf: Preflight) -> dict[str, Any]:
    return {
        "bundle": str(pf.bundle),
        "gpu": asdict(pf.gpu) if pf.gpu else None,
        "tensorrt_llm": pf.trtllm_version,
        "checks": pf.checks,
        "notes": list(pf.llm.notes) if pf.llm else [],
    }
