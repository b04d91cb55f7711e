"""CLI commands of the reference runtime: ``alpha``, ``gate`` and ``recommend`` (registered by eagle3_trt.cli)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
import torch
from rich.console import Console
from rich.table import Table

from eagle3_trt.atomic import check_writable, staged_dir
from eagle3_trt.convert.prompts import load_prompt_records, use_chat_template
from eagle3_trt.errors import GateFailed, UserError
from eagle3_trt.formats.checkpoint_io import read_json
from eagle3_trt.pipeline import bundle as bundle_format
from eagle3_trt.pipeline import bundle_write
from eagle3_trt.pipeline.bundle import Bundle, open_bundle
from eagle3_trt.pipeline.gpus import get_gpu
from eagle3_trt.pipeline.memory import kv_bytes_per_token
from eagle3_trt.pipeline.model_size import count_target, moe_cost_inputs, parse_shape
from eagle3_trt.pipeline.trtllm_adapter import recommend as recommended_options
from eagle3_trt.runtime.alpha_report import compare, render_summary, summary_console
from eagle3_trt.runtime.cost_model import CostParams, model_cost, predict, recommend
from eagle3_trt.runtime.diagnostics import diagnose
from eagle3_trt.runtime.loader import engine_from_bundle
from eagle3_trt.runtime.measure import measure
from eagle3_trt.runtime.plots import plot_report

DEFAULT_GATE_THRESHOLD = 0.55


# ---------------------------------------------------------------------------------------------
# Bundle facts the cost model needs
# ---------------------------------------------------------------------------------------------
def _weight_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in Path(d).glob("*.safetensors"))


def bundle_cost_inputs(bundle: Bundle | Path, gpu: str | None = None, tp: int | None = None) -> dict:
    """Keyword arguments for ``cost_model.recommend`` read from a bundle (formats, options, configs, file sizes)."""
    b = bundle if isinstance(bundle, Bundle) else open_bundle(bundle)
    gpu_name = gpu or b.target_gpu.name
    tp = b.tensor_parallel_size if tp is None else tp
    tcfg = read_json(b.target_dir / "config.json")
    dcfg = read_json(b.draft_dir / "config.json")
    kv_dtype = "fp8" if b.kv_cache == "fp8" else "bf16"
    # whole-model bytes (tp=1): the cost model splits them over TP itself
    ts = parse_shape(tcfg, str(b.target_dir / "config.json"))
    ds = parse_shape(dcfg, str(b.draft_dir / "config.json"))
    tb, db = _weight_bytes(b.target_dir), _weight_bytes(b.draft_dir)
    if not tb or not db:
        raise UserError(b.path, "no weight files in target/ or draft/", "this looks like a --dry-run bundle; build it fully")
    # a target kept as shipped is costed in its shipped format (gpt-oss: MXFP4 experts, the rest BF16)
    target_format = b.quant.target_native if b.quant.target == "native" else b.quant.target
    moe = moe_cost_inputs(ts, target_format if target_format in ("mxfp4", "fp8", "nvfp4") else "bf16")
    return dict(
        gpu=get_gpu(gpu_name),
        target_bytes=tb,
        draft_bytes=db,
        tp=tp,
        target_format=target_format,
        draft_format=b.quant.draft,
        target_params=float(count_target(ts).total) if moe else None,
        target_moe=moe,
        target_kv_bytes_per_token=kv_bytes_per_token(ts.layers, ts.kv_heads, ts.head_dim, kv_dtype, tp=1),
        draft_kv_bytes_per_token=kv_bytes_per_token(ds.layers, ds.kv_heads, ds.head_dim, kv_dtype, tp=1),
        target_layers=int(tcfg["num_hidden_layers"]),
        hidden=int(tcfg["hidden_size"]),
    )


def _device(device: str | None) -> str:
    if device:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


# ---------------------------------------------------------------------------------------------
# alpha
# ---------------------------------------------------------------------------------------------
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
    sweep: tuple[int, ...] = (),
    chat_template: bool | None = None,
) -> dict:
    """Measure the bundle (as built) and optionally a reference pair; returns the report dict.

    ``chat_template``: None encodes chat records through the template and raw completion
    records as they are; False sends every record raw; True templates every record."""
    say = progress or (lambda msg: None)
    if max_draft_len is not None and not 1 <= max_draft_len <= 16:  # 0 would silently mean the bundle's K
        raise UserError("--max-draft-len", f"{max_draft_len}", "draft lengths are 1..16")
    if sweep and method != "estimator":
        raise UserError("--sweep", "needs the estimator", "drop --method generate (the estimator's counts are identical)")
    b = open_bundle(Path(bundle))
    bundle = b.path
    records = load_prompt_records(Path(prompts_file), limit)
    use_chat_template(records, chat_template, source=prompts_file)  # a one-line error before any model is loaded
    device = _device(device)
    k = int(max_draft_len or b.k)
    t0 = time.perf_counter()
    say(f"loading {bundle} ({b.label}) on {device}")
    eng = engine_from_bundle(b, device=device, max_draft_len=k)
    load_s = time.perf_counter() - t0
    say(f"measuring {len(records)} prompts ({turns} turns, up to {max_tokens} tokens each)")
    prim = measure(
        eng, records, label=b.label, max_tokens=max_tokens, turns=turns, method=method, batch_size=batch_size, k=k, sweep=sweep, chat_template=chat_template
    )
    diag = diagnose(eng, prim) if diagnostics and prim.results else []
    del eng

    ref = None
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
    if reng is not None:
        say("measuring the reference pair")
        ref = measure(
            reng, records, label=ref_label, max_tokens=max_tokens, turns=turns, method=method, batch_size=batch_size, k=k, chat_template=chat_template
        )
        del reng

    report: dict = {
        "schema": 1,
        "kind": "eagle3-trt alpha report",
        "bundle": str(bundle),
        "settings": {
            "prompts": str(prompts_file),
            "records": len(records),
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
        },
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
        report["numerics_note"] = (
            "target experts are MXFP4 as shipped; the reference runtime dequantizes them exactly (every "
            "E2M1 x 2^k value is a BF16 value) and runs activations unquantized, which is TensorRT-LLM's "
            "W4A16 MXFP4 path on Hopper; Blackwell MoE kernels that also quantize activations (MXFP8) "
            "are not emulated, so alpha there can differ by rounding"
        )
    ov = prim.overall()
    if ov.draft_tokens:
        try:
            rec = recommend(
                ov.cumulative_acceptance,
                concurrency=concurrency,
                **bundle_cost_inputs(b),
                measured_by_k={kk: v["cumulative_acceptance"] for kk, v in prim.sweep().items()},
            )
            report["recommendation"] = rec.to_dict()
        except UserError as e:
            report["recommendation_error"] = e.line()
    return report


def read_report(path: Path) -> dict:
    """An alpha report.json, or a one-line UserError."""
    hint = "pass the report.json written by `eagle3-trt alpha`"
    if not path.is_file():
        raise UserError(path, "report not found", hint)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(path, f"not valid JSON ({e})", hint) from None
    if not isinstance(data, dict):
        raise UserError(path, "not an alpha report (expected a JSON object)", hint)
    return data


def report_curves(report: dict, where: str | Path) -> tuple[list[float], dict[int, list[float]]]:
    """(the run's cumulative acceptance, {K: cumulative acceptance measured at K} for every K of its
    sweep) from an alpha report.json, so ``recommend`` can choose any K the sweep measured."""
    try:
        prim = report["pairs"]["bundle"]
        cum = prim["overall"]["cumulative_acceptance"]
    except (KeyError, TypeError):
        raise UserError(
            where, "not an alpha report (pairs.bundle.overall.cumulative_acceptance missing)", "pass the report.json written by `eagle3-trt alpha`"
        ) from None
    by_k: dict[int, list[float]] = {}
    sweep = prim.get("sweep") or {}
    if not isinstance(sweep, dict):
        raise UserError(where, "pairs.bundle.sweep is not a K -> measurement map", "pass the report.json written by `eagle3-trt alpha`")
    for key, v in sweep.items():
        c = v.get("cumulative_acceptance") if isinstance(v, dict) else None
        if not str(key).isdigit() or not isinstance(c, list):
            raise UserError(
                where, f"sweep entry {key!r} has no per-position acceptance (cumulative_acceptance)", "re-run `eagle3-trt alpha --sweep ...` with this version"
            )
        by_k[int(key)] = c
    return cum, by_k


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


def write_report(report: dict, out: Path) -> Path:
    """report.json, summary.txt, alpha.png into ``out`` (written next to it, then renamed into place)."""
    out = Path(out)
    with staged_dir(out) as tmp:
        (tmp / "report.json").write_text(json.dumps(report, indent=1) + "\n")
        (tmp / "summary.txt").write_text(summary_console(report).export_text())
        plot_report(report, tmp / "alpha.png")
    return out


def _print_summary(report: dict) -> None:
    render_summary(report, Console(highlight=False))


CHAT_TEMPLATE_OPTION = click.option(
    "--chat-template/--no-chat-template",
    "chat_template",
    default=None,
    help="default: chat records (turns/messages) through the bundle's chat template, raw completion records "
    '({"text"}/{"prompt"}) as they are; --no-chat-template: every prompt raw, as a /v1/completions request '
    "(plain-text lines too; chat records are refused); --chat-template: every prompt as a user turn",
)
PROMPTS_HELP = (
    'JSONL: chat records {"turns": [...]} (MT-Bench layout, optional "category") or {"messages": [...]}, '
    'raw completion records {"text": ...} or {"prompt": ...}; or plain text, one prompt a line'
)


@click.command("alpha")
@click.argument("bundle", type=click.Path(file_okay=False))
@click.option("--prompts", "prompts_file", required=True, type=click.Path(dir_okay=False), help=PROMPTS_HELP)
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
@click.option("-o", "--out", default=None, help="report dir (default: reports/alpha-<bundle name>)")
@click.option("--json", "as_json", is_flag=True, help="print the report JSON on stdout")
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
    out: str | None,
    as_json: bool,
) -> None:
    """Measure acceptance (alpha) of BUNDLE's quantized pair on your prompts, per category, vs BF16."""
    err = Console(stderr=True)
    open_bundle(Path(bundle))  # a one-line error before any model is loaded
    dest = Path(out) if out else Path("reports") / f"alpha-{Path(bundle).resolve().name}"
    check_writable(dest)  # not after an hour of measuring a 70B pair
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
        progress=lambda m: err.print(f"[dim]{m}[/]"),
        sweep=parse_sweep(sweep),
        chat_template=chat_template,
    )
    write_report(report, dest)
    if as_json:
        click.echo(json.dumps(report, indent=1))
    else:
        _print_summary(report)
        click.echo(f"report: {dest}/report.json, {dest}/summary.txt, {dest}/alpha.png")


