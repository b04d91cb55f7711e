"""The rollout benchmark: speculation on vs off against one server, per concurrency level.

For each concurrency C (in order) and each arm (speculation on, then off), C worker threads
each hold one connection (a gRPC stream to Triton, or an HTTP session to an OpenAI-compatible
endpoint such as NVIDIA Dynamo's frontend: ``open_client``) and send streaming requests until
the level's request budget is spent. Client-side timestamps give TTFT, ITL and latency; the final response's perf
outputs give alpha and AL per request; the model's Prometheus counters, read before and
after each run, give the server-side alpha, AL and per-position acceptance.

ITL is per token: the gap between two streamed responses divided by the number of tokens
the later one carries (a speculative step delivers several at once), each token counted.

Greedy identity: with greedy sampling, speculation must not change the text. Request i of a
level is the same prompt in both arms, so the two texts are compared pair by pair and the
divergence rate is reported. An FP8 (or NVFP4) bundle can legitimately differ on float
near-ties, because verification runs K+1 positions in one forward and the batched GEMMs round
differently from one-token decoding (seen: 1 prompt in 29): the report shows the rate and
where each pair first differs; it does not fail the gate on it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from eagle3_trt.clients.bench_gate import DEFAULT_ALPHA_THRESHOLD, Gate, evaluate_gate
from eagle3_trt.clients.bench_stats import ArmResult, RequestRecord, identity_check, summarize
from eagle3_trt.clients.llm_client import GenerationParams, LLMClient
from eagle3_trt.clients.openai_client import OpenAIClient
from eagle3_trt.clients.prom import SpecCounters, read_counters, settled_counters
from eagle3_trt.errors import UserError


def parse_concurrency(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError("--concurrency", f"'{text}' is not a comma-separated list of integers", "e.g. 1,4,16,64") from None
    if not levels or any(c < 1 for c in levels):
        raise UserError("--concurrency", "levels must be integers >= 1")
    return sorted(set(levels))


# ---- running -----------------------------------------------------------------------------------
@dataclass
class BenchConfig:
    url: str
    model: str
    prompts: list[str]
    concurrency: list[int]
    max_tokens: int = 32
    requests_per_level: int | None = None  # default: max(C, min_requests)
    min_requests: int = 4
    max_requests: int = 256
    warmup: int = 2
    temperature: float | None = None
    metrics_url: str | None = None
    baseline_model: str | None = None  # A/B via a second model instead of the request switch
    timeout_s: float = 600.0
    http: bool = False  # HTTP generate_stream (server-sent events) instead of one gRPC stream per worker
    # "triton": the eagle3 model on Triton (url = host:port); "openai": an OpenAI-compatible endpoint,
    # NVIDIA Dynamo's frontend (url = http://host:port/v1), speculation off per request by annotation
    endpoint: str = "triton"
    chat: bool = True  # openai: /v1/chat/completions with the server's chat template; False: /v1/completions, raw text
    system: str | None = None  # openai + chat: system message
    bundle: str | None = None  # openai: the served bundle's path, when known (for the report)

    def budget(self, c: int) -> int:
        n = self.requests_per_level if self.requests_per_level else max(c, self.min_requests)
        return max(1, min(n, self.max_requests))


def open_client(cfg: BenchConfig, model: str | None = None) -> LLMClient | OpenAIClient:
    """The client for ``cfg.endpoint``: both have the same stream/generate interface and Chunk fields."""
    model = model or cfg.model
    if cfg.endpoint == "openai":
        return OpenAIClient(cfg.url, model=model, timeout_s=cfg.timeout_s, chat=cfg.chat, system=cfg.system, bundle=cfg.bundle)
    if cfg.endpoint != "triton":
        raise UserError("endpoint", f"'{cfg.endpoint}' is not one of triton, openai")
    return LLMClient(cfg.url, model=model, timeout_s=cfg.timeout_s, http=cfg.http)


def run_arm(
    cfg: BenchConfig, concurrency: int, speculative: bool, on_done: Callable[[], None] = lambda: None, offset: int = 0
) -> tuple[list[RequestRecord], float]:
    budget = cfg.budget(concurrency)
    model = cfg.model if (speculative or not cfg.baseline_model) else cfg.baseline_model
    params = GenerationParams(
        max_tokens=cfg.max_tokens,
        temperature=cfg.temperature,
        speculative=None if (speculative or cfg.baseline_model) else False,
        perf_metrics=True,
    )
    next_i = [0]
    lock = threading.Lock()
    records: list[RequestRecord] = []

    def worker() -> None:
        client = open_client(cfg, model)
        try:
            while True:
                with lock:
                    if next_i[0] >= budget:
                        return
                    i = next_i[0]
                    next_i[0] += 1
                pi = (offset + i) % len(cfg.prompts)
                rec = RequestRecord(concurrency, speculative, pi, ok=False, t_send=time.perf_counter(), request_index=i)
                _stream_into(rec, client, cfg.prompts[pi], params)
                with lock:
                    records.append(rec)
                on_done()
        finally:
            client.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(concurrency, budget))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return records, time.perf_counter() - t0


def _stream_into(rec: RequestRecord, client: LLMClient | OpenAIClient, prompt: str, params: GenerationParams) -> None:
    """Send one streaming request and record its chunks, timings and final perf outputs in ``rec``."""
    parts: list[str] = []
    try:
        for ch in client.stream(prompt, params, streaming=True):
            parts.append(ch.text)
            rec.chunk_times.append(ch.t)
            rec.chunk_tokens.append(ch.n_tokens)
            rec.n_tokens += ch.n_tokens
            if ch.n_tokens and not rec.t_first:
                rec.t_first = ch.t
            if ch.final:
                rec.finish_reason = ch.finish_reason
                rec.draft_tokens = _int_or_none(ch.perf.get("total_draft_tokens"))
                rec.accepted_tokens = _int_or_none(ch.perf.get("total_accepted_draft_tokens"))
                al = ch.perf.get("acceptance_length")
                rec.acceptance_length = float(al) if al is not None else None
                sd = ch.perf.get("speculative_decoding")
                rec.served_speculative = None if sd is None else bool(sd)
        rec.t_end = time.perf_counter()
        rec.text = "".join(parts)
        rec.t_first = rec.t_first or rec.t_end
        rec.ok = True
    except Exception as e:  # recorded, counted as an error, the run goes on
        rec.error = f"{type(e).__name__}: {e}"
        rec.t_end = time.perf_counter()


def _int_or_none(v) -> int | None:
    return None if v is None else int(v)


@dataclass
class BenchRun:
    config: dict
    arms: list[ArmResult]
    gate: Gate
    records: list[RequestRecord]
    started_unix: float
    took_s: float
    metrics_available: bool
    identity: dict = field(default_factory=dict)
    environment: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "schema": 2,
            "kind": "eagle3-trt rollout benchmark",
            "started_unix": self.started_unix,
            "took_s": self.took_s,
            "config": self.config,
            "environment": self.environment,
            "metrics_available": self.metrics_available,
            "arms": [asdict(a) | {"thin_p99": a.thin_p99(), "speculation_switched_off": a.speculation_switched_off} for a in self.arms],
            "gate": asdict(self.gate),
            "greedy_identity": self.identity,
            "requests": [
                {k: v for k, v in asdict(r).items() if k not in ("chunk_times", "chunk_tokens")}
                | {"ttft_s": r.ttft_s if r.ok else None, "latency_s": r.latency_s if r.ok else None}
                for r in self.records
            ],
        }


def run_bench(
    cfg: BenchConfig,
    alpha_threshold: float = DEFAULT_ALPHA_THRESHOLD,
    itl_tolerance: float = 0.0,
    progress: Callable[[str, int], Callable[[], None]] | None = None,
    log: Callable[[str], None] = lambda s: None,
    environment: dict | None = None,
) -> BenchRun:
    """Every level, speculation on then off; ``progress(label, total)`` returns a per-request tick."""
    started = time.time()
    t_start = time.perf_counter()
    metrics_ok = _metrics_readable(cfg, log)
    if cfg.warmup:
        pre = read_counters(cfg.metrics_url, cfg.model) if metrics_ok else None  # type: ignore[arg-type]
        with open_client(cfg) as client:
            for i in range(cfg.warmup):
                client.generate(cfg.prompts[i % len(cfg.prompts)], GenerationParams(max_tokens=min(8, cfg.max_tokens)), stream=True)
        if pre is not None:  # the first arm's counters must not take in the warm-up's late figures
            settled_counters(cfg.metrics_url, cfg.model, pre, cfg.warmup)  # type: ignore[arg-type]

    arms: list[ArmResult] = []
    records: list[RequestRecord] = []
    offset = 0
    for c in cfg.concurrency:
        for spec in (True, False):
            label = f"C={c:<3d} speculation {'on ' if spec else 'off'}"
            tick = progress(label, cfg.budget(c)) if progress else (lambda: None)
            arm, recs = _measure_arm(cfg, c, spec, tick, offset, metrics_ok, log)
            arms.append(arm)
            records += recs
            errs = [r.error for r in recs if not r.ok]
            if errs:
                log(f"{label}: {len(errs)} request(s) failed, e.g. {errs[0]}")
        offset += cfg.budget(c)
    gate = evaluate_gate(arms, alpha_threshold, itl_tolerance)
    conf = {k: v for k, v in asdict(cfg).items() if k != "prompts"} | {
        "num_prompts": len(cfg.prompts),
        "alpha_threshold": alpha_threshold,
        "itl_tolerance": itl_tolerance,
    }
    identity = identity_check(records, greedy=not cfg.temperature)
    if identity["diverged"]:
        log(
            f"greedy text differs with speculation on vs off in {identity['diverged']} of {identity['compared']} requests "
            "(float near-ties in a quantized bundle can do this; see the report)"
        )
    return BenchRun(conf, arms, gate, records, started, time.perf_counter() - t_start, metrics_ok, identity, environment or {})


def _metrics_readable(cfg: BenchConfig, log: Callable[[str], None]) -> bool:
    """Whether the metrics endpoint answers; when it does not, alpha and AL come from the responses."""
    if cfg.metrics_url is None:
        return False
    try:
        read_counters(cfg.metrics_url, cfg.model)
    except Exception as e:
        log(f"metrics endpoint {cfg.metrics_url} unreadable ({e}); alpha/AL from responses only")
        return False
    return True


def _measure_arm(
    cfg: BenchConfig, c: int, spec: bool, tick: Callable[[], None], offset: int, metrics_ok: bool, log: Callable[[str], None]
) -> tuple[ArmResult, list[RequestRecord]]:
    """One level and arm: its requests, their statistics and, for a speculative arm, the server's counters over the run."""
    # The counters are the speculative model's: an off arm sent to --baseline-model moves none of them.
    counted = metrics_ok and (spec or not cfg.baseline_model)
    before = read_counters(cfg.metrics_url, cfg.model) if counted else None  # type: ignore[arg-type]
    recs, wall = run_arm(cfg, c, spec, tick, offset)
    arm = summarize(recs, c, spec, wall)
    if before is not None:
        after, settled = settled_counters(cfg.metrics_url, cfg.model, before, len(recs))  # type: ignore[arg-type]
        if not settled:
            log(f"the server counted fewer than the {len(recs)} requests this arm sent; its metrics may miss the last ones")
        d: SpecCounters = after.minus(before)
        if spec:
            arm.alpha_metrics = d.alpha
            arm.al_metrics = d.acceptance_length
            arm.acceptance_by_position = d.acceptance_by_position()
            arm.drafted_by_position = [v for _, v in sorted(d.drafted_pos.items())]
    return arm, recs
