"""Build an engine bundle: validate -> calibrate + quantize -> export -> options + manifest.

Everything is written into a staging directory next to the destination and renamed into place
at the end (eagle3_trt.atomic.staged_dir), so a failure leaves no partial bundle. The on-disk
format is build/bundle.py's; this module only decides what goes in (loading, quantizing and
exporting the checkpoints is pipeline/build_checkpoints.py's).

Cache: the inputs (every source file's sha256, the calibration file) and the build request
hash to ``inputs_fingerprint``. A bundle already at the destination with the same
fingerprint is a cache hit only if it also verifies clean (every file matches the digest the
manifest records); otherwise it is rebuilt and the log says why. Changes made through
``bundle.update`` (``recommend --write``) are recorded in the manifest, so they survive a
rebuild with the same inputs; a hand edit does not verify and is rebuilt away.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from eagle3_trt import __version__
from eagle3_trt.atomic import remove_stale_staging, staged_dir, write_json
from eagle3_trt.convert import behaviour, quantize
from eagle3_trt.convert.draft_format import DraftCheckpoint, for_max_seq_len, head_hooks, load_draft
from eagle3_trt.convert.embedded import embedded_pair
from eagle3_trt.convert.prompts import load_prompt_records
from eagle3_trt.convert.target import TargetInfo, read_target
from eagle3_trt.convert.validate import ValidationReport, check_target_family, check_target_tokenizer, validate_pair
from eagle3_trt.convert.validate_draft import aux_default_warning, check_window, max_position_warning
from eagle3_trt.errors import UserError
from eagle3_trt.formats.bundle_manifest import Behaviour
from eagle3_trt.formats.checkpoint_io import read_json, sha256_file
from eagle3_trt.formats.draft_config import read_draft_config
from eagle3_trt.formats.hf_config import Eagle3DraftConfigFields, parse_config
from eagle3_trt.pipeline import bundle as fmt
from eagle3_trt.pipeline import bundle_write, gpus
from eagle3_trt.pipeline.build_checkpoints import Progress, measure_embedded_acceptance, measure_file_acceptance, quantize_and_export, write_config_only
from eagle3_trt.pipeline.llm_options import CudaGraphOptions, Eagle3Options, KvCacheOptions, LlmApiOptions, MoeOptions
from eagle3_trt.pipeline.planner import make_plan as plan_deployment
from eagle3_trt.pipeline.presets import Preset, override_dir, resolve_source
from eagle3_trt.pipeline.reference_memory import device_shortfall, measure_plan
from eagle3_trt.resources import data_dir
from eagle3_trt.speculative.registry import method_for_head

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
    # convert/behaviour.py's checks (target loss, draft agreement): on unless --skip-behaviour-checks
    # or behaviour.SKIP_ENV is set (random-weight test pairs, which the checks rightly refuse)
    skip_behaviour_checks: bool = False
    # held-out prompts for the build's acceptance check and gate verdict (an embedded pair ships its own)
    heldout_prompts: str | None = None


@dataclass
class BuildResult:
    bundle: Path
    cache_hit: bool
    opened: fmt.Bundle
    warnings: list[str] = field(default_factory=list)
    reason: str | None = None  # why the bundle was (re)built; None for a cache hit
    gate_note: str | None = None  # why no acceptance was measured and gated, and how to get it (None: measured, or a dry run)

    @property
    def manifest(self) -> fmt.Manifest:
        return self.opened.manifest


def _no_progress(stage: str, total: int | None = None) -> Callable[[], None]:
    return lambda: None


def resolve_quant(req: EngineRequest, gpu: gpus.GpuSpec, target: TargetInfo | None = None) -> str:
    """--quant, else what the target calls for, else the preset's format for the GPU. A target that ships in
    a format TensorRT-LLM serves as is (gpt-oss MXFP4) is kept as shipped; an unquantized target of a family
    whose ModelOpt formats are refused (convert/families.py ``modelopt_refused``) is built in BF16. An
    explicit --quant is checked against the target later (plan_checks.check_quant_for_target)."""
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


def default_bundle_dir(preset: str, quant: str, gpu: str, root: Path | None = None, method: str | None = None) -> Path:
    """engines/<preset>-<quant>-<gpu>; a head of a method with its own format adds the method's registry
    name, so its bundle never replaces the preset's EAGLE-3 bundle: engines/<preset>-<method>-<quant>-<gpu>."""
    return (root or Path.cwd()) / ENGINES_DIR / "-".join([preset, *([method] if method else []), quant, gpu])


