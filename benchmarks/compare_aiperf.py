"""Cross-check `eagle3-trt bench` against NVIDIA's AIPerf: same server, same prompts, same load.

For each concurrency level (default 1 and 8) and round, this runs the bench's speculation-on arm
(``clients/bench.run_arm``) over gRPC streaming (what ``eagle3-trt bench`` uses) and over HTTP
``generate_stream`` (AIPerf's transport, to separate transport from client), then AIPerf 0.13 (``aiperf profile``, HTTP
``/v2/models/<model>/generate_stream`` through its ``template`` endpoint: a Jinja2 body with the
Triton generate fields, ``text_output`` read from each server-sent event), with the same
chat-formatted prompts, max_tokens, concurrency and request count, and prints TTFT, ITL and
output throughput side by side with the relative difference (goal: within 10 %).

Both sides are put on AIPerf's definitions so that the comparison is like for like:
- TTFT: send -> first response that carries text, per request; mean and p50.
- ITL: per request (latency - TTFT) / (output tokens - 1), then the mean and p50 over requests
  (AIPerf's ``inter_token_latency``). The bench's own ITL (one sample per token) is printed too.
- Output throughput: output tokens / wall time of the run. AIPerf counts tokens by re-tokenizing
  the returned text with ``--tokenizer`` (the bundle's tokenizer); the bench uses the server's
  ``num_output_tokens``. The token totals are printed, so a re-tokenization difference shows.

Without --url it builds the tiny FP8 bundle (or takes --bundle), packages it and starts a real
tritonserver on 127.0.0.1 with free ports, as benchmarks/bench_serving_overhead.py does.

Dynamo mode (``--dynamo``): the same against NVIDIA Dynamo's OpenAI frontend (``eagle3-trt
serve-dynamo``; started here with ``--workers`` workers unless ``--openai-url`` names a running one):
the bench's speculation-on arm through ``OpenAIClient`` (``/v1/chat/completions``, the frontend
applies the chat template) against AIPerf's ``chat`` endpoint type with the same raw prompts,
``max_tokens`` and greedy sampling. AIPerf cannot read ``nvext``, so acceptance length is taken for
both sides from the workers' Prometheus counters around each run (output tokens / target forwards,
prefill included: the definition of the responses' ``acceptance_length``), and for the bench also
from its responses.

    .venv/bin/python benchmarks/compare_aiperf.py [--bundle DIR] [--concurrency 1,8] [--requests 16] \
        [--max-tokens 48] [--rounds 1] [--aiperf .venv-aiperf/bin/aiperf] [--json out.json]
    .venv/bin/python benchmarks/compare_aiperf.py --dynamo [--workers 2] [--openai-url URL --dynamo-state-dir DIR] ...
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eagle3_trt.clients.bench import BenchConfig, run_arm  # noqa: E402
from eagle3_trt.clients.chat import PromptFormatter  # noqa: E402
from eagle3_trt.clients.prom import scrape  # noqa: E402
from eagle3_trt.convert.prompts import load_prompts  # noqa: E402
from eagle3_trt.dynamo_serving.launcher import Deployment, free_port  # noqa: E402
from eagle3_trt.dynamo_serving.launcher import start as start_dynamo  # noqa: E402
from eagle3_trt.dynamo_serving.launcher import stop as stop_dynamo  # noqa: E402
from eagle3_trt.pipeline.builder import EngineRequest, build_bundle  # noqa: E402 - after the sys.path line above
from eagle3_trt.pipeline.presets import load_preset  # noqa: E402
from eagle3_trt.triton_serving.package import package_bundle  # noqa: E402
from eagle3_trt.triton_serving.server import free_ports, start_server, stop_server  # noqa: E402

DEFAULT_PROMPTS = ROOT / "convert" / "data" / "calib_prompts.jsonl"

# The Triton generate request AIPerf sends (its template endpoint renders this with Jinja2).
TEMPLATE = """{"text_input": {{ text|tojson }}, "streaming": {{ stream|tojson }}, "sampling_param_max_tokens": %d,
 "sampling_param_exclude_input_from_output": true, "sampling_param_return_perf_metrics": false}"""


def mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def bench_side(url: str, model: str, prompts: list[str], c: int, n: int, max_tokens: int, http: bool = False, endpoint: str = "triton") -> dict:
    cfg = BenchConfig(
        url=url,
        model=model,
        prompts=prompts,
        concurrency=[c],
        max_tokens=max_tokens,
        requests_per_level=n,
        max_requests=n,
        warmup=0,
        http=http,
        endpoint=endpoint,
    )
    recs, wall = run_arm(cfg, c, True)
    ok = [r for r in recs if r.ok]
    # Acceptance length over the run, tokens per target forward (prefill included): forwards = n / AL per request.
    fwd = sum(round(r.n_tokens / r.acceptance_length) for r in ok if r.acceptance_length)
    al = sum(r.n_tokens for r in ok if r.acceptance_length) / fwd if fwd else None
    itl_req = [(r.latency_s - r.ttft_s) / (r.n_tokens - 1) for r in ok if r.n_tokens > 1]
    per_token = sorted(x for r in ok for x in r.itl_samples())
    tokens = sum(r.n_tokens for r in ok)
    return {
        "requests": len(recs),
        "errors": len(recs) - len(ok),
        "output_tokens": tokens,
        "wall_s": wall,
        "ttft_mean_ms": mean([r.ttft_s * 1e3 for r in ok]),
        "ttft_p50_ms": median([r.ttft_s * 1e3 for r in ok]),
        "itl_mean_ms": mean([x * 1e3 for x in itl_req]),
        "itl_p50_ms": median([x * 1e3 for x in itl_req]),
        "itl_per_token_p50_ms": median([x * 1e3 for x in per_token]),
        "output_tokens_per_s": tokens / wall if wall > 0 else None,
        "al_responses": al,
    }


# ---- Dynamo / OpenAI mode ------------------------------------------------------------------------
def worker_counters(dep: Deployment) -> dict[str, float]:
    """The eagle3_* counters summed over the deployment's workers (their /metrics)."""
    out: dict[str, float] = {}
    for w in dep.workers:
        for (name, _labels), v in scrape(f"http://127.0.0.1:{w.port}/metrics").items():
            if name in ("eagle3_output_tokens_total", "eagle3_target_forwards_total", "eagle3_draft_tokens_total", "eagle3_accepted_draft_tokens_total"):
                out[name] = out.get(name, 0.0) + v
    return out


