"""Is temperature > 0 under speculation distributed as the target's own sampling, per TensorRT-LLM
sampling-flag combination (core/spec_sampling.py)? A chi-square check on the toy pair.

The reference is the exact joint distribution of the first 3 generated tokens, enumerated with
transformers' forward and its logits warpers (not with the runtime's code); tokens 2 and 3 come out
of the first speculative iteration (K = 2). Used by tests/test_spec_sampling.py;
``python -m eagle3_trt.testing.spec_sampling_check`` prints the table (p-value and acceptance per
combination).
"""

from __future__ import annotations

import torch

from eagle3_trt.core.engine import SamplingParams, SpeculativeEngine
from eagle3_trt.core.spec_sampling import SpecSamplingConfig
from eagle3_trt.testing.toy_pair import toy_engine

V, PROMPT = 16, (1, 2, 3)


def exact_joint(hf, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """P(t1, t2, t3) [V, V, V] after PROMPT, from HF forward passes and HF's warpers."""
    # transformers only for the exact reference distribution (HF's own warpers)
    from transformers.generation.logits_process import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    warp = LogitsProcessorList(
        [TemperatureLogitsWarper(temperature)] + ([TopKLogitsWarper(top_k)] if top_k else []) + ([TopPLogitsWarper(top_p)] if top_p < 1 else [])
    )
    t12 = torch.cartesian_prod(torch.arange(V), torch.arange(V))
    ids = torch.cat([torch.tensor(PROMPT).expand(V * V, -1), t12], dim=1)
    with torch.no_grad():
        logits = hf(input_ids=ids).logits.float()

    def probs(lg, prefix):
        return torch.softmax(warp(prefix, lg), dim=-1)

    n = len(PROMPT)
    p1 = probs(logits[:1, n - 1], ids[:1, :n])[0]
    first = torch.arange(0, V * V, V)
    p2 = probs(logits[first, n], ids[first, : n + 1])
    p3 = probs(logits[:, n + 1], ids).view(V, V, V)
    return p1[:, None, None] * p2[:, :, None] * p3


def chi2_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square p-value of ``counts`` against ``probs``, cells expecting < 5 pooled; 0 when
    an outcome of probability 0 was drawn."""
    exp = probs.flatten().double() * counts.sum()
    obs = counts.flatten().double()
    big = exp >= 5
    o = torch.cat([obs[big], obs[~big].sum()[None]])
    e = torch.cat([exp[big], exp[~big].sum()[None]])
    keep = e > 0
    if bool((o[~keep] > 0).any()):
        return 0.0
    stat = float((((o - e) ** 2) / e)[keep].sum())
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))


def sample_counts(eng: SpeculativeEngine, flags: SpecSamplingConfig, params: SamplingParams, n: int) -> tuple[torch.Tensor, int, int]:
    """(counts of the first 3 tokens [V, V, V], accepted draft tokens, drafted tokens) of ``n``
    speculative requests served with ``flags``."""
    eng.sampling = flags
    res = eng.generate([list(PROMPT)] * n, params, speculate=True)
    counts = torch.zeros(V, V, V)
    for r in res:
        counts[tuple(r.token_ids[:3])] += 1
    return counts, sum(r.stats.accepted_tokens for r in res), sum(r.stats.draft_tokens for r in res)


COMBINATIONS: tuple[tuple[str, SpecSamplingConfig], ...] = (
    ("flags off (TensorRT-LLM defaults)", SpecSamplingConfig()),
    ("allow_advanced_sampling", SpecSamplingConfig(allow_advanced_sampling=True)),
    ("+ use_rejection_sampling", SpecSamplingConfig(allow_advanced_sampling=True, use_rejection_sampling=True)),
    ("allow_advanced_sampling, no_topk", SpecSamplingConfig(allow_advanced_sampling=True, advanced_sampling_mode="no_topk")),
)


def main(n: int = 3000) -> None:
    torch.set_num_threads(1)
    hf, eng = toy_engine(V, 12, max_draft_len=2, seed=0)
    for temperature, top_k, top_p in ((1.0, 0, 1.0), (0.8, 6, 0.9)):
        exact = exact_joint(hf, temperature, top_k, top_p)
        params = SamplingParams(max_tokens=4, temperature=temperature, top_k=top_k, top_p=top_p, seed=99)
        for name, flags in COMBINATIONS:
            counts, acc, drafted = sample_counts(eng, flags, params, n)
            print(
                f"T={temperature} top_k={top_k} top_p={top_p}  {name:34s} chi-square p={chi2_p(counts, exact):.2e}  "
                f"draft acceptance={acc / drafted:.3f}  (n={n})"
            )


if __name__ == "__main__":
    main()
