"""``recommend``'s work: the acceptance curves it predicts from, the speedup table, and writing the choice into a bundle."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from eagle3_trt.errors import UserError
from eagle3_trt.pipeline import bundle as bundle_format
from eagle3_trt.pipeline import bundle_write
from eagle3_trt.pipeline.bundle import Bundle, open_bundle
from eagle3_trt.pipeline.trtllm_adapter import recommend as recommended_options
from eagle3_trt.runtime.alpha_run import run_alpha
from eagle3_trt.runtime.cost_model import Recommendation
from eagle3_trt.runtime.report_files import read_report, report_curves


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
) -> tuple[list[float], dict[int, list[float]], dict]:
    """(cumulative acceptance, {K: curve measured at K}, the alpha report they come from) from an
    alpha report, else measured on the prompts."""
    if report_file:
        rep = read_report(Path(report_file))
        return (*report_curves(rep, report_file), rep)
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
        return (*report_curves(rep, prompts_file), rep)
    raise UserError("recommend", "needs --report or --prompts", "measure acceptance first with `eagle3-trt alpha`")


def acceptance_at(report: dict, k: int, source: str | None, old: bundle_format.Acceptance | None) -> bundle_format.Acceptance | None:
    """The manifest's acceptance record once K is ``k``: the alpha report's measurement at ``k`` (its
    sweep, or its own run at that K), else the old record with ``measured_on`` saying which K it
    measured, so no K in the manifest reads as the options' K without saying so."""
    prim = report.get("pairs", {}).get("bundle", {})
    entry = (prim.get("sweep") or {}).get(str(k))
    if entry is None and report.get("settings", {}).get("max_draft_len") == k:
        entry = dict(prim.get("overall", {}), turns=prim.get("overall", {}).get("requests"))
    counts = ("alpha", "acceptance_length", "turns", "generated_tokens", "target_forwards")
    if isinstance(entry, dict) and all(isinstance(entry.get(c), int | float) for c in counts):
        return bundle_format.Acceptance(
            alpha=round(float(entry["alpha"]), 4),
            acceptance_length=round(float(entry["acceptance_length"]), 4),
            max_draft_len=k,
            prompts=int(entry["turns"]),
            generated_tokens=int(entry["generated_tokens"]),
            target_forwards=int(entry["target_forwards"]),
            measured_on=f"{source or 'alpha'} (alpha measurement at K={k}, taken by recommend --write), greedy, reference runtime on this bundle",
        )
    if old is None or old.max_draft_len == k:
        return old
    note = f"measured at K={old.max_draft_len}, not at the options' K={k} (recommend --write found no measurement at K={k} in {source or 'its alpha run'}); "
    return old if old.measured_on.startswith("measured at K=") else old.model_copy(update={"measured_on": note + old.measured_on})


def write_recommendation_to_bundle(bundle: Path, rec, source: str | None, report: dict | None = None) -> Bundle:
    """K and max_concurrency into llm_api_options.yaml (TensorRT-LLM's names), the evidence into
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
    opts = recommended_options(b.options, rec.max_draft_len, max_concurrency=rec.max_concurrency)
    evidence = bundle_format.Recommendation(
        max_draft_len=rec.max_draft_len,
        max_concurrency=rec.max_concurrency,
        cumulative_acceptance=rec.cumulative_acceptance,
        measured_on=source,
        evidence=rec.evidence,
        table=rec.table,
    )
    acceptance = acceptance_at(report or {}, rec.max_draft_len, source, b.manifest.acceptance)
    return bundle_write.update(b.path, options=opts, record=evidence, acceptance=acceptance)


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
