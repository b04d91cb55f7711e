"""The alpha report as a picture: per-position acceptance, acceptance-length histogram, alpha by category."""

from __future__ import annotations

from pathlib import Path


def plot_report(report: dict, path: Path) -> None:
    """PNG: per-position acceptance (cumulative and conditional) and accepted-length histogram, per pair."""
    # local: matplotlib.pyplot takes about half a second to import and only a report written to disk is plotted
    import matplotlib

    matplotlib.use("Agg")  # no display on a server; must precede the pyplot import
    import matplotlib.pyplot as plt  # local: heavy, see above

    pairs = [report["pairs"]["bundle"]] + ([report["pairs"]["reference"]] if report["pairs"].get("reference") else [])
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.2))
    colors = ["tab:blue", "tab:orange"]
    for p, col in zip(pairs, colors):
        o = p["overall"]
        ks = list(range(1, len(o["cumulative_acceptance"]) + 1))
        ax1.plot(ks, o["cumulative_acceptance"], "o-", color=col, label=f"{p['label']} cumulative")
        ax1.plot(ks, o["conditional_acceptance"], "s--", color=col, alpha=0.7, label=f"{p['label']} conditional")
    K = max(len(p["overall"]["cumulative_acceptance"]) for p in pairs)
    ax1.set_xticks(range(1, K + 1))
    ax1.set(xlabel="draft position k", ylabel="acceptance", ylim=(0, 1.02), title="per-position acceptance")
    ax1.legend(fontsize=7)
    width = 0.8 / len(pairs)
    for i, (p, col) in enumerate(zip(pairs, colors)):
        h = p["overall"]["accept_hist"]
        h = h + [0] * (K + 1 - len(h))
        tot = max(sum(h), 1)
        ax2.bar([a + 1 + (i - (len(pairs) - 1) / 2) * width for a in range(len(h))], [x / tot for x in h], width, color=col, label=p["label"])
    ax2.set_xticks(range(1, K + 2))
    ax2.set(xlabel="tokens per target forward (accepted + 1)", ylabel="fraction of iterations", title="acceptance length histogram")
    ax2.legend(fontsize=7)
    cats = list(pairs[0]["by_category"])
    for i, (p, col) in enumerate(zip(pairs, colors)):
        ax3.bar(
            [j + (i - (len(pairs) - 1) / 2) * width for j in range(len(cats))],
            [p["by_category"].get(c, {}).get("alpha", 0) for c in cats],
            width,
            color=col,
            label=p["label"],
        )
    ax3.set_xticks(range(len(cats)), cats, rotation=30, ha="right", fontsize=8)
    ax3.set(ylabel="alpha", ylim=(0, 1), title="alpha by category")
    ax3.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
