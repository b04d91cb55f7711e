"""Fast greedy alpha estimator vs running speculative generation, on the same prompts.

Pairs (--pair): ``embedded``, the shipped trained tiny pair (192 wide, 8 layers, vocab 2048;
acceptance length 2.68 at K=3 on its held-out text), or ``random``, a 64-wide random target
"sharpened" so its hidden states carry context, with a draft distilled onto it for a few seconds
(acceptance neither 0 nor 1). Prompt sets: (1) ``mt-bench``: the first turns of
../shared/data/mt_bench.jsonl with the pair's chat template (hundreds of tokens); (2) ``short``:
5-14 tokens (the embedded pair's held-out prompts cut short, or random ids).

Times (best of --repeats, default 1):
- estimator: ``measure.estimator.estimate`` (the target's greedy continuation for all prompts in one
  batched decode, K batched draft passes over every position, a replay walk);
- generation, batch 1: ``SpeculativeEngine.generate`` one prompt at a time;
- generation, batched: all prompts in one batch.
The acceptance counts of all three must be identical (checked; the script exits 1 otherwise).
Goal from the issue: estimator >= 5x faster than speculative generation.

Choosing K (``--sweep``): neither the target's greedy continuation nor the draft's step-s
prediction at a position depends on K, so one estimate replays every K up to the largest, where
measuring by generation takes a run per K; the sweep compares the two for K in 1..5.

Work is printed next to the times: sequential passes of the target and the draft, and the rows
(tokens) they processed. Read the ratio with them. The estimator does about the same arithmetic
as generation (the target evaluates each continuation token once where generation verifies K+1
per pass; the draft runs at every position where generation drafts only from accepted roots) but
in far fewer sequential passes. On a GPU a decode pass is bound by reading the weights, so its
cost barely depends on the rows in it and the time ratio follows the pass ratio; on a CPU a pass
over 32 rows costs about 32 single-row passes once the matmuls are compute-bound (the embedded
pair, long prompts), and the ratio falls toward the per-pass overhead saved.

    .venv/bin/python benchmarks/bench_alpha_estimator.py [--pair embedded|random] [--sets mt-bench,short]
        [--prompts 32] [--max-tokens 128] [--k 3] [--threads N] [--repeats 3] [--sweep 1,2,3,4,5]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ("draft_tokens", "accepted_tokens", "target_forwards", "generated_tokens", "drafted_per_position", "accepted_per_position")


def build(k: int, device: str, threads: int, pair: str = "random"):
    from eagle3_trt.convert.load import load_engine
    from eagle3_trt.testing.tiny_pair import make_pair
    from eagle3_trt.testing.toy_pair import sharpen_target
    from eagle3_trt.train.trainer import distill_draft

    torch.set_num_threads(threads)
    if pair == "embedded":
        from eagle3_trt.convert.embedded import embedded_pair

        t, d = embedded_pair("tiny")
        print(f"pair: the embedded trained tiny pair ({t.parent})")
        return load_engine(t, d, device=device, dtype=torch.float32, max_draft_len=k)
    tmp = Path(tempfile.mkdtemp(prefix="bench-alpha-"))
    t, d = make_pair(tmp)
    eng = load_engine(t, d, device=device, dtype=torch.float32, max_draft_len=k)
    sharpen_target(eng.target)
    rng = random.Random(0)
    train = [[0] + [rng.randrange(6, 512) for _ in range(rng.randrange(4, 14))] for _ in range(256)]
    t0 = time.perf_counter()
    distill_draft(eng, train, steps=200, lr=5e-3, gen_tokens=24)
    print(f"pair: random tiny target, sharpened, with a draft distilled onto it in {time.perf_counter() - t0:.1f} s")
    return eng


def chat_prompts(eng, n: int) -> tuple[str, list[list[int]]]:
    """(the set's label, its prompts): MT-Bench first turns, or random token ids labelled as such."""
    from eagle3_trt.convert.prompts import load_prompt_records
    from eagle3_trt.measure.acceptance import encode_chat

    src = ROOT.parent / "shared" / "data" / "mt_bench.jsonl"
    if src.is_file():
        recs = load_prompt_records(src, limit=n)
        return "mt-bench", [encode_chat(eng.tokenizer, [{"role": "user", "content": r.turns[0]}]) for r in recs]
    # labelled "random-ids", never "mt-bench": a figure from random ids must not read as an MT-Bench figure
    print(f"mt-bench prompts: {src.resolve()} not found (../shared is missing): measuring {n} random token-id prompts, labelled [random-ids]")
    rng = random.Random(1)
    return "random-ids", [[0] + [rng.randrange(6, 512) for _ in range(rng.randrange(20, 60))] for _ in range(n)]


def best_of(fn, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


class Work:
    """Counts the target's and the draft's forward passes and the token rows they process."""

    def __init__(self, eng):
        self.eng = eng
        self.passes = {"target": 0, "draft": 0}
        self.rows = {"target": 0, "draft": 0}

    def _count(self, who):
        def hook(_mod, args, kwargs):
            x = kwargs.get("input_ids") if who == "target" else (args[0] if args else kwargs.get("embeds"))
            self.passes[who] += 1
            self.rows[who] += x.shape[0] * x.shape[1]

        return hook

    def __enter__(self):
        self.handles = [
            self.eng.target.hf.model.register_forward_pre_hook(self._count("target"), with_kwargs=True),
            self.eng.draft.register_forward_pre_hook(self._count("draft"), with_kwargs=True),
        ]
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        return False

    def __str__(self):
        t, d = self.passes, self.rows
        return f"{t['target']:6d} ({d['target']:7d})   {t['draft']:6d} ({d['draft']:7d})"


def short_prompts(n: int, pair: str) -> list[list[int]]:
    if pair == "embedded":  # the shipped held-out prompts (64 tokens of unseen stdlib source), cut short
        from eagle3_trt.convert.embedded import embedded_pair, heldout_prompts

        held = heldout_prompts(embedded_pair("tiny")[0].parent)
        rng = random.Random(2)
        return [held[i % len(held)][: rng.randrange(5, 15)] for i in range(n)]
    rng = random.Random(2)
    return [[0] + [rng.randrange(6, 512) for _ in range(rng.randrange(4, 14))] for _ in range(n)]


def compare(eng, name: str, prompts: list[list[int]], a) -> bool:
    from eagle3_trt.core.engine import SamplingParams
    from eagle3_trt.core.stats import aggregate
    from eagle3_trt.measure.estimator import estimate

    params = SamplingParams(max_tokens=a.max_tokens)
    estimate(eng, prompts[:2], a.max_tokens)  # warm-up
    t_est, est = best_of(lambda: estimate(eng, prompts, a.max_tokens, batch_size=a.batch_size), a.repeats)
    t_gen1, gen1 = best_of(lambda: [eng.generate([p], params)[0] for p in prompts], a.repeats)
    t_genb, genb = best_of(lambda: eng.generate(prompts, params), a.repeats)
    with Work(eng) as w_est:
        estimate(eng, prompts, a.max_tokens, batch_size=a.batch_size)
    with Work(eng) as w_gen1:
        [eng.generate([p], params) for p in prompts]
    with Work(eng) as w_genb:
        eng.generate(prompts, params)
    ok = True
    for e, g1, gb in zip(est.stats, gen1, genb):
        te, t1, tb = (tuple(getattr(s, f) for f in FIELDS) for s in (e, g1.stats, gb.stats))
        ok &= te == t1 == tb
    agg = aggregate(est.stats)
    lens = sorted(len(p) for p in prompts)
    print(f"[{name}] {len(prompts)} prompts of {lens[0]}-{lens[-1]} tokens, up to {a.max_tokens} generated, K={a.k}")
    print(f"  alpha {agg.alpha:.3f}, acceptance length {agg.acceptance_length:.2f}, cumulative per position {[round(x, 3) for x in agg.cumulative_acceptance]}")
    print(f"  {'':31s}{'time':>8s}  {'ratio':>6s}   target passes (rows)   draft passes (rows)")
    print(f"  {'estimator':31s}{t_est:7.2f}s  {'':6s}   {w_est}")
    print(f"  {'speculative generation, b=1':31s}{t_gen1:7.2f}s  {t_gen1 / t_est:5.1f}x   {w_gen1}   (goal >= 5x)")
    print(f"  {f'speculative generation, b={len(prompts)}':31s}{t_genb:7.2f}s  {t_genb / t_est:5.1f}x   {w_genb}")
    print(f"  acceptance counts identical: {ok}")
    if a.sweep:
        ok &= compare_sweep(eng, prompts, a)
    return ok


def compare_sweep(eng, prompts: list[list[int]], a) -> bool:
    """Choosing K: acceptance at every K of --sweep, from one estimate vs one generation run per K."""
    from eagle3_trt.core.engine import SamplingParams
    from eagle3_trt.core.stats import aggregate
    from eagle3_trt.measure.estimator import estimate

    ks = sorted({int(x) for x in a.sweep.split(",")})
    params = SamplingParams(max_tokens=a.max_tokens)
    t_est, est = best_of(lambda: estimate(eng, prompts, a.max_tokens, k=ks[0], batch_size=a.batch_size, sweep=ks), a.repeats)
    t_gen1 = t_genb = 0.0
    ok = True
    saved = eng.max_draft_len
    try:
        for k in ks:
            eng.max_draft_len = k
            t1, gen1 = best_of(lambda: [eng.generate([p], params)[0] for p in prompts], a.repeats)
            tb, genb = best_of(lambda: eng.generate(prompts, params), a.repeats)
            t_gen1, t_genb = t_gen1 + t1, t_genb + tb
            for e, g1, gb in zip(est.by_k[k], gen1, genb):
                ok &= tuple(getattr(e, f) for f in FIELDS) == tuple(getattr(g1.stats, f) for f in FIELDS) == tuple(getattr(gb.stats, f) for f in FIELDS)
    finally:
        eng.max_draft_len = saved
    als = ", ".join(f"K={k}: {aggregate(est.by_k[k]).acceptance_length:.2f}" for k in ks)
    print(f"  sweep K in {ks}: acceptance length {als}")
    print(f"  {'estimator, one run for all K':31s}{t_est:7.2f}s")
    print(f"  {'generation b=1, a run per K':31s}{t_gen1:7.2f}s  {t_gen1 / t_est:5.1f}x")
    print(f"  {f'generation b={len(prompts)}, a run per K':31s}{t_genb:7.2f}s  {t_genb / t_est:5.1f}x")
    print(f"  acceptance counts identical at every K: {ok}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32, help="estimator batch size")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads for both methods (1: the per-pass comparison without OpenMP effects)")
    ap.add_argument("--sets", default="short,mt-bench", help="comma list of: short, mt-bench")
    ap.add_argument(
        "--pair",
        choices=("embedded", "random"),
        default="embedded",
        help="embedded: the shipped trained pair (192 wide, 8 layers); random: a 64-wide random "
        "target with a quickly distilled draft (attention-bound on long prompts)",
    )
    ap.add_argument("--sweep", default="1,2,3,4,5", help="draft lengths for the K-sweep comparison (empty: skip it)")
    a = ap.parse_args()
    sets = a.sets.split(",")
    if unknown := [x for x in sets if x not in ("short", "mt-bench")]:
        ap.error(f"--sets: unknown set(s) {', '.join(unknown)}; use short and/or mt-bench")

    eng = build(a.k, a.device, a.threads, a.pair)
    print(f"device {a.device}, {a.threads} CPU thread(s)")
    ok = True
    for name in sets:
        label, prompts = ("short", short_prompts(a.prompts, a.pair)) if name == "short" else chat_prompts(eng, a.prompts)
        ok &= compare(eng, label, prompts, a)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
