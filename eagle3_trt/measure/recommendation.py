"""``recommend``'s work: the acceptance curves it predicts from, the speedup table, and writing the choice into a bundle."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from eagle3_trt.errors import UserError
from eagle3_trt.formats.alpha_report import AlphaReport, TrafficAlphaReport, read_alpha_report, read_traffic_report
from eagle3_trt.measure.alpha_run import run_alpha
from eagle3_trt.measure.bundle_costs import method_of as bundle_method
from eagle3_trt.measure.cost_model import Recommendation, acceptance_gate, draft_len_schedule
from eagle3_trt.measure.dynamic_tree_choice import DT_KEYS, dynamic_tree_choice
from eagle3_trt.measure.dynamic_tree_choice import bundle_inputs as dt_inputs
from eagle3_trt.measure.gate_replay import GateChoice, choose_gate, sequences_at
from eagle3_trt.measure.method_gate import mode_gate, no_gate_reason, none_applies
from eagle3_trt.measure.sampling_choice import sampling_choice
from eagle3_trt.pipeline import bundle as bundle_format
from eagle3_trt.pipeline import bundle_write
from eagle3_trt.pipeline.bundle import Bundle, open_bundle
from eagle3_trt.pipeline.llm_options import validate_options
from eagle3_trt.pipeline.trtllm_adapter import recommend as recommended_options
from eagle3_trt.speculative.dynamic_tree.mode import DYNAMIC_TREE_MODE
from eagle3_trt.speculative.registry import DEFAULT_METHOD
from eagle3_trt.speculative.sa.options import SAEnhancerOptions


def acceptance_curves(
    bundle: Path,
    report_file: str | None,
    prompts_file: str | None,
    *,
    max_draft_len: int | None,
    limit: int | None,
    max_tokens: int,
    device: str | None,
    chat_template: bool | None,
) -> tuple[list[float], dict[int, list[float]], AlphaReport]:
    """(cumulative acceptance, {K: curve measured at K}, the alpha report they come from) from an
    alpha report, else measured on the prompts."""
    if report_file:
        rep = read_alpha_report(Path(report_file))
        if rep.bundle_weights is not None and rep.bundle_weights != open_bundle(Path(bundle)).weights_id:
            raise UserError(
                report_file,
                f"measured on {rep.bundle}, whose target, draft or tokenizer files differ from {bundle}'s; nothing written",
                f"measure this bundle: eagle3-trt alpha {bundle} --prompts FILE",
            )
        return (*rep.curves(), rep)
    if prompts_file:
        k = max_draft_len or open_bundle(Path(bundle)).k
        # every K up to the largest measured directly (one continuation serves all)
        rep = run_alpha(
            Path(bundle),
            Path(prompts_file),
            bf16=False,
            max_tokens=max_tokens,
            limit=limit,
            turns="first",
            max_draft_len=k,
            device=device,
            diagnostics=False,
            sweep=tuple(range(1, k + 1)),
            chat_template=chat_template,
        )
        return (*rep.curves(), rep)
    raise UserError("recommend", "needs --report or --prompts", "measure acceptance first with `eagle3-trt alpha`")


def acceptance_at(report: AlphaReport | None, k: int, source: str | None, old: bundle_format.Acceptance | None) -> bundle_format.Acceptance | None:
    """The manifest's acceptance record once K is ``k``: the alpha report's measurement at ``k`` (its
    sweep, or its own run at that K), else the old record with ``measured_on`` saying which K it
    measured, so no K in the manifest reads as the options' K without saying so."""
    figures = _figures_at(report, k) if report is not None else None
    if figures is not None:
        alpha, al, turns, generated, forwards = figures
        return bundle_format.Acceptance(
            alpha=round(float(alpha), 4),
            acceptance_length=round(float(al), 4),
            max_draft_len=k,
            prompts=turns,
            generated_tokens=generated,
            target_forwards=forwards,
            measured_on=f"{source or 'alpha'} (alpha measurement at K={k}, taken by recommend --write), greedy, reference runtime on this bundle",
        )
    if old is None or old.max_draft_len == k:
        return old
    note = f"measured at K={old.max_draft_len}, not at the options' K={k} (recommend --write found no measurement at K={k} in {source or 'its alpha run'}); "
    return old if old.measured_on.startswith("measured at K=") else old.model_copy(update={"measured_on": note + old.measured_on})