# ---------------------------------------------------------------------------------------------
# gate
# ---------------------------------------------------------------------------------------------
def run_gate(
    bundle: Path,
    prompts_file: Path,
    *,
    threshold: float = DEFAULT_GATE_THRESHOLD,
    concurrency: int = 1,
    max_tokens: int = 64,
    limit: int | None = None,
    turns: str = "first",
    device: str | None = None,
    batch_size: int = 16,
    chat_template: bool | None = None,
) -> dict:
    """alpha of the bundle as built and the predicted speedup at ``concurrency``; 'passed' says if both clear the bar."""
    if not 0 <= threshold <= 1:
        raise UserError("--threshold", f"{threshold} is not a probability", "use e.g. 0.55")
    if concurrency < 1:
        raise UserError("--concurrency", f"{concurrency}", "concurrency is at least 1")
    b = open_bundle(Path(bundle))
    bundle = b.path
    k = b.k
    records = load_prompt_records(Path(prompts_file), limit)
    use_chat_template(records, chat_template, source=prompts_file)  # before any model is loaded
    eng = engine_from_bundle(b, device=_device(device))
    m = measure(eng, records, label=b.label, max_tokens=max_tokens, turns=turns, batch_size=batch_size, k=k, chat_template=chat_template)
    ov = m.overall()
    ci = bundle_cost_inputs(b)
    gpu, tp = ci["gpu"], ci["tp"]
    tcost = model_cost(
        ci["target_bytes"],
        ci["target_format"],
        gpu,
        tp,
        kv_bytes_per_token=ci["target_kv_bytes_per_token"],
        layers=ci["target_layers"],
        hidden=ci["hidden"],
        params=ci["target_params"],
        moe=ci["target_moe"],
    )
    dcost = model_cost(ci["draft_bytes"], ci["draft_format"], gpu, tp, kv_bytes_per_token=ci["draft_kv_bytes_per_token"])
    cum = ov.cumulative_acceptance + [0.0] * (k - len(ov.cumulative_acceptance))
    pred = predict(cum, gpu, tcost, dcost, tp, concurrency, k, CostParams())
    reasons = []
    if ov.alpha < threshold:
        reasons.append(f"alpha {ov.alpha:.3f} < threshold {threshold:.2f}")
    if pred.speedup < 1.0:
        reasons.append(f"predicted speedup {pred.speedup:.2f}x < 1 at concurrency {concurrency} on {gpu.name} (K={k})")
    return {
        "bundle": str(bundle),
        "prompts": str(prompts_file),
        "turns_measured": len(m.results),
        "alpha": ov.alpha,
        "acceptance_length": ov.acceptance_length,
        "cumulative_acceptance": ov.cumulative_acceptance,
        "by_category": {c: a.alpha for c, a in m.by_category().items()},
        "threshold": threshold,
        "concurrency": concurrency,
        "max_draft_len": k,
        "gpu": gpu.name,
        "tp": tp,
        "predicted_speedup": pred.speedup,
        "prediction": pred.to_dict(),
        "passed": not reasons,
        "reasons": reasons,
    }


