"""Build an engine bundle: validate -> calibrate + quantize -> export -> options + manifest.

Everything is written into a staging directory next to the destination and renamed into place
at the end (eagle3_trt.atomic.staged_dir), so a failure leaves no partial bundle. The on-disk
format is build/bundle.py's; this module only decides what goes in.

Cache: the inputs (every source file's sha256, the calibration file) and the build request
hash to ``inputs_fingerprint``. A bundle already at the destination with the same
fingerprint is a cache hit only if it also verifies clean (every file matches the digest the
manifest records); otherwise it is rebuilt and the log says why. Changes made through
``bundle.update`` (``recommend --write``) are recorded in the manifest, so they survive a
rebuild with the same inputs; a hand edit does not verify and is rebuilt away.
"""

from __future__ import annotations

import contextlib
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from eagle3_trt import __version__
from eagle3_trt.atomic import remove_stale_staging, staged_dir, write_json
from eagle3_trt.convert import export, quantize
from eagle3_trt.convert.draft_format import for_max_seq_len, load_draft
from eagle3_trt.convert.embedded import embedded_pair, heldout_prompts
from eagle3_trt.convert.load import load_engine
from eagle3_trt.convert.prompts import load_prompts
from eagle3_trt.convert.target import TargetInfo, read_target
from eagle3_trt.convert.validate import ValidationReport, check_target_family, check_target_tokenizer, validate_pair
from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.core.engine import SamplingParams
from eagle3_trt.errors import UserError
from eagle3_trt.formats.checkpoint_io import read_json, sha256_file
from eagle3_trt.formats.draft_config import read_draft_config
from eagle3_trt.formats.hf_config import Eagle3DraftConfigFields, parse_config
from eagle3_trt.pipeline import bundle as fmt
from eagle3_trt.pipeline import bundle_write, gpus
from eagle3_trt.pipeline.llm_options import CudaGraphOptions, Eagle3Options, KvCacheOptions, LlmApiOptions, MoeOptions
from eagle3_trt.pipeline.planner import make_plan as plan_deployment
from eagle3_trt.pipeline.presets import Preset, resolve_source
from eagle3_trt.resources import data_dir

ENGINES_DIR = "engines"
# Planner fields the bundle stores elsewhere (K, formats and max_seq_len in the options and the
# manifest's quant): the recorded plan leaves them out so no reader can take a stale copy.
_PLAN_FACTS_STORED_ELSEWHERE = ("max_draft_len", "quant", "kv_cache_dtype", "max_seq_len")


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
    opened: fmt.Bundle
    warnings: list[str] = field(default_factory=list)
    reason: str | None = None  # why the bundle was (re)built; None for a cache hit

    @property
    def manifest(self) -> fmt.Manifest:
        return self.opened.manifest


Progress = Callable[[str, int | None], Callable[[], None]]


def _no_progress(stage: str, total: int | None = None) -> Callable[[], None]:
    return lambda: None


def resolve_quant(req: EngineRequest, gpu: gpus.GpuSpec, target: TargetInfo | None = None) -> str:
    """--quant, else what the target calls for, else the preset's format for the GPU. A target that ships in
    a format TensorRT-LLM serves as is (gpt-oss MXFP4) is kept as shipped; an unquantized target of a family
    whose ModelOpt formats are refused (convert/families.py ``modelopt_refused``) is built in BF16. An
    explicit --quant is checked against the target later (planner.check_quant_for_target)."""
    if req.quant:
        quant, where = req.quant, "--quant"
    elif target is not None and target.native_format:
        quant, where = "native", f"target (ships {target.native_format})"
    elif target is not None and target.family_spec.modelopt_refused and not target.quantized:
        quant, where = "bf16", f"target ({target.family} is built in BF16 or as shipped)"
    else:
        quant = getattr(req.preset.quant, gpu.generation)
        where = f"preset {req.preset.name} quant.{gpu.generation}"
    gpus.check_quant_for_gpu(quant, gpu, where)
    return quant


def default_bundle_dir(preset: str, quant: str, gpu: str, root: Path | None = None) -> Path:
    return (root or Path.cwd()) / ENGINES_DIR / f"{preset}-{quant}-{gpu}"


