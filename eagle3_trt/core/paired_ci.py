"""Confidence intervals for a difference of pooled acceptance lengths measured on the same requests.

Acceptance length (AL) pooled over requests is a ratio of sums, sum(tokens) / sum(target
forwards) (core/stats.py). Two measurements of the same requests (offline vs served, NEW vs OLD)
are paired: request i contributes (tokens_a[i], forwards_a[i]) and (tokens_b[i], forwards_b[i]).
The interval of AL_a - AL_b comes from a paired percentile bootstrap over requests: resample the
request indices with replacement, recompute both pooled ratios on the resample, take the
difference's quantiles. Pairing keeps the prompt-to-prompt spread (long easy prompts, short hard
ones) out of the difference; a difference that is exactly zero on every request gives [0, 0].

Requests are not independent when a prompt was sent more than once (or near-duplicates were):
its copies behave alike, so resampling them one by one counts one prompt as several and narrows
the interval. With ``groups`` (one label per request, e.g. the traffic split's prompt groups) the
bootstrap resamples whole groups (a cluster bootstrap): each group's sums enter or leave together,
and ``n_groups`` is the number of independent units the interval rests on.

A quantity that is a function of the pooled ratio (the predicted speedup of a method at a fixed
K and concurrency is a function of its AL: ``measure/against.py``) gets its paired interval the
same way: ``transform_a`` / ``transform_b`` map each side's pooled ratio, at the point estimate and
in every resample, before the difference is taken (the two sides may be different methods, so
each has its own map).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch

DEFAULT_LEVEL = 0.95
DEFAULT_RESAMPLES = 4000


@dataclass(frozen=True)
class PairedDiff:
    """AL_a - AL_b over ``n`` paired requests, with its bootstrap interval at ``level``."""

    a: float
    b: float
    diff: float
    lo: float
    hi: float
    n: int
    level: float
    n_groups: int = 0  # independent units resampled (distinct prompt groups; = n without groups)

    def excludes_zero_by(self, tolerance: float) -> bool:
        """The whole interval lies more than ``tolerance`` away from 0 (on either side)."""
        return self.lo > tolerance or self.hi < -tolerance

    def to_dict(self) -> dict[str, object]:
        return {"a": self.a, "b": self.b, "diff": self.diff, "ci": [self.lo, self.hi], "level": self.level, "n": self.n, "n_groups": self.n_groups}


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    return torch.where(den > 0, num / den.clamp(min=1e-12), torch.zeros_like(num))


def _mapped(f: Callable[[float], float] | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """``f`` applied elementwise to a 1-D tensor of ratios (the identity for None). The resamples
    hold few distinct ratios (sums of small counts), so ``f`` runs once per distinct value."""
    if f is None:
        return lambda r: r

    def apply(r: torch.Tensor) -> torch.Tensor:
        uniq, inv = torch.unique(r, return_inverse=True)
        return torch.tensor([float(f(float(x))) for x in uniq.tolist()], dtype=torch.float64)[inv]

    return apply


def paired_ratio_diff(
    num_a: Sequence[float],
    den_a: Sequence[float],
    num_b: Sequence[float],
    den_b: Sequence[float],
    *,
    level: float = DEFAULT_LEVEL,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    groups: Sequence[Hashable] | None = None,
    transform_a: Callable[[float], float] | None = None,
    transform_b: Callable[[float], float] | None = None,
) -> PairedDiff:
    """sum(num_a)/sum(den_a) - sum(num_b)/sum(den_b) and its paired percentile-bootstrap interval
    (deterministic for a seed). Every sequence holds one value per request, in the same order;
    ``groups``, one label per request, makes it a cluster bootstrap over the distinct labels.
    ``transform_a`` / ``transform_b``: f_a(ratio_a) - f_b(ratio_b) instead (point and resamples)."""
    n = len(num_a)
    if not n == len(den_a) == len(num_b) == len(den_b):
        raise ValueError("paired_ratio_diff: the four sequences must have one value per request")
    if groups is not None and len(groups) != n:
        raise ValueError("paired_ratio_diff: groups must have one label per request")
    if n == 0:
        raise ValueError("paired_ratio_diff: no requests")
    if not 0 < level < 1:
        raise ValueError(f"paired_ratio_diff: level {level} is not in (0, 1)")
    cols = torch.tensor([list(num_a), list(den_a), list(num_b), list(den_b)], dtype=torch.float64)  # [4, n]
    if groups is not None:
        # one column per group (its requests' sums), in first-seen order: the units resampled below
        index: dict[Hashable, int] = {}
        g_of = torch.tensor([index.setdefault(g, len(index)) for g in groups])
        cols = torch.zeros(4, len(index), dtype=torch.float64).index_add_(1, g_of, cols)
    units = cols.shape[1]
    tot = cols.sum(1)
    fa, fb = _mapped(transform_a), _mapped(transform_b)
    a, b = float(fa(_ratio(tot[0], tot[1]).reshape(1))[0]), float(fb(_ratio(tot[2], tot[3]).reshape(1))[0])
    gen = torch.Generator().manual_seed(int(seed))
    step = max(1, 1_000_000 // units)  # resamples per chunk: bounded memory for large traffic sets
    sums = torch.cat(
        [cols[:, torch.randint(0, units, (min(step, resamples - s), units), generator=gen)].sum(-1) for s in range(0, int(resamples), step)], dim=1
    )  # [4, R]
    d = fa(_ratio(sums[0], sums[1])) - fb(_ratio(sums[2], sums[3]))
    q = torch.tensor([(1 - level) / 2, 1 - (1 - level) / 2], dtype=torch.float64)
    lo, hi = torch.quantile(d, q).tolist()
    # the point estimate always lies in its interval (a degenerate resample set can round past it)
    return PairedDiff(a, b, a - b, min(lo, a - b), max(hi, a - b), n, level, units)