def with_metrics_al(dep: Deployment, fn) -> dict:
    """Run ``fn()`` and add the acceptance length the workers' counters saw during it."""
    before = worker_counters(dep)
    res = fn()
    after = worker_counters(dep)
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    fwd = d.get("eagle3_target_forwards_total", 0.0)
    res["al_metrics"] = d.get("eagle3_output_tokens_total", 0.0) / fwd if fwd else None
    res["server_output_tokens"] = d.get("eagle3_output_tokens_total")
    return res


def aiperf_chat_side(
    aiperf: str, base_url: str, model: str, tokenizer: Path, prompts_file: Path, max_tokens: int, c: int, n: int, out: Path, reuse: str = "never"
) -> dict:
    """AIPerf's OpenAI ``chat`` endpoint type (messages; the frontend applies the chat template).

    ``reuse`` is AIPerf's --connection-reuse-strategy. Its default, ``pooled``, against Dynamo 1.6.1's
    frontend on loopback delays the first byte of every response on a reused connection by 20-30 ms
    and delivers the events in 2-3 bursts (AIPerf's own per-request ``http_req_waiting`` and
    ``http_req_chunks_received``; seen here at C=1 with 16-token answers: TTFT 43-52 ms against 19-29 ms on a fresh
    connection, ITL 0.5-1 ms against 2.7 ms), the pattern of Nagle's algorithm meeting delayed ACKs on
    a keep-alive socket; the bench's HTTP client (Python's http.client sends headers and body in one
    write) does not see it. ``never`` (a new connection per request) measures the server instead."""
    extra = json.dumps({"max_tokens": max_tokens, "temperature": 0})
    cmd = [
        aiperf,
        "profile",
        "--model",
        model,
        "--url",
        base_url,
        "--endpoint-type",
        "chat",
        "--streaming",
        "--extra-inputs",
        extra,
        "--input-file",
        str(prompts_file),
        "--custom-dataset-type",
        "single_turn",
        "--dataset-sampling-strategy",
        "sequential",
        "--tokenizer",
        str(tokenizer),
        "--concurrency",
        str(c),
        "--request-count",
        str(n),
        "--output-artifact-dir",
        str(out),
        "--ui-type",
        "none",
        "--no-auto-plot",
        "--workers-max",
        str(max(1, min(c, 4))),
        "--connection-reuse-strategy",
        reuse,
    ]
    return _run_aiperf(cmd, out)


