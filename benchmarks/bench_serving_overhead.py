"""Per-token serving overhead: the Triton model (and Dynamo's frontend) vs the runtime called
directly, same bundle, same prompts, greedy, at concurrency 1 to 64, speculation on and off.

Builds the tiny FP8 bundle (or takes --bundle), packages it, starts a real tritonserver on
127.0.0.1 with free ports (with --dynamo also Dynamo's frontend and one reference-runtime
worker), and a "direct" process that opens the same runtime with ``runtime.factory.open_llm``
(``ReferenceLLM``, the object the Triton model and the Dynamo worker drive, in place of
TensorRT-LLM's ``LLM``) and streams from ``generate_async`` in an asyncio loop, as a Python
program using the LLM API would. What the comparison measures is therefore the serving layer:
Triton's process, the Python model (``model.py`` over ``triton_serving/job.py``) and the client
(or Dynamo's frontend, its request plane and the worker's ``engine.py``). Every side gets the same
executor from ``open_llm``: the engine in a worker process under the opener (TensorRT-LLM's split for
one GPU, ``GenerationExecutor.create`` in tensorrt_llm/executor/executor.py @ed53795b; see
``ReferenceLLM``), so the ratio compares like with like, and each side's CPU counts that worker.

Every server process and the direct process run in their own session: with the kernel's
autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``) each session gets an equal
share of a loaded CPU, so a direct process left in the benchmark's session would run slower than
a server in its own (an earlier version of this benchmark reported Triton 40-60 % *faster* than
the runtime it wraps on a loaded machine for that reason).

A round, at each concurrency C and speculation setting: C=1, every prompt once on each side,
request by request (direct, Triton[, Dynamo], sides rotated each round); C>1, one wave of C
requests started together on each side, in turn. Per side and round: ITL = median over the
round's requests of (last token time - first token time) / (tokens - first response's tokens),
from the client's clock (the direct side: the time each ``RequestOutput`` update reached the
consumer), and throughput = generated tokens / the wave's wall time. The headline per row is the
median over rounds of each round's ITL overhead (side ITL / direct ITL - 1) with min..max, and
the same for throughput. Goal from issue 32: <= 5 % added ITL at C=1, speculation on and off
(median over at least 7 rounds, quiet machine).

    .venv/bin/python benchmarks/bench_serving_overhead.py [--bundle DIR] [--rounds 9] [--concurrency 1]
        [--max-tokens 48] [--speculate both] [--dynamo] [--http] [--rounds-high 3] [--json]

The README table (concurrency 1-64, Triton and Dynamo): ``--concurrency 1,8,32,64 --dynamo
--rounds 7 --rounds-high 3 --max-tokens 32``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about the ocean.",
    "Explain what a hash table is.",
    "Give three tips for writing clean code.",
]
DYNAMO_STAMP = ROOT / ".venv" / ".eagle3-trt-dynamo"


def build_bundle(out: Path) -> Path:
    from eagle3_trt.pipeline.builder import EngineRequest, build_bundle
    from eagle3_trt.pipeline.presets import load_preset

    return build_bundle(EngineRequest(preset=load_preset("tiny"), target_gpu="h100", out=str(out))).bundle


# The direct side runs in its own process (and session): gRPC's client library keeps background
# threads alive in any process that used it, and they would slow a runtime sharing that process.
DIRECT_WORKER = r"""
import asyncio, json, sys, time
sys.path.insert(0, sys.argv[3])
from eagle3_trt.runtime.factory import open_llm
from eagle3_trt.triton_serving.job import prompt_has_bos
llm = open_llm(sys.argv[1], "reference", device="cpu", torch_threads=int(sys.argv[2]), speculation=True)
tok = llm.tokenizer

async def one(text, max_tokens, speculate):
    ids = tok.encode(text, add_special_tokens=not prompt_has_bos(tok, text))
    sp = llm.sampling_params_cls(max_tokens=max_tokens, top_k=1, eagle3_speculative=speculate)
    t0 = time.perf_counter()
    times, counts, seen = [], [], 0
    async for out in llm.generate_async(ids, sp, streaming=True):
        n = len(out.outputs[0].token_ids)
        if n > seen:
            times.append(time.perf_counter())
            counts.append(n - seen)
            seen = n
    return {"t0": t0, "times": times, "counts": counts}

async def wave(req):
    t0 = time.perf_counter()
    rs = await asyncio.gather(*(one(t, req["max_tokens"], req["speculate"]) for t in req["texts"]))
    return {"wall": time.perf_counter() - t0, "requests": rs}