def resolve_pair(req: EngineRequest) -> tuple[Path, Path]:
    p = req.preset
    if req.dry_run and not (req.target or req.draft) and not p.target.embedded:
        cfg_dir = data_dir("build") / "model_configs" / p.name
        if (cfg_dir / "target" / "config.json").is_file():
            return cfg_dir / "target", cfg_dir / "draft"
    if p.target.embedded and not (req.target or req.draft):
        return embedded_pair(p.target.embedded)
    if p.target.embedded and req.draft and not req.target:
        # a head of its own for the embedded target (e.g. another method's head under models/tiny/): the embedded target with it
        return embedded_pair(p.target.embedded)[0], override_dir(req.draft, "draft")
    if bool(req.target) != bool(req.draft) and p.target.embedded:
        raise UserError(
            "TARGET/DRAFT",
            "the embedded preset needs both or neither overridden",
            "pass TARGET=... and DRAFT=... together (a DRAFT alone runs with the embedded target)",
        )
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


def llm_options(req: EngineRequest, kv: str, k: int, aux: tuple[int, ...], aux_default: bool, plan, draft: DraftCheckpoint | None = None) -> LlmApiOptions:
    batches = list(plan.cuda_graph_batch_sizes)
    hooks = head_hooks(draft) if draft is not None else None
    method_options = dict(hooks.speculative_options) if hooks is not None else {}  # a method's own head: the key selecting it
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
            # without it TensorRT-LLM's one-model EAGLE-3 serves temperature > 0 greedily (core/spec_sampling.py);
            # with it the target samples each position and the output follows the target's distribution
            allow_advanced_sampling=True,
            **method_options,
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


@dataclass(frozen=True)
class _Settings:
    """What a request resolves to (preset defaults filled in), checked before any weight is read."""

    gpu: gpus.GpuSpec
    target_dir: Path
    draft_dir: Path
    target: TargetInfo
    quant: str
    kv: str
    draft_quant: str
    k: int
    calib_file: Path
    n_calib: int
    calib_len: int
    dest: Path


def _resolve_kv(req: EngineRequest, quant: str, gpu: gpus.GpuSpec) -> str:
    kv = req.kv_cache or req.preset.kv_cache_dtype
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
    return kv


def _resolve_draft_quant(req: EngineRequest, quant: str, gpu: gpus.GpuSpec) -> str:
    draft_quant = (req.draft_quant or quant) if req.quantize_draft else "bf16"
    if req.quantize_draft:
        if draft_quant in ("bf16", "native"):
            raise UserError("--quantize-draft", f"the target format is {quant}, nothing to quantize the draft to", "pass --draft-quant fp8|nvfp4")
        gpus.check_quant_for_gpu(draft_quant, gpu, "--draft-quant")
    return draft_quant