def _figures_at(report: AlphaReport, k: int) -> tuple[float, float, int, int, int] | None:
    """(alpha, AL, turns, generated tokens, target forwards) the report measured at K = ``k`` (its
    sweep, else its own run at that K); None without them (a sweep from before its counts were recorded)."""
    prim = report.pairs.bundle
    at_k = (prim.sweep or {}).get(k)
    if at_k is not None:
        if at_k.turns is None or at_k.generated_tokens is None or at_k.target_forwards is None:
            return None
        return at_k.alpha, at_k.acceptance_length, at_k.turns, at_k.generated_tokens, at_k.target_forwards
    if report.settings.max_draft_len == k:
        o = prim.overall
        return o.alpha, o.acceptance_length, o.requests, o.generated_tokens, o.target_forwards
    return None


SA_MODE = "sa"  # alpha --modes' name of the chain with the suffix automaton
# SA must beat the chain by more than run-to-run noise in acceptance length: both margins
SA_MIN_GAIN_REL = 0.03
SA_MIN_GAIN_ABS = 0.05


def sa_line(report: AlphaReport | None, k: int, written: bool) -> str | None:
    """The suffix automaton's verdict as `recommend` prints it, for a report measured with
    ``--modes chain,sa`` (None otherwise): its gain, the rule, and whether sa_config is (or would be)
    written at the recommended K (``sa_at_k``, the decision ``--write`` applies)."""
    threshold, ev = sa_at_k(report, k)
    if ev is None or report is None:
        return None
    lo_hi = f" [{ev['gain_ci95'][0]:+.3f}, {ev['gain_ci95'][1]:+.3f}]" if ev["gain_ci95"] else ""
    head = (
        f"suffix automaton (sa_config): AL {ev['sa_acceptance_length']:.3f} vs chain {ev['chain_acceptance_length']:.3f}, "
        f"gain {ev['sa_acceptance_length'] - ev['chain_acceptance_length']:+.3f}{lo_hi} at K={report.settings.max_draft_len}"
    )
    if threshold is not None:
        return f"{head}: {'wrote' if written else 'wins:'} sa_config {{threshold: {threshold}}}" + ("" if written else " (--write writes it)")
    if "note" in ev:  # it won where measured, not at the recommended K
        return f"{head}: wins, but {ev['note']} to write sa_config at it"
    return f"{head}: no sa_config (the rule: gain >= {SA_MIN_GAIN_REL:.0%} and >= {SA_MIN_GAIN_ABS}, its 95% interval above 0)"


def sa_at_k(report: AlphaReport | None, k: int) -> tuple[int | None, dict | None]:
    """``sa_choice`` at the K that will be written: SA's gain holds at the K it was measured with (at
    another K its K tokens and the chain's differ), so a win measured elsewhere is not written and its
    evidence says which --max-draft-len to measure."""
    threshold, ev = sa_choice(report)
    measured_k = report.settings.max_draft_len if report is not None else None
    if threshold is not None and ev is not None and measured_k is not None and int(measured_k) != k:
        note = f"SA measured at K={measured_k}, K={k} recommended: measure alpha --modes chain,sa --max-draft-len {k}"
        return None, {**ev, "written": False, "note": note}
    return threshold, ev


def sa_choice(report: AlphaReport | None) -> tuple[int | None, dict | None]:
    """(sa_config threshold to write, the measurement it comes from) from an alpha report measured
    with ``--modes chain,sa``: a threshold only when SA's overall acceptance length beats the chain's
    by >= 3% and >= 0.05 and the gain's paired 95% interval lies above 0; (None, None) without both
    modes measured."""
    modes = (report.modes if report is not None else None) or {}
    chain, sa = modes.get("chain"), modes.get("sa")
    if report is None or chain is None or sa is None or sa.sa_config is None:
        return None, None
    al_c, al_s = chain.overall.acceptance_length, sa.overall.acceptance_length
    # the paired 95% interval of the gain over the same turns (measure/mode_compare.py), where the report has one
    ci = sa.vs_chain.ci if sa.vs_chain is not None else None
    beyond_noise = ci is None or ci[0] > 0
    wins = al_c > 0 and al_s - al_c >= SA_MIN_GAIN_ABS and (al_s - al_c) / al_c >= SA_MIN_GAIN_REL and beyond_noise
    ev = {
        "chain_acceptance_length": round(al_c, 4),
        "sa_acceptance_length": round(al_s, 4),
        "gain_ci95": [round(x, 4) for x in ci] if ci is not None else None,
        "threshold": sa.sa_config.threshold,
        "turns": sa.overall.requests,
        "prompts": report.settings.prompts,
        "rule": f"sa_config written when AL gain >= {SA_MIN_GAIN_REL:.0%} and >= {SA_MIN_GAIN_ABS} and its paired 95% interval excludes 0",
        "written": wins,
    }
    return (sa.sa_config.threshold if wins else None), ev


