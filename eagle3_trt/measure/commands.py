"""CLI commands of the reference runtime: ``alpha``, ``gate`` and ``recommend`` (registered by eagle3_trt.cli)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from eagle3_trt.atomic import check_writable
from eagle3_trt.errors import GateFailed, UserError
from eagle3_trt.formats.alpha_report import AlphaReport, report_json
from eagle3_trt.measure.acceptance import incomplete
from eagle3_trt.measure.against import method_choice_from_report
from eagle3_trt.measure.against_command import AGAINST_HELP, alpha_against
from eagle3_trt.measure.alpha_report import render_summary
from eagle3_trt.measure.alpha_run import run_alpha
from eagle3_trt.measure.bundle_costs import bundle_cost_inputs, recommendation_batches
from eagle3_trt.measure.cost_model import recommend
from eagle3_trt.measure.dynamic_tree_choice import dynamic_tree_summary
from eagle3_trt.measure.gate import run_gate
from eagle3_trt.measure.gate_verdict import DEFAULT_GATE_THRESHOLD
from eagle3_trt.measure.recommendation import (
    acceptance_curves,
    gate_choice,
    print_recommendation,
    read_gate_traffic,
    sa_line,
    write_recommendation_to_bundle,
)
from eagle3_trt.measure.report_files import write_report
from eagle3_trt.measure.switch_off import context_switch_off
from eagle3_trt.measure.traffic_alpha import AL_TOLERANCE
from eagle3_trt.measure.traffic_commands import alpha_traffic, gate_traffic
from eagle3_trt.measure.traffic_gate import DEFAULT_MARGIN
from eagle3_trt.pipeline.bundle import open_bundle
from eagle3_trt.progress import Bars
from eagle3_trt.runtime.distributed import launch, relaunch_argv, tp_session, under_torchrun
from eagle3_trt.speculative.dynamic_tree.mode import DEFAULT_TOPK as DYNAMIC_TREE_DEFAULT_TOPK
from eagle3_trt.speculative.registry import DEFAULT_METHOD


def parse_sweep(text: str | None) -> tuple[int, ...]:
    """'1-5' or '1,2,4' (or a mix) -> sorted draft lengths."""
    if not text:
        return ()
    ks: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        try:
            a, b = int(lo), int(hi if dash else lo)
        except ValueError:
            raise UserError("--sweep", f"{part.strip()!r} in {text!r} is not a draft length or range", "use e.g. 1-5 or 1,2,4") from None
        if not 1 <= a <= b <= 16:
            raise UserError("--sweep", f"{part.strip()!r} in {text!r}", "ranges go up, within draft lengths 1..16")
        ks.update(range(a, b + 1))
    return tuple(sorted(ks))


def tensor_parallel(option: str = "--tp") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--tp N`` on a measuring command: the target split over N GPUs of this node (runtime/distributed.py).
    Outside torchrun it starts ``torchrun --nproc-per-node N`` with the same command line; inside,
    each rank runs the command on its own device, and rank 0 alone prints and writes. ``option``:
    the flag's name (recommend's --tp is the deployment's TP its prediction is for)."""
    dest = option.lstrip("-").replace("-", "_")

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*args: Any, **kw: Any) -> Any:
            tp = int(kw.pop(dest))
            if tp < 1:
                raise UserError(option, f"{tp}", "tensor parallelism is at least 1")
            if tp > 1 and not under_torchrun():
                return launch(relaunch_argv(click.get_current_context()), tp)
            with tp_session(tp, kw.get("device")) as device:
                kw["device"] = device
                click.get_current_context().params["device"] = device  # the forms that read ctx.params (--against)
                return fn(*args, **kw)

        return click.option(
            option,
            dest,
            type=int,
            default=1,
            show_default=True,
            help="measure with the target split over N GPUs of this node (tensor parallel; starts torchrun --nproc-per-node N); rank 0 writes",
        )(run)

    return wrap


def _print_summary(report: AlphaReport) -> None:
    render_summary(report, Console(highlight=False))