def _resolve(req: EngineRequest) -> _Settings:
    preset = req.preset
    gpu = gpus.get_gpu(req.target_gpu or preset.default_gpu)
    target_dir, draft_dir = resolve_pair(req)
    target = read_target(target_dir)
    quant = resolve_quant(req, gpu, target)
    kv = _resolve_kv(req, quant, gpu)
    draft_quant = _resolve_draft_quant(req, quant, gpu)
    if req.heldout_prompts:
        if req.dry_run:
            raise UserError("--heldout-prompts", "a dry run reads no weights, so there is nothing to measure", "drop --dry-run or --heldout-prompts")
        load_prompt_records(req.heldout_prompts, option="--heldout-prompts")  # missing, empty or malformed: refused before any weight is read
    if req.max_draft_len is not None and not 1 <= req.max_draft_len <= 16:  # 0 would silently mean the preset's K
        raise UserError("--max-draft-len", f"{req.max_draft_len}", "draft lengths are 1..16")
    return _Settings(
        gpu=gpu,
        target_dir=target_dir,
        draft_dir=draft_dir,
        target=target,
        quant=quant,
        kv=kv,
        draft_quant=draft_quant,
        k=req.max_draft_len or preset.max_draft_len,
        calib_file=Path(req.calib_file) if req.calib_file else quantize.DEFAULT_CALIB_FILE,
        n_calib=req.calib_samples or preset.calibration.num_samples,
        calib_len=req.calib_max_length or preset.calibration.max_length,
        dest=Path(req.out) if req.out else default_bundle_dir(preset.name, quant, gpu.name, method=_head_method(draft_dir)),
    )


def _head_method(draft_dir: Path) -> str | None:
    """The registered method whose own head format the draft is (None: an EAGLE-3 head, or no config to read)."""
    cfg = draft_dir / "config.json"
    method = method_for_head(read_json(cfg)) if cfg.is_file() else None
    return method.name if method is not None else None


def _validate(req: EngineRequest, st: _Settings):
    """The plan, the loaded draft (None for a dry run) and the validation report, before any target weight is loaded."""
    preset = req.preset
    quantize.calibration_prompts(
        st.calib_file, st.n_calib, st.calib_len, st.target, "--calib-max-length" if req.calib_max_length else f"preset {preset.name} calibration.max_length"
    )  # before any weight is loaded
    plan = make_plan(req, st.target_dir, st.draft_dir, st.gpu, st.quant, st.kv, st.k)
    draft = None
    if req.dry_run:
        method = method_for_head(read_json(st.draft_dir / "config.json"))
        if method is not None:  # a dry run writes the configs of a TensorRT-LLM bundle (formats.draft_config)
            raise UserError("--dry-run", f"the draft is a {method.name} head, whose bundle ships it in its own format", "build it without --dry-run")
        report = _validate_config_only(st.target, st.draft_dir, preset.max_seq_len)
    else:
        draft = load_draft(st.draft_dir)
        hooks = head_hooks(draft)
        if hooks is not None and st.draft_quant != "bf16":
            raise UserError("--quantize-draft", f"a {hooks.label} head is shipped unquantized, in the format its serving engine reads", "drop --quantize-draft")
        report = validate_pair(st.target, draft, preset.max_seq_len, quant=st.quant)
        if hooks is not None and st.k > hooks.trained_k(draft):
            report.warn(f"K={st.k} but the {hooks.label} head was trained for K={hooks.trained_k(draft)}: drafts past it come from positions it never learned")
        draft = for_max_seq_len(draft, preset.max_seq_len)  # the draft's rope table covers the bundle's contexts
    return plan, draft, report


def _inputs_fingerprint(req: EngineRequest, st: _Settings, digests: dict[str, dict[str, fmt.FileDigest]], calib_digest: str | None, report, plan) -> str:
    return fmt.fingerprint(
        {
            "schema": fmt.SCHEMA,
            "toolkit": __version__,
            "inputs": {role: {rel: d.sha256 for rel, d in files.items()} for role, files in digests.items()},
            "quant": st.quant,
            "kv": st.kv,
            "draft_quant": st.draft_quant,
            "gpu": st.gpu.name,
            "k": st.k,
            "max_seq_len": req.preset.max_seq_len,
            "calib": [calib_digest, st.n_calib, st.calib_len],
            "dry_run": req.dry_run,
            "behaviour_checks": report.behaviour is None or "skipped" not in report.behaviour,
            "aux": list(report.aux_layer_ids),
            "gpus": plan.num_gpus,
            "tp": plan.tp,
            # the prompts the build's gate measured (only when given: bundles built without keep their fingerprint)
            **({"heldout": sha256_file(Path(req.heldout_prompts))} if req.heldout_prompts else {}),
        }
    )


