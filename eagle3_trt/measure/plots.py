"""The alpha report as a picture: per-position acceptance, acceptance-length histogram, alpha by category."""

from __future__ import annotations

from pathlib import Path

from eagle3_trt.formats.acceptance_by_context import AcceptanceByContext
from eagle3_trt.formats.alpha_report import AlphaReport


def plot_report(report: AlphaReport, path: Path) -> None:
    """PNG: per-position acceptance (cumulative and conditional) and accepted-length histogram, per pair."""
    # local: matplotlib.pyplot takes about half a second to import and only a report written to disk is plotted
    import matplotlib

    matplotlib.use("Agg")  # no display on a server; must precede the pyplot import
    import matplotlib.pyplot as plt  # local: heavy, see above

    pairs = [report.pairs.bundle] + ([report.pairs.reference] if report.pairs.reference else [])
    ctx = report.acceptance_by_context
    ctx_rows = ctx.by_context.rows if ctx is not None else []
    fig, axes = plt.subplots(1, 4 if ctx_rows else 3, figsize=(20 if ctx_rows else 15, 4.2))
    ax1, ax2, ax3 = axes[:3]
    colors = ["tab:blue", "tab:orange"]
    for p, col in zip(pairs, colors):
        o = p.overall
        ks = list(range(1, len(o.cumulative_acceptance) + 1))
        ax1.plot(ks, o.cumulative_acceptance, "o-", color=col, label=f"{p.label} cumulative")
        ax1.plot(ks, o.conditional_acceptance, "s--", color=col, alpha=0.7, label=f"{p.label} conditional")
    K = max(len(p.overall.cumulative_acceptance) for p in pairs)
    ax1.set_xticks(range(1, K + 1))
    ax1.set(xlabel="draft position k", ylabel="acceptance", ylim=(0, 1.02), title="per-position acceptance")
    ax1.legend(fontsize=7)
    width = 0.8 / len(pairs)
    for i, (p, col) in enumerate(zip(pairs, colors)):
        h = p.overall.accept_hist
        h = h + [0] * (K + 1 - len(h))
        tot = max(sum(h), 1)
        ax2.bar([a + 1 + (i - (len(pairs) - 1) / 2) * width for a in range(len(h))], [x / tot for x in h], width, color=col, label=p.label)
    ax2.set_xticks(range(1, K + 2))
    ax2.set(xlabel="tokens per target forward (accepted + 1)", ylabel="fraction of iterations", title="acceptance length histogram")
    ax2.legend(fontsize=7)
    cats = list(pairs[0].by_category)
    for i, (p, col) in enumerate(zip(pairs, colors)):
        ax3.bar(
            [j + (i - (len(pairs) - 1) / 2) * width for j in range(len(cats))],
            [p.by_category[c].alpha if c in p.by_category else 0 for c in cats],
            width,
            color=col,
            label=p.label,
        )
    ax3.set_xticks(range(len(cats)), cats, rotation=30, ha="right", fontsize=8)
    ax3.set(ylabel="alpha", ylim=(0, 1), title="alpha by category")
    ax3.legend(fontsize=7)
    if ctx is not None and ctx_rows:
        _plot_by_context(axes[3], ctx, pairs[0].label)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_by_context(ax, ctx: AcceptanceByContext, label: str) -> None:
    """AL per decode forward by tokens of context at the verification (measure/context_buckets.py),
    each bar labelled with its alpha and forwards."""
    rows = ctx.by_context.rows
    x = range(len(rows))
    ax.bar(x, [r.acceptance_length for r in rows], 0.6, color="tab:blue", label=label)
    for i, r in enumerate(rows):
        ax.text(i, r.acceptance_length, f"alpha {r.alpha:.2f}\n{r.forwards} fwd", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(x), [r.bucket for r in rows], fontsize=8)
    top = max(r.acceptance_length for r in rows)
    ax.set(xlabel="tokens of context at the verification", ylabel="tokens per decode forward (AL)", ylim=(0, top * 1.25 + 0.1))
    ax.set_title(f"acceptance by context (K={ctx.k})")
    ax.legend(fontsize=7, loc="lower left")