CHAT_TEMPLATE_OPTION = click.option(
    "--chat-template/--no-chat-template",
    "chat_template",
    default=None,
    help="default: chat records (turns/messages) through the bundle's chat template, raw completion records "
    '({"text"}/{"prompt"}) as they are; --no-chat-template: every prompt raw, as a /v1/completions request '
    "(plain-text lines too; chat records are refused); --chat-template: every prompt as a user turn",
)
TRAFFIC_HELP = "a capture directory (serve --capture DIR): the requests as served, measured on the token ids the model saw"
PROMPTS_HELP = (
    'JSONL: chat records {"turns": [...]} (MT-Bench layout, optional "category") or {"messages": [...]}, '
    'raw completion records {"text": ...} or {"prompt": ...}; or plain text, one prompt a line; or a held-out '
    'prompts file {"prompts": [[token ids], ...]} (models/tiny/heldout_prompts.json: token ids measured as stored)'
)


@click.command("alpha")
@click.argument("bundle", type=click.Path(file_okay=False))
@click.option("--prompts", "prompts_file", default=None, type=click.Path(dir_okay=False), help=PROMPTS_HELP + " (or --traffic)")
@click.option("--traffic", "traffic_dir", default=None, type=click.Path(), help=TRAFFIC_HELP)
@click.option("--against", "against", default=None, type=click.Path(file_okay=False), help=AGAINST_HELP)
@click.option(
    "--tolerance",
    type=float,
    default=AL_TOLERANCE,
    show_default=True,
    help="--traffic: AL difference (tokens per forward) beyond the 95% interval that is flagged",
)
@click.option("--window", type=int, default=None, help="--traffic: requests per drift window (default: about a tenth of the traffic, at least 10)")
@click.option("--reference-bundle", type=click.Path(file_okay=False), default=None, help="compare with this bundle (e.g. a BF16 one)")
@click.option(
    "--bf16/--no-bf16", "bf16", default=None, help="compare with the BF16 sources in manifest.json (default: when the bundle is quantized and they exist)"
)
@click.option("--max-tokens", type=int, default=128, show_default=True, help="tokens generated per turn")
@click.option("--limit", type=int, default=None, help="first N prompt records only")
@click.option("--turns", type=click.Choice(["all", "first"]), default="all", show_default=True, help="later turns see the target's own earlier replies")
@click.option("--max-draft-len", type=int, default=None, help="K to measure (default: the bundle's; larger K shows what longer drafts would give)")
@click.option(
    "--method",
    type=click.Choice(["estimator", "generate"]),
    default="estimator",
    show_default=True,
    help="estimator: teacher-forced, identical counts, fast; generate: run speculative decoding",
)
@click.option("--device", default=None, help="cpu or cuda[:i] (default: cuda when available)")
@click.option("--batch-size", type=int, default=16, show_default=True)
@click.option("--concurrency", type=int, default=1, show_default=True, help="batch size the K recommendation optimizes for")
@click.option(
    "--sweep",
    default=None,
    help="also measure these draft lengths, e.g. 1-5 or 1,2,4 (estimator; one continuation serves all); `recommend --report` may then choose any of them",
)
@CHAT_TEMPLATE_OPTION
@click.option(
    "--modes",
    default=None,
    help="also measure these speculation modes, comma-separated: chain (the neural chain), sa (chain + TensorRT-LLM's suffix-automaton enhancer, sa_config), "
    "dynamic-tree (TensorRT-LLM's use_dynamic_tree, by speculative generation)",
)
@click.option("--sa-threshold", type=int, default=4, show_default=True, help="sa mode: minimum suffix-match length for the automaton to override the draft")
@click.option(
    "--dynamic-tree-topk",
    type=int,
    default=DYNAMIC_TREE_DEFAULT_TOPK,
    show_default=True,
    help="dynamic-tree mode: TensorRT-LLM's dynamic_tree_max_topK, the nodes expanded per draft layer",
)
@click.option(
    "--max-total-draft-tokens",
    type=int,
    default=None,
    help="dynamic-tree mode: tree nodes verified per step, in [K, topK*K] (default: TensorRT-LLM's, topK * max_draft_len)",
)
@click.option(
    "--temperature",
    type=float,
    default=0.0,
    show_default=True,
    help="sample at this temperature (with --method generate), served as TensorRT-LLM serves the bundle's speculative sampling flags",
)
@click.option("-o", "--out", default=None, help="report dir (default: reports/alpha-<bundle name>)")
@click.option("--json", "as_json", is_flag=True, help="print the report JSON on stdout")
@tensor_parallel()
def alpha_cmd(
    bundle: str,
    prompts_file: str,
    reference_bundle: str | None,
    bf16: bool | None,
    max_tokens: int,
    limit: int | None,
    turns: str,
    max_draft_len: int | None,
    method: str,
    device: str | None,
    batch_size: int,
    concurrency: int,
    sweep: str | None,
    chat_template: bool | None,
    modes: str | None,
    sa_threshold: int,
    temperature: float,
    out: str | None,
    as_json: bool,
    traffic_dir: str | None = None,
    tolerance: float = AL_TOLERANCE,
    window: int | None = None,
    dynamic_tree_topk: int = DYNAMIC_TREE_DEFAULT_TOPK,
    max_total_draft_tokens: int | None = None,
    against: str | None = None,
) -> None:
    """Measure acceptance (alpha) of BUNDLE's quantized pair on your prompts, per category, vs BF16."""
    if against is not None:  # two bundles of one target side by side (measure/against_command.py)
        return alpha_against(click.get_current_context(), bundle, against, prompts_file, traffic_dir)
    if traffic_dir is not None or prompts_file is None:
        if prompts_file is not None or traffic_dir is None:
            raise UserError(
                "--prompts" if traffic_dir is None else "--traffic",
                "missing" if traffic_dir is None else "does not go with --prompts",
                "pass --prompts FILE or --traffic DIR",
            )
        return alpha_traffic(
            click.get_current_context(),
            bundle,
            traffic_dir,
            device=device,
            batch_size=batch_size,
            sweep=parse_sweep(sweep),
            tolerance=tolerance,
            window=window,
            out=out,
            as_json=as_json,
        )
    open_bundle(Path(bundle))  # a one-line error before any model is loaded
    dest = Path(out) if out else Path("reports") / f"alpha-{Path(bundle).resolve().name}"
    check_writable(dest)  # not after an hour of measuring a 70B pair
    with Bars() as bars:  # the measuring shows prompts done / total, tokens and elapsed time
        report = run_alpha(
            Path(bundle),
            Path(prompts_file),
            reference_bundle=Path(reference_bundle) if reference_bundle else None,
            bf16=bf16,
            max_tokens=max_tokens,
            limit=limit,
            turns=turns,
            max_draft_len=max_draft_len,
            method=method,
            device=device,
            batch_size=batch_size,
            concurrency=concurrency,
            sweep=parse_sweep(sweep),
            chat_template=chat_template,
            modes=tuple(m.strip() for m in modes.split(",") if m.strip()) if modes else (),
            sa_threshold=sa_threshold,
            temperature=temperature,
            dynamic_tree_topk=dynamic_tree_topk,
            max_total_draft_tokens=max_total_draft_tokens,
            progress=bars.say,
            tasks=bars.task,
        )
    write_report(report, dest)
    if as_json:
        click.echo(json.dumps(report_json(report), indent=1))
    else:
        _print_summary(report)
        click.echo(f"report: {dest}/report.json, {dest}/summary.txt, {dest}/alpha.png")
    p = report.pairs.bundle  # fewer turns measured than asked: the report says which and why, the exit says so
    short = incomplete(p.requests_asked, len(p.requests), p.skipped, str(prompts_file))
    if short is not None:
        raise short