def resolve_pair(req: EngineRequest) -> tuple[Path, Path]:
    p = req.preset
    if req.dry_run and not (req.target or req.draft) and not p.target.embedded:
        cfg_dir = data_dir("build") / "model_configs" / p.name
        if (cfg_dir / "target" / "config.json").is_file():
            return cfg_dir / "target", cfg_dir / "draft"
    if p.target.embedded and not (req.target or req.draft):
        return embedded_pair(p.target.embedded)
    if bool(req.target) != bool(req.draft) and p.target.embedded:
        raise UserError("TARGET/DRAFT", "the embedded preset needs both or neither overridden", "pass TARGET=... and DRAFT=... together")
    target = resolve_source(p.target, req.target, "target")
    draft = resolve_source(p.draft, req.draft, "draft")
    assert target is not None and draft is not None  # embedded sources without overrides returned above
    return target, draft


def input_digests(target: Path, draft: Path) -> dict[str, dict[str, fmt.FileDigest]]:
    """sha256 of every input file (a dry run's config-only inputs simply have no weights)."""
    return {"target": fmt.file_digests(target), "draft": fmt.file_digests(draft)}


def make_plan(req: EngineRequest, target_dir: Path, draft_dir: Path, gpu: gpus.GpuSpec, quant: str, kv: str, k: int):
    """The deployment plan from config files (refuses layouts that cannot work, before any weight is read)."""
    target_cfg = read_json(target_dir / "config.json")
    draft_cfg = read_json(draft_dir / "config.json")
    if draft_cfg.get("transformer_layer_config"):  # speculators layout nests the layer config
        draft_cfg = {**draft_cfg["transformer_layer_config"], **{x: draft_cfg[x] for x in ("draft_vocab_size", "target_hidden_size") if x in draft_cfg}}
    # the one config schema, with the file named: a dry run reads no weights, so this is where a bad
    # draft field is met (pad_token_id is none of a head's business; load_draft skips it too)
    parse_config({x: v for x, v in draft_cfg.items() if x != "pad_token_id"}, draft_dir / "config.json", Eagle3DraftConfigFields)
    return plan_deployment(
        target_cfg,
        draft_cfg,
        gpu,
        req.gpus or req.preset.default_gpus,
        quant,
        req.preset.max_seq_len,
        "fp8" if kv == "fp8" else "bf16",
        k,
        tp=req.tp,
        model=req.preset.name,
    )


def llm_options(req: EngineRequest, kv: str, k: int, aux: tuple[int, ...], aux_default: bool, plan) -> LlmApiOptions:
    batches = list(plan.cuda_graph_batch_sizes)
    return LlmApiOptions(
        model="target",
        tokenizer="target",
        tensor_parallel_size=plan.tp,
        moe_expert_parallel_size=plan.moe_ep or None,
        max_batch_size=plan.max_batch_size,
        max_num_tokens=plan.max_num_tokens,
        enable_chunked_prefill=plan.enable_chunked_prefill,
        max_seq_len=req.preset.max_seq_len,
        # the family's KV settings (gpt-oss: TensorRT-LLM's guide's 0.8 and no block reuse; others the defaults)
        kv_cache_config=KvCacheOptions(
            dtype="fp8" if kv == "fp8" else "auto", free_gpu_memory_fraction=plan.free_gpu_memory_fraction, enable_block_reuse=plan.kv_block_reuse
        ),
        cuda_graph_config=CudaGraphOptions(batch_sizes=batches, max_batch_size=max(batches), enable_padding=plan.cuda_graph_padding),
        moe_config=MoeOptions(backend=plan.moe_backend) if plan.moe_backend else None,
        speculative_config=Eagle3Options(
            max_draft_len=k,
            speculative_model="draft",
            eagle3_layers_to_capture=None if aux_default else list(aux),
        ),
    )


def cache_miss_reason(dest: Path, inputs_fp: str, force: bool) -> str | None:
    """None when the bundle at ``dest`` can be reused as it is, else why it is (re)built."""
    if force:
        return "--force"
    if not dest.exists():
        return "new bundle"
    try:
        old = fmt.open_bundle(dest)
    except UserError as e:
        return f"the bundle there cannot be read ({e.line()})"
    if old.manifest.inputs_fingerprint != inputs_fp:
        return "inputs or build options changed since it was built"
    problems = fmt.verify(old)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return f"it does not match its manifest: {problems[0]}{more}"
    return None


