"""Measuring alpha of a bundle (and of a reference pair) into the alpha report (formats/alpha_report.AlphaReport): what ``eagle3-trt alpha`` runs."""

from __future__ import annotations

import time
from dataclasses import asdict
from functools import partial
from pathlib import Path

from eagle3_trt.convert.prompts import load_prompt_records, use_chat_template
from eagle3_trt.core.stats import AggregateStats
from eagle3_trt.errors import UserError
from eagle3_trt.formats.acceptance_by_context import AcceptanceByContext
from eagle3_trt.formats.alpha_report import KIND, SCHEMA, AlphaReport, CostRecommendation
from eagle3_trt.measure.acceptance import Measurement, measure
from eagle3_trt.measure.alpha_report import compare
from eagle3_trt.measure.bundle_costs import bundle_cost_inputs, recommendation_batches
from eagle3_trt.measure.context_buckets import context_tables
from eagle3_trt.measure.cost_model import recommend
from eagle3_trt.measure.diagnostics import diagnose
from eagle3_trt.measure.method_choice import estimator_replays
from eagle3_trt.measure.mode_compare import add_vs_chain
from eagle3_trt.pipeline.bundle import Bundle, open_bundle
from eagle3_trt.runtime.distributed import current
from eagle3_trt.runtime.loader import default_device, engine_from_bundle, refuse_what_does_not_fit
from eagle3_trt.speculative.dynamic_tree.builder import DynamicTreeConfig
from eagle3_trt.speculative.dynamic_tree.method import DynamicTreeMethod
from eagle3_trt.speculative.dynamic_tree.mode import DEFAULT_TOPK, DYNAMIC_TREE_MODE, dynamic_tree_entry, dynamic_tree_for_modes, refuse_combined_modes
from eagle3_trt.speculative.registry import DEFAULT_METHOD
from eagle3_trt.speculative.sa.automaton import SAConfig
from eagle3_trt.speculative.sa.method import SuffixAutomatonMethod

MXFP4_NUMERICS_NOTE = (
    "target experts are MXFP4 as shipped; the reference runtime dequantizes them exactly (every "
    "E2M1 x 2^k value is a BF16 value) and runs activations unquantized, which is TensorRT-LLM's "
    "W4A16 MXFP4 path on Hopper; Blackwell MoE kernels that also quantize activations (MXFP8) "
    "are not emulated, so alpha there can differ by rounding"
)


