"""Build an engine bundle: validate -> calibrate + quantize -> export -> options + manifest.

Everything is written into a temp directory next to the destination and renamed into place
at the end, so a failure leaves no partial bundle. A bundle whose inputs and options hash to
the fingerprint already recorded at the destination is a cache hit and is not rebuilt.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from eagle3_trt import __version__
from eagle3_trt.atomic import staged_dir
from eagle3_trt.build import gpus, manifest
from eagle3_trt.build.other_engines import write_launchers
from eagle3_trt.build.llm_options import CudaGraphOptions, Eagle3Options, KvCacheOptions, LlmApiOptions
from eagle3_trt.build.presets import Preset, resolve_source
from eagle3_trt.errors import UserError

OPTIONS_FILE = "llm_api_options.yaml"
ENGINES_DIR = "engines"


@dataclass
class EngineRequest:
    preset: Preset
    target: str | None = None  # local override of the preset's target source
    draft: str | None = None
    target_gpu: str | None = None
    gpus: int | None = None
    tp: int | None = None
    quant: str | None = None
    kv_cache: str | None = None
    quantize_draft: bool = False
    draft_quant: str | None = None
    calib_file: str | None = None
    calib_samples: int | None = None
    calib_max_length: int | None = None
    max_draft_len: int | None = None
    out: str | None = None
    force: bool = False
    dry_run: bool = False


@dataclass
class BuildResult:
    bundle: Path
    cache_hit: bool
    manifest: dict
    warnings: list[str] = field(default_factory=list)


Progress = Callable[[str, int | None], Callable[[], None]]


def _no_progress(stage: str, total: int | None = None) -> Callable[[], None]:
    return lambda: None


def resolve_quant(req: EngineRequest, gpu: gpus.GpuSpec) -> str:
    quant = req.quant or getattr(req.preset.quant, gpu.generation)
    gpus.check_quant_for_gpu(quant, gpu, "--quant" if req.quant else f"preset {req.preset.name} quant.{gpu.generation}")
    return quant


def default_bundle_dir(preset: str, quant: str, gpu: str, root: Path | None = None) -> Path:
    return (root or Path.cwd()) / ENGINES_DIR / f"{preset}-{quant}-{gpu}"


def resolve_pair(req: EngineRequest) -> tuple[Path, Path]:
    p = req.preset
    if req.dry_run and not (req.target or req.draft) and not p.target.embedded:
        cfg_dir = Path(__file__).resolve().parent / "model_configs" / p.name
        if (cfg_dir / "target" / "config.json").is_file():
            return cfg_dir / "target", cfg_dir / "draft"
    if p.target.embedded and not (req.target or req.draft):
        from eagle3_trt.convert.embedded import embedded_pair

        return embedded_pair(p.target.embedded)
    if bool(req.target) != bool(req.draft) and p.target.embedded:
        raise UserError("TARGET/DRAFT", "the embedded preset needs both or neither overridden", "pass TARGET=... and DRAFT=... together")
    target = resolve_source(p.target, req.target, "target")
    draft = resolve_source(p.draft, req.draft, "draft")
    return target, draft


def input_digests(target: Path, draft: Path, dry_run: bool) -> dict:
    """sha256 of every input file (config-only inputs in a dry run have no weights)."""
    return {"target": manifest.file_digests(target), "draft": manifest.file_digests(draft)}


def make_plan(req: EngineRequest, target_dir: Path, draft_dir: Path, gpu: gpus.GpuSpec, quant: str, kv: str, k: int):
    """The deployment plan from config files (refuses layouts that cannot work, before any weight is read)."""
    from eagle3_trt.build.planner import make_plan as plan
    from eagle3_trt.convert.checkpoint_io import read_json

    target_cfg = read_json(target_dir / "config.json")
    draft_cfg = read_json(draft_dir / "config.json")
    if draft_cfg.get("transformer_layer_config"):  # speculators layout nests the layer config
        draft_cfg = {**draft_cfg["transformer_layer_config"], **{x: draft_cfg[x] for x in ("draft_vocab_size", "target_hidden_size") if x in draft_cfg}}
    return plan(target_cfg, draft_cfg, gpu, req.gpus or req.preset.default_gpus, quant, req.preset.max_seq_len,
                "fp8" if kv == "fp8" else "bf16", k, tp=req.tp, model=req.preset.name)


def llm_options(req: EngineRequest, quant: str, kv: str, k: int, aux: tuple[int, ...], aux_default: bool, plan) -> LlmApiOptions:
    batches = list(plan.cuda_graph_batch_sizes)
    return LlmApiOptions(
        model="target",
        tokenizer="target",
        tensor_parallel_size=plan.tp,
        max_batch_size=plan.max_batch_size,
        max_num_tokens=plan.max_num_tokens,
        enable_chunked_prefill=plan.enable_chunked_prefill,
        max_seq_len=req.preset.max_seq_len,
        kv_cache_config=KvCacheOptions(dtype="fp8" if kv == "fp8" else "auto"),
        cuda_graph_config=CudaGraphOptions(batch_sizes=batches, max_batch_size=max(batches), enable_padding=plan.cuda_graph_padding),
        speculative_config=Eagle3Options(
            max_draft_len=k,
            speculative_model="draft",
            eagle3_layers_to_capture=None if aux_default else list(aux),
        ),
    )


def build_bundle(req: EngineRequest, progress: Progress = _no_progress, log: Callable[[str], None] = lambda s: None) -> BuildResult:
    from eagle3_trt.convert.draft_format import load_draft
    from eagle3_trt.convert.quantize import DEFAULT_CALIB_FILE
    from eagle3_trt.convert.target import read_target
    from eagle3_trt.convert.validate import validate_pair

    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    preset = req.preset
    gpu = gpus.get_gpu(req.target_gpu or preset.default_gpu)
    quant = resolve_quant(req, gpu)
    kv = req.kv_cache or preset.kv_cache_dtype
    if kv == "fp8" and gpu.sm < 89:
        raise UserError("--kv-cache", f"FP8 KV cache needs SM89 or newer, {gpu.name} is SM{gpu.sm}", "use --kv-cache auto")
    draft_quant = (req.draft_quant or quant) if req.quantize_draft else "bf16"
    if req.quantize_draft:
        if draft_quant == "bf16":
            raise UserError("--quantize-draft", "the target format is bf16, nothing to quantize the draft to", "pass --draft-quant fp8|nvfp4")
        gpus.check_quant_for_gpu(draft_quant, gpu, "--draft-quant")
    k = req.max_draft_len or preset.max_draft_len
    calib_file = Path(req.calib_file) if req.calib_file else DEFAULT_CALIB_FILE
    n_calib = req.calib_samples or preset.calibration.num_samples
    calib_len = req.calib_max_length or preset.calibration.max_length
    dest = Path(req.out) if req.out else default_bundle_dir(preset.name, quant, gpu.name)

    s = time.perf_counter()
    target_dir, draft_dir = resolve_pair(req)
    target = read_target(target_dir)
    plan = make_plan(req, target_dir, draft_dir, gpu, quant, kv, k)
    if req.dry_run:
        report = _validate_config_only(target, draft_dir, preset.max_seq_len)
    else:
        draft = load_draft(draft_dir)
        report = validate_pair(target, draft, preset.max_seq_len)
    timings["validate_s"] = time.perf_counter() - s
    for w in report.warnings:
        log(f"warning: {w}")

    s = time.perf_counter()
    digests = input_digests(target_dir, draft_dir, req.dry_run)
    timings["hash_inputs_s"] = time.perf_counter() - s
    calib_digest = manifest.sha256_file(calib_file) if calib_file.is_file() else None
    fp_parts = {
        "toolkit": __version__, "inputs": digests, "quant": quant, "kv": kv, "draft_quant": draft_quant,
        "gpu": gpu.name, "k": k, "max_seq_len": preset.max_seq_len, "calib": [calib_digest, n_calib, calib_len],
        "dry_run": req.dry_run, "aux": list(report.aux_layer_ids), "gpus": plan.num_gpus, "tp": plan.tp,
    }
    fp = manifest.fingerprint(fp_parts)
    old = manifest.read_manifest(dest)
    if old and old.get("fingerprint") == fp and not req.force and (dest / OPTIONS_FILE).is_file():
        return BuildResult(dest, True, old, report.warnings)

    with staged_dir(dest) as tmp:
        calib_info: dict = {"file": str(calib_file), "sha256": calib_digest, "num_samples": n_calib, "max_length": calib_len}
        if req.dry_run:
            _write_config_only(target_dir, draft_dir, tmp)
        else:
            calib_info.update(_quantize_and_export(target_dir, draft, report, tmp, quant, kv, draft_quant,
                                                   calib_file, n_calib, calib_len, timings, progress))
        opts = llm_options(req, quant, kv, k, report.aux_layer_ids, report.aux_layers_are_default, plan)
        (tmp / OPTIONS_FILE).write_text(
            "# TensorRT-LLM LLM-API options (EAGLE-3 one-model). Paths are relative to this bundle.\n"
            + yaml.safe_dump(opts.to_yaml_dict(), sort_keys=False)
        )
        manifest.write_json_atomic(tmp / "validation.json", report.to_dict())
        timings["total_s"] = time.perf_counter() - t0
        man = {
            "schema": manifest.SCHEMA,
            "kind": "eagle3-trt engine bundle" + (" (dry run: configs only, no weights)" if req.dry_run else ""),
            "created_unix": int(time.time()),
            "preset": preset.name,
            "target_gpu": {"name": gpu.name, "generation": gpu.generation, "sm": gpu.sm},
            "quant": {"target": quant, "draft": draft_quant, "kv_cache": kv},
            "max_draft_len": k,
            "max_seq_len": preset.max_seq_len,
            "aux_layer_ids": list(report.aux_layer_ids),
            "aux_layers_are_default": report.aux_layers_are_default,
            "plan": plan.to_dict(),
            "dry_run": req.dry_run,
            "sources": {
                "target": {"path": str(target_dir.resolve()), "source": preset.target.source, "revision": preset.target.revision, "files": digests["target"]},
                "draft": {"path": str(draft_dir.resolve()), "source": preset.draft.source, "revision": preset.draft.revision, "files": digests["draft"]},
            },
            "calibration": calib_info,
            "validation": {"checks": [c["check"] for c in report.checks], "warnings": report.warnings},
            "versions": manifest.package_versions(),
            "git_sha": manifest.git_sha(),
            "timings": {k_: round(v, 3) for k_, v in timings.items()},
            "fingerprint": fp,
        }
        manifest.write_json_atomic(tmp / "manifest.json", man)
        if not req.dry_run and preset.target.embedded and not (req.target or req.draft):
            tick = progress("measure acceptance on held-out prompts", None)
            man["acceptance"] = measure_embedded_acceptance(tmp, target_dir.parent, k)
            tick()
        # Launch scripts for trtllm-serve, vLLM and SGLang read the manifest and options just written.
        write_launchers(tmp)
        man["outputs"] = manifest.file_digests(tmp, skip=("manifest.json",))
        manifest.write_json_atomic(tmp / "manifest.json", man)
    return BuildResult(dest, False, man, report.warnings)


def measure_embedded_acceptance(bundle: Path, pair_dir: Path, k: int, n_prompts: int = 8, max_tokens: int = 32) -> dict | None:
    """Greedy speculative decoding of the built (quantized) bundle on the pair's shipped held-out prompts.

    Only embedded pairs ship such prompts; a few seconds on a CPU. The figure is the bundle's own
    (FP8/NVFP4 weights dequantized, activations fake-quantized by the reference runtime)."""
    from eagle3_trt.convert.embedded import heldout_prompts

    prompts = heldout_prompts(pair_dir)
    if prompts is None:
        return None
    from eagle3_trt.core.engine import SamplingParams, SpeculativeEngine

    prompts = prompts[:n_prompts]
    eng = SpeculativeEngine.from_bundle(bundle, device="cpu", max_draft_len=k)
    res = eng.generate(prompts, SamplingParams(max_tokens=max_tokens))
    gen = sum(r.stats.generated_tokens for r in res)
    fwd = sum(r.stats.target_forwards for r in res)
    drafted = sum(r.stats.draft_tokens for r in res)
    accepted = sum(r.stats.accepted_tokens for r in res)
    return {"alpha": round(accepted / drafted, 4) if drafted else 0.0, "acceptance_length": round(gen / fwd, 4) if fwd else 1.0,
            "max_draft_len": k, "prompts": len(prompts), "generated_tokens": gen, "target_forwards": fwd,
            "measured_on": "heldout_prompts.json (held-out text), greedy, reference runtime on the quantized bundle"}


def _validate_config_only(target, draft_dir: Path, max_seq_len: int):
    """Config-level checks for DRY_RUN builds (no weights): vocab, hidden sizes, aux ids, rope."""
    from eagle3_trt.convert.checkpoint_io import read_json
    from eagle3_trt.convert.validate import ValidationReport

    rep = ValidationReport()
    cfg_path = draft_dir / "config.json"
    cfg = read_json(cfg_path)
    if cfg.get("vocab_size") != target.vocab_size:
        raise UserError(f"{cfg_path}:vocab_size", f"{cfg.get('vocab_size')} but the target has {target.vocab_size}", "this head belongs to another target")
    th = cfg.get("target_hidden_size") or cfg.get("hidden_size")
    if th != target.hidden_size:
        raise UserError(f"{cfg_path}:hidden_size", f"{th} but the target's hidden_size is {target.hidden_size}", "this head belongs to another target")
    dvs = cfg.get("draft_vocab_size", cfg.get("vocab_size"))
    if dvs > target.vocab_size:
        raise UserError(f"{cfg_path}:draft_vocab_size", f"{dvs} exceeds the target vocab {target.vocab_size}", "this head belongs to another target")
    rep.ok("config", f"vocab {target.vocab_size}, draft vocab {dvs}, hidden {th} (weights not checked: dry run)")
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    default = target.default_aux_layers()
    ids = tuple(ids) if ids else default
    if any(not 0 <= i < target.num_hidden_layers for i in ids) or len(set(ids)) != len(ids):
        raise UserError(f"{cfg_path}:eagle_aux_hidden_state_layer_ids", f"{list(ids)} invalid for {target.num_hidden_layers} layers", "ids must be distinct target layers")
    rep.aux_layer_ids, rep.aux_layers_are_default = ids, tuple(sorted(ids)) == tuple(sorted(default))
    rep.ok("aux_layers", f"captures outputs of target layers {list(ids)} of {target.num_hidden_layers}")
    if cfg.get("max_position_embeddings", max_seq_len) < max_seq_len:
        rep.warn(f"draft max_position_embeddings {cfg['max_position_embeddings']} < max_seq_len {max_seq_len}: acceptance drops on longer contexts")
    rep.warn("dry run: weights, d2t and tensor shapes were not checked")
    return rep


def _write_config_only(target_dir: Path, draft_dir: Path, tmp: Path) -> None:
    from eagle3_trt.convert.export import copy_tokenizer

    for role, src in (("target", target_dir), ("draft", draft_dir)):
        (tmp / role).mkdir()
        shutil.copy2(src / "config.json", tmp / role / "config.json")
    copy_tokenizer(target_dir, tmp / "target")
    copy_tokenizer(target_dir, tmp / "tokenizer")


def _quantize_and_export(target_dir, draft, report, tmp: Path, quant: str, kv: str, draft_quant: str,
                         calib_file: Path, n_calib: int, calib_len: int, timings: dict, progress: Progress) -> dict:
    """Library chatter (ModelOpt prints its whole config, transformers draws bars) goes to build.log."""
    import contextlib
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    with open(tmp / "build.log", "w") as logf, contextlib.redirect_stdout(logf), warnings.catch_warnings():
        warnings.showwarning = lambda msg, cat, fn, ln, file=None, line=None: logf.write(warnings.formatwarning(msg, cat, fn, ln, line))
        return _quantize_and_export_inner(target_dir, draft, report, tmp, quant, kv, draft_quant, calib_file,
                                          n_calib, calib_len, timings, progress)


def _quantize_and_export_inner(target_dir, draft, report, tmp: Path, quant: str, kv: str, draft_quant: str,
                               calib_file: Path, n_calib: int, calib_len: int, timings: dict, progress: Progress) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eagle3_trt.convert import export, quantize

    s = time.perf_counter()
    tick = progress("load target", None)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir), trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(
        str(target_dir), dtype=torch.bfloat16, trust_remote_code=False, low_cpu_mem_usage=True,
        **({"device_map": "auto"} if device == "cuda" else {}),
    ).eval()
    tick()
    timings["load_target_s"] = time.perf_counter() - s

    prompts = quantize.load_prompts(calib_file, n_calib)
    batches = quantize.calibration_batches(tokenizer, prompts, calib_len)
    info = {"prompts_used": len(batches), "tokens": int(sum(b.numel() for b in batches)), "tokens_sha256": quantize.calibration_hash(batches)}

    s = time.perf_counter()
    if quant != "bf16":
        tick = progress(f"calibrate + quantize target ({quant}, KV {kv})", len(batches))
        quantize.quantize_target(model, batches, quant, kv, on_step=tick)
    timings["quantize_target_s"] = time.perf_counter() - s

    s = time.perf_counter()
    if draft_quant != "bf16":
        from eagle3_trt.core.draft import Eagle3Draft

        dm = Eagle3Draft.from_checkpoint(draft, dtype=torch.bfloat16, device=device)
        tick = progress(f"calibrate + quantize draft ({draft_quant})", len(batches))
        quantize.quantize_draft(dm, model, batches, report.aux_layer_ids, draft_quant, on_step=tick)
        timings["quantize_draft_s"] = time.perf_counter() - s
        s = time.perf_counter()
        export.export_draft_quantized(dm, draft, tmp / "draft")
    else:
        export.export_draft_bf16(draft, tmp / "draft")
    timings["export_draft_s"] = time.perf_counter() - s

    s = time.perf_counter()
    tick = progress("export target (unified HF checkpoint)", None)
    export.export_target(model, tmp / "target", Path(target_dir))
    export.copy_tokenizer(Path(target_dir), tmp / "tokenizer")
    tick()
    timings["export_target_s"] = time.perf_counter() - s
    return info