def build_bundle(req: EngineRequest, progress: Progress = _no_progress, log: Callable[[str], None] = lambda s: None) -> BuildResult:
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    st = _resolve(req)

    s = time.perf_counter()
    plan, draft, report = _validate(req, st)
    timings["validate_s"] = time.perf_counter() - s
    if req.dry_run:
        report.behaviour = {"skipped": "dry run: no weights were read, so the target's loss and the draft's agreement were not measured"}
    elif req.skip_behaviour_checks or behaviour.skipped_by_env():
        report.behaviour = {"skipped": f"--skip-behaviour-checks ({behaviour.SKIP_ENV})"}
    for w in report.warnings:
        log(f"warning: {w}")

    s = time.perf_counter()
    digests = input_digests(st.target_dir, st.draft_dir)
    timings["hash_inputs_s"] = time.perf_counter() - s
    calib_digest = sha256_file(st.calib_file) if st.calib_file.is_file() else None
    inputs_fp = _inputs_fingerprint(req, st, digests, calib_digest, report, plan)
    reason = cache_miss_reason(st.dest, inputs_fp, req.force)
    if reason is None:
        # a cache hit writes nothing, so staged_dir's clean-up never runs: a build SIGKILLed
        # earlier (say a --force rebuild) would leave its staging directory beside the bundle for good
        remove_stale_staging(st.dest)
        opened = fmt.open_bundle(st.dest)
        note = None if opened.manifest.acceptance else _gate_note(req, st, plan, st.dest)
        return BuildResult(st.dest, True, opened, report.warnings, gate_note=note)
    if st.dest.exists():
        log(f"rebuilding {st.dest}: {reason}")
    if report.behaviour is None:  # measured only now: a cache hit pays nothing, a refusal writes nothing
        s = time.perf_counter()
        tick = progress("check behaviour (target loss, draft agreement)", None)
        behaviour.check_behaviour(st.target_dir, draft, report.aux_layer_ids, st.calib_file, st.calib_len, report)
        tick()
        timings["behaviour_s"] = time.perf_counter() - s

    with staged_dir(st.dest) as tmp:
        calib = fmt.Calibration(file=str(st.calib_file), sha256=calib_digest, num_samples=st.n_calib, max_length=st.calib_len)
        if req.dry_run:
            write_config_only(st.target_dir, st.draft_dir, tmp, req.preset.max_seq_len)
        else:
            info = quantize_and_export(
                st.target_dir, draft, report, tmp, st.quant, st.kv, st.draft_quant, st.calib_file, st.n_calib, st.calib_len, timings, progress
            )
            calib = calib.model_copy(update=info)
            # recorded, and shown by the summary and `gate`: a short file is used as it is, never silently
            calib = calib.model_copy(update={"shortfall": fmt.calibration_shortfall(calib)})
        opts = llm_options(req, st.kv, st.k, report.aux_layer_ids, report.aux_layers_are_default, plan, draft)
        bundle_write.write_options(tmp, opts)
        write_json(tmp / fmt.VALIDATION_FILE, report.to_dict())
        acceptance, note = None, None
        if not req.dry_run:
            note = _gate_note(req, st, plan, tmp)
        if note is None and req.heldout_prompts:
            tick = progress("measure acceptance on held-out prompts", None)
            acceptance = measure_file_acceptance(tmp, Path(req.heldout_prompts), st.k, tuple(report.aux_layer_ids), device=_measure_device())
            tick()
        elif note is None and not req.dry_run:
            tick = progress("measure acceptance on held-out prompts", None)
            acceptance = measure_embedded_acceptance(tmp, st.target_dir.parent, st.k, tuple(report.aux_layer_ids))
            tick()
        timings["total_s"] = time.perf_counter() - t0
        bundle_write.seal(tmp, _manifest(req, st, plan, report, digests, calib, timings, acceptance, inputs_fp, draft))
    return BuildResult(st.dest, False, fmt.open_bundle(st.dest), report.warnings, reason, gate_note=note)


