"""CLI commands: ``generate`` and ``bench`` (registered by eagle3_trt/cli.py)."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import click

from eagle3_trt.clients.bench import BenchConfig, BenchRun, open_client, parse_concurrency, run_bench
from eagle3_trt.clients.bench_gate import DEFAULT_ALPHA_THRESHOLD
from eagle3_trt.clients.environment import describe_environment
from eagle3_trt.clients.llm_client import GenerationParams, LLMClient, Result, ServerError
from eagle3_trt.clients.openai_client import normalize_openai_url
from eagle3_trt.clients.report import write_report
from eagle3_trt.clients.servers import check_model, dynamo_bundle, is_loopback, make_formatter, resolve_urls
from eagle3_trt.convert.prompts import load_prompts
from eagle3_trt.dynamo_serving.launcher import DEFAULT_STATE_DIR as DYNAMO_STATE_DIR
from eagle3_trt.errors import GateFailed, UserError
from eagle3_trt.progress import Bars
from eagle3_trt.runtime.llm_api import SERVED_MODEL_NAME

STATE_FILE = Path(".serve") / "server.json"


def _common(f):
    opts = [
        click.option("--url", default=None, help="host:port (gRPC, default 127.0.0.1:8001 or the server `eagle3-trt serve` started)"),
        click.option("--model", default=SERVED_MODEL_NAME, show_default=True, help="Triton model name"),
        click.option(
            "--bundle",
            type=click.Path(file_okay=False, path_type=Path),
            default=None,
            help="engine bundle whose tokenizer's chat template formats the prompt (default: the server's, if local)",
        ),
        click.option("--no-chat-template", "raw", is_flag=True, help="send the prompt as-is"),
        click.option("--system", default=None, help="system message for the chat template"),
        click.option("--state-dir", default=".serve", show_default=True, type=click.Path(path_type=Path), hidden=True),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


@click.command("generate")
@click.argument("prompt")
@_common
@click.option("--http", is_flag=True, help="use HTTP (generate / generate_stream) instead of gRPC")
@click.option("--stream", is_flag=True, help="print tokens as they arrive")
@click.option("--max-tokens", default=64, show_default=True)
@click.option("--temperature", type=float, default=None, help="default: greedy")
@click.option("--top-p", type=float, default=None)
@click.option("--top-k", type=int, default=None)
@click.option("--seed", type=int, default=None)
@click.option("--stop", "stop", multiple=True, help="stop string (repeatable)")
@click.option("--no-speculation", is_flag=True, help="serve this request without the draft (speculative_decoding=false)")
@click.option("--json", "as_json", is_flag=True, help="print the result and its statistics as JSON")
def generate_cmd(
    prompt: str,
    url: str | None,
    model: str,
    bundle: Path | None,
    raw: bool,
    system: str | None,
    state_dir: Path,
    http: bool,
    stream: bool,
    max_tokens: int,
    temperature: float | None,
    top_p: float | None,
    top_k: int | None,
    seed: int | None,
    stop: tuple[str, ...],
    no_speculation: bool,
    as_json: bool,
) -> None:
    """Send PROMPT to the eagle3 model on a Triton server (chat template applied client-side)."""
    url, _ = resolve_urls(url, http, None, state_dir)
    params = GenerationParams(
        max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, stop=tuple(stop), speculative=False if no_speculation else None
    )
    try:
        with LLMClient(url, model=model, http=http) as client:
            check_model(client)
            fmt = make_formatter(client, bundle, raw, system)
            res = _generate(client, fmt(prompt), params, stream=stream, as_json=as_json)
    except ServerError as e:
        raise UserError(f"server {url}", str(e)) from None
    except ConnectionError as e:
        raise UserError("--url", f"cannot reach {url}: {e}", "is the server running? `eagle3-trt serve REPO`") from None
    _print_generation(res, as_json, streamed=stream)


def _generate(client: LLMClient, text_in: str, params: GenerationParams, *, stream: bool, as_json: bool) -> Result:
    """One request; its text goes to stdout (as it arrives with --stream) unless --json."""
    t0 = time.perf_counter()
    if stream and not as_json:
        chunks = []
        for ch in client.stream(text_in, params, streaming=True):
            chunks.append(ch)
            sys.stdout.write(ch.text)
            sys.stdout.flush()
        sys.stdout.write("\n")
        first = next((c.t for c in chunks if c.n_tokens), chunks[-1].t)
        return Result(
            "".join(c.text for c in chunks), sum(c.n_tokens for c in chunks), chunks[-1].finish_reason, chunks[-1].perf, t0, first, chunks[-1].t, chunks
        )
    res = client.generate(text_in, params, stream=stream)
    if not as_json:
        click.echo(res.text)
    return res


def _print_generation(res: Result, as_json: bool, *, streamed: bool) -> None:
    """The request's statistics: with the text as JSON on stdout, else one line on stderr.

    Without --stream the server answers once, with every token: the time to the first token is not
    observed (it would equal the latency), so TTFT is null in the JSON and "n/a" in the line."""
    p = res.perf
    dt = res.t_end - res.t_first
    stats = {
        "tokens": res.n_tokens,
        "finish_reason": res.finish_reason,
        "ttft_s": round(res.ttft_s, 4) if streamed else None,
        "latency_s": round(res.latency_s, 4),
        "decode_tokens_per_s": round((res.n_tokens - 1) / dt, 2) if dt > 0 and res.n_tokens > 1 else None,
        "speculative_decoding": p.get("speculative_decoding"),
        "acceptance_rate": p.get("acceptance_rate"),
        "acceptance_length": p.get("acceptance_length"),
        "draft_tokens": p.get("total_draft_tokens"),
        "accepted_draft_tokens": p.get("total_accepted_draft_tokens"),
    }
    if as_json:
        click.echo(json.dumps({"text": res.text, **stats}, indent=2))
    else:
        extra = ""
        if p.get("speculative_decoding"):
            extra = f", alpha {float(p.get('acceptance_rate') or 0):.3f}, AL {float(p.get('acceptance_length') or 0):.2f}"
        ttft = f"TTFT {res.ttft_s * 1000:.0f} ms" if streamed else "TTFT n/a without --stream"
        click.echo(f"[{res.n_tokens} tokens, {res.finish_reason}, {ttft}, {res.latency_s:.2f} s{extra}]", err=True)


@click.command("bench")
@_common
@click.option(
    "--prompts",
    "prompts_file",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="JSONL (turns / prompt / text) or one prompt per line, e.g. ../shared/data/mt_bench.jsonl",
)
@click.option("--concurrency", default="1,4,16,64", show_default=True, help="comma-separated concurrency levels")
@click.option(
    "--requests", "requests_per_level", type=int, default=None, help="requests per level and arm (default: max(concurrency, 4), capped by --max-requests)"
)
@click.option("--max-requests", default=256, show_default=True, type=click.IntRange(1, 1024), help="upper bound on requests per level and arm (at most 1024)")
@click.option("--max-tokens", default=32, show_default=True)
@click.option("--temperature", type=float, default=None, help="default: greedy")
@click.option("--metrics-url", default=None, help="Triton metrics URL (default: port 8002 on the server's host, or the recorded server)")
@click.option("--baseline-model", default=None, help="A/B against this model (e.g. eagle3_nospec) instead of the speculative_decoding switch")
@click.option("--alpha-threshold", default=DEFAULT_ALPHA_THRESHOLD, show_default=True)
@click.option("--itl-tolerance", default=0.0, show_default=True, help="allowed relative P99 ITL excess with speculation (0.05 = 5%)")
@click.option("--warmup", default=2, show_default=True, help="warm-up requests (not measured)")
@click.option("-o", "--out", "out", type=click.Path(path_type=Path), default=None, help="report folder (default reports/bench-<time>)")
@click.option("--fail-on-gate", is_flag=True, help="exit with code 3 when the gate fails")
@click.option("--allow-remote", is_flag=True, help="allow a server that is not on this machine (default: loopback only)")
@click.option(
    "--openai-url",
    default=None,
    help="bench an OpenAI-compatible endpoint instead of Triton: NVIDIA Dynamo's frontend "
    "(`eagle3-trt serve-dynamo`), e.g. http://127.0.0.1:8080/v1; the chat template is applied by the server "
    "(--no-chat-template: raw text to /v1/completions)",
)
def bench_cmd(
    url: str | None,
    model: str,
    bundle: Path | None,
    raw: bool,
    system: str | None,
    state_dir: Path,
    prompts_file: Path,
    concurrency: str,
    requests_per_level: int | None,
    max_requests: int,
    max_tokens: int,
    temperature: float | None,
    metrics_url: str | None,
    baseline_model: str | None,
    alpha_threshold: float,
    itl_tolerance: float,
    warmup: int,
    out: Path | None,
    fail_on_gate: bool,
    allow_remote: bool,
    openai_url: str | None,
) -> None:
    """Rollout benchmark: TTFT, ITL, throughput, alpha and AL with speculation on vs off; report + gate verdict.

    Against Triton (--url, default) or an OpenAI endpoint (--openai-url: Dynamo); one loop, one report."""
    levels = parse_concurrency(concurrency)
    url, metrics_url, served_bundle = _bench_endpoint(url, openai_url, metrics_url, bundle, state_dir)
    if not allow_remote:
        _require_loopback(url, metrics_url)
    prompts = load_prompts(prompts_file)
    cfg = BenchConfig(
        url=url,
        model=model,
        prompts=prompts,
        concurrency=levels,
        max_tokens=max_tokens,
        requests_per_level=requests_per_level,
        max_requests=max_requests,
        warmup=warmup,
        temperature=temperature,
        metrics_url=metrics_url,
        baseline_model=baseline_model,
    )
    if openai_url is not None:
        # The frontend applies the model's chat template (the bundle's); the prompts go as user messages.
        cfg = replace(cfg, endpoint="openai", chat=not raw, system=system, bundle=served_bundle)
    environment = _check_servers(cfg, bundle, raw, system)
    run = _run_with_progress(cfg, alpha_threshold, itl_tolerance, environment)
    out = out or Path("reports") / time.strftime("bench-%Y%m%d-%H%M%S")
    write_report(run, out)
    _print_bench_summary(run, out)
    if fail_on_gate and run.gate.verdict == "fail":
        raise GateFailed()  # the summary's last line is the verdict


def _bench_endpoint(
    url: str | None, openai_url: str | None, metrics_url: str | None, bundle: Path | None, state_dir: Path
) -> tuple[str, str | None, str | None]:
    """(server URL, metrics URL, the served bundle's path for an OpenAI endpoint) from the bench options."""
    if openai_url is None:
        url, metrics_url = resolve_urls(url, False, metrics_url, state_dir)
        return url, metrics_url, None
    if url is not None:
        raise UserError("--openai-url", "give --url (Triton) or --openai-url (OpenAI / Dynamo), not both")
    if metrics_url is not None:
        raise UserError(
            "--metrics-url",
            "is read with Triton's metric names; with --openai-url alpha and AL come from the responses (nvext.engine_data.eagle3)",
            "drop --metrics-url",
        )
    url = normalize_openai_url(openai_url)
    # --state-dir (hidden) names Triton's state by default; for Dynamo it may name serve-dynamo's
    served_bundle = str(bundle.resolve()) if bundle else dynamo_bundle(url, DYNAMO_STATE_DIR if state_dir == Path(".serve") else state_dir)
    return url, None, served_bundle


def _require_loopback(url: str, metrics_url: str | None) -> None:
    for name, u in (("--url", url), ("--metrics-url", metrics_url)):
        if u is not None and not is_loopback(u):
            raise UserError(
                name,
                f"{u} is not a loopback address; the benchmark is a load generator",
                "run it on the server's machine, or pass --allow-remote for a server you operate",
            )


def _check_servers(cfg: BenchConfig, bundle: Path | None, raw: bool, system: str | None) -> dict:
    """Fail early when a model is not there; apply the chat template (Triton); describe the environment."""
    with open_client(cfg) as client:
        check_model(client)
        if cfg.endpoint != "openai":
            fmt = make_formatter(client, bundle, raw, system)
            cfg.prompts = [fmt(p) for p in cfg.prompts]
        environment = describe_environment(client, str(bundle) if bundle else None)
    if cfg.baseline_model:
        with open_client(cfg, cfg.baseline_model) as client:
            check_model(client)
    return environment


def _run_with_progress(cfg: BenchConfig, alpha_threshold: float, itl_tolerance: float, environment: dict) -> BenchRun:
    """run_bench on the commands' progress display (eagle3_trt/progress.py; plain lines in a log):
    every request, and the current level and arm."""
    total = sum(2 * cfg.budget(c) for c in cfg.concurrency)
    with Bars() as bars:
        overall = bars.task("all requests", total)

        def progress(label: str, n: int):
            task = bars.task(label, n)

            def tick() -> None:
                task(1)
                overall(1)

            return tick

        return run_bench(cfg, alpha_threshold, itl_tolerance, progress=progress, log=lambda m: bars.say(m, style="yellow"), environment=environment)


def _print_bench_summary(run: BenchRun, out: Path) -> None:
    g = run.gate
    click.echo(f"report: {out}/summary.md (bench.json, plots)")
    for a in run.arms:
        click.echo(
            f"  C={a.concurrency:<3d} spec {'on ' if a.speculative else 'off'}  ITL p50/p99 "
            f"{(a.itl_p50_s or 0) * 1000:.1f}/{(a.itl_p99_s or 0) * 1000:.1f} ms  TTFT p50 {(a.ttft_p50_s or 0) * 1000:.0f} ms  "
            f"{a.output_tokens_per_s:.1f} tok/s"
            + (f"  alpha {a.alpha_metrics if a.alpha_metrics is not None else a.alpha_responses or 0:.3f}" if a.speculative else "")
            + (f"  ({a.errors} errors)" if a.errors else "")
        )
    idt = run.identity
    if idt.get("checked") and idt["compared"]:
        click.echo(f"greedy text on vs off: {idt['diverged']} of {idt['compared']} differ ({idt['rate']:.1%})")
    thin = [a for a in run.arms if a.thin_p99()]
    if thin:
        click.echo(f"warning: {len(thin)} arm(s) have a p99 from fewer than 100 samples (see summary.md)")
    headline = {"pass": "PASS", "pass_with_switch_off": f"SPECULATION ONLY UP TO CONCURRENCY {g.switch_off_above}"}.get(g.verdict, "FAIL")
    click.echo(f"gate: {headline} - {g.recommendation}")