@click.command("gate")
@click.argument("bundle", type=click.Path(file_okay=False))
@click.option("--prompts", "prompts_file", required=True, type=click.Path(dir_okay=False), help=PROMPTS_HELP)
@click.option("--threshold", type=float, default=DEFAULT_GATE_THRESHOLD, show_default=True, help="minimum alpha")
@click.option("--concurrency", type=int, default=1, show_default=True, help="batch size the deployment runs at")
@click.option("--max-tokens", type=int, default=64, show_default=True)
@click.option("--limit", type=int, default=None)
@click.option("--turns", type=click.Choice(["all", "first"]), default="first", show_default=True)
@click.option("--device", default=None)
@CHAT_TEMPLATE_OPTION
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON on stdout")
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
) -> None:
    """Fail (exit 3) when BUNDLE's alpha on the prompts is below --threshold or speculation would slow it down."""
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
            f"alpha {res['alpha']:.3f} (threshold {threshold:.2f}) over {res['turns_measured']} turns; AL {res['acceptance_length']:.2f}"
            + (f"; by category: {cats}" if len(res["by_category"]) > 1 else "")
        )
        click.echo(
            f"predicted speedup at concurrency {concurrency} on {res['gpu']} TP{res['tp']} with K={res['max_draft_len']}: {res['predicted_speedup']:.2f}x"
        )
        click.echo("gate passed" if res["passed"] else "gate FAILED: " + "; ".join(res["reasons"]))
    if not res["passed"]:
        raise GateFailed(f"{bundle}: " + "; ".join(res["reasons"]))