def write_recommendation_to_bundle(
    bundle: Path, rec, source: str | None, report: AlphaReport | None = None, gate_traffic: TrafficAlphaReport | None = None
) -> Bundle:
    """K, the draft_len_schedule and the acceptance gate (``schedule_and_gate``) into
    llm_api_options.yaml (TensorRT-LLM's names), the same and the evidence into
    manifest.json, and the acceptance record at the new K (``acceptance_at``, from ``report``): one
    ``bundle.update``, so the launchers, the digests and the fingerprint follow."""
    if not rec.speculation_pays:
        raise UserError(
            f"{bundle}",
            "speculation is predicted to lose at every batch size; nothing written",
            "train a domain draft head (eagle3-trt train-draft) or serve without speculation",
        )
    b = open_bundle(Path(bundle))
    if rec.max_concurrency is not None and rec.max_concurrency > b.options.max_batch_size:
        raise UserError(
            f"{bundle}",
            f"max_concurrency {rec.max_concurrency} exceeds the bundle's max_batch_size {b.options.max_batch_size}; nothing written",
            "predict over bundle_costs.recommendation_batches(bundle) (recommend does)",
        )
    # the dynamic tree (measure/dynamic_tree_choice.py): its keys when it beats the chain, else removed;
    # when it wins, K is its depth and the schedule only switches speculation off
    dt_fields, dt_evidence = _tree_fields(b, rec, report)
    k = int(dt_fields.pop("max_draft_len", rec.max_draft_len))
    acceptance = acceptance_at(report, k, source, b.manifest.acceptance)
    # the winning method's acceptance gate (gate_choice: the same decision recommend prints without --write)
    choice = gate_choice(rec, report, gate_traffic, b)
    gate = {} if choice is None or choice.window is None else {"acceptance_rate_window_size": choice.window, "acceptance_rate_threshold": choice.threshold}
    spec_knobs = {"draft_len_schedule": dt_fields.pop("draft_len_schedule"), **gate} if dt_fields["use_dynamic_tree"] else schedule_and_gate(rec, gate)
    base = b.options.model_copy(update={"speculative_config": b.options.speculative_config.model_copy(update=dict.fromkeys(DT_KEYS))})
    opts = recommended_options(base, k, **spec_knobs)
    sa_threshold, sa_evidence = sa_at_k(report, k)
    if dt_fields["use_dynamic_tree"] and sa_evidence is not None:
        sa_threshold, sa_evidence = None, {**sa_evidence, "written": False, "note": "the dynamic tree won (TensorRT-LLM refuses it with sa_config)"}
    if sa_evidence is not None:
        # measured: SA's sa_config when it wins, none when it does not (a stale one is removed)
        sa_cfg = SAEnhancerOptions(threshold=sa_threshold) if sa_threshold is not None else None
        opts = opts.model_copy(update={"speculative_config": opts.speculative_config.model_copy(update={"sa_config": sa_cfg})})
    elif opts.speculative_config.sa_config is not None and b.manifest.recommendation is not None:
        sa_evidence = b.manifest.recommendation.evidence.get("sa")  # not measured this time: the enhancer stays, with its evidence
    # the speculative sampling flags temperature > 0 requests are served with (measure/sampling_choice.py)
    sampling_fields, sampling_evidence = sampling_choice(report, opts.speculative_config)
    opts = opts.model_copy(update={"speculative_config": opts.speculative_config.model_copy(update=sampling_fields)})
    rec.evidence["spec_sampling"] = sampling_evidence
    if dt_fields["use_dynamic_tree"]:
        dt_fields["sa_config"] = None  # an enhancer kept from before goes: TensorRT-LLM refuses it with the tree
    opts = validate_options({**opts.model_dump(), "speculative_config": {**opts.speculative_config.model_dump(), **dt_fields}}, f"{b.path}: recommendation")
    if dt_evidence is not None:
        rec.evidence["dynamic_tree"] = dt_evidence
    evidence = bundle_format.Recommendation(
        max_draft_len=k,
        max_concurrency=rec.max_concurrency,
        cumulative_acceptance=rec.cumulative_acceptance,
        measured_on=source,
        evidence={**rec.evidence, "sa": sa_evidence} if sa_evidence else rec.evidence,
        table=rec.table,
        **spec_knobs,
        **{k: v for k, v in dt_fields.items() if k in DT_KEYS and v is not None},
    )
    return bundle_write.update(b.path, options=opts, record=evidence, acceptance=acceptance)


