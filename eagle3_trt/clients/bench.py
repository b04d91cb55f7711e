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

import importlib.metadata
import math
import platform
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eagle3_trt import __version__
from eagle3_trt.clients.llm_client import GenerationParams, LLMClient, Timed
from eagle3_trt.clients.openai_client import OpenAIClient
from eagle3_trt.clients.prom import SpecCounters, read_counters
from eagle3_trt.errors import UserError
from eagle3_trt.pipeline.bundle import open_bundle

DEFAULT_ALPHA_THRESHOLD = 0.55
# Below this many samples a p99 is the largest value or next to it: one outlier sets it.
MIN_P99_SAMPLES = 100


def parse_concurrency(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError("--concurrency", f"'{text}' is not a comma-separated list of integers", "e.g. 1,4,16,64") from None
    if not levels or any(c < 1 for c in levels):
        raise UserError("--concurrency", "levels must be integers >= 1")
    return sorted(set(levels))


# ---- statistics ------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    v = sorted(values)
    if len(v) == 1:
        return v[0]
    pos = (len(v) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


@dataclass
class RequestRecord(Timed):
    concurrency: int
    speculative: bool
    prompt_index: int
    ok: bool
    error: str | None = None
    t_send: float = 0.0
    t_first: float = 0.0
    t_end: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    n_tokens: int = 0
    finish_reason: str | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    acceptance_length: float | None = None  # engine definition: tokens per target forward, prefill included
    request_index: int = -1  # i-th request of its level and arm: the same prompt in both arms
    text: str = ""
    served_speculative: bool | None = None  # the server's speculative_decoding output (None: not reported)

    def itl_samples(self) -> list[float]:
        """Per-token inter-token latencies (seconds), one per token after the first response."""
        out: list[float] = []
        for i in range(1, len(self.chunk_times)):
            n = self.chunk_tokens[i]
            if n > 0:
                out += [(self.chunk_times[i] - self.chunk_times[i - 1]) / n] * n
        return out


@dataclass
class ArmResult:
    concurrency: int
    speculative: bool
    requests: int
    errors: int
    wall_s: float
    output_tokens: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    latency_p50_s: float | None
    latency_p99_s: float | None
    output_tokens_per_s: float
    alpha_responses: float | None
    al_responses: float | None
    alpha_metrics: float | None = None
    al_metrics: float | None = None
    acceptance_by_position: list[float] = field(default_factory=list)
    drafted_by_position: list[float] = field(default_factory=list)
    ttft_samples: int = 0
    itl_samples: int = 0
    latency_samples: int = 0
    served_without_speculation: int = 0  # requests of a speculation-on arm the server ran without it

    def thin_p99(self) -> list[str]:
        """The p99s that rest on fewer than MIN_P99_SAMPLES samples."""
        return [
            f"{name} p99 from {n} samples"
            for name, n in (("TTFT", self.ttft_samples), ("ITL", self.itl_samples), ("latency", self.latency_samples))
            if 0 < n < MIN_P99_SAMPLES
        ]

    @property
    def speculation_switched_off(self) -> bool:
        """A speculation-on arm that the server mostly served without the draft (e.g. above max_concurrency)."""
        return self.speculative and self.requests > self.errors and self.served_without_speculation * 2 > self.requests - self.errors


def summarize(records: list[RequestRecord], concurrency: int, speculative: bool, wall_s: float) -> ArmResult:
    ok = [r for r in records if r.ok]
    itl = [x for r in ok for x in r.itl_samples()]
    toks = sum(r.n_tokens for r in ok)
    draft = sum(r.draft_tokens or 0 for r in ok)
    acc = sum(r.accepted_tokens or 0 for r in ok)
    # AL per verification step from the per-request figures: target forwards = n / AL
    # (prefill included); the prefill forward yields one token and verifies nothing.
    steps = tok_v = 0.0
    for r in ok:
        if r.acceptance_length and r.n_tokens > 1:
            forwards = round(r.n_tokens / r.acceptance_length)
            if forwards > 1:
                steps += forwards - 1
                tok_v += r.n_tokens - 1
    return ArmResult(
        concurrency=concurrency,
        speculative=speculative,
        requests=len(records),
        errors=len(records) - len(ok),
        wall_s=wall_s,
        output_tokens=toks,
        ttft_p50_s=percentile([r.ttft_s for r in ok], 50),
        ttft_p99_s=percentile([r.ttft_s for r in ok], 99),
        itl_p50_s=percentile(itl, 50),
        itl_p99_s=percentile(itl, 99),
        latency_p50_s=percentile([r.latency_s for r in ok], 50),
        latency_p99_s=percentile([r.latency_s for r in ok], 99),
        output_tokens_per_s=toks / wall_s if wall_s > 0 else 0.0,
        alpha_responses=(acc / draft) if (speculative and draft) else None,
        al_responses=(tok_v / steps) if (speculative and steps) else None,
        ttft_samples=len(ok),
        itl_samples=len(itl),
        latency_samples=len(ok),
        served_without_speculation=sum(1 for r in ok if speculative and r.served_speculative is False),
    )


# ---- greedy identity -----------------------------------------------------------------------------
def identity_check(records: list[RequestRecord], greedy: bool, examples: int = 5) -> dict:
    """Compare the text of request i with speculation on and off at each level (same prompt).

    Only meaningful for greedy sampling; sampled runs are reported as not checked."""
    if not greedy:
        return {"checked": False, "reason": "sampling is not greedy (--temperature set)", "compared": 0, "diverged": 0, "rate": None, "examples": []}
    on = {(r.concurrency, r.request_index): r for r in records if r.ok and r.speculative}
    off = {(r.concurrency, r.request_index): r for r in records if r.ok and not r.speculative}
    pairs = sorted(set(on) & set(off))
    diverged = []
    for key in pairs:
        a, b = on[key].text, off[key].text
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            diverged.append(
                {
                    "concurrency": key[0],
                    "request": key[1],
                    "prompt_index": on[key].prompt_index,
                    "first_difference_at_char": at,
                    "on": a[max(0, at - 20) : at + 40],
                    "off": b[max(0, at - 20) : at + 40],
                }
            )
    return {
        "checked": True,
        "compared": len(pairs),
        "diverged": len(diverged),
        "rate": (len(diverged) / len(pairs)) if pairs else None,
        "examples": diverged[:examples],
    }


# ---- environment ---------------------------------------------------------------------------------
def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def describe_environment(client: LLMClient | OpenAIClient, bundle: str | None = None) -> dict:
    """What the numbers were measured on: server, model parameters, bundle fingerprint, versions.

    ``bundle``: the bundle directory if it is on this machine (default: the one the server reports)."""
    env: dict = {
        "client": {"eagle3_trt": __version__, "tritonclient": _dist_version("tritonclient"), "python": platform.python_version(), "host": platform.node()},
        "server_kind": client.server_kind,
    }
    try:
        env["server"] = client.server_metadata()
    except Exception as e:
        env["server"] = {"error": str(e).splitlines()[0]}
    try:
        params = client.model_config().get("parameters", {})
        env["model_parameters"] = {k: (v.get("string_value") or v.get("stringValue")) for k, v in params.items()}
    except Exception as e:
        env["model_parameters"] = {"error": str(e).splitlines()[0]}
    bundle = bundle or env.get("model_parameters", {}).get("eagle3_bundle")
    if bundle:
        try:
            b = open_bundle(Path(bundle))
            env["bundle"] = {
                "path": str(b.path),
                "fingerprint": b.manifest.fingerprint,
                "label": b.label,
                "formats": b.formats,
                "k": b.k,
                "max_concurrency": b.options.speculative_config.max_concurrency,
                "built_with": b.manifest.versions,
            }
        except Exception as e:
            env["bundle"] = {"path": str(bundle), "error": str(e).splitlines()[0]}
    return env


# ---- gate --------------------------------------------------------------------------------------
@dataclass
class Gate:
    alpha: float | None
    alpha_source: str
    alpha_threshold: float
    alpha_ok: bool
    itl_tolerance: float
    per_concurrency: list[dict]
    switch_off_above: int | None
    verdict: str  # pass | pass_with_switch_off | fail
    recommendation: str


def evaluate_gate(arms: list[ArmResult], alpha_threshold: float = DEFAULT_ALPHA_THRESHOLD, itl_tolerance: float = 0.0) -> Gate:
    """alpha >= threshold, and per concurrency P99 ITL(on) <= P99 ITL(off) * (1 + tolerance)."""
    on = [a for a in arms if a.speculative]
    # Pool alpha over every speculative run; prefer the server's counters when present.
    draft_m = [a for a in on if a.alpha_metrics is not None]
    alpha: float | None
    if draft_m:
        alpha = sum(a.alpha_metrics for a in draft_m) / len(draft_m)  # type: ignore[misc]
        source = "metrics endpoint"
    else:
        vals = [a.alpha_responses for a in on if a.alpha_responses is not None]
        alpha = sum(vals) / len(vals) if vals else None
        source = "responses"
    alpha_ok = alpha is not None and alpha >= alpha_threshold
    by_c: dict[int, dict[bool, ArmResult]] = {}
    for a in arms:
        by_c.setdefault(a.concurrency, {})[a.speculative] = a
    rows: list[dict[str, Any]] = []
    for c in sorted(by_c):
        a_on, a_off = by_c[c].get(True), by_c[c].get(False)
        p_on = a_on.itl_p99_s if a_on else None
        p_off = a_off.itl_p99_s if a_off else None
        switched_off = bool(a_on and a_on.speculation_switched_off)
        ok = p_on is not None and p_off is not None and p_on <= p_off * (1 + itl_tolerance)
        thin = (a_on.thin_p99() if a_on else []) + (a_off.thin_p99() if a_off else [])
        rows.append(
            {
                "concurrency": c,
                "itl_p99_on_s": p_on,
                "itl_p99_off_s": p_off,
                "ratio": (p_on / p_off) if (p_on and p_off) else None,
                # None: the server ran the "on" arm without speculation, so there is nothing to judge
                "itl_ok": None if switched_off else ok,
                "itl_samples_on": a_on.itl_samples if a_on else 0,
                "itl_samples_off": a_off.itl_samples if a_off else 0,
                "thin_p99": [x for x in thin if x.startswith("ITL")],
            }
        )
    judged = [r for r in rows if r["itl_ok"] is not None]
    not_judged = [r["concurrency"] for r in rows if r["itl_ok"] is None]
    switch: int | None = None
    for r in judged:
        if not r["itl_ok"]:
            break
        switch = r["concurrency"]
    all_ok = bool(judged) and all(r["itl_ok"] for r in judged)
    top = judged[-1]["concurrency"] if judged else None
    off_note = (
        (f"; at concurrency {', '.join(map(str, not_judged))} the server already ran without speculation (max_concurrency), which is not part of this verdict")
        if not_judged
        else ""
    )
    if alpha_ok and all_ok:
        verdict = "pass"
        rec = f"keep speculation on at every concurrency where it ran (up to {top}){off_note}"
    elif alpha_ok and switch is not None:
        verdict = "pass_with_switch_off"
        failed = [r["concurrency"] for r in judged if not r["itl_ok"]]
        rec = (
            f"speculation on up to concurrency {switch} only; it is slower at {', '.join(map(str, failed))}: "
            f"switch it off above {switch} (speculative_config.max_concurrency: {switch}){off_note}"
        )
    else:
        verdict = "fail"
        why = []
        if not alpha_ok:
            why.append(f"alpha {alpha:.3f} < {alpha_threshold}" if alpha is not None else "alpha unavailable")
        if switch is None and judged:
            why.append(f"P99 ITL with speculation is worse already at concurrency {judged[0]['concurrency']}")
        if not judged:
            why.append("no concurrency level ran with speculation")
        rec = "do not enable speculation (" + "; ".join(why) + ")"
    return Gate(alpha, source, alpha_threshold, alpha_ok, itl_tolerance, rows, switch, verdict, rec)


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
                parts: list[str] = []
                try:
                    for ch in client.stream(cfg.prompts[pi], params, streaming=True):
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
    metrics_ok = cfg.metrics_url is not None
    if metrics_ok:
        try:
            read_counters(cfg.metrics_url, cfg.model)  # type: ignore[arg-type]
        except Exception as e:
            log(f"metrics endpoint {cfg.metrics_url} unreadable ({e}); alpha/AL from responses only")
            metrics_ok = False

    if cfg.warmup:
        with open_client(cfg) as client:
            for i in range(cfg.warmup):
                client.generate(cfg.prompts[i % len(cfg.prompts)], GenerationParams(max_tokens=min(8, cfg.max_tokens)), stream=True)

    arms: list[ArmResult] = []
    records: list[RequestRecord] = []
    offset = 0
    for c in cfg.concurrency:
        for spec in (True, False):
            label = f"C={c:<3d} speculation {'on ' if spec else 'off'}"
            tick = progress(label, cfg.budget(c)) if progress else (lambda: None)
            before = read_counters(cfg.metrics_url, cfg.model) if metrics_ok else None  # type: ignore[arg-type]
            recs, wall = run_arm(cfg, c, spec, tick, offset)
            arm = summarize(recs, c, spec, wall)
            if before is not None:
                after = read_counters(cfg.metrics_url, cfg.model)  # type: ignore[arg-type]
                d: SpecCounters = after.minus(before)
                if spec:
                    arm.alpha_metrics = d.alpha
                    arm.al_metrics = d.acceptance_length
                    arm.acceptance_by_position = d.acceptance_by_position()
                    arm.drafted_by_position = [v for _, v in sorted(d.drafted_pos.items())]
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
