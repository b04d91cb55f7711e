"""Write the rollout report: bench.json, summary.md and PNG plots, atomically into one folder."""

from __future__ import annotations

import json
from pathlib import Path

from eagle3_trt.atomic import staged_dir
from eagle3_trt.clients.bench import BenchRun
from eagle3_trt.clients.bench_stats import MIN_P99_SAMPLES

PLOTS = ("latency_cdf.png", "itl_vs_concurrency.png", "throughput_vs_concurrency.png", "acceptance_by_position.png")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def _f(v: float | None, nd: int = 3) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def _headline(run: BenchRun) -> str:
    g = run.gate
    if g.verdict == "pass":
        return "PASS"
    if g.verdict == "pass_with_switch_off":
        # Not a PASS: speculation loses above this concurrency and must be switched off there.
        return f"SPECULATION ONLY UP TO CONCURRENCY {g.switch_off_above}"
    return "FAIL"


def _environment_lines(env: dict) -> list[str]:
    if not env:
        return ["- environment not recorded"]
    server = env.get("server", {})
    params = env.get("model_parameters", {})
    bundle = env.get("bundle", {})
    client = env.get("client", {})
    lines = [
        f"- server: {server.get('name', '?')} {server.get('version', server.get('error', '?'))}; runtime `{params.get('eagle3_runtime', '?')}`",
        f"- bundle: `{bundle.get('path', params.get('eagle3_bundle', '?'))}`, fingerprint `{bundle.get('fingerprint', bundle.get('error', 'unknown'))}`"
        + (f", {bundle.get('label')}, K={bundle.get('k')}, max_concurrency {bundle.get('max_concurrency')}" if "fingerprint" in bundle else ""),
    ]
    if bundle.get("built_with"):
        lines.append("- bundle built with: " + ", ".join(f"{k} {v}" for k, v in bundle["built_with"].items() if v))
    lines.append("- client: " + ", ".join(f"{k} {v}" for k, v in client.items() if v))
    return lines


def _gate_row(r: dict) -> str:
    if r["itl_ok"] is None:
        status = "not judged: the server ran this level without speculation (max_concurrency)"
    elif r["itl_ok"]:
        status = "ok"
    else:
        status = "**FAIL: speculation is slower here; switch it off**"
    thin = f" (warning: {', '.join(r['thin_p99'])})" if r.get("thin_p99") else ""
    return f"  - C={r['concurrency']}: {_ms(r['itl_p99_on_s'])} ms on vs {_ms(r['itl_p99_off_s'])} ms off -> {status}{thin}"


def _identity_lines(idt: dict) -> list[str]:
    if not idt:
        return []
    if not idt.get("checked"):
        return ["## Greedy text, speculation on vs off", "", f"Not checked: {idt.get('reason')}.", ""]
    lines = ["## Greedy text, speculation on vs off", ""]
    if not idt["compared"]:
        return lines + ["No request succeeded in both arms; nothing compared.", ""]
    lines.append(
        f"{idt['diverged']} of {idt['compared']} requests differ ({idt['rate']:.1%}). "
        + (
            "Identical everywhere."
            if not idt["diverged"]
            else "A quantized bundle can differ on float near-ties (verification of K+1 positions in one forward rounds "
            "differently from one-token decoding); a rate well above a few percent, or a difference early in most "
            "texts, points to a bug instead."
        )
    )
    for ex in idt.get("examples", []):
        lines.append(
            f"- C={ex['concurrency']} request {ex['request']} (prompt {ex['prompt_index']}), first difference at character "
            f"{ex['first_difference_at_char']}: on `{ex['on']!r}` vs off `{ex['off']!r}`"
        )
    return lines + [""]


def _samples(run: BenchRun, n: int = 3, chars: int = 300) -> list[str]:
    recs = sorted((r for r in run.records if r.ok and r.text), key=lambda r: (r.concurrency, r.request_index, not r.speculative))
    seen, lines = set(), ["## Sample of generated text", ""]
    for r in recs:
        key = (r.concurrency, r.request_index)
        if key in seen:
            continue
        seen.add(key)
        if len(seen) > n:
            break
        pair = [x for x in recs if (x.concurrency, x.request_index) == key]
        for x in pair:
            text = x.text if len(x.text) <= chars else x.text[:chars] + " ..."
            lines += [
                f"C={x.concurrency}, prompt {x.prompt_index}, speculation {'on' if x.speculative else 'off'} ({x.n_tokens} tokens, {x.finish_reason}):",
                "",
                "```text",
                text,
                "```",
                "",
            ]
    return lines if len(lines) > 2 else []