def schedule_and_gate(rec: Recommendation, gate: dict) -> dict:
    """The speculative_config knobs ``recommend --write`` sets beside K for a chain (with or without the
    suffix automaton), in TensorRT-LLM's names (tensorrt_llm/llmapi/llm_args.py ``Eagle3DecodingConfig``):
    ``draft_len_schedule`` (best K per batch size, non-increasing, up to max_concurrency:
    ``cost_model.draft_len_schedule``; it replaces max_concurrency, which TensorRT-LLM would turn into
    ``{max_concurrency: K}`` anyway) and ``gate``, the acceptance gate's two keys (``gate_choice``;
    empty when none is written), or the long-context switch-off where that was replayed to help."""
    knobs: dict = {"draft_len_schedule": draft_len_schedule(rec), **gate}
    rec.evidence["draft_len_schedule_written"] = knobs["draft_len_schedule"]
    ctx = rec.evidence.get("context_switch_off") or {}
    if ctx.get("written"):  # measure/switch_off.py: replayed on the measured traffic, the switch-off at long context's break-even saves time
        knobs.update(acceptance_rate_window_size=ctx["window"], acceptance_rate_threshold=ctx["threshold"])
    return knobs


def _tree_fields(b: Bundle, rec: Recommendation, report: AlphaReport | None) -> tuple[dict, dict | None]:
    """``dynamic_tree_choice`` on a report measured with --modes (the tree's keys all None otherwise)."""
    if report is None or not report.modes:
        return dict.fromkeys(DT_KEYS), None
    return dynamic_tree_choice(report, rec, *dt_inputs(b, rec))


def gate_choice(rec: Recommendation, report: AlphaReport | None, gate_traffic: TrafficAlphaReport | None = None, b: Bundle | None = None) -> GateChoice | None:
    """The acceptance gate of the method ``recommend --write`` writes (the dynamic tree, the suffix
    automaton, else what the bundle serves), one decision for ``recommend`` and ``recommend --write``.
    The chain's: threshold = break-even acceptance at K and the expected concurrency
    (``cost_model.acceptance_gate``), window = the smallest whose replay of the measured requests
    switches speculation off with probability at most ``MAX_TRIP_PROBABILITY`` (measure/gate_replay.py);
    a winning mode's the same way through its own cost hook and measured turns (measure/method_gate.py);
    a method TensorRT-LLM does not serve: one line saying why none applies. Recorded in
    ``rec.evidence["acceptance_gate"]`` (with the line ``recommend`` prints); None when speculation does
    not pay at all. ``gate_traffic``: an ``alpha --traffic`` report whose captured requests are replayed
    instead of the alpha report's (for the chain the bundle serves)."""
    if not rec.speculation_pays:
        return None
    conc = int(rec.evidence.get("chosen_at_concurrency", 1))
    winner = _winning_mode(b, rec, report) if b is not None else None
    if winner is not None:
        mode, k = winner
        assert b is not None and report is not None  # a mode wins only on a report measured with --modes
        choice = mode_gate(mode, rec, report, dt_inputs(b, rec)[0], k)
        _chain_switch_off_not_written(rec, f"the {mode} mode won")
        return _record(rec, choice, {"method": mode}, f"{report.settings.prompts} (alpha --modes {mode})")
    served = bundle_method(b) if b is not None else DEFAULT_METHOD
    why = no_gate_reason(served)
    if why is not None:
        _chain_switch_off_not_written(rec, why)
        return _record(rec, none_applies(served, rec.max_draft_len, conc, why), {"method": served}, None)
    k = rec.max_draft_len
    threshold, how = acceptance_gate(rec)
    src = gate_traffic if gate_traffic is not None else report
    seqs = sequences_at(src, k) if src is not None else None
    if seqs is None:
        reason = (
            f"the alpha --traffic report holds no per-verification acceptance at K={k} (run alpha --traffic --sweep {k} with this version)"
            if gate_traffic is not None
            else f"the alpha report holds no per-verification acceptance at K={k} (measure it again: alpha --sweep {k}, or --max-draft-len {k})"
        )
        choice = GateChoice(None, threshold, None, {"reason": reason, "k": k, "concurrency": conc, "requests": 0})
    else:
        choice = choose_gate(seqs, k, threshold, conc)
    measured_on = (
        f"captured traffic {gate_traffic.traffic} (alpha --traffic, greedy requests)"
        if gate_traffic is not None
        else f"{report.settings.prompts if report is not None else None}"
    )
    return _record(rec, choice, how, measured_on)