def build_bundle(req: EngineRequest, progress: Progress = _no_progress, log: Callable[[str], None] = lambda s: None) -> BuildResult:
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    preset = req.preset
    gpu = gpus.get_gpu(req.target_gpu or preset.default_gpu)
    target_dir, draft_dir = resolve_pair(req)
    target = read_target(target_dir)
    quant = resolve_quant(req, gpu, target)
    kv = req.kv_cache or preset.kv_cache_dtype
    if quant in ("bf16", "native") and kv == "fp8":
        # An FP8 KV cache needs k/v scales, which only ModelOpt's calibration writes (fp8/nvfp4 builds):
        # without them TensorRT-LLM would run an FP8 cache the reference runtime cannot reproduce, so these
        # builds keep the KV cache in the checkpoint's dtype (TensorRT-LLM's gpt-oss guide sets no KV dtype)
        if req.kv_cache:
            raise UserError(
                "--kv-cache",
                f"fp8 with --quant {quant}: an FP8 KV cache needs calibrated k/v scales, which only an fp8/nvfp4 build writes",
                "drop --kv-cache (the cache stays in the checkpoint's dtype) or build with --quant fp8",
            )
        kv = "auto"
    gpus.check_kv_for_gpu(kv, gpu, "--kv-cache")
    draft_quant = (req.draft_quant or quant) if req.quantize_draft else "bf16"
    if req.quantize_draft:
        if draft_quant in ("bf16", "native"):
            raise UserError("--quantize-draft", f"the target format is {quant}, nothing to quantize the draft to", "pass --draft-quant fp8|nvfp4")
        gpus.check_quant_for_gpu(draft_quant, gpu, "--draft-quant")
    if req.max_draft_len is not None and not 1 <= req.max_draft_len <= 16:  # 0 would silently mean the preset's K
        raise UserError("--max-draft-len", f"{req.max_draft_len}", "draft lengths are 1..16")
    k = req.max_draft_len or preset.max_draft_len
    calib_file = Path(req.calib_file) if req.calib_file else quantize.DEFAULT_CALIB_FILE
    n_calib = req.calib_samples or preset.calibration.num_samples
    calib_len = req.calib_max_length or preset.calibration.max_length
    dest = Path(req.out) if req.out else default_bundle_dir(preset.name, quant, gpu.name)

    s = time.perf_counter()
    quantize.calibration_prompts(
        calib_file, n_calib, calib_len, target, "--calib-max-length" if req.calib_max_length else f"preset {preset.name} calibration.max_length"
    )  # before any weight is loaded
    plan = make_plan(req, target_dir, draft_dir, gpu, quant, kv, k)
    draft = None
    if req.dry_run:
        report = _validate_config_only(target, draft_dir, preset.max_seq_len)
    else:
        draft = load_draft(draft_dir)
        report = validate_pair(target, draft, preset.max_seq_len, quant=quant)
        draft = for_max_seq_len(draft, preset.max_seq_len)  # the draft's rope table covers the bundle's contexts
    timings["validate_s"] = time.perf_counter() - s
    for w in report.warnings:
        log(f"warning: {w}")

    s = time.perf_counter()
    digests = input_digests(target_dir, draft_dir)
    timings["hash_inputs_s"] = time.perf_counter() - s
    calib_digest = sha256_file(calib_file) if calib_file.is_file() else None
    inputs_fp = fmt.fingerprint(
        {
            "schema": fmt.SCHEMA,
            "toolkit": __version__,
            "inputs": {role: {rel: d.sha256 for rel, d in files.items()} for role, files in digests.items()},
            "quant": quant,
            "kv": kv,
            "draft_quant": draft_quant,
            "gpu": gpu.name,
            "k": k,
            "max_seq_len": preset.max_seq_len,
            "calib": [calib_digest, n_calib, calib_len],
            "dry_run": req.dry_run,
            "aux": list(report.aux_layer_ids),
            "gpus": plan.num_gpus,
            "tp": plan.tp,
        }
    )
    reason = cache_miss_reason(dest, inputs_fp, req.force)
    if reason is None:
        # a cache hit writes nothing, so staged_dir's clean-up never runs: a build SIGKILLed
        # earlier (say a --force rebuild) would leave its staging directory beside the bundle for good
        remove_stale_staging(dest)
        return BuildResult(dest, True, fmt.open_bundle(dest), report.warnings)
    if dest.exists():
        log(f"rebuilding {dest}: {reason}")

    with staged_dir(dest) as tmp:
        calib = fmt.Calibration(file=str(calib_file), sha256=calib_digest, num_samples=n_calib, max_length=calib_len)
        if req.dry_run:
            _write_config_only(target_dir, draft_dir, tmp)
        else:
            info = _quantize_and_export(target_dir, draft, report, tmp, quant, kv, draft_quant, calib_file, n_calib, calib_len, timings, progress)
            calib = calib.model_copy(update=info)
        opts = llm_options(req, kv, k, report.aux_layer_ids, report.aux_layers_are_default, plan)
        bundle_write.write_options(tmp, opts)
        write_json(tmp / fmt.VALIDATION_FILE, report.to_dict())
        acceptance = None
        if not req.dry_run and preset.target.embedded and not (req.target or req.draft):
            tick = progress("measure acceptance on held-out prompts", None)
            acceptance = measure_embedded_acceptance(tmp, target_dir.parent, k, tuple(report.aux_layer_ids))
            tick()
        timings["total_s"] = time.perf_counter() - t0
        man = fmt.Manifest(
            kind=fmt.KIND + (" (dry run: configs only, no weights)" if req.dry_run else ""),
            created_unix=int(time.time()),
            preset=preset.name,
            dry_run=req.dry_run,
            target_gpu=fmt.TargetGpu(name=gpu.name, generation=gpu.generation, sm=gpu.sm),
            quant=fmt.Quant(target=quant, draft=draft_quant, target_native=plan.target.native_format if quant == "native" else None),
            plan={k_: v for k_, v in plan.to_dict().items() if k_ not in _PLAN_FACTS_STORED_ELSEWHERE},
            sources=fmt.Sources(
                target=fmt.Source(path=str(target_dir.resolve()), source=preset.target.source, revision=preset.target.revision, files=digests["target"]),
                draft=fmt.Source(path=str(draft_dir.resolve()), source=preset.draft.source, revision=preset.draft.revision, files=digests["draft"]),
            ),
            calibration=calib,
            validation=fmt.Validation(checks=[c["check"] for c in report.checks], warnings=report.warnings),
            versions=fmt.package_versions(),
            git_sha=fmt.git_sha(),
            timings={k_: round(v, 3) for k_, v in timings.items()},
            acceptance=acceptance,
            inputs_fingerprint=inputs_fp,
        )
        bundle_write.seal(tmp, man)
    return BuildResult(dest, False, fmt.open_bundle(dest), report.warnings, reason)


