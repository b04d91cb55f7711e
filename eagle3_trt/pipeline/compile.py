"""``eagle3-trt compile BUNDLE``: prove a bundle on the GPU it will serve on.

Loads the bundle in TensorRT-LLM with EAGLE-3 one-model speculation and CUDA graphs (captured
during the load for the bundle's cuda_graph_config batch sizes), runs a smoke generation and a
short acceptance measurement from TensorRT-LLM's own per-request statistics
(``SamplingParams(return_perf_metrics=True)`` -> ``outputs[0].request_perf_metrics.speculative_decoding``),
and records the results, the GPU and the versions in manifest.json (through ``bundle.update``).

Every check that needs neither TensorRT-LLM nor a GPU runs first, in this order, so a wrong
bundle fails in seconds: manifest, GPU formats (detected GPU or ``--target-gpu``), TensorRT-LLM
version, option names (``trtllm_adapter.to_llm_kwargs``), the configs' rope as that release's
transformers reads it (``check_rope``), parallel size vs visible GPUs.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from eagle3_trt.convert.prompts import SHIPPED_PROMPTS, load_prompts
from eagle3_trt.errors import UserError
from eagle3_trt.formats import rope_params, rope_releases
from eagle3_trt.formats.checkpoint_io import read_json
from eagle3_trt.formats.families import family_of_config
from eagle3_trt.pipeline import trtllm_adapter as adapter
from eagle3_trt.pipeline import trtllm_versions as versions
from eagle3_trt.pipeline.bundle import MANIFEST_FILE, OPTIONS_FILE, Bundle, CompileRecord, open_bundle
from eagle3_trt.pipeline.bundle_write import update
from eagle3_trt.pipeline.gpu_checks import DetectedGpu, check_formats, detect_gpus
from eagle3_trt.pipeline.gpus import get_gpu
from eagle3_trt.pipeline.other_engines import refuse_on_trtllm

SMOKE_PROMPT = "What is the capital of France? Answer in one sentence."


# ---------------------------------------------------------------------------------------------
# The record


def record_compile(bundle: Path, record: dict[str, Any]) -> Bundle:
    """Store ``record`` as the manifest's compile record (and the TensorRT-LLM version under
    "versions"); every other field is kept as it was (``bundle.update``, atomic)."""
    return update(bundle, record=CompileRecord.model_validate(record))


# ---------------------------------------------------------------------------------------------
# Checks that run anywhere


@dataclass(frozen=True)
class GpuChoice:
    label: str  # for messages: "NVIDIA H100 80GB HBM3 (detected)" or "h100 (--target-gpu)"
    sm: int
    detected: DetectedGpu | None


def choose_gpu(target_gpu: str | None, detected: DetectedGpu | None, bundle: Bundle | None = None) -> GpuChoice | None:
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
    if bundle is not None:
        tg = bundle.target_gpu
        return GpuChoice(f"{tg.name} (bundle's target_gpu)", tg.sm, None)
    return None


@dataclass
class Preflight:
    bundle: Bundle
    gpu: GpuChoice | None
    trtllm_version: str | None
    llm: adapter.LlmKwargs | None
    checks: list[str] = field(default_factory=list)


def preflight(
    bundle: Path, target_gpu: str | None = None, *, require_runtime: bool = True, detected: DetectedGpu | None = None, for_release: str | None = None
) -> Preflight:
    """All checks before the load. ``require_runtime``: also insist on TensorRT-LLM and a GPU.
    ``for_release`` (checks only): the options as that TensorRT-LLM release would load them
    (trtllm_versions.spec_for_release: keys it lacks left out with a note, or refused)."""
    b = open_bundle(Path(bundle))
    refuse_on_trtllm(b.path, b.options, "compile")  # a method no TensorRT-LLM release serves (its head hooks say why)
    pf = Preflight(b, None, None, None, ["manifest"])
    pf.gpu = choose_gpu(target_gpu, detected, b)
    if pf.gpu is not None:
        check_formats(b.formats, pf.gpu.sm, pf.gpu.label)
        pf.checks.append(f"formats {b.quant.target}/{b.quant.draft}/KV {b.kv_cache} on SM{pf.gpu.sm}")
    if for_release is not None and require_runtime:
        raise UserError("--trtllm-version", f"{for_release}", "only with --check-only; a compile loads the installed release")
    pf.trtllm_version = for_release or versions.installed_version()
    if pf.trtllm_version is None:
        if require_runtime:
            raise UserError(
                "compile",
                "TensorRT-LLM is not installed here",
                "run inside a TensorRT-LLM container (nvcr.io/nvidia/tensorrt-llm/release:1.2.x or newer); use --check-only for the checks that need no GPU",
            )
    else:
        versions.check_supported(pf.trtllm_version)
        pf.checks.append(f"tensorrt_llm {pf.trtllm_version}")
    if require_runtime and (pf.gpu is None or pf.gpu.detected is None):
        raise UserError("compile", "no CUDA GPU is visible", "run on the GPU machine; use --check-only with --target-gpu NAME on a CPU-only machine")
    if require_runtime and b.dry_run:
        raise UserError(f"{b.path / MANIFEST_FILE}:dry_run", "a dry-run bundle has configs only, no weights", "build it without DRY_RUN=1 / --dry-run first")
    installed = for_release is None  # another release's options: its documented names and forms, not the installed field list
    pf.llm = adapter.to_llm_kwargs(b.path, b.options, version=pf.trtllm_version, use_installed=installed, resolve_paths=True, check_files=not b.dry_run)
    pf.checks.append(f"option names ({pf.llm.names_checked_against})")
    pf.checks.append(check_rope(b, pf.trtllm_version))
    world = int(pf.llm.kwargs.get("tensor_parallel_size", 1)) * int(pf.llm.kwargs.get("pipeline_parallel_size", 1))
    if pf.gpu is not None and pf.gpu.detected is not None and world > pf.gpu.detected.count:
        raise UserError(
            f"{b.path / OPTIONS_FILE}:tensor_parallel_size",
            f"the bundle needs {world} GPUs and {pf.gpu.detected.count} are visible",
            "set CUDA_VISIBLE_DEVICES to enough GPUs, or rebuild with a smaller --tp (eagle3-trt plan shows what fits)",
        )
    pf.checks.append(f"parallel size {world}")
    return pf


def check_rope(b: Bundle, version: str | None) -> str:
    """The bundle's target and draft configs read as ``version``'s transformers and RopeParams.from_config read
    them (trtllm_versions.rope_reader; None: every supported release) must give the rope the reference runtime
    measured (rope_params.from_raw_config); a config spelling one value twice with two values is refused first."""
    readers = versions.rope_reader(version)
    for role, d in (("target", b.target_dir), ("draft", b.draft_dir)):
        path = d / "config.json"
        cfg = read_json(path)
        family = family_of_config(cfg, str(path)) if role == "target" else None  # the EAGLE-3 draft: RopeParams.from_config
        measured = rope_params.from_raw_config(cfg, str(path), family)
        for reader in readers:
            rope_releases.check_release(cfg, measured, reader, str(path), family)
    return f"rope as {', '.join(r.label for r in readers)} reads it"


# ---------------------------------------------------------------------------------------------
# Acceptance from TensorRT-LLM's per-request metrics


@dataclass(frozen=True)
class RequestSpec:
    accepted: int  # total_accepted_draft_tokens
    drafted: int  # total_draft_tokens
    generated: int  # output tokens
    forwards: int | None  # target forwards incl. prefill (last_iter - first_iter + 1), if reported
    token_ids: tuple[int, ...] | None = None  # the generated tokens, where the caller kept them


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
    return RequestSpec(int(sd.total_accepted_draft_tokens), int(sd.total_draft_tokens), len(comp.token_ids), forwards, tuple(comp.token_ids))


def spec_from_reference(result: Any) -> RequestSpec:
    """One reference-runtime GenerationResult's counters, in TensorRT-LLM's terms (core/stats.RequestStats)."""
    st = result.stats
    return RequestSpec(int(st.accepted_tokens), int(st.draft_tokens), int(st.generated_tokens), int(st.target_forwards), tuple(result.token_ids))


# how far the served overall alpha may sit from the reference's on the same prompts before the
# two are said to disagree (FP8 kernels and the dequantized reference round differently)
AGREEMENT_ALPHA_TOLERANCE = 0.05


def agreement(reference: list[RequestSpec], served: list[RequestSpec], k: int, tolerance: float = AGREEMENT_ALPHA_TOLERANCE) -> dict[str, Any]:
    """Per-request acceptance of the same prompts, measured by the reference runtime and served by
    TensorRT-LLM, and whether they agree: overall alpha within ``tolerance``, and how many requests
    match exactly (counters, and generated tokens where both sides kept them)."""
    if len(reference) != len(served) or not reference:
        raise UserError("compile", f"{len(reference)} reference and {len(served)} served requests", "compare the same prompts, at least one")

    def one(r: RequestSpec) -> dict[str, Any]:
        return {
            "accepted": r.accepted,
            "drafted": r.drafted,
            "generated": r.generated,
            "forwards": r.forwards,
            "alpha": round(r.accepted / r.drafted, 4) if r.drafted else None,
        }

    per_request, same_counts, same_tokens, max_diff = [], 0, 0, 0.0
    for ref, srv in zip(reference, served):
        a, b = one(ref), one(srv)
        diff = round(b["alpha"] - a["alpha"], 4) if a["alpha"] is not None and b["alpha"] is not None else None
        max_diff = max(max_diff, abs(diff)) if diff is not None else max_diff
        counts = (ref.accepted, ref.drafted, ref.generated) == (srv.accepted, srv.drafted, srv.generated)
        tokens = ref.token_ids is not None and ref.token_ids == srv.token_ids
        same_counts += counts
        same_tokens += tokens
        per_request.append({"reference": a, "served": b, "alpha_difference": diff, "same_counts": counts, "same_tokens": tokens})
    ref_acc = {**aggregate_acceptance(reference, k), "source": "reference runtime (eagle3_trt) on the bundle"}
    srv_acc = aggregate_acceptance(served, k)
    both = ref_acc["alpha"] is not None and srv_acc["alpha"] is not None
    diff = round(srv_acc["alpha"] - ref_acc["alpha"], 4) if both else None
    return {
        "requests": len(reference),
        "reference": ref_acc,
        "served": srv_acc,
        "alpha_difference": diff,
        "max_request_alpha_difference": round(max_diff, 4),
        "requests_with_same_counts": same_counts,
        "requests_with_same_tokens": same_tokens,
        "tolerance": tolerance,
        "agree": diff is not None and abs(diff) <= tolerance,
        "per_request": per_request,
    }


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


def _chat(tokenizer: Any, prompt: str) -> str:
    # The public EAGLE-3 drafts lose most of their acceptance without the chat template (TensorRT-LLM
    # maintainers on the yuhuili Llama-3.3 drafts, NVIDIA/TensorRT-LLM PR #4802).
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
        import torch  # local: versions are reported even where torch is missing

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
    k = pf.bundle.k
    record: dict[str, Any] = {
        "ok": False,
        "when_unix": int(time.time()),
        "gpu": {"name": det.device_name, "key": det.key, "sm": det.sm, "count": det.count, "memory_bytes": det.memory_bytes},
        "versions": _versions(pf.trtllm_version),
        "checks": pf.checks,
        "options": {k_: v for k_, v in pf.llm.kwargs.items() if k_ not in ("model", "tokenizer")},
        "timings": {},
    }
    from tensorrt_llm import SamplingParams  # local: optional and heavy (GPU machines only)

    t0 = time.perf_counter()
    try:
        log(f"loading {bundle} with TensorRT-LLM {pf.trtllm_version} (EAGLE-3 one-model, K={k}, CUDA graphs)")
        llm = adapter.build_llm(pf.llm)
        record["timings"]["load_s"] = round(time.perf_counter() - t0, 1)
        try:
            from transformers import AutoTokenizer  # local: heavy, needed only for the smoke request

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
            outs = llm.generate([_chat(tok, p) for p in load_prompts(SHIPPED_PROMPTS, prompts)], sp)
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
        "bundle": str(pf.bundle.path),
        "gpu": asdict(pf.gpu) if pf.gpu else None,
        "tensorrt_llm": pf.trtllm_version,
        "checks": pf.checks,
        "notes": list(pf.llm.notes) if pf.llm else [],
    }