def _embedded_own(req: EngineRequest) -> bool:
    """The build is of an embedded pair as shipped, with its own held-out prompts."""
    return bool(req.preset.target.embedded) and not (req.target or req.draft)


def _measure_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _gate_note(req: EngineRequest, st: _Settings, plan, bundle_dir: Path) -> str | None:
    """None when the build measures acceptance and gates it (an embedded pair's own prompts, or
    --heldout-prompts whose target fits the measuring device), else the one line saying why it
    does not and the command that does."""
    dest = st.dest
    if req.dry_run:
        return None
    if not req.heldout_prompts:
        if _embedded_own(req):
            return None
        return (
            f"gate: not run: no held-out prompts for this target; give them to the build (--heldout-prompts FILE, "
            f"make engine ... HELDOUT=FILE) or gate the bundle afterwards: eagle3-trt gate {dest} --prompts FILE"
        )
    device = _measure_device()
    cfg = read_json(bundle_dir / "target" / "config.json")
    draft_cfg_file = bundle_dir / "draft" / "config.json"
    draft_cfg = read_json(draft_cfg_file) if draft_cfg_file.is_file() else None
    short = device_shortfall(cfg, draft_cfg, 1, device)
    if short is None:
        return None
    try:  # the TP `plan --measure` picks for these GPUs (the fewest that hold a measuring batch)
        tp = measure_plan(cfg, draft_cfg, st.gpu, plan.num_gpus, st.k).memory.tp
    except UserError:
        tp = plan.num_gpus
    return (
        f"gate: not run in the build: measuring the target on one device {short}; "
        f"measure it across {tp} GPUs: eagle3-trt gate {dest} --prompts {req.heldout_prompts} --tp {tp}"
    )


def _manifest(
    req: EngineRequest,
    st: _Settings,
    plan,
    report,
    digests,
    calib: fmt.Calibration,
    timings: dict[str, float],
    acceptance,
    inputs_fp: str,
    draft: DraftCheckpoint | None = None,
) -> fmt.Manifest:
    preset = req.preset
    hooks = head_hooks(draft) if draft is not None else None
    return fmt.Manifest(
        kind=fmt.KIND + (" (dry run: configs only, no weights)" if req.dry_run else ""),
        created_unix=int(time.time()),
        preset=preset.name,
        dry_run=req.dry_run,
        target_gpu=fmt.TargetGpu(name=st.gpu.name, generation=st.gpu.generation, sm=st.gpu.sm),
        quant=fmt.Quant(target=st.quant, draft=st.draft_quant, target_native=plan.target.native_format if st.quant == "native" else None),
        plan={k_: v for k_, v in plan.to_dict().items() if k_ not in _PLAN_FACTS_STORED_ELSEWHERE},
        sources=fmt.Sources(
            target=fmt.Source(path=str(st.target_dir.resolve()), source=preset.target.source, revision=preset.target.revision, files=digests["target"]),
            draft=fmt.Source(path=str(st.draft_dir.resolve()), source=preset.draft.source, revision=preset.draft.revision, files=digests["draft"]),
        ),
        calibration=calib,
        validation=fmt.Validation(
            checks=[c["check"] for c in report.checks], warnings=report.warnings, behaviour=Behaviour(**report.behaviour) if report.behaviour else None
        ),
        versions=fmt.package_versions(),
        git_sha=fmt.git_sha(),
        timings={k_: round(v, 3) for k_, v in timings.items()},
        acceptance=acceptance,
        method=draft.method if hooks is not None and draft is not None else None,
        served_by=hooks.serving("draft", st.k) if hooks is not None else None,
        inputs_fingerprint=inputs_fp,
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
    aux_warning = aux_default_warning(dc, ids)  # validate's words (convert/validate_draft.py)
    if aux_warning:
        rep.warn(aux_warning)
    check_window(dc, max_seq_len, cfg_path, rep)
    warning = max_position_warning(dc, max_seq_len)
    if warning:
        rep.warn(warning)
    rep.warn("dry run: weights, d2t and tensor shapes were not checked")
    return rep
