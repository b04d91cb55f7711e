"""Traffic records from real generations of the serving runtime, for tests of what reads captures.

``served_records`` sends token-id prompts through ``ReferenceLLM`` (the object the Triton model
and the Dynamo worker drive) and turns each finished request into a ``TrafficRecord`` with the
acceptance the server reports (``llm_api.spec_stats``), as ``serve --capture`` records it.
``bundle_fingerprint`` defaults to the bundle's own; a test may stamp another one on purpose.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from eagle3_trt.formats.traffic import CapturedSampling, SegmentWriter, TrafficRecord, read_traffic, segments
from eagle3_trt.pipeline.bundle import open_bundle
from eagle3_trt.runtime.capture import served_acceptance
from eagle3_trt.runtime.llm_api import SamplingParams, spec_stats
from eagle3_trt.runtime.reference_llm import ReferenceLLM


def served_records(
    bundle: Path,
    prompts: Sequence[Sequence[int]],
    *,
    max_tokens: int = 24,
    temperature: float = 0.0,
    seed: int | None = None,
    fingerprint: str | None = None,
    categories: Sequence[str | None] | None = None,
    start_unix: float | None = None,
    prefix: str = "req",
    stop: str | None = None,
) -> list[TrafficRecord]:
    llm = ReferenceLLM(Path(bundle), device="cpu")
    fp = fingerprint or open_bundle(Path(bundle)).manifest.fingerprint
    t0 = time.time() if start_unix is None else start_unix
    out: list[TrafficRecord] = []
    try:
        for n, ids in enumerate(prompts):
            s = None if seed is None else seed + n
            sp = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=s, stop=stop, return_perf_metrics=True)
            o = llm.generate_async([int(i) for i in ids], sp).result(timeout=300).outputs[0]
            st = spec_stats(o.request_perf_metrics, len(o.token_ids), True)
            out.append(
                TrafficRecord(
                    request_id=f"{prefix}-{n}",
                    time_unix=t0 + n,
                    bundle_fingerprint=fp,
                    model="eagle3",
                    frontend="triton",
                    chat=False,
                    prompt_text=None,
                    prompt_ids=[int(i) for i in ids],
                    output_ids=list(o.token_ids),
                    output_text=o.text,
                    finish_reason=o.finish_reason,
                    sampling=CapturedSampling(temperature=temperature, max_tokens=max_tokens, seed=s),
                    acceptance=served_acceptance(st),
                    category=categories[n] if categories else None,
                )
            )
    finally:
        llm.shutdown()
    return out


def write_traffic(d: Path, records: Sequence[TrafficRecord], segment_records: int = 16) -> Path:
    """``records`` written as capture segments under ``d`` (the SegmentWriter serve --capture uses)."""
    w = SegmentWriter(Path(d), segment_records=segment_records)
    for r in records:
        assert w.write(r)
    w.flush()
    return Path(d)


def captured_records(cap: Path, n: int, timeout_s: float = 15) -> list[TrafficRecord]:
    """The records under capture directory ``cap`` once there are ``n`` (each is written within ~0.5 s
    of its request), or what is there after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        recs = read_traffic(cap) if list(segments(cap)) else []
        if len(recs) >= n or time.monotonic() > deadline:
            return recs
        time.sleep(0.1)


def newer_missing(kept: dict[str, float], sent: dict[str, float]) -> list[tuple[float, str]]:
    """Retention's promise, checked: the requests ``sent`` (name -> a time just before it was sent, at most
    its record's time) missing from ``kept`` (name -> record time) that were sent after the oldest
    record kept; empty when no record newer than the oldest surviving one is missing."""
    oldest = min(kept.values())
    return sorted((t, name) for name, t in sent.items() if name not in kept and t > oldest)
