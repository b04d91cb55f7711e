"""The held-back split on templated and on distinct traffic: the held-back share and the split's time
at 1k, 10k and 100k records (formats/traffic_split.split_capture, what ``train-draft --traffic`` and
``gate --traffic`` read).

Traffic (synthetic token ids, no tokenizer; 96-token prompts):

- ``templated``: prompts filled into 200 templates (a fixed 94-token text with one 2-token slot),
  template popularity Zipf-like (the most used one takes 1/6 of the requests): prompts of one
  template share 92 of their 93 4-grams' worth of text, so each template is one near-duplicate group
  of many distinct prompts (the hold-out's hard case: a group was held back with probability
  fraction^m);
- ``distinct``: every prompt random (one group per record).

Each size and kind is written to a capture directory in a temporary folder (``SegmentWriter``), then
split (timed: pass 1's read and grouping, and the split). Printed per run: records, groups, the
held-back share of records and of groups, wall and CPU seconds (the split is one thread: CPU
seconds are its time on a core of its own, wall seconds include waiting for a shared one).

    .venv/bin/python benchmarks/bench_traffic_split.py [--sizes 1000,10000,100000] [--kinds templated,distinct] [--fraction 0.2] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from eagle3_trt.formats.traffic_split import split_capture
from eagle3_trt.testing.id_capture import write_id_capture

PROMPT_TOKENS = 96
TEMPLATES = 200


def prompts(kind: str, n: int, seed: int = 0) -> list[list[int]]:
    """``n`` prompts of the kind (module doc), deterministic for ``seed``."""
    rng = random.Random(seed)
    if kind == "distinct":
        return [[rng.randrange(3, 32000) for _ in range(PROMPT_TOKENS)] for _ in range(n)]
    if kind != "templated":
        raise ValueError(kind)
    body = PROMPT_TOKENS - 2
    templates = [[rng.randrange(3, 32000) for _ in range(body)] for _ in range(TEMPLATES)]
    slots = [rng.randrange(10, body - 10) for _ in range(TEMPLATES)]
    weights = [1.0 / (k + 1) for k in range(TEMPLATES)]
    out = []
    for t in rng.choices(range(TEMPLATES), weights=weights, k=n):
        s = slots[t]
        out.append(templates[t][:s] + [rng.randrange(3, 32000), rng.randrange(3, 32000)] + templates[t][s:])
    return out


def write_capture(d: Path, ps: list[list[int]]) -> None:
    write_id_capture(d, ps).close()


def run(kind: str, n: int, fraction: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "cap"
        write_capture(d, prompts(kind, n))
        t0, c0 = time.perf_counter(), time.process_time()
        sp = split_capture(d, seed=0, holdout_fraction=fraction)
        secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "kind": kind,
        "records": n,
        "groups": sp.groups,
        "heldout_share": len(sp.heldout) / n,
        "heldout_groups_share": sp.heldout_groups / sp.groups,
        "seconds": secs,
        "cpu_seconds": cpu,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,100000", help="records per run, comma-separated")
    ap.add_argument("--kinds", default="templated,distinct", help="traffic kinds: templated, distinct")
    ap.add_argument("--fraction", type=float, default=0.2, help="the requested held-back fraction")
    ap.add_argument("--json", action="store_true", help="one JSON object per run instead of the table")
    a = ap.parse_args(argv)
    if not a.json:
        print(f"{'kind':<10} {'records':>8} {'groups':>7} {'held-back share':>16} {'of groups':>10} {'seconds':>8} {'cpu s':>7}  (requested {a.fraction:g})")
    for kind in a.kinds.split(","):
        for n in (int(x) for x in a.sizes.split(",")):
            r = run(kind, n, a.fraction)
            if a.json:
                print(json.dumps(r))
            else:
                print(
                    f"{kind:<10} {n:>8} {r['groups']:>7} {r['heldout_share']:>16.3f} {r['heldout_groups_share']:>10.3f} {r['seconds']:>8.1f} {r['cpu_seconds']:>7.1f}"
                )
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