def markdown(run: BenchRun) -> str:
    g = run.gate
    cfg = run.config
    openai = cfg.get("endpoint") == "openai"
    switch = "the `eagle3_speculative=false` request annotation (`nvext.annotations`)" if openai else "the `speculative_decoding` request input"
    kind = ("Dynamo (OpenAI API, " + ("/v1/chat/completions" if cfg.get("chat", True) else "/v1/completions") + ")") if openai else "Triton"
    lines = [
        "# EAGLE-3 rollout benchmark",
        "",
        f"Server: {kind} `{cfg['url']}`, model `{cfg['model']}`"
        + (f" (baseline model `{cfg['baseline_model']}`)" if cfg.get("baseline_model") else f" (speculation off via {switch})")
        + f"; {cfg['num_prompts']} prompts, max_tokens {cfg['max_tokens']}, took {run.took_s:.1f} s.",
        "",
        *_environment_lines(run.environment),
        "",
        f"## Gate: **{_headline(run)}**",
        "",
        f"- alpha = {_f(g.alpha)} (from the {g.alpha_source}); threshold {g.alpha_threshold} -> {'ok' if g.alpha_ok else 'FAIL'}",
        f"- P99 ITL with speculation must not be worse than without (tolerance {g.itl_tolerance:.0%}), per concurrency:",
    ]
    lines += [_gate_row(r) for r in g.per_concurrency]
    lines += [f"- **Recommendation:** {g.recommendation}", ""]
    thin = [(a, a.thin_p99()) for a in run.arms if a.thin_p99()]
    if thin:
        lines += [
            f"**Warning:** some p99 figures rest on fewer than {MIN_P99_SAMPLES} samples, where the p99 is the largest "
            "value or next to it (more requests: `--requests`, or longer outputs: `--max-tokens`):"
        ]
        lines += [f"- C={a.concurrency} speculation {'on' if a.speculative else 'off'}: {', '.join(t)}" for a, t in thin]
        lines.append("")
    lines += [
        "## Results",
        "",
        "| C | spec | req | err | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | latency p50 s | latency p99 s | out tok/s | alpha (resp) | AL (resp) | alpha (metrics) | AL (metrics) |",
        "|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for a in run.arms:
        spec = ("on (server: off)" if a.speculation_switched_off else "on") if a.speculative else "off"
        lines.append(
            f"| {a.concurrency} | {spec} | {a.requests} | {a.errors} | {_ms(a.ttft_p50_s)} | {_ms(a.ttft_p99_s)} | "
            f"{_ms(a.itl_p50_s)} | {_ms(a.itl_p99_s)} | {_f(a.latency_p50_s, 2)} | {_f(a.latency_p99_s, 2)} | "
            f"{a.output_tokens_per_s:.1f} | {_f(a.alpha_responses)} | {_f(a.al_responses, 2)} | {_f(a.alpha_metrics)} | {_f(a.al_metrics, 2)} |"
        )
    pos = _pooled_position_acceptance(run)
    lines += [
        "",
        "AL = tokens per verification step (accepted draft tokens + 1). ITL is per token: the gap between",
        "two streamed responses divided by the tokens the later one carries.",
        "",
    ]
    if pos:
        lines += [
            "Cumulative acceptance by draft position (metrics endpoint, all speculative runs): " + ", ".join(f"{k + 1}: {v:.3f}" for k, v in enumerate(pos)),
            "",
        ]
    lines += _identity_lines(run.identity)
    lines += _samples(run)
    lines += ["Plots: " + ", ".join(f"[{p}]({p})" for p in PLOTS), ""]
    return "\n".join(lines)


def _pooled_position_acceptance(run: BenchRun) -> list[float]:
    drafted: list[float] = []
    accepted: list[float] = []
    for a in run.arms:
        if not a.speculative or not a.drafted_by_position:
            continue
        for k, (d, rate) in enumerate(zip(a.drafted_by_position, a.acceptance_by_position)):
            if len(drafted) <= k:
                drafted.append(0.0)
                accepted.append(0.0)
            drafted[k] += d
            accepted[k] += d * rate
    return [acc / d if d else 0.0 for acc, d in zip(accepted, drafted)]


def _save_concurrency_plot(fig, ax, levels: list[int], ylabel: str, title: str, path: Path) -> None:
    """Log2 concurrency axis, labels, grid and legend; write the PNG and close the figure."""
    import matplotlib.pyplot as plt  # local: about half a second to import; plot_all has set the Agg backend

    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.set_xlabel("concurrency")
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)  # a truncated axis exaggerates differences
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_all(run: BenchRun, out: Path) -> None:
    # local: matplotlib.pyplot takes about half a second to import and only a written report is plotted
    import matplotlib

    matplotlib.use("Agg")  # no display on a server; must precede the pyplot import
    import matplotlib.pyplot as plt  # local: heavy, see above

    levels = sorted({a.concurrency for a in run.arms})
    _plot_latency_cdf(plt, run, levels, out / "latency_cdf.png")
    _plot_itl(plt, run, levels, out / "itl_vs_concurrency.png")
    _plot_throughput(plt, run, levels, out / "throughput_vs_concurrency.png")
    _plot_acceptance(plt, run, out / "acceptance_by_position.png")