def run_alpha(
    bundle: Path,
    prompts_file: Path,
    *,
    reference_bundle: Path | None = None,
    bf16: bool | None = None,
    max_tokens: int = 128,
    limit: int | None = None,
    turns: str = "all",
    max_draft_len: int | None = None,
    method: str = "estimator",
    device: str | None = None,
    batch_size: int = 16,
    concurrency: int = 1,
    diagnostics: bool = True,
    progress=None,
    tasks=None,
    sweep: tuple[int, ...] = (),
    chat_template: bool | None = None,
    modes: tuple[str, ...] = (),
    sa_threshold: int = 4,
    temperature: float = 0.0,
    dynamic_tree_topk: int = DEFAULT_TOPK,
    max_total_draft_tokens: int | None = None,
) -> AlphaReport:
    """Measure the bundle (as built) and optionally a reference pair; returns the report.

    ``modes``: also measure these speculation modes ("chain": the neural chain; "sa": the chain with
    TensorRT-LLM's suffix-automaton enhancer at ``sa_threshold``) into report["modes"].

    ``chat_template``: None encodes chat records through the template and raw completion
    records as they are; False sends every record raw; True templates every record.

    ``temperature`` > 0 (``--method generate``): sampled, served as TensorRT-LLM serves the bundle's
    speculative sampling flags (core/spec_sampling.py; a one-line warning when that is not the
    target's own sampling).

    ``progress(message)``: a line per step; ``tasks(desc, total)``: a task of the commands' progress
    display (eagle3_trt/progress.py) advanced per prompt measured, with the tokens so far."""
    say = progress or (lambda msg: None)
    if temperature < 0 or (temperature > 0 and method != "generate"):
        raise UserError("--temperature", f"{temperature}", "use 0 (greedy), or a positive temperature with --method generate (the estimator is greedy)")
    if max_draft_len is not None and not 1 <= max_draft_len <= 16:  # 0 would silently mean the bundle's K
        raise UserError("--max-draft-len", f"{max_draft_len}", "draft lengths are 1..16")
    if sweep and method != "estimator":
        raise UserError("--sweep", "needs the estimator", "drop --method generate (the estimator's counts are identical)")
    refuse_combined_modes(modes)  # dynamic-tree+sa: TensorRT-LLM refuses it
    bad = [m for m in modes if m not in SPEC_MODES]
    if bad:
        raise UserError("--modes", f"unknown mode {bad[0]!r}", f"use a comma-separated subset of {','.join(SPEC_MODES)}")
    sa_cfg = SAConfig(threshold=sa_threshold) if "sa" in modes else None  # a bad threshold fails before loading
    b = open_bundle(Path(bundle))
    records = load_prompt_records(Path(prompts_file), limit)
    use_chat_template(records, chat_template, source=prompts_file)  # a one-line error before any model is loaded
    device = default_device(device)
    k = int(max_draft_len or b.k)
    # dynamic-tree (dynamic_tree_max_topK, max_total_draft_tokens): checked before any model is loaded
    dyn_cfg = dynamic_tree_for_modes(modes, b.target_config, b.target_dir / "config.json", k, dynamic_tree_topk, max_total_draft_tokens, temperature)
    # the bundle and its reference pair are measured alike
    measure_pair = partial(
        measure,
        records=records,
        max_tokens=max_tokens,
        progress=tasks,
        turns=turns,
        method=method,
        batch_size=batch_size,
        k=k,
        chat_template=chat_template,
        temperature=temperature,
    )
    flags = b.options.speculative_config.sampling_flags()
    sampling_warning = flags.warning() if temperature > 0 else None
    if sampling_warning:
        say(sampling_warning)
    refuse_what_does_not_fit(b, device)  # before the first progress line: the refusal is the one line printed
    t0 = time.perf_counter()
    say(f"loading {b.path} ({b.label}) on {device}")
    eng = engine_from_bundle(b, device=device, max_draft_len=k)
    load_s = time.perf_counter() - t0
    say(f"measuring {len(records)} prompts ({turns} turns, up to {max_tokens} tokens each)")
    served = getattr(eng.method, "name", DEFAULT_METHOD)
    if not estimator_replays(served) and method == "estimator":
        # a method the estimator does not replay (TensorRT-LLM's dynamic tree): measured as served
        if sweep:
            raise UserError("--sweep", f"the bundle serves {served}, which the estimator's K sweep does not replay", "drop --sweep")
        say(f"the bundle serves {served}: measured by speculative generation")
        prim = measure_pair(eng, label=b.label, sweep=(), method="generate")
    else:
        prim = measure_pair(eng, label=b.label, sweep=sweep)
    nothing = prim.incomplete(str(prompts_file)) if not prim.results else None
    if nothing is not None:  # every prompt skipped: no report of AL 0, nothing else measured
        raise nothing
    diag = diagnose(eng, prim) if diagnostics and prim.results else []
    by_mode = measure_modes(eng, modes, sa_cfg, measure_pair, say, dyn_cfg)
    max_seq_len = eng.max_seq_len  # the draft-length rule near the context's end (acceptance by context)
    del eng  # before a reference pair is loaded next to it
    ref, ref_note = _measure_reference(b, reference_bundle, bf16, device, k, measure_pair, say)
    settings = _settings(prompts_file, len(records), limit, turns, max_tokens, k, method, device, batch_size, sweep, chat_template)
    if temperature > 0:
        settings["decoding"] = f"sampled, temperature {temperature}"
        settings["temperature"] = temperature
        settings["spec_sampling"] = {**asdict(flags), "served": flags.served}
    report = _report(b, settings, prim, ref, ref_note, diag, load_s)
    if sampling_warning:
        report.sampling_warning = sampling_warning
    _add_recommendation(report, b, prim, concurrency)
    # AL and alpha per context and prompt-length bucket, from each request's verifications (measure/context_buckets.py)
    report.acceptance_by_context = AcceptanceByContext.model_validate(context_tables([r.to_dict() for r in prim.results], k, max_tokens, max_seq_len))
    if by_mode:
        report.modes = by_mode  # validated into formats/alpha_report.ModeEntry on assignment
    return report