@click.command("gate")
@click.argument("bundle", type=click.Path(file_okay=False))
@click.option("--prompts", "prompts_file", default=None, type=click.Path(dir_okay=False), help=PROMPTS_HELP + " (or --against OLD --traffic DIR)")
@click.option("--against", default=None, type=click.Path(file_okay=False), help="OLD: the bundle serving now; BUNDLE (NEW) must beat it on --traffic")
@click.option("--traffic", "traffic_dir", default=None, type=click.Path(), help=TRAFFIC_HELP + "; measured on its held-back split")
@click.option(
    "--margin", type=float, default=DEFAULT_MARGIN, show_default=True, help="--against: AL gain (tokens per forward) the whole 95% interval must clear"
)
@click.option("--seed", type=int, default=None, help="--against: held-back split seed (default: NEW's manifest lineage, else 0)")
@click.option("--holdout-fraction", type=float, default=None, help="--against: held-back fraction (default: NEW's manifest lineage, else 0.2)")
@click.option("--json-out", default=None, type=click.Path(dir_okay=False), help="--against: the JSON report (default: reports/gate-NEW-vs-OLD.json)")
@click.option("--allow-other-bundles", is_flag=True, help="--against: use records a bundle other than OLD/NEW served (you vouch it served the same target)")
@click.option("--threshold", type=float, default=DEFAULT_GATE_THRESHOLD, show_default=True, help="minimum alpha")
@click.option("--concurrency", type=int, default=1, show_default=True, help="batch size the deployment runs at")
@click.option("--max-tokens", type=int, default=64, show_default=True)
@click.option("--limit", type=int, default=None)
@click.option("--turns", type=click.Choice(["all", "first"]), default="first", show_default=True)
@click.option("--device", default=None)
@CHAT_TEMPLATE_OPTION
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON on stdout")
@tensor_parallel()
def gate_cmd(
    bundle: str,
    prompts_file: str,
    threshold: float,
    concurrency: int,
    max_tokens: int,
    limit: int | None,
    turns: str,
    device: str | None,
    chat_template: bool | None,
    as_json: bool,
    against: str | None = None,
    traffic_dir: str | None = None,
    margin: float = DEFAULT_MARGIN,
    seed: int | None = None,
    holdout_fraction: float | None = None,
    json_out: str | None = None,
    allow_other_bundles: bool = False,
) -> None:
    """Fail (exit 3) when BUNDLE's alpha on the prompts is below --threshold or speculation would slow it down."""
    if against is not None or traffic_dir is not None or prompts_file is None:
        if prompts_file is not None or (against is None and traffic_dir is None):
            what = "missing" if prompts_file is None else "does not go with --against/--traffic"
            raise UserError("--prompts", what, "gate on prompts (--prompts FILE) or on traffic (--against OLD --traffic DIR)")
        return gate_traffic(
            click.get_current_context(),
            bundle,
            against,
            traffic_dir,
            margin=margin,
            seed=seed,
            holdout_fraction=holdout_fraction,
            json_out=json_out,
            allow_other_bundles=allow_other_bundles,
            threshold=threshold,
            concurrency=concurrency,
            device=device,
            as_json=as_json,
        )
    res = run_gate(
        Path(bundle),
        Path(prompts_file),
        threshold=threshold,
        concurrency=concurrency,
        max_tokens=max_tokens,
        limit=limit,
        turns=turns,
        device=device,
        chat_template=chat_template,
    )
    if as_json:
        click.echo(json.dumps(res, indent=1))
    else:
        cats = ", ".join(f"{c} {a:.2f}" for c, a in res["by_category"].items())
        click.echo(
            f"alpha {res['alpha']:.3f} (threshold {threshold:.2f}) over {res['turns_measured']} turns of {res['prompts']}; AL {res['acceptance_length']:.2f}"
            + (f"; by category: {cats}" if len(res["by_category"]) > 1 else "")
        )
        click.echo(
            f"predicted speedup at concurrency {concurrency} on {res['gpu']} TP{res['tp']} with K={res['max_draft_len']}"
            + (f", mode {res['mode']} (as the bundle's options serve it)" if res["mode"] != DEFAULT_METHOD else "")
            + f": {res['predicted_speedup']:.2f}x"
        )
        if res["calibration_shortfall"]:
            click.echo(f"warning: {res['calibration_shortfall']}: this bundle's quantization scales come from that little data")
        if res["passed"]:
            click.echo("gate passed")
    if not res["passed"]:
        # the one verdict line, printed by the CLI on stderr (with --json too, next to the data)
        raise GateFailed(f"gate FAILED: {bundle}: " + "; ".join(res["reasons"]))