def _plot_latency_cdf(plt, run: BenchRun, levels: list[int], path: Path) -> None:
    colors = {c: plt.cm.viridis(i / max(1, len(levels) - 1)) for i, c in enumerate(levels)}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for c in levels:
        for spec in (True, False):
            lat = sorted(r.latency_s for r in run.records if r.ok and r.concurrency == c and r.speculative == spec)
            if lat:
                ys = [(i + 1) / len(lat) for i in range(len(lat))]
                ax.step(lat, ys, where="post", color=colors[c], linestyle="-" if spec else "--", label=f"C={c} {'on' if spec else 'off'}")
    ax.set_xlabel("request latency (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("Latency CDF (solid: speculation on, dashed: off)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _series(run: BenchRun, attr: str, spec: bool) -> tuple[list, list]:
    """(concurrency levels, values of ``attr``) of the arms with speculation ``spec`` that have the value."""
    pts = [(a.concurrency, getattr(a, attr)) for a in run.arms if a.speculative == spec and getattr(a, attr) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def _plot_itl(plt, run: BenchRun, levels: list[int], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for spec, style in ((True, "-"), (False, "--")):
        for attr, marker, color in (("itl_p50_s", "o", "tab:blue"), ("itl_p99_s", "s", "tab:red")):
            xs, ys = _series(run, attr, spec)
            ax.plot(xs, [y * 1000 for y in ys], style, marker=marker, color=color, label=f"{attr[4:7]} {'on' if spec else 'off'}")
    _save_concurrency_plot(fig, ax, levels, "inter-token latency (ms)", "ITL vs concurrency (solid: speculation on, dashed: off)", path)


def _plot_throughput(plt, run: BenchRun, levels: list[int], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for spec, style in ((True, "-o"), (False, "--s")):
        xs, ys = _series(run, "output_tokens_per_s", spec)
        ax.plot(xs, ys, style, label=f"speculation {'on' if spec else 'off'}")
    _save_concurrency_plot(fig, ax, levels, "output tokens/s", "Throughput vs concurrency", path)


def _plot_acceptance(plt, run: BenchRun, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    pos = _pooled_position_acceptance(run)
    if pos:
        ax.bar([str(k + 1) for k in range(len(pos))], pos, color="tab:blue")
        for k, v in enumerate(pos):
            ax.text(k, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
        ax.set_ylim(0, 1.05)
    else:
        ax.text(0.5, 0.5, "per-position counters unavailable\n(metrics endpoint not read)", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("draft position")
    ax.set_ylabel("cumulative acceptance P(1..k accepted)")
    ax.set_title("Acceptance by draft position (speculative runs, metrics endpoint)")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(run: BenchRun, out: Path) -> Path:
    """bench.json + summary.md + plots into ``out`` (temp folder next to it, then renamed)."""
    out = Path(out)
    with staged_dir(out) as tmp:
        (tmp / "bench.json").write_text(json.dumps(run.to_json(), indent=2) + "\n")
        (tmp / "summary.md").write_text(markdown(run))
        plot_all(run, tmp)
    return out


__all__ = ["PLOTS", "markdown", "plot_all", "write_report"]