def _record(rec: Recommendation, choice: GateChoice, how: dict, measured_on: str | None) -> GateChoice:
    """``choice`` into ``rec.evidence["acceptance_gate"]``, with the line recommend prints."""
    rec.evidence["acceptance_gate"] = {
        **how,
        **choice.evidence,
        "measured_on": measured_on,
        "written": choice.window is not None,
        "line": choice.line() + (f"; measured on {measured_on}" if measured_on else ""),
    }
    return choice


def _winning_mode(b: Bundle, rec: Recommendation, report: AlphaReport | None) -> tuple[str, int] | None:
    """(the alpha --modes mode --write writes instead of what the bundle serves, its K): the dynamic tree
    when it wins (its depth), else the suffix automaton when it wins at the recommended K; None otherwise."""
    fields, _ = _tree_fields(b, rec, report)
    if fields["use_dynamic_tree"]:
        return DYNAMIC_TREE_MODE, int(fields["max_draft_len"])
    threshold, _ = sa_at_k(report, rec.max_draft_len)
    return (SA_MODE, rec.max_draft_len) if threshold is not None else None


def _chain_switch_off_not_written(rec: Recommendation, why: str) -> None:
    """The long-context switch-off was replayed for the chain the bundle serves; it is not written for another method."""
    ctx = rec.evidence.get("context_switch_off") or {}
    if ctx.get("written"):
        ctx["written"] = False
        ctx["lines"] = [ln for ln in ctx["lines"] if not ln.startswith("closest setting:")] + [
            f"closest setting not written: it was replayed for the chain, and {why}"
        ]


def read_gate_traffic(path: Path, b: Bundle) -> TrafficAlphaReport:
    """An ``alpha --traffic`` report of traffic ``b`` itself served, for ``recommend --gate-traffic``; a
    one-line UserError for anything else (another file, or another bundle's traffic)."""
    rep = read_traffic_report(path)
    if rep.bundle_fingerprint != b.manifest.fingerprint:
        raise UserError(
            path,
            f"measures bundle {rep.bundle_fingerprint[:12]}, not {b.path} ({b.manifest.fingerprint[:12]}): its acceptance is another head's",
            "run alpha --traffic with this bundle",
        )
    return rep


def print_recommendation(rec: Recommendation) -> None:
    """The predicted speedup per batch size and K, then the chosen K and max_concurrency."""
    con = Console()
    ks = sorted({r["k"] for r in rec.table})
    tab = Table(title=f"predicted speedup ({rec.evidence['gpu']['name']}, TP{rec.evidence['tp']})")
    tab.add_column("batch", justify="right")
    for k in ks:
        tab.add_column(f"K={k}", justify="right")
    for b in sorted({r["batch"] for r in rec.table}):
        row = {r["k"]: r["speedup"] for r in rec.table if r["batch"] == b}
        tab.add_row(str(b), *[f"{row[k]:.2f}" for k in ks])
    con.print(tab)
    mc = rec.max_concurrency
    con.print(
        f"max_draft_len: {rec.max_draft_len} (chosen among K=1..{max(ks)}; measured K: "
        f"{', '.join(map(str, rec.evidence['measured_k']))}); max_concurrency: {mc}" + ("" if mc else " (speculation never pays here: build without it)")
    )
