"""The alpha report for people: deltas against the reference pair and the console summary."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from eagle3_trt.core.stats import AggregateStats
from eagle3_trt.formats.alpha_report import AlphaReport, CostRecommendation, Delta, Deltas, ModeEntry, PairMeasurement, SweepPoint
from eagle3_trt.measure.acceptance import Measurement
from eagle3_trt.measure.context_buckets import render_context_tables


def compare(primary: Measurement, reference: Measurement | None) -> Deltas:
    """alpha / AL deltas (primary - reference), overall and per category present in both."""
    if reference is None:
        return Deltas.model_validate({})  # written as {} (no reference pair)

    def d(a: AggregateStats, b: AggregateStats) -> Delta:
        return Delta(
            alpha=a.alpha - b.alpha,
            acceptance_length=a.acceptance_length - b.acceptance_length,
            cumulative_acceptance=[x - y for x, y in zip(a.cumulative_acceptance, b.cumulative_acceptance)],
        )

    pc, rc = primary.by_category(), reference.by_category()
    return Deltas(overall=d(primary.overall(), reference.overall()), by_category={c: d(pc[c], rc[c]) for c in pc if c in rc})


def summary_console(report: AlphaReport, width: int = 110) -> Console:
    """A recording rich Console holding the human summary of an alpha report (for summary.txt)."""
    con = Console(record=True, width=width, file=io.StringIO(), highlight=False)
    render_summary(report, con)
    return con


def render_summary(report: AlphaReport, con: Console) -> None:
    """Tables of the report (per category, per position, sweep), warnings, diagnostics, recommendation."""
    prim, ref = report.pairs.bundle, report.pairs.reference
    con.print(_category_table(report, prim, ref))
    con.print(_position_table(prim, ref))
    render_context_tables(report, con)  # AL and alpha by context and prompt length (measure/context_buckets.py)
    if prim.sweep:
        con.print(_sweep_table(prim.sweep))
    if report.modes:
        con.print(_modes_table(report.modes))
    for p in [prim] + ([ref] if ref else []):
        _print_pair_notes(p, con)
    if report.numerics_note:
        con.print(f"note: {report.numerics_note}", highlight=False)
    for c in report.diagnostics:
        mark = "[red]PROBLEM[/]" if not c.ok else "[cyan]info[/]" if c.info else "[green]ok[/]"
        con.print(f"{mark} {c.check}: {c.detail}", highlight=False)
    if report.recommendation:
        _print_recommendation(report.recommendation, con)


def _category_table(report: AlphaReport, prim: PairMeasurement, ref: PairMeasurement | None) -> Table:
    tab = Table(title=f"acceptance on {report.settings.prompts} (greedy, K={report.settings.max_draft_len})")
    tab.add_column("category")
    tab.add_column("turns", justify="right")
    tab.add_column(f"alpha {prim.label}", justify="right")
    if ref:
        tab.add_column(f"alpha {ref.label}", justify="right")
        tab.add_column("delta", justify="right")
    tab.add_column("AL", justify="right")
    if ref:
        tab.add_column("AL ref", justify="right")
    cats = list(prim.by_category) + ["overall"]
    for c in cats:
        a = prim.overall if c == "overall" else prim.by_category[c]
        row = [c, str(a.requests), f"{a.alpha:.3f}"]
        if ref:
            b = ref.overall if c == "overall" else ref.by_category.get(c)
            row += [f"{b.alpha:.3f}", f"{a.alpha - b.alpha:+.3f}"] if b else ["-", "-"]
        row.append(f"{a.acceptance_length:.2f}")
        if ref:
            row.append(f"{b.acceptance_length:.2f}" if b else "-")
        tab.add_row(*row, style="bold" if c == "overall" else None)
    return tab


def _position_table(prim: PairMeasurement, ref: PairMeasurement | None) -> Table:
    pos = Table(title="per-position acceptance (overall): cumulative P(first k accepted) / conditional P(k | 1..k-1)")
    pos.add_column("pair")
    K = len(prim.overall.cumulative_acceptance)
    for k in range(K):
        pos.add_column(f"k={k + 1}", justify="right")
    for p in [prim] + ([ref] if ref else []):
        o = p.overall
        pos.add_row(p.label, *[f"{c:.2f} / {q:.2f}" for c, q in zip(o.cumulative_acceptance, o.conditional_acceptance)])
    return pos


def _modes_table(modes: dict[str, ModeEntry]) -> Table:
    """Per speculation mode (alpha --modes), overall and per category."""
    t = Table(title="speculation modes: acceptance length / alpha / tokens verified per target forward; AL gain over the chain (paired 95% interval)")
    t.add_column("mode")
    t.add_column("category")
    for c in ("acceptance length", "alpha", "verified/forward", "vs chain"):
        t.add_column(c, justify="right")
    for mode, e in modes.items():
        vs = e.vs_chain
        gain = f"{vs.diff:+.3f} [{vs.ci[0]:+.3f}, {vs.ci[1]:+.3f}]" if vs else ""
        for cat, f in [("overall", e.overall), *e.by_category.items()]:
            t.add_row(
                f"{mode} ({e.method})" if cat == "overall" else mode,
                cat,
                f"{f.acceptance_length:.3f}",
                f"{f.alpha:.3f}",
                f"{f.tokens_verified_per_forward:.2f}",
                gain if cat == "overall" else "",
            )
    return t


def _sweep_table(sweep: dict[int, SweepPoint]) -> Table:
    sw = Table(title="draft length sweep (one continuation, replayed per K): measured vs the cost model's E_K")
    sw.add_column("K", justify="right")
    for col in ("alpha", "AL measured", "AL predicted"):
        sw.add_column(col, justify="right")
    for k, v in sweep.items():
        sw.add_row(str(k), f"{v.alpha:.3f}", f"{v.acceptance_length:.2f}", f"{v.predicted_acceptance_length:.2f}")
    return sw


def _print_pair_notes(p: PairMeasurement, con: Console) -> None:
    """How one pair's prompts were encoded, and what it skipped."""
    raw = p.raw_prompts
    if raw:
        con.print(
            f"note: {p.label}: {raw} of {len(p.requests)} prompts measured as raw completion text (no chat template, BOS as the tokenizer adds it)",
            highlight=False,
        )
    if not p.chat_template and raw < len(p.requests):
        con.print(f"[yellow]warning:[/] {p.label}: the tokenizer has no chat template; chat prompts were sent as plain text")
    for sk in p.skipped:
        con.print(f"[yellow]skipped[/] ({p.label}): {sk}")


def _print_recommendation(rec: CostRecommendation, con: Console) -> None:
    ev = rec.evidence  # the cost model's own record (measure/cost_model.py recommend)
    mc = rec.max_concurrency
    con.print(
        f"recommendation for {ev['gpu']['name']} (TP{ev['tp']}): max_draft_len={rec.max_draft_len}, "
        + (f"speculation off above concurrency {mc}" if mc else "speculation does not pay at any batch size")
        + f" (predicted speedup at batch {ev['chosen_at_concurrency']}: {ev['speedup_at_concurrency']:.2f}x)",
        highlight=False,
    )