def aiperf_side(aiperf: str, http_url: str, model: str, tokenizer: Path, prompts_file: Path, template_file: Path, c: int, n: int, out: Path) -> dict:
    cmd = [
        aiperf,
        "profile",
        "--model",
        model,
        "--url",
        http_url,
        "--endpoint-type",
        "template",
        "--custom-endpoint",
        f"/v2/models/{model}/generate_stream",
        "--streaming",
        "--extra-inputs",
        f"payload_template:{template_file}",
        "--extra-inputs",
        "response_field:text_output",
        "--input-file",
        str(prompts_file),
        "--custom-dataset-type",
        "single_turn",
        "--dataset-sampling-strategy",
        "sequential",
        "--tokenizer",
        str(tokenizer),
        "--concurrency",
        str(c),
        "--request-count",
        str(n),
        "--output-artifact-dir",
        str(out),
        "--ui-type",
        "none",
        "--no-auto-plot",
        "--workers-max",
        str(max(1, min(c, 4))),
    ]
    return _run_aiperf(cmd, out)


def _run_aiperf(cmd: list[str], out: Path) -> dict:
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    took = time.monotonic() - t0
    if r.returncode != 0:
        raise RuntimeError(f"aiperf failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    found = sorted(out.rglob("profile_export_aiperf.json"))
    if not found:
        raise RuntimeError(f"aiperf wrote no profile_export_aiperf.json under {out}:\n{r.stdout[-2000:]}")
    data = json.loads(found[-1].read_text())

    def metric(tag: str, stat: str) -> float | None:
        m = data.get(tag) or next((x for x in data.get("records", []) if isinstance(x, dict) and x.get("tag") == tag), None)
        return None if not m else m.get(stat)

    return {
        "requests": metric("request_count", "avg"),
        "errors": metric("error_request_count", "avg") or 0,
        "output_tokens": metric("total_output_tokens", "avg"),
        "wall_s": metric("benchmark_duration", "avg"),
        "ttft_mean_ms": metric("time_to_first_token", "avg"),
        "ttft_p50_ms": metric("time_to_first_token", "p50"),
        "itl_mean_ms": metric("inter_token_latency", "avg"),
        "itl_p50_ms": metric("inter_token_latency", "p50"),
        "itl_per_token_p50_ms": None,
        "output_tokens_per_s": metric("output_token_throughput", "avg"),
        "process_s": took,
        "export": str(found[-1]),
    }


ROWS = (
    ("TTFT mean (ms)", "ttft_mean_ms"),
    ("TTFT p50 (ms)", "ttft_p50_ms"),
    ("ITL mean (ms)", "itl_mean_ms"),
    ("ITL p50 (ms)", "itl_p50_ms"),
    ("output tok/s", "output_tokens_per_s"),
    ("output tokens", "output_tokens"),
    ("requests (errors)", "requests"),
    ("bench ITL per token p50 (ms)", "itl_per_token_p50_ms"),
)


def combine(rounds: list[dict]) -> dict:
    """Median over rounds of each figure (None when no round has it)."""
    out = {}
    for k in rounds[0]:
        vals = [r[k] for r in rounds if isinstance(r.get(k), (int, float))]
        out[k] = statistics.median(vals) if vals else rounds[0][k]
    return out


def _diff(x, y) -> str:
    return f"{(x / y - 1) * 100:+7.1f}%" if isinstance(x, (int, float)) and isinstance(y, (int, float)) and y else "      -"


def table(c: int, g: dict, h: dict, a: dict) -> str:
    """bench over gRPC, bench over HTTP (AIPerf's transport), AIPerf; differences against AIPerf."""
    lines = [f"concurrency {c}", f"  {'':30s} {'bench gRPC':>11s} {'bench HTTP':>11s} {'AIPerf':>9s} {'HTTP/AIPerf':>12s} {'gRPC/AIPerf':>12s}"]
    for label, k in ROWS:
        vals = [d.get(k) for d in (g, h, a)]
        if k == "requests":
            cells = [f"{d.get(k) or 0:.0f} ({d.get('errors') or 0:.0f})" for d in (g, h, a)]
            lines.append(f"  {label:30s} {cells[0]:>11s} {cells[1]:>11s} {cells[2]:>9s}")
            continue
        cells = ["-" if v is None else f"{v:.2f}" for v in vals]
        lines.append(f"  {label:30s} {cells[0]:>11s} {cells[1]:>11s} {cells[2]:>9s} {_diff(vals[1], vals[2]):>12s} {_diff(vals[0], vals[2]):>12s}")
    return "\n".join(lines)


ROWS_OPENAI = (
    ("TTFT mean (ms)", "ttft_mean_ms"),
    ("TTFT p50 (ms)", "ttft_p50_ms"),
    ("ITL mean (ms)", "itl_mean_ms"),
    ("ITL p50 (ms)", "itl_p50_ms"),
    ("output tok/s", "output_tokens_per_s"),
    ("output tokens", "output_tokens"),
    ("AL, worker metrics", "al_metrics"),
    ("AL, responses", "al_responses"),
    ("requests (errors)", "requests"),
)


def table_openai(c: int, b: dict, a: dict) -> str:
    """bench over the OpenAI endpoint vs AIPerf's chat endpoint, same frontend."""
    lines = [f"concurrency {c}", f"  {'':30s} {'bench':>9s} {'AIPerf':>9s} {'bench/AIPerf':>13s}"]
    for label, k in ROWS_OPENAI:
        if k == "requests":
            cells = [f"{d.get(k) or 0:.0f} ({d.get('errors') or 0:.0f})" for d in (b, a)]
            lines.append(f"  {label:30s} {cells[0]:>9s} {cells[1]:>9s}")
            continue
        x, y = b.get(k), a.get(k)
        lines.append(f"  {label:30s} {'-' if x is None else f'{x:.2f}':>9s} {'-' if y is None else f'{y:.2f}':>9s} {_diff(x, y):>13s}")
    return "\n".join(lines)


def main_dynamo(args, aiperf: str, tmp: Path) -> int:
    bundle = args.bundle
    dep = None
    started = False
    if args.openai_url is None:
        bundle = bundle or build_bundle(EngineRequest(preset=load_preset("tiny"), target_gpu="h100", out=str(tmp / "bundle"))).bundle
        dep = start_dynamo(bundle, workers=args.workers, state_dir=tmp / "dynamo", http_port=free_port(), torch_threads=args.threads, model_name=args.model)
        started = True
    else:
        dep = Deployment.load(args.dynamo_state_dir)
        if dep is None or dep.url.rstrip("/") != args.openai_url.rstrip("/"):
            print(
                f"--openai-url: no serve-dynamo deployment at {args.openai_url} recorded in {args.dynamo_state_dir} "
                "(its workers' metrics give the acceptance length)",
                file=sys.stderr,
            )
            return 2
        bundle = bundle or Path(dep.bundle)
    results = []
    try:
        prompts = load_prompts(args.prompts)[: args.num_prompts]
        prompts_file = tmp / "prompts.jsonl"
        prompts_file.write_text("".join(json.dumps({"text": p}) + "\n" for p in prompts))
        tokenizer = Path(bundle) / "tokenizer"
        base = dep.url[: -len("/v1")]
        bench_side(dep.url, args.model, prompts, 1, 2, 8, endpoint="openai")  # warm-up
        for c in [int(x) for x in args.concurrency.split(",")]:
            n = max(args.requests, c)
            b_rounds, a_rounds = [], []
            for i in range(args.rounds):  # alternate, so drift on a shared machine hits both alike
                b_rounds.append(with_metrics_al(dep, lambda: bench_side(dep.url, args.model, prompts, c, n, args.max_tokens, endpoint="openai")))
                a_rounds.append(
                    with_metrics_al(
                        dep,
                        lambda: aiperf_chat_side(
                            aiperf, base, args.model, tokenizer, prompts_file, args.max_tokens, c, n, tmp / f"aiperf-c{c}-r{i}", args.aiperf_connection_reuse
                        ),
                    )
                )
            b, a = combine(b_rounds), combine(a_rounds)
            results.append(
                {"concurrency": c, "requests": n, "bench_openai": b, "aiperf_chat": a, "rounds": {"bench_openai": b_rounds, "aiperf_chat": a_rounds}}
            )
            print(table_openai(c, b, a), flush=True)
    finally:
        if started:
            stop_dynamo(dep)
    out = {
        "server": "dynamo",
        "workers": len(dep.workers),
        "bundle": str(bundle),
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "prompts": len(prompts),
        "results": results,
    }
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    print("goal: TTFT, ITL, throughput and AL within 10 %; see README 'Serving with Dynamo'")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, default=None)
    ap.add_argument("--url", default=None, help="HTTP host:port of a running server (then --grpc-url too); default: start one")
    ap.add_argument("--grpc-url", default=None)
    ap.add_argument("--model", default="eagle3")
    ap.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS)
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--requests", type=int, default=16, help="requests per level (at least the concurrency)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=1, help="alternating bench/AIPerf rounds per level; the median is shown")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the served reference runtime")
    ap.add_argument("--aiperf", default=str(ROOT / ".venv-aiperf" / "bin" / "aiperf"))
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--dynamo", action="store_true", help="against NVIDIA Dynamo's OpenAI frontend instead of Triton")
    ap.add_argument("--openai-url", default=None, help="--dynamo: a running serve-dynamo frontend (http://host:port/v1)")
    ap.add_argument("--dynamo-state-dir", type=Path, default=Path(".serve-dynamo"), help="--dynamo with --openai-url: its state dir")
    ap.add_argument("--workers", type=int, default=2, help="--dynamo without --openai-url: workers to start")
    ap.add_argument(
        "--aiperf-connection-reuse",
        default="never",
        choices=["never", "pooled"],
        help="--dynamo: AIPerf's --connection-reuse-strategy (see aiperf_chat_side for why never)",
    )
    args = ap.parse_args()

    aiperf = args.aiperf if Path(args.aiperf).exists() else shutil.which("aiperf")
    if not aiperf:
        print("aiperf not found: `make bench-aiperf` installs it into .venv-aiperf (pip install 'eagle3-trt[bench]')", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="e3-aiperf-"))
    if args.dynamo:
        return main_dynamo(args, aiperf, tmp)
    server = None
    bundle = args.bundle
    if args.url is None:
        bundle = bundle or build_bundle(EngineRequest(preset=load_preset("tiny"), target_gpu="h100", out=str(tmp / "bundle"))).bundle
        package_bundle(bundle, tmp / "repo", torch_threads=args.threads)
        h, g, m = free_ports(3)
        server = start_server(tmp / "repo", state_dir=tmp / "state", http_port=h, grpc_port=g, metrics_port=m, timeout_s=600)
        http_url, grpc_url = server.http_url, server.grpc_url
    else:
        if bundle is None or args.grpc_url is None:
            ap.error("--url needs --grpc-url and --bundle (the tokenizer and chat template)")
        http_url, grpc_url = args.url if args.url.startswith("http") else f"http://{args.url}", args.grpc_url
    try:
        fmt = PromptFormatter(bundle)
        prompts = [fmt(p) for p in load_prompts(args.prompts)[: args.num_prompts]]
        prompts_file = tmp / "prompts.jsonl"
        prompts_file.write_text("".join(json.dumps({"text": p}) + "\n" for p in prompts))
        template_file = tmp / "generate.j2"
        template_file.write_text(TEMPLATE % args.max_tokens)
        tokenizer = Path(bundle) / "tokenizer"
        # warm both paths (first requests pay for lazy initialisation on the server)
        bench_side(grpc_url, args.model, prompts, 1, 2, 8)
        results = []
        for c in [int(x) for x in args.concurrency.split(",")]:
            n = max(args.requests, c)
            g_rounds, h_rounds, a_rounds = [], [], []
            for i in range(args.rounds):  # alternate, so drift on a shared machine hits all three alike
                g_rounds.append(bench_side(grpc_url, args.model, prompts, c, n, args.max_tokens))
                h_rounds.append(bench_side(http_url, args.model, prompts, c, n, args.max_tokens, http=True))
                a_rounds.append(aiperf_side(aiperf, http_url, args.model, tokenizer, prompts_file, template_file, c, n, tmp / f"aiperf-c{c}-r{i}"))
            g, h, a = combine(g_rounds), combine(h_rounds), combine(a_rounds)
            results.append(
                {
                    "concurrency": c,
                    "requests": n,
                    "bench_grpc": g,
                    "bench_http": h,
                    "aiperf": a,
                    "rounds": {"bench_grpc": g_rounds, "bench_http": h_rounds, "aiperf": a_rounds},
                }
            )
            print(table(c, g, h, a), flush=True)
    finally:
        if server is not None:
            stop_server(server)
    out = {"bundle": str(bundle), "max_tokens": args.max_tokens, "rounds": args.rounds, "prompts": len(prompts), "results": results}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    print("goal: TTFT, ITL and throughput within 10 %; see README 'Rollout benchmark' for the differences in method")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