SPEC_MODES = ("chain", "sa", DYNAMIC_TREE_MODE)


def mode_figures(a: AggregateStats) -> dict:
    """Acceptance length (tokens per target forward), alpha, and tokens the target verifies per
    forward (the root plus the drafted tokens), with the counts behind them."""
    f = a.target_forwards
    return {
        "acceptance_length": a.acceptance_length,
        "alpha": a.alpha,
        # a tree verifies all its nodes (verified_tokens); a chain its draft (the estimator counts only that)
        "tokens_verified_per_forward": ((a.verified_tokens or a.draft_tokens) + f) / f if f else 0.0,
        "requests": a.requests,
        "generated_tokens": a.generated_tokens,
        "target_forwards": f,
        "draft_tokens": a.draft_tokens,
        "accepted_tokens": a.accepted_tokens,
    }


def mode_method(mode: str, measure_pair) -> str:
    """How a mode is measured: greedy chain and sa by the run's own method (the estimator's counts
    equal the engine loop's, tests/test_sa_estimator.py), anything else (a tree, sampling) by
    speculative generation."""
    kw = getattr(measure_pair, "keywords", {})
    if mode in ("chain", "sa") and not kw.get("temperature"):
        return str(kw.get("method", "estimator"))
    return "generate"


def measure_modes(eng, modes: tuple[str, ...], sa_cfg: SAConfig | None, measure_pair, say, dyn_cfg: DynamicTreeConfig | None = None) -> dict:
    """Each mode measured alike (``mode_method``): chain and sa greedy by the run's method (the
    estimator replays the suffix automaton exactly, measure/estimator.walk_chain), else by running
    speculative generation."""
    out: dict = {}
    measured: dict = {}
    for mode in modes:
        method = mode_method(mode, measure_pair)
        say(f"measuring mode {mode} ({'speculative generation' if method == 'generate' else 'estimator'})")
        spec = (
            SuffixAutomatonMethod(sa_cfg)
            if mode == "sa" and sa_cfg is not None
            else DynamicTreeMethod(dyn_cfg)
            if mode == DYNAMIC_TREE_MODE and dyn_cfg is not None
            else None
        )
        with eng.using(spec):  # what the bundle serves (runtime/loader.py) is put back after the mode
            m = measure_pair(eng, label=f"mode {mode}", method=method, sweep=())
        entry = {
            "method": method,
            "overall": mode_figures(m.overall()),
            "by_category": {c: mode_figures(a) for c, a in m.by_category().items()},
            # each turn's accepted drafts per verification, in order: recommend replays them through the
            # acceptance-rate switch-off when this mode wins (measure/method_gate.py)
            "accepted_seqs": [list(r.stats.accepted_seq) for r in m.results],
        }
        if mode == "sa" and sa_cfg is not None:
            entry["sa_config"] = {"threshold": sa_cfg.threshold, "enable_global_pool": sa_cfg.enable_global_pool}
        if mode == DYNAMIC_TREE_MODE and dyn_cfg is not None:
            entry["dynamic_tree"] = dynamic_tree_entry(dyn_cfg, eng.max_draft_len)
        out[mode], measured[mode] = entry, m
    add_vs_chain(out, measured)  # each mode's AL gain over the chain, with its paired interval
    return out


