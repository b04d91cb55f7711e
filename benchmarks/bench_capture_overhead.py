"""Per-request cost of traffic capture: two real tritonservers on one bundle, one with
``--capture DIR --capture-redact REGEX`` and one without, the same requests sent to each in turn.

Builds the tiny FP8 bundle (or takes --bundle), packages it twice (one repository per server),
starts both servers on 127.0.0.1 with free ports (1 torch thread each), warms both, then for every
round sends every prompt to each server (gRPC streaming, batch 1, greedy), alternating which goes
first, so drift on a shared machine hits both alike. Latency = client send -> last token. The
capture thread runs while the next request is served, so its work is part of what is measured.

Printed: the median per-request latency of each side, the added milliseconds and the ratio
(median capture-on / median capture-off), the median of the per-pair ratios and their spread, and
how many records the capturing server wrote (every request it served, warm-up included); then the
capturer alone in this process: the cost of ``record`` on the request path (a queue put) and the
capture thread's time per record.

    .venv/bin/python benchmarks/bench_capture_overhead.py [--bundle DIR] [--rounds 8] [--max-tokens 32] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about the ocean. My key is sk-live-0123456789abcdef.",
    "Explain what a hash table is.",
    "Give three tips for writing clean code.",
]
REDACT = r"sk-live-[0-9a-f]+"


def capture_cost(bundle: Path, tmp: Path, n: int = 2000) -> dict:
    """The capturer alone, in this process, on records of the size the servers see: what ``record``
    costs the request path (a queue put), and the capture thread's wall time per record (decode,
    redaction, re-encoding, JSON, atomic segment rewrites every 0.5 s)."""
    from eagle3_trt.pipeline.bundle import open_bundle
    from eagle3_trt.runtime.capture import CaptureConfig, Capturer, CaptureSource, load_tokenizer
    from eagle3_trt.runtime.llm_api import SpecStats

    b = open_bundle(bundle)
    tok = load_tokenizer(b.tokenizer_dir)
    warnings: list[str] = []
    cap = Capturer(
        CaptureConfig(dir=tmp / "direct", redact=(REDACT,)),
        CaptureSource(b.manifest.fingerprint, "eagle3", "triton", "1"),
        tokenizer=lambda: tok,
        warn=warnings.append,
        queue_size=n + 1,
    )
    ids = [tok.encode(p) for p in PROMPTS]
    out = tok.encode(" The answer is a short sentence of about thirty tokens, give or take a few of them here.", add_special_tokens=False)
    stats = SpecStats(True, 60, 20, 12, len(out))
    sampling = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 32, "seed": None}
    calls = []
    t0 = time.perf_counter()
    for i in range(n):
        k = i % len(PROMPTS)
        c0 = time.perf_counter()
        cap.record(request_id=str(i), prompt_ids=ids[k], prompt_text=PROMPTS[k], output_ids=out, output_text="x" * 90, sampling=sampling, stats=stats)
        calls.append(time.perf_counter() - c0)
    cap.close()
    wall = time.perf_counter() - t0
    assert not warnings and cap.written == n, (warnings, cap.written)
    return {"records": n, "record_call_us_median": statistics.median(calls) * 1e6, "capture_thread_ms_per_record": wall / n * 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from eagle3_trt.clients.chat import PromptFormatter
    from eagle3_trt.clients.llm_client import GenerationParams, LLMClient
    from eagle3_trt.formats.traffic import read_traffic
    from eagle3_trt.runtime.capture import capture_config
    from eagle3_trt.triton_serving.package import package_bundle
    from eagle3_trt.triton_serving.server import free_ports, start_server, stop_server

    tmp = Path(tempfile.mkdtemp(prefix="e3-capture-bench-"))
    if args.bundle is None:
        from eagle3_trt.pipeline.builder import EngineRequest, build_bundle
        from eagle3_trt.pipeline.presets import load_preset

        bundle = build_bundle(EngineRequest(preset=load_preset("tiny"), target_gpu="h100", out=str(tmp / "bundle"))).bundle
    else:
        bundle = args.bundle
    cap_dir = tmp / "capture"
    ports = free_ports(6)
    servers = {}
    try:
        for i, side in enumerate(("off", "on")):
            package_bundle(bundle, tmp / f"repo-{side}", torch_threads=1)
            cap = capture_config(cap_dir, redact=[REDACT]) if side == "on" else None
            h, g, m = ports[3 * i : 3 * i + 3]
            servers[side] = start_server(tmp / f"repo-{side}", state_dir=tmp / f"state-{side}", http_port=h, grpc_port=g, metrics_port=m, capture=cap)
        fmt = PromptFormatter(bundle)
        texts = [fmt(p) for p in PROMPTS]
        clients = {side: LLMClient(s.grpc_url, timeout_s=600) for side, s in servers.items()}
        params = GenerationParams(max_tokens=args.max_tokens)

        def once(side: str, text: str) -> float:
            r = clients[side].generate(text, params, stream=True)
            assert r.n_tokens == args.max_tokens or r.finish_reason == "stop", r
            return r.t_end - r.t_send

        sent_on = 0
        for text in texts:  # warm both
            once("off", text)
            once("on", text)
            sent_on += 1
        lat: dict[str, list[float]] = {"off": [], "on": []}
        pairs = []
        for rnd in range(args.rounds):
            order = ("off", "on") if rnd % 2 == 0 else ("on", "off")
            for text in texts:
                got = {side: once(side, text) for side in order}
                sent_on += 1
                for side, v in got.items():
                    lat[side].append(v)
                pairs.append(got["on"] / got["off"])
        for c in clients.values():
            c.close()
    finally:
        for s in servers.values():
            stop_server(s)
    records = len(read_traffic(cap_dir)) if cap_dir.is_dir() else 0
    direct = capture_cost(bundle, tmp)
    off, on = statistics.median(lat["off"]), statistics.median(lat["on"])
    q = statistics.quantiles(pairs, n=10)
    result = {
        "bundle": str(bundle),
        "requests_per_side": len(lat["off"]),
        "max_tokens": args.max_tokens,
        "off_latency_ms_median": off * 1e3,
        "on_latency_ms_median": on * 1e3,
        "added_ms_per_request": (on - off) * 1e3,
        "ratio_on_off": on / off,
        "paired_ratio_median": statistics.median(pairs),
        "paired_ratio_p10": q[0],
        "paired_ratio_p90": q[-1],
        "records_written": records,
        **direct,
        "requests_sent_to_capturing_server": sent_on,
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"bundle {bundle}; {result['requests_per_side']} requests per side ({args.rounds} alternating rounds x {len(PROMPTS)} prompts), "
        f"max_tokens {args.max_tokens}, batch 1, greedy, 1 torch thread per server"
    )
    print(f"capture off: median latency {off * 1e3:.1f} ms per request")
    print(f"capture on : median latency {on * 1e3:.1f} ms per request ({REDACT!r} redacted)")
    print(f"overhead   : {result['added_ms_per_request']:+.2f} ms per request, ratio {on / off:.3f}")
    print(f"paired     : median on/off {result['paired_ratio_median']:.3f} (p10 {q[0]:.3f}, p90 {q[-1]:.3f})")
    print(f"records    : {records} written for {sent_on} requests served by the capturing server")
    print(
        f"capturer   : record() on the request path {direct['record_call_us_median']:.1f} us (median of {direct['records']}); "
        f"capture thread {direct['capture_thread_ms_per_record']:.2f} ms per record, off the request path"
    )
    print(f"machine    : {os.cpu_count()} cores, load average {', '.join(f'{x:.1f}' for x in os.getloadavg())} (other work shares it)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
