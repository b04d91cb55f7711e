"""How the cost of captured traffic grows with its size: records per second and peak RSS for 1k, 10k
and 100k synthetic captured records (issue 30).

Each step runs in its own Python process (peak RSS is the process's ``ru_maxrss``; the RSS after
its imports is printed beside it, so what the records themselves cost is the difference):

- ``write``: ``SegmentWriter`` (formats/traffic.py) writes N records in 256-record segments, the
  open segment flushed (rewritten whole through the atomic writer, fsynced) every 0.5 s, as the
  capture thread does (``FLUSH_S``); the records are 64 distinct ones with new ids and times;
- ``stream``: ``iter_traffic`` reads them back one segment at a time, keeping nothing (the reader
  ``alpha --traffic`` uses);
- ``alpha-read``: what ``alpha --traffic`` keeps while it reads (measure/traffic_alpha.py): four
  fields of every request for the drift summary, and the whole records of the bundle it measures
  (here one request in ``--measured-every``);
- ``split``: what ``train-draft --traffic`` and ``gate --traffic`` read (formats/traffic_split.split_capture):
  pass 1 keeps a small digest of each record and groups the prompts, then the held-back split is
  made, the training side read back record by record and its traffic digest computed (what
  ``train-draft`` keeps beyond this, the distinct training prompts it regenerates and trains on, is
  its training set, not the capture's cost); ``bytes_per_record`` is (peak RSS - RSS after imports) / N;
- ``list``: ``read_traffic``, every record in one sorted list (what ``train-draft --traffic`` and
  ``gate --traffic`` read before issue 30's streaming split; tests and examples still use it).

One request in 8 repeats the previous request's prompt (the split groups them); the others'
prompts are distinct (tokens shifted, text numbered), the split's worst case for memory.

A record is the size of a chat request: 128 prompt tokens, 64 output tokens, ~700 characters of
text (``--prompt-tokens``/``--output-tokens`` change it).

    .venv/bin/python benchmarks/bench_capture_scale.py [--sizes 1000,10000,100000] [--json]
    .venv/bin/python benchmarks/bench_capture_scale.py --smoke     # 300 records: the suite's run
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STEPS = ("write", "stream", "alpha-read", "split", "list")
FP_MEASURED, FP_OTHER = "a" * 64, "b" * 64


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _records(n: int, prompt_tokens: int, output_tokens: int, measured_every: int):
    from eagle3_trt.formats.traffic import CapturedSampling, ServedAcceptance, TrafficRecord

    rng = random.Random(0)
    words = ["the", "model", "speculative", "draft", "token", "accept", "cache", "request", "server", "answer"]
    fw = max(1, output_tokens // 3)
    pool = [
        TrafficRecord(
            request_id="",
            time_unix=0.0,
            bundle_fingerprint=FP_OTHER,
            model="eagle3",
            model_version="1",
            frontend="triton",
            chat=True,
            prompt_text=" ".join(rng.choice(words) for _ in range(prompt_tokens * 3 // 4)),
            prompt_ids=[rng.randrange(32000) for _ in range(prompt_tokens)],
            output_ids=[rng.randrange(32000) for _ in range(output_tokens)],
            output_text=" ".join(rng.choice(words) for _ in range(output_tokens * 3 // 4)),
            finish_reason="length",
            sampling=CapturedSampling(max_tokens=output_tokens),
            acceptance=ServedAcceptance(
                speculative=True, draft_tokens=3 * fw, accepted_draft_tokens=output_tokens - fw, target_forwards=fw, completion_tokens=output_tokens
            ),
            category="chat" if i % 2 else "code",
        )
        for i in range(64)
    ]
    for i in range(n):
        fp = FP_MEASURED if i % measured_every == 0 else FP_OTHER
        q = i - 1 if i % 8 == 7 else i  # one request in 8 repeats the previous prompt; the others are distinct prompts
        base = pool[q % len(pool)]
        yield base.model_copy(
            update={
                "request_id": f"req-{i:07d}",
                "time_unix": 1.7e9 + i * 0.01,
                "bundle_fingerprint": fp,
                "prompt_ids": [(t + q) % 32000 for t in base.prompt_ids],
                "prompt_text": f"{q} {base.prompt_text}",
            }
        )


def child(step: str, d: Path, n: int, prompt_tokens: int, output_tokens: int, measured_every: int) -> dict:
    """One step in this (fresh) process: its figures."""
    from eagle3_trt.formats.traffic import SegmentWriter, iter_traffic, read_traffic

    if step == "alpha-read":
        from eagle3_trt.measure.traffic_alpha import ServedRequest  # imports torch: this step's baseline is higher
    if step == "split":
        from eagle3_trt.formats.traffic_split import split_capture  # imports numpy, before the baseline
    base = _rss_mb()
    t0 = time.perf_counter()
    kept = 0
    if step == "write":
        from eagle3_trt.runtime.capture import FLUSH_S

        w = SegmentWriter(d, segment_records=256)
        last = time.monotonic()
        for rec in _records(n, prompt_tokens, output_tokens, measured_every):
            assert w.write(rec)
            if time.monotonic() - last >= FLUSH_S:
                w.flush()
                last = time.monotonic()
        w.flush()
        kept = n
        extra = {"mb_on_disk": round(sum(p.stat().st_size for p in d.iterdir()) / 1e6, 1)}
    elif step == "stream":
        kept = sum(1 for _ in iter_traffic(d))
        extra = {}
    elif step == "alpha-read":
        served, mine = [], []
        for r in iter_traffic(d):  # as measure/traffic_alpha.run_alpha_traffic reads
            served.append(ServedRequest(r.time_unix, r.bundle_fingerprint, r.acceptance, r.category))
            if r.bundle_fingerprint == FP_MEASURED:
                mine.append(r)
        kept = len(served)
        extra = {"measured_records_kept": len(mine)}
    elif step == "split":
        sp = split_capture(d, seed=0, holdout_fraction=0.2)
        train = sum(1 for _ in sp.train)  # read back record by record, as train/from_traffic reads the training side
        digest = sp.train_digest()
        kept = sp.records
        extra = {"train": train, "heldout": len(sp.heldout), "prompt_groups": sp.groups, "digest": digest[:12]}
    else:
        kept = len(read_traffic(d))
        extra = {}
    s = time.perf_counter() - t0
    if kept != n:
        raise SystemExit(f"{step}: {kept} records, expected {n}")
    return {
        "step": step,
        "records": n,
        "seconds": round(s, 3),
        "records_per_s": round(n / s),
        "rss_after_imports_mb": round(base, 1),
        "peak_rss_mb": round(_rss_mb(), 1),
        "bytes_per_record": round((_rss_mb() - base) * 2**20 / n),
        **extra,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000", help="comma-separated record counts")
    ap.add_argument("--smoke", action="store_true", help="one small size (300 records): the suite's run")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--measured-every", type=int, default=10, help="alpha-read: one request in this many was served by the bundle measured")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", choices=STEPS, help=argparse.SUPPRESS)
    ap.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.dir, a.n, a.prompt_tokens, a.output_tokens, a.measured_every)))
        return
    sizes = [300] if a.smoke else [int(x) for x in a.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-capture-scale-") as tmp:
        for n in sizes:
            d = Path(tmp) / f"cap-{n}"
            for step in STEPS:
                argv = [sys.executable, __file__, "--child", step, "--dir", str(d), "--n", str(n)]
                argv += ["--prompt-tokens", str(a.prompt_tokens), "--output-tokens", str(a.output_tokens), "--measured-every", str(a.measured_every)]
                p = subprocess.run(argv, capture_output=True, text=True, check=False)
                if p.returncode != 0:
                    raise SystemExit(f"{step} at {n} records failed:\n{p.stderr[-2000:]}")
                rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
                if not a.json:
                    r = rows[-1]
                    print(
                        f"{n:>7} records  {step:<10} {r['records_per_s']:>8} records/s  peak RSS {r['peak_rss_mb']:>7.1f} MB "
                        f"(after imports {r['rss_after_imports_mb']:.1f} MB, {r['bytes_per_record']} B/record)"
                        + (f"  {r['mb_on_disk']} MB on disk" if "mb_on_disk" in r else ""),
                        flush=True,
                    )
    if a.json:
        print(
            json.dumps(
                {"schema": 1, "kind": "capture scale", "record": {"prompt_tokens": a.prompt_tokens, "output_tokens": a.output_tokens}, "rows": rows}, indent=1
            )
        )


if __name__ == "__main__":
    main()