@click.command("recommend")
@click.argument("bundle", type=click.Path(file_okay=False))
@click.option("--report", "report_file", type=click.Path(dir_okay=False), default=None, help="an alpha report.json (else --prompts is measured)")
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False), default=None, help=PROMPTS_HELP)
@click.option(
    "--max-draft-len",
    type=int,
    default=None,
    help="largest K to consider (default: with --report, every K it measured, its --sweep included; with --prompts, the bundle's)",
)
@click.option("--limit", type=int, default=None)
@click.option("--max-tokens", type=int, default=64, show_default=True)
@click.option("--gpu", default=None, help="GPU to predict for (default: the bundle's)")
@click.option("--tp", type=int, default=None, help="tensor parallelism (default: the bundle's)")
@click.option("--concurrency", type=int, default=1, show_default=True, help="batch size K is chosen for")
@click.option("--device", default=None)
@CHAT_TEMPLATE_OPTION
@click.option(
    "--gate-traffic",
    "gate_traffic_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="an `alpha BUNDLE --traffic DIR` report.json: the acceptance gate's window is chosen by replaying its captured requests",
)
@click.option(
    "--write",
    is_flag=True,
    help="write max_draft_len, draft_len_schedule and the acceptance-rate gate into the bundle's options, the same and the evidence into its manifest",
)
@click.option("--json", "as_json", is_flag=True)
@tensor_parallel("--measure-tp")
def recommend_cmd(
    bundle: str,
    report_file: str | None,
    prompts_file: str | None,
    max_draft_len: int | None,
    limit: int | None,
    max_tokens: int,
    gpu: str | None,
    tp: int | None,
    concurrency: int,
    device: str | None,
    chat_template: bool | None,
    gate_traffic_file: str | None,
    write: bool,
    as_json: bool,
) -> None:
    """Predict speedup per K and batch size from measured acceptance; recommend K and max_concurrency."""
    if max_draft_len is not None and not 1 <= max_draft_len <= 16:
        raise UserError("--max-draft-len", f"{max_draft_len}", "draft lengths are 1..16")
    b = open_bundle(Path(bundle))
    if concurrency > b.options.max_batch_size:
        raise UserError(
            "--concurrency",
            f"{concurrency} exceeds the bundle's max_batch_size {b.options.max_batch_size}",
            "no server batches more; pass a smaller batch size",
        )
    gate_traffic = read_gate_traffic(Path(gate_traffic_file), b) if gate_traffic_file else None  # before anything is measured
    cum, by_k, report = acceptance_curves(
        Path(bundle),
        report_file,
        prompts_file,
        max_draft_len=max_draft_len,
        limit=limit,
        max_tokens=max_tokens,
        device=device,
        chat_template=chat_template,
    )
    costs = bundle_cost_inputs(b, gpu=gpu, tp=tp)
    rec = recommend(cum, concurrency=concurrency, **costs, batches=recommendation_batches(b), measured_by_k=by_k, max_k=max_draft_len)
    dt_line = dynamic_tree_summary(report, rec, b)  # alpha --modes chain,dynamic-tree: the tree against the chain
    # an alpha --against report: the method and K per concurrency over both bundles (measure/against.py)
    methods = method_choice_from_report(report, gpu, tp, sorted(set(recommendation_batches(b)) | {concurrency}))
    if methods is not None:
        rec.evidence["method_choice"] = methods[0]
    # where speculation stops paying by context length, and the switch-off replayed (measure/switch_off.py)
    rec.evidence["context_switch_off"] = context_switch_off(report, rec.max_draft_len, concurrency, costs)
    if write:
        write_recommendation_to_bundle(Path(bundle), rec, source=report_file or prompts_file, report=report, gate_traffic=gate_traffic)
    else:
        gate_choice(rec, report, gate_traffic, b)  # what --write would write for the method it writes, and why
    if as_json:
        click.echo(json.dumps(rec.to_dict(), indent=1))
        return
    print_recommendation(rec)
    settings, measured = report.settings, report.pairs.bundle.requests
    if settings.prompts:  # what every figure above was measured on
        click.echo(
            f"acceptance measured on {settings.prompts}: {len(measured)} requests ({settings.turns} turns), {settings.decoding}, K={settings.max_draft_len} and sweep {settings.sweep or '-'}"
        )
    if dt_line:
        click.echo(dt_line)
    sa = sa_line(report, rec.max_draft_len, write)
    if sa:
        click.echo(sa)
    for line in methods[1] if methods is not None else []:
        click.echo(line)
    ctx = rec.evidence["context_switch_off"]
    for line in ctx["lines"]:
        click.echo(("wrote " if write and ctx["written"] and line.startswith("closest setting:") else "") + line)
    gate = rec.evidence.get("acceptance_gate")
    if gate:
        click.echo(("wrote " if write and gate["written"] and not ctx["written"] else "") + gate["line"])
