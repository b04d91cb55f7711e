"""Reference runtime throughput: speculative decoding (chain K, optionally a tree) vs K = 0.

Pair (--shape): ``embedded``, the shipped trained tiny pair (192 wide, 8 layers) on its held-out
prompts; or a random pair of the tiny pair's architecture (tiny: hidden 64; medium: hidden 512,
where the target's forward outweighs Python overhead), target "sharpened" and draft distilled
onto it (see train/trainer.py distill_draft) so acceptance is not 0 (medium needs far more --distill-steps
than the default to reach a useful alpha). Batch 1, greedy,
short prompts; tokens/s are wall-clock over all prompts (best of --repeats).

Reported: alpha, acceptance length (AL, tokens per target forward), tokens/s for K = 0 and for
speculation, the measured speedup, and the fraction of the ideal speedup (measured speedup / AL:
1.0 would mean drafting and verification cost nothing beyond one target forward).

    .venv/bin/python benchmarks/bench_runtime_speed.py [--shape tiny|medium|embedded] [--device cpu|cuda] [--k 3]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

SHAPES = {
    "tiny": dict(),
    "medium": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, intermediate_size=1536, draft_intermediate_size=1536),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=[*SHAPES, "embedded"], default="tiny", help="embedded: the shipped trained tiny pair (192 wide) on its held-out prompts")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--tree", default=None, help='optional static tree as JSON, e.g. "[[0],[1],[0,0],[0,1],[0,0,0]]"')
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--distill-steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 avoids OpenMP spin on shared cores)")
    a = ap.parse_args()

    from eagle3_trt.convert.load import load_engine
    from eagle3_trt.core.engine import SamplingParams
    from eagle3_trt.core.stats import aggregate
    from eagle3_trt.core.tree import parse_tree
    from eagle3_trt.testing.tiny_pair import TinyShape, make_pair
    from eagle3_trt.testing.toy_pair import sharpen_target
    from eagle3_trt.train.trainer import distill_draft

    torch.set_num_threads(a.threads)
    dtype = torch.float32 if a.device == "cpu" else torch.bfloat16
    rng = random.Random(0)
    if a.shape == "embedded":
        from eagle3_trt.convert.embedded import embedded_pair, heldout_prompts

        t, d = embedded_pair("tiny")
        eng = load_engine(t, d, device=a.device, dtype=torch.float32, max_draft_len=a.k)
        held = heldout_prompts(t.parent)
        prompts = [held[i % len(held)] for i in range(a.prompts)]
        print(f"embedded trained pair on {a.device}, {len(prompts)} held-out prompts of {len(prompts[0])} tokens")
    else:
        t, d = make_pair(Path(tempfile.mkdtemp(prefix="bench-speed-")), shape=TinyShape(**SHAPES[a.shape]))
        eng = load_engine(t, d, device=a.device, dtype=torch.float32, max_draft_len=a.k)
        sharpen_target(eng.target, 20.0 if a.shape == "tiny" else 8.0)
        train = [[0] + [rng.randrange(6, 512) for _ in range(rng.randrange(4, 14))] for _ in range(256)]
        t0 = time.perf_counter()
        distill_draft(eng, train, steps=a.distill_steps, lr=5e-3 if a.shape == "tiny" else 2e-3, gen_tokens=32)
        print(f"{a.shape} pair ready on {a.device} (draft distilled in {time.perf_counter() - t0:.1f} s)")
        prompts = [[0] + [rng.randrange(6, 512) for _ in range(rng.randrange(4, 14))] for _ in range(a.prompts)]
    if dtype != torch.float32:
        eng.target.hf.to(dtype)
        eng.target.dtype = dtype
        eng.draft.to(dtype)
    params = SamplingParams(max_tokens=a.max_tokens)
    tree = parse_tree(a.tree)

    def run(speculate: bool):
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        res = [eng.generate([p], params, speculate=speculate, tree=tree)[0] for p in prompts]
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t0, res

    run(True), run(False)  # warm-up
    best = {}
    for spec in (False, True):
        best[spec] = min((run(spec) for _ in range(a.repeats)), key=lambda x: x[0])
    (t_base, base), (t_spec, spec) = best[False], best[True]
    assert [r.token_ids for r in base] == [r.token_ids for r in spec], "greedy outputs differ"
    n = sum(len(r.token_ids) for r in spec)
    agg = aggregate(r.stats for r in spec)
    speedup = t_base / t_spec
    label = f"tree {a.tree}" if tree is not None else f"chain K={a.k}"
    print(f"{a.prompts} prompts x {a.max_tokens} tokens, batch 1, greedy, {a.device} ({a.threads} thread(s)), {label}")
    print(
        f"  alpha {agg.alpha:.3f}  AL {agg.acceptance_length:.2f} tokens/target forward  "
        f"cumulative per position {[round(x, 3) for x in agg.cumulative_acceptance]}"
    )
    print(f"  K=0          {n / t_base:8.1f} tokens/s")
    print(f"  speculative  {n / t_spec:8.1f} tokens/s")
    print(f"  speedup {speedup:.2f}x; fraction of ideal (speedup / AL) {speedup / agg.acceptance_length:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