def measure_embedded_acceptance(bundle: Path, pair_dir: Path, k: int, aux: tuple[int, ...], n_prompts: int = 8, max_tokens: int = 32) -> fmt.Acceptance | None:
    """Greedy speculative decoding of the built (quantized) checkpoints on the pair's shipped held-out prompts.

    Only embedded pairs ship such prompts; a few seconds on a CPU. The figure is the bundle's own
    (FP8/NVFP4 weights dequantized, activations fake-quantized by the reference runtime)."""
    prompts = heldout_prompts(pair_dir)
    if prompts is None:
        return None
    prompts = prompts[:n_prompts]
    bundle = Path(bundle)
    eng = load_engine(bundle / "target", bundle / "draft", tokenizer_dir=bundle / "tokenizer", max_draft_len=k, aux_layer_ids=aux, quantized=True, device="cpu")
    res = eng.generate(prompts, SamplingParams(max_tokens=max_tokens))
    gen = sum(r.stats.generated_tokens for r in res)
    fwd = sum(r.stats.target_forwards for r in res)
    drafted = sum(r.stats.draft_tokens for r in res)
    accepted = sum(r.stats.accepted_tokens for r in res)
    return fmt.Acceptance(
        alpha=round(accepted / drafted, 4) if drafted else 0.0,
        acceptance_length=round(gen / fwd, 4) if fwd else 1.0,
        max_draft_len=k,
        prompts=len(prompts),
        generated_tokens=gen,
        target_forwards=fwd,
        measured_on="heldout_prompts.json (held-out text), greedy, reference runtime on the quantized bundle",
    )


def _validate_config_only(target, draft_dir: Path, max_seq_len: int) -> ValidationReport:
    """Config-level checks for DRY_RUN builds (no weights): vocab, hidden sizes, aux ids, rope."""
    rep = ValidationReport()
    check_target_family(target, rep)
    if (Path(target.path) / "tokenizer.json").is_file():  # config-only presets (build/model_configs) ship none
        check_target_tokenizer(target, rep)
    cfg_path = draft_dir / "config.json"
    # the loader's own config parsing (layouts, speculators' nesting and aux-id convention, the
    # strict schema), so a dry run accepts and refuses exactly the heads a real build does
    dc = read_draft_config(draft_dir)
    if dc.vocab_size != target.vocab_size:
        raise UserError(f"{cfg_path}:vocab_size", f"{dc.vocab_size} but the target has {target.vocab_size}", "this head belongs to another target")
    th = dc.target_hidden_size
    if th != target.hidden_size:
        raise UserError(f"{cfg_path}:target_hidden_size", f"{th} but the target's hidden_size is {target.hidden_size}", "this head belongs to another target")
    dvs = dc.draft_vocab_size
    if dvs > target.vocab_size:
        raise UserError(f"{cfg_path}:draft_vocab_size", f"{dvs} exceeds the target vocab {target.vocab_size}", "this head belongs to another target")
    rep.ok("config", f"vocab {target.vocab_size}, draft vocab {dvs}, hidden {th} (weights not checked: dry run)")
    default = target.default_aux_layers()
    ids = dc.aux_layer_ids if dc.aux_layer_ids else default
    if any(not 0 <= i < target.num_hidden_layers for i in ids) or len(set(ids)) != len(ids):
        raise UserError(
            f"{cfg_path}:eagle_aux_hidden_state_layer_ids", f"{list(ids)} invalid for {target.num_hidden_layers} layers", "ids must be distinct target layers"
        )
    rep.aux_layer_ids, rep.aux_layers_are_default = tuple(ids), tuple(sorted(ids)) == tuple(sorted(default))
    rep.ok("aux_layers", f"captures outputs of target layers {list(ids)} of {target.num_hidden_layers}")
    if dc.max_position_embeddings < max_seq_len:
        rep.warn(f"draft max_position_embeddings {dc.max_position_embeddings} < max_seq_len {max_seq_len}: acceptance drops on longer contexts")
    rep.warn("dry run: weights, d2t and tensor shapes were not checked")
    return rep


