"""CLI commands: ``generate`` and ``bench`` (registered by eagle3_trt/cli.py)."""

from __future__ import annotations

import ipaddress
import json
import socket
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from eagle3_trt.clients.bench import BenchConfig, describe_environment, open_client, parse_concurrency, run_bench
from eagle3_trt.clients.chat import PromptFormatter
from eagle3_trt.clients.llm_client import GenerationParams, LLMClient, Result, ServerError
from eagle3_trt.clients.openai_client import normalize_openai_url
from eagle3_trt.clients.report import write_report
from eagle3_trt.convert.prompts import load_prompts
from eagle3_trt.dynamo_serving.launcher import DEFAULT_STATE_DIR as DYNAMO_STATE_DIR
from eagle3_trt.dynamo_serving.launcher import Deployment
from eagle3_trt.errors import GateFailed, UserError
from eagle3_trt.runtime.llm_api import SERVED_MODEL_NAME

STATE_FILE = Path(".serve") / "server.json"


def _recorded_server(state_dir: Path) -> dict | None:
    try:
        return json.loads((Path(state_dir) / "server.json").read_text())
    except (OSError, ValueError):
        return None


def resolve_urls(url: str | None, http: bool, metrics_url: str | None, state_dir: Path) -> tuple[str, str | None]:
    """--url, else the server `eagle3-trt serve` recorded, else Triton's default ports on 127.0.0.1."""
    rec = _recorded_server(state_dir)
    if url is None:
        if rec:
            url = f"127.0.0.1:{rec['http_port'] if http else rec['grpc_port']}"
        else:
            url = "127.0.0.1:8000" if http else "127.0.0.1:8001"
    if metrics_url is None:
        host = url.split("://")[-1].rsplit(":", 1)[0]
        if rec and host in ("127.0.0.1", "localhost") and url.rsplit(":", 1)[-1] in (str(rec["http_port"]), str(rec["grpc_port"])):
            metrics_url = f"http://127.0.0.1:{rec['metrics_port']}/metrics"
        elif url.rsplit(":", 1)[-1] in ("8000", "8001"):
            metrics_url = f"http://{host}:8002/metrics"
    return url, metrics_url


def is_loopback(url: str) -> bool:
    host = urlsplit(url if "://" in url else "//" + url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None))
        except (OSError, ValueError):
            return False


def dynamo_bundle(openai_url: str, state_dir: Path = DYNAMO_STATE_DIR) -> str | None:
    """The bundle `eagle3-trt serve-dynamo` serves at ``openai_url`` (from its state file), if it recorded one."""
    try:
        dep = Deployment.load(state_dir)
    except UserError:
        return None
    return dep.bundle if dep is not None and normalize_openai_url(dep.url) == normalize_openai_url(openai_url) else None


def check_model(client) -> None:
    """Fail early, with the reason, when the server or the model is not there."""
    try:
        client.model_config()
    except Exception as e:
        msg = str(e.message() if hasattr(e, "message") else e).splitlines()[0]
        dynamo = client.server_kind == "dynamo"
        raise UserError(
            "--openai-url" if dynamo else "--url",
            f"model '{client.model}' at {client.url} is not reachable: {msg}",
            f"is the server running (`eagle3-trt {'serve-dynamo BUNDLE' if dynamo else 'serve REPO'}`) and the model name right (--model)?",
        ) from None


def make_formatter(client, bundle: Path | None, raw: bool, system: str | None):
    """Chat template from --bundle, else from the bundle path the server reports (if it exists here)."""
    if raw:
        return PromptFormatter(None, raw=True)
    if bundle is None:
        try:
            served = client.bundle_path()
        except Exception:
            served = None
        if served and Path(served).is_dir():
            bundle = Path(served)
        else:
            raise UserError(
                "--bundle",
                "the chat template comes from the bundle's tokenizer, and the server's bundle"
                + (f" ({served}) is not on this machine" if served else " path is unknown"),
                "pass --bundle DIR (the engine bundle) or --no-chat-template to send raw text",
            )
    return PromptFormatter(bundle, system=system)


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
            text_in = fmt(prompt)
            t0 = time.perf_counter()
            if stream and not as_json:
                chunks = []
                for ch in client.stream(text_in, params, streaming=True):
                    chunks.append(ch)
                    sys.stdout.write(ch.text)
                    sys.stdout.flush()
                sys.stdout.write("\n")
                first = next((c.t for c in chunks if c.n_tokens), chunks[-1].t)
                res = Result(
                    "".join(c.text for c in chunks), sum(c.n_tokens for c in chunks), chunks[-1].finish_reason, chunks[-1].perf, t0, first, chunks[-1].t, chunks
                )
            else:
                res = client.generate(text_in, params, stream=stream)
                if not as_json:
                    click.echo(res.text)
    except ServerError as e:
        raise UserError(f"server {url}", str(e)) from None
    except ConnectionError as e:
        raise UserError("--url", f"cannot reach {url}: {e}", "is the server running? `eagle3-trt serve REPO`") from None
    p = res.perf
    dt = res.t_end - res.t_first
    stats = {
        "tokens": res.n_tokens,
        "finish_reason": res.finish_reason,
        "ttft_s": round(res.ttft_s, 4),
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
        click.echo(f"[{res.n_tokens} tokens, {res.finish_reason}, TTFT {res.ttft_s * 1000:.0f} ms, {res.latency_s:.2f} s{extra}]", err=True)


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
@click.option("--alpha-threshold", default=0.55, show_default=True)
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
    if openai_url is not None:
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
    else:
        url, metrics_url = resolve_urls(url, False, metrics_url, state_dir)
    if not allow_remote:
        for name, u in (("--url", url), ("--metrics-url", metrics_url)):
            if u is not None and not is_loopback(u):
                raise UserError(
                    name,
                    f"{u} is not a loopback address; the benchmark is a load generator",
                    "run it on the server's machine, or pass --allow-remote for a server you operate",
                )
    prompts = load_prompts(prompts_file)
    if openai_url is not None:
        # The frontend applies the model's chat template (the bundle's); the prompts go as user messages.
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
            baseline_model=baseline_model,
            endpoint="openai",
            chat=not raw,
            system=system,
            bundle=served_bundle,
        )
    else:
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
    with open_client(cfg) as client:
        check_model(client)
        if openai_url is None:
            fmt = make_formatter(client, bundle, raw, system)
            cfg.prompts = [fmt(p) for p in prompts]
        environment = describe_environment(client, str(bundle) if bundle else None)
    if baseline_model:
        with open_client(cfg, baseline_model) as client:
            check_model(client)
    console = Console(stderr=True)
    total = sum(2 * cfg.budget(c) for c in levels)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=False) as prog:
        overall = prog.add_task("all requests", total=total)
        current: dict[str, TaskID | None] = {"task": None}

        def progress(label: str, n: int):
            if current["task"] is not None:
                prog.update(current["task"], visible=False)
            task = prog.add_task(label, total=n)
            current["task"] = task

            def tick() -> None:
                prog.advance(task)
                prog.advance(overall)

            return tick

        run = run_bench(cfg, alpha_threshold, itl_tolerance, progress=progress, log=lambda m: console.print(f"[yellow]{m}"), environment=environment)
    out = out or Path("reports") / time.strftime("bench-%Y%m%d-%H%M%S")
    write_report(run, out)
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
    if fail_on_gate and g.verdict == "fail":
        raise GateFailed(f"gate failed: {g.recommendation}")