# ---------------------------------------------------------------------------------------------
# recommend
# ---------------------------------------------------------------------------------------------
def write_recommendation_to_bundle(bundle: Path, rec, source: str | None) -> Bundle:
    """K and max_concurrency into llm_api_options.yaml (TensorRT-LLM's names), the evidence into
    manifest.json: one ``bundle.update``, so the launchers, the digests and the fingerprint follow."""
    if not rec.speculation_pays:
        raise UserError(
            f"{bundle}",
            "speculation is predicted to lose at every batch size; nothing written",
            "train a domain draft head (eagle3-trt train-draft) or serve without speculation",
        )
    b = open_bundle(Path(bundle))
    opts = recommended_options(b.options, rec.max_draft_len, max_concurrency=rec.max_concurrency)
    evidence = bundle_format.Recommendation(
        max_draft_len=rec.max_draft_len,
        max_concurrency=rec.max_concurrency,
        cumulative_acceptance=rec.cumulative_acceptance,
        measured_on=source,
        evidence=rec.evidence,
        table=rec.table,
    )
    return bundle_write.update(b.path, options=opts, record=evidence)


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
@click.option("--write", is_flag=True, help="write max_draft_len and max_concurrency into the bundle's options, evidence into its manifest")
@click.option("--json", "as_json", is_flag=True)
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
    write: bool,
    as_json: bool,
) -> None:
    """Predict speedup per K and batch size from measured acceptance; recommend K and max_concurrency."""
    if max_draft_len is not None and not 1 <= max_draft_len <= 16:
        raise UserError("--max-draft-len", f"{max_draft_len}", "draft lengths are 1..16")
    if report_file:
        rep = read_report(Path(report_file))
        cum, by_k = report_curves(rep, report_file)
    elif prompts_file:
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
        cum, by_k = report_curves(rep, prompts_file)
    else:
        raise UserError("recommend", "needs --report or --prompts", "measure acceptance first with `eagle3-trt alpha`")
    rec = recommend(cum, concurrency=concurrency, **bundle_cost_inputs(Path(bundle), gpu=gpu, tp=tp), measured_by_k=by_k, max_k=max_draft_len)
    if write:
        write_recommendation_to_bundle(Path(bundle), rec, source=report_file or prompts_file)
    if as_json:
        click.echo(json.dumps(rec.to_dict(), indent=1))
        return
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