def _measure_reference(
    b: Bundle, reference_bundle: Path | None, bf16: bool | None, device: str, k: int, measure_pair, say
) -> tuple[Measurement | None, str | None]:
    """(the reference pair's measurement, or a note saying why there is none)."""
    ref_note = None
    # a natively quantized target (gpt-oss MXFP4) has no BF16 source to compare with: the shipped checkpoint
    # is both what the bundle serves and the reference; only a draft quantized by the build has one
    quantized = b.quant.target not in ("bf16", "native") or b.quant.draft != "bf16"
    if bf16 and b.quant.target == "native" and not quantized and reference_bundle is None:
        raise UserError(
            "--bf16",
            f"the bundle's target is kept as shipped ({b.quant.target_native}) and its draft is BF16: there is no BF16 source pair to compare with",
            "drop --bf16 (or pass --reference-bundle)",
        )
    if reference_bundle is not None:
        rb = open_bundle(Path(reference_bundle))
        say(f"loading reference bundle {reference_bundle}")
        reng = engine_from_bundle(rb, device=device, max_draft_len=k)
        ref_label = f"reference ({rb.label})"
    elif bf16 or (bf16 is None and quantized):
        try:
            say("loading the BF16 source pair named in manifest.json")
            reng = engine_from_bundle(b, device=device, max_draft_len=k, reference=True)
            ref_label = "bf16 target + bf16 draft"
        except UserError as e:
            if bf16:
                raise
            reng, ref_note = None, f"no BF16 reference: {e.line()}"
    else:
        reng = None
        ref_note = (
            "reference disabled (--no-bf16)"
            if quantized
            else f"target kept as shipped ({b.quant.target_native}) and draft BF16; no reference pair"
            if b.quant.target == "native"
            else "bundle is BF16; no reference pair"
        )
    if reng is None:
        return None, ref_note
    say("measuring the reference pair")
    return measure_pair(reng, label=ref_label), ref_note


def _settings(
    prompts_file: Path,
    n_records: int,
    limit: int | None,
    turns: str,
    max_tokens: int,
    k: int,
    method: str,
    device: str,
    batch_size: int,
    sweep: tuple[int, ...],
    chat_template: bool | None,
) -> dict:
    return {
        "prompts": str(prompts_file),
        "records": n_records,
        "limit": limit,
        "turns": turns,
        "max_tokens": max_tokens,
        "max_draft_len": k,
        "method": method,
        "device": device,
        "decoding": "greedy",
        "batch_size": batch_size,
        "sweep": list(sweep),
        "chat_template": {None: "per record", True: "always", False: "never"}[chat_template],
        "tensor_parallel": group.world if (group := current()) is not None else 1,
    }


def _report(b: Bundle, settings: dict, prim: Measurement, ref: Measurement | None, ref_note: str | None, diag: list[dict], load_s: float) -> AlphaReport:
    """The report's typed model (formats/alpha_report.py), built from the measurements' records."""
    report: dict = {
        "schema": SCHEMA,
        "kind": KIND,
        "bundle": str(b.path),
        "bundle_weights": b.weights_id,
        "settings": settings,
        "pairs": {"bundle": prim.to_dict()},
        "delta": compare(prim, ref),
        "diagnostics": diag,
        "timings": {"load_s": load_s},
    }
    if ref is not None:
        report["pairs"]["reference"] = ref.to_dict()
    if ref_note:
        report["reference_note"] = ref_note
    if b.quant.target_native == "mxfp4":
        report["numerics_note"] = MXFP4_NUMERICS_NOTE
    return AlphaReport.model_validate(report)


def _add_recommendation(report: AlphaReport, b: Bundle, prim: Measurement, concurrency: int) -> None:
    """K and max_concurrency from the measurement, or the one-line reason there is none."""
    ov = prim.overall()
    if not ov.draft_tokens:
        return
    try:
        rec = recommend(
            ov.cumulative_acceptance,
            concurrency=concurrency,
            **bundle_cost_inputs(b),
            batches=recommendation_batches(b),
            measured_by_k={kk: v["cumulative_acceptance"] for kk, v in prim.sweep().items()},
        )
        report.recommendation = CostRecommendation.model_validate(rec.to_dict())
    except UserError as e:
        report.recommendation_error = e.line()