print("ready", flush=True)
for line in sys.stdin:
    print(json.dumps(asyncio.run(wave(json.loads(line)))), flush=True)
llm.shutdown()
"""


class DirectRuntime:
    def __init__(self, bundle: Path, threads: int):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", DIRECT_WORKER, str(bundle), str(threads), str(ROOT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        if self.proc.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
            raise RuntimeError("direct runtime worker failed to start")

    def wave(self, texts: list[str], max_tokens: int, speculate: bool) -> dict:
        self.proc.stdin.write(json.dumps({"texts": texts, "max_tokens": max_tokens, "speculate": speculate}) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return json.loads(self.proc.stdout.readline())  # type: ignore[union-attr]

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait(30)


class ClientSide:
    """C client objects (one per thread, as LLMClient and OpenAIClient want), one wave at a time."""

    def __init__(self, make, c: int):
        self.clients = [make() for _ in range(c)]

    def wave(self, texts: list[str], max_tokens: int, speculate: bool) -> dict:
        from eagle3_trt.clients.llm_client import GenerationParams

        params = GenerationParams(max_tokens=max_tokens, speculative=speculate)
        out: list = [None] * len(texts)
        start = threading.Barrier(len(texts) + 1)

        def run(i: int) -> None:
            start.wait()
            try:
                r = self.clients[i].generate(texts[i], params, stream=True)
                chunks = [c for c in r.chunks if c.n_tokens]
                out[i] = {"t0": r.t_send, "times": [c.t for c in chunks], "counts": [c.n_tokens for c in chunks]}
            except Exception as e:  # reported, never silently dropped
                out[i] = {"error": f"{type(e).__name__}: {e}"}

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(texts))]
        for t in threads:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        return {"wall": time.perf_counter() - t0, "requests": out}

    def close(self) -> None:
        for c in self.clients:
            c.close()


def _proc_tree(root: int) -> list[int]:
    """``root`` and its descendants (Triton's Python-backend stubs are children of tritonserver)."""
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                parent[int(d)] = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += [c for c, pp in parent.items() if pp == p]
    return out


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds the processes have used (all their threads)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in pids:
        try:
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(f[11]) + int(f[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / tick


class Metered:
    """A side whose waves also report the CPU seconds its processes used (load-robust: other
    work on the machine stretches wall time, much less the CPU a token costs)."""

    def __init__(self, side, pids: list[int]):
        self.side, self.pids = side, pids

    def wave(self, texts: list[str], max_tokens: int, speculate: bool) -> dict:
        c0 = cpu_s(self.pids)
        w = self.side.wave(texts, max_tokens, speculate)
        w["cpu_s"] = cpu_s(self.pids) - c0
        return w

    def close(self) -> None:
        self.side.close()


def itl(r: dict) -> float | None:
    times, counts = r["times"], r["counts"]
    n = sum(counts)
    if len(times) < 2 or n <= counts[0]:
        return None
    return (times[-1] - times[0]) / (n - counts[0])


def spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)} if xs else {"median": None, "min": None, "max": None}


def side_round(waves: list[dict]) -> dict:
    """One side's round: median ITL over its requests, throughput over its waves."""
    reqs = [r for w in waves for r in w["requests"]]
    errors = [r["error"] for r in reqs if "error" in r]
    if errors:
        raise RuntimeError(f"{len(errors)} request(s) failed: {errors[0]}")
    itls = [x for x in (itl(r) for r in reqs) if x is not None]
    tokens = sum(sum(r["counts"]) for r in reqs)
    wall = sum(w["wall"] for w in waves)
    cpu = sum(w.get("cpu_s", 0.0) for w in waves)
    return {
        "itl": statistics.median(itls) if itls else None,
        "tokens": tokens,
        "tok_s": tokens / wall if wall else None,
        "cpu_ms_tok": cpu / tokens * 1e3 if tokens else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=9, help="alternating rounds at concurrency 1 (at least 7)")
    ap.add_argument("--rounds-high", type=int, default=3, help="alternating rounds at concurrency above 1")
    ap.add_argument("--concurrency", default="1", help="comma-separated levels, e.g. 1,8,32,64")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--speculate", choices=["on", "off", "both"], default="both")
    ap.add_argument("--dynamo", action="store_true", help="also through Dynamo's frontend (needs the dynamo extra: make .venv/.eagle3-trt-dynamo)")
    ap.add_argument(
        "--http",
        action="store_true",
        help="also over HTTP generate_stream: through serve's HTTP front (http_front) and straight to tritonserver's own HTTP port",
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads on every side (1 is far less noisy on a shared CPU)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.rounds < 7:
        ap.error("--rounds must be at least 7 (the headline is the median over rounds)")
    try:
        levels = sorted({int(x) for x in args.concurrency.split(",")})
    except ValueError:
        ap.error(f"--concurrency {args.concurrency!r}: comma-separated integers, e.g. 1,8,32,64")
    if not levels or levels[0] < 1 or levels[-1] > 256:
        ap.error("--concurrency: levels from 1 to 256")
    if args.rounds_high < 1:
        ap.error("--rounds-high must be at least 1")
    if args.dynamo:
        from eagle3_trt.dynamo_serving.launcher import check_dynamo
        from eagle3_trt.errors import UserError

        try:
            check_dynamo()
        except UserError as e:
            print(f"error: {e.line()}", file=sys.stderr)
            return 2

    from eagle3_trt.clients.chat import PromptFormatter
    from eagle3_trt.clients.llm_client import LLMClient
    from eagle3_trt.triton_serving.package import package_bundle
    from eagle3_trt.triton_serving.server import free_ports, start_server, stop_server

    load_start = os.getloadavg()
    t_start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="e3-overhead-"))
    bundle = args.bundle or build_bundle(tmp / "bundle")
    package_bundle(bundle, tmp / "repo", torch_threads=args.threads)
    h, g, m = free_ports(3)
    server = start_server(tmp / "repo", state_dir=tmp / "state", http_port=h, grpc_port=g, metrics_port=m, timeout_s=600)
    dep = None
    rows: list[dict] = []
    sides_open: list = []
    try:
        if args.dynamo:
            from eagle3_trt.dynamo_serving import launcher

            dep = launcher.start(
                bundle, workers=1, state_dir=tmp / "dynamo", http_port=launcher.free_port({h, g, m}), torch_threads=args.threads, timeout_s=600
            )
        direct = DirectRuntime(bundle, args.threads)
        sides_open.append(direct)
        fmt = PromptFormatter(bundle)
        chat = [fmt(p) for p in PROMPTS]
        modes = {"on": [True], "off": [False], "both": [True, False]}[args.speculate]

        for c in levels:
            triton = ClientSide(lambda: LLMClient(server.grpc_url, timeout_s=600), c)
            sides_open.append(triton)
            sides = {"direct": Metered(direct, _proc_tree(direct.proc.pid)), "triton": Metered(triton, _proc_tree(server.pid))}
            texts = {"direct": chat, "triton": chat}
            if args.http:  # the front's cost is http_front vs http_triton (same client, same tritonserver)
                for n, url, pids in (
                    ("http_front", server.http_url, [*_proc_tree(server.pid), server.front_pid]),
                    ("http_triton", f"http://127.0.0.1:{server.triton_http_port}", _proc_tree(server.pid)),
                ):
                    sides[n] = Metered(ClientSide(lambda url=url: LLMClient(url, http=True, timeout_s=600), c), pids)
                    sides_open.append(sides[n].side)
                    texts[n] = chat
            if dep is not None:
                from eagle3_trt.clients.openai_client import OpenAIClient

                # Dynamo's frontend applies the chat template itself: it gets the plain prompts.
                sides["dynamo"] = Metered(ClientSide(lambda: OpenAIClient(dep.url, timeout_s=600), c), [p for q in dep.procs for p in _proc_tree(q.pid)])
                sides_open.append(sides["dynamo"].side)
                texts["dynamo"] = list(PROMPTS)
            names = list(sides)
            rounds = args.rounds if c == 1 else args.rounds_high
            for spec in modes:
                for name in names:  # warm every path at this level
                    sides[name].wave([texts[name][i % 4] for i in range(c)], 4, spec)
                per: dict[str, list[dict]] = {n: [] for n in names}
                for k in range(rounds):
                    order = names[k % len(names) :] + names[: k % len(names)]
                    waves: dict[str, list[dict]] = {n: [] for n in names}
                    if c == 1:
                        for i in range(len(PROMPTS)):
                            for n in order:
                                waves[n].append(sides[n].wave([texts[n][i]], args.max_tokens, spec))
                    else:
                        for n in order:
                            waves[n].append(sides[n].wave([texts[n][i % 4] for i in range(c)], args.max_tokens, spec))
                    for n in names:
                        per[n].append(side_round(waves[n]))
                d = per["direct"]
                row = {
                    "concurrency": c,
                    "speculation": spec,
                    "rounds": rounds,
                    "direct_itl_ms": spread([r["itl"] * 1e3 for r in d if r["itl"]]),
                    "direct_tok_s": spread([r["tok_s"] for r in d]),
                    "direct_cpu_ms_per_token": spread([r["cpu_ms_tok"] for r in d]),
                }
                for n in names[1:]:
                    s = per[n]
                    pairs = [(a, b) for a, b in zip(d, s) if a["itl"] and b["itl"]]
                    row[n] = {
                        "itl_ms": spread([b["itl"] * 1e3 for _, b in pairs]),
                        "tok_s": spread([b["tok_s"] for b in s]),
                        "itl_overhead_pct": spread([(b["itl"] / a["itl"] - 1) * 100 for a, b in pairs]),
                        "added_itl_ms": spread([(b["itl"] - a["itl"]) * 1e3 for a, b in pairs]),
                        "throughput_change_pct": spread([(b["tok_s"] / a["tok_s"] - 1) * 100 for a, b in zip(d, s)]),
                        "round_itl_overhead_pct": [round((b["itl"] / a["itl"] - 1) * 100, 2) for a, b in pairs],
                        "cpu_ms_per_token": spread([b["cpu_ms_tok"] for b in s]),
                        "added_cpu_ms_per_token": spread([b["cpu_ms_tok"] - a["cpu_ms_tok"] for a, b in zip(d, s)]),
                    }
                    if c == 1:
                        row[n]["meets_goal"] = row[n]["itl_overhead_pct"]["median"] <= 5.0
                rows.append(row)
                if not args.json:
                    print_row(row, names[1:], flush=True)
            for n in names[1:]:
                sides[n].close()
                sides_open.remove(sides[n].side)
        direct.close()
        sides_open.remove(direct)
    finally:
        for s in sides_open:
            try:
                s.close()
            except Exception:
                pass
        if dep is not None:
            from eagle3_trt.dynamo_serving import launcher

            launcher.stop(dep, grace_s=0)
        stop_server(server)
    result = {
        "bundle": str(bundle),
        "torch_threads": args.threads,
        "max_tokens": args.max_tokens,
        "cpu_count": os.cpu_count(),
        "load_average_start": load_start,
        "load_average_end": os.getloadavg(),
        "wall_s": round(time.monotonic() - t_start, 1),
        "goal_overhead_pct": 5.0,
        "rows": rows,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        la = ", ".join(f"{x:.1f}" for x in load_start)
        lb = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(
            f"bundle {bundle}; {args.max_tokens} max tokens, greedy, {args.threads} torch thread(s) per process; "
            f"{os.cpu_count()} cores, load average {la} at the start, {lb} at the end; {result['wall_s']} s"
        )
        print("ITL overhead = median over rounds of (side ITL / direct ITL - 1) [min..max]; throughput change likewise")
        for r in rows:
            if r["concurrency"] == 1:
                for n in [k for k in ("triton", "dynamo") if k in r]:
                    v = r[n]["itl_overhead_pct"]
                    print(
                        f"goal C=1 speculation {'on' if r['speculation'] else 'off'} {n}: {v['median']:+.1f}% "
                        f"[{v['min']:+.1f}..{v['max']:+.1f}] over {r['rounds']} rounds -> {'meets' if r[n]['meets_goal'] else 'misses'} the 5 % goal"
                    )
    return 0


def print_row(r: dict, others: list[str], flush: bool = False) -> None:
    def f(s: dict, fmt: str) -> str:
        return f"{s['median']:{fmt}} [{s['min']:{fmt}}..{s['max']:{fmt}}]" if s["median"] is not None else "n/a"

    head = (
        f"C={r['concurrency']:<3} spec {'on ' if r['speculation'] else 'off'} ({r['rounds']} rounds) direct ITL {f(r['direct_itl_ms'], '.2f')} ms, "
        f"{f(r['direct_tok_s'], '.0f')} tok/s, CPU {f(r['direct_cpu_ms_per_token'], '.2f')} ms/token"
    )
    print(head, flush=flush)
    for n in others:
        s = r[n]
        print(
            f"    {n:<11} ITL {f(s['itl_ms'], '.2f')} ms: {f(s['itl_overhead_pct'], '+.1f')} % ({f(s['added_itl_ms'], '+.2f')} ms); "
            f"{f(s['tok_s'], '.0f')} tok/s: {f(s['throughput_change_pct'], '+.1f')} %; server CPU {f(s['cpu_ms_per_token'], '.2f')} ms/token "
            f"({f(s['added_cpu_ms_per_token'], '+.2f')})",
            flush=flush,
        )


if __name__ == "__main__":
    raise SystemExit(main())