def _write_config_only(target_dir: Path, draft_dir: Path, tmp: Path) -> None:
    for role, src in (("target", target_dir), ("draft", draft_dir)):
        (tmp / role).mkdir()
        shutil.copy2(src / "config.json", tmp / role / "config.json")
    export.copy_tokenizer(target_dir, tmp / "target")
    export.copy_tokenizer(target_dir, tmp / "tokenizer")


def _quantize_and_export(
    target_dir,
    draft,
    report,
    tmp: Path,
    quant: str,
    kv: str,
    draft_quant: str,
    calib_file: Path,
    n_calib: int,
    calib_len: int,
    timings: dict,
    progress: Progress,
) -> dict:
    """Library chatter (ModelOpt prints its whole config, transformers draws bars) goes to build.log."""
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    with open(tmp / "build.log", "w") as logf, contextlib.redirect_stdout(logf), warnings.catch_warnings():

        def to_log(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: TextIO | None = None, line: str | None = None) -> None:
            logf.write(warnings.formatwarning(message, category, filename, lineno, line))

        warnings.showwarning = to_log
        return _quantize_and_export_inner(target_dir, draft, report, tmp, quant, kv, draft_quant, calib_file, n_calib, calib_len, timings, progress)


def _quantize_and_export_inner(
    target_dir,
    draft,
    report,
    tmp: Path,
    quant: str,
    kv: str,
    draft_quant: str,
    calib_file: Path,
    n_calib: int,
    calib_len: int,
    timings: dict,
    progress: Progress,
) -> dict:
    s = time.perf_counter()
    tick = progress("load target", None)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir), trust_remote_code=False)
    model = None  # only ModelOpt calibration needs the target loaded; a BF16 target is streamed (export_target_bf16)
    if quant not in ("bf16", "native") or draft_quant != "bf16":
        model = AutoModelForCausalLM.from_pretrained(
            str(target_dir),
            dtype=torch.bfloat16,
            trust_remote_code=False,
            low_cpu_mem_usage=True,
            **({"device_map": "auto"} if device == "cuda" else {}),
        ).eval()
    tick()
    timings["load_target_s"] = time.perf_counter() - s

    if quant in ("bf16", "native") and draft_quant == "bf16":
        batches, info = [], {}  # nothing is calibrated: the manifest records no calibration prompts
    else:
        prompts = load_prompts(calib_file, n_calib, option="--calib")
        batches = quantize.calibration_batches(tokenizer, prompts, calib_len)
        info = {"prompts_used": len(batches), "tokens": int(sum(b.numel() for b in batches)), "tokens_sha256": quantize.calibration_hash(batches)}

    s = time.perf_counter()
    if quant not in ("bf16", "native"):
        tick = progress(f"calibrate + quantize target ({quant}, KV {kv})", len(batches))
        quantize.quantize_target(model, batches, quant, kv, on_step=tick)
    timings["quantize_target_s"] = time.perf_counter() - s

    s = time.perf_counter()
    if draft_quant != "bf16":
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
    tick = progress("copy target as shipped" if quant == "native" else "export target (unified HF checkpoint)", None)
    if quant == "native":
        export.export_target_native(Path(target_dir), tmp / "target")
    elif quant == "bf16":
        export.export_target_bf16(Path(target_dir), tmp / "target")
    else:
        export.export_target(model, tmp / "target", Path(target_dir))
    export.copy_tokenizer(Path(target_dir), tmp / "tokenizer")
    tick()
    timings["export_target_s"] = time.perf_counter() - s
    return info
