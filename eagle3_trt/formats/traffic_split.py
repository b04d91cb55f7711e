"""The seeded train / held-back split of captured traffic (issue 23): ``split_traffic``.

Retraining a draft head on traffic (``train-draft --traffic``) and gating the new head on traffic
(``gate --traffic``) must never see the same prompt on both sides, or the gate measures recall.
So records are first grouped, then whole groups are assigned to one side:

* exact duplicates: records with the same ``prompt_ids`` are one group;
* same text: records whose ``prompt_text`` is equal after normalization (case folded, runs of
  whitespace collapsed, stripped) are one group;
* near-duplicates: records whose prompts share most of their token 4-grams are one group, namely
  when the Jaccard similarity of their 4-gram sets (over ``prompt_ids``) is at least
  ``NEAR_DUP_JACCARD`` (0.8). Candidate pairs come from MinHash banding (128 hashes, 32 bands of
  4 rows: a pair at Jaccard 0.8 becomes a candidate with probability 1 - (1 - 0.8**4)**32 > 1 - 1e-7)
  and every candidate is confirmed with the exact Jaccard, so no pair under the threshold is merged.
  The grouping is the transitive closure (a chain of near-duplicates is one group).

Each group gets a score, the largest seeded hash (sha256 of ``seed`` and the prompt ids) over its
members, mapped to [0, 1); a group is held back when its score is below ``holdout_fraction``. So the
split depends only on the set of records and the seed (not on their order), and the held-back
fraction is honoured in expectation over groups. As traffic grows, groups only merge, and a merged
group's score can only rise: a prompt held back from more traffic was held back from less too, so
``gate --traffic`` on a capture that kept growing after ``train-draft --traffic`` never measures a
prompt the head was trained on (a held-back prompt may move to the training side, never back). With at least two groups and
0 < fraction < 1 neither side is left empty: the lowest-scoring group is held back, or the
highest-scoring one trained on, when the threshold alone would leave a side empty (only then can a
side change other than as described above).

Pure Python and numpy (formats layer: no torch).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from eagle3_trt.errors import UserError
from eagle3_trt.formats.traffic import TrafficRecord

NEAR_DUP_JACCARD = 0.8
"""Two prompts whose token 4-gram sets have at least this Jaccard similarity are one group."""
SHINGLE = 4
_BANDS, _ROWS = 32, 4
_NUM_HASHES = _BANDS * _ROWS
_U64 = npt.NDArray[np.uint64]
_WS = re.compile(r"\s+")


@dataclass(frozen=True)
class TrafficSplit:
    """The two sides of a split, each oldest first, and the parameters that made it."""

    train: list[TrafficRecord]
    heldout: list[TrafficRecord]
    seed: int
    holdout_fraction: float
    groups: int = 0
    """how many prompt groups (exact, same-text and near-duplicate prompts merged) the records formed"""
    near_dup_jaccard: float = NEAR_DUP_JACCARD
    heldout_groups: int = 0
    merged: int = field(default=0)
    """records that joined another record's group (duplicates and near-duplicates)"""


def normalize_text(text: str) -> str:
    """The text key of a prompt: case folded, whitespace runs collapsed to one space, stripped."""
    return _WS.sub(" ", text.casefold()).strip()


def _ids_key(ids: Sequence[int]) -> bytes:
    return hashlib.sha256(",".join(map(str, ids)).encode("ascii")).digest()


def _score(seed: int, ids_key: bytes) -> float:
    h = hashlib.sha256(f"eagle3-trt traffic split {int(seed)}:".encode("ascii") + ids_key).digest()
    return int.from_bytes(h[:8], "big") / 2.0**64


def _shingles(ids: Sequence[int]) -> _U64:
    """The prompt's token 4-grams, each hashed to a 64-bit integer (a shorter prompt is one shingle)."""
    n = max(1, len(ids) - SHINGLE + 1)
    grams = {tuple(ids[i : i + SHINGLE]) for i in range(n)}
    out = np.fromiter(
        (int.from_bytes(hashlib.blake2b(repr(g).encode("ascii"), digest_size=8).digest(), "little") for g in grams), dtype=np.uint64, count=len(grams)
    )
    return np.unique(out)


def _mix(z: _U64) -> _U64:
    """splitmix64's finalizer, vectorized (uint64 arithmetic wraps, as it should)."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


_SALTS = _mix(np.arange(1, _NUM_HASHES + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))[:, None]


def _minhash(sh: _U64) -> _U64:
    with np.errstate(over="ignore"):
        out: _U64 = _mix(sh[None, :] ^ _SALTS).min(axis=1)
    return out


def _jaccard(a: _U64, b: _U64) -> float:
    inter = np.intersect1d(a, b, assume_unique=True).size
    return float(inter / (a.size + b.size - inter))


class _Groups:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, i: int, j: int) -> None:
        a, b = self.find(i), self.find(j)
        if a != b:
            self.parent[max(a, b)] = min(a, b)


def group_prompts(records: Sequence[TrafficRecord], *, near_dup_jaccard: float = NEAR_DUP_JACCARD) -> list[int]:
    """Each record's group root (an index into ``records``): same ids, same normalized text and
    near-duplicate token 4-gram sets are merged. The partition does not depend on record order."""
    n = len(records)
    g = _Groups(n)
    by_ids: dict[bytes, int] = {}
    by_text: dict[str, int] = {}
    uniq: list[int] = []  # one record per distinct prompt_ids
    for i, r in enumerate(records):
        k = _ids_key(r.prompt_ids)
        if k in by_ids:
            g.union(by_ids[k], i)
        else:
            by_ids[k] = i
            uniq.append(i)
        if r.prompt_text is not None and not r.redacted:
            t = normalize_text(r.prompt_text)
            if t in by_text:
                g.union(by_text[t], i)
            else:
                by_text[t] = i
    sh = {i: _shingles(records[i].prompt_ids) for i in uniq}
    buckets: dict[tuple[int, bytes], list[int]] = {}
    for i in uniq:
        sig = _minhash(sh[i])
        for b in range(_BANDS):
            buckets.setdefault((b, sig[b * _ROWS : (b + 1) * _ROWS].tobytes()), []).append(i)
    checked: set[tuple[int, int]] = set()
    for members in buckets.values():
        for x in range(len(members)):
            for y in range(x + 1, len(members)):
                i, j = members[x], members[y]
                if (i, j) in checked or g.find(i) == g.find(j):
                    continue
                checked.add((i, j))
                if _jaccard(sh[i], sh[j]) >= near_dup_jaccard:
                    g.union(i, j)
    return [g.find(i) for i in range(n)]


def split_traffic(records: Iterable[TrafficRecord], *, seed: int = 0, holdout_fraction: float = 0.2) -> TrafficSplit:
    """Split captured traffic into a training side and a held-back side (see the module doc)."""
    if not 0.0 <= float(holdout_fraction) < 1.0:
        raise UserError("--holdout-fraction", f"is {holdout_fraction}, not in [0, 1)", "hold back a fraction such as 0.2; 0 trains on everything")
    # a canonical order first, so nothing below depends on the order the records came in
    recs = sorted(records, key=lambda r: (r.time_unix, r.request_id, r.to_line()))
    roots = group_prompts(recs)
    score: dict[int, float] = {}
    for i, r in enumerate(recs):
        s = _score(seed, _ids_key(r.prompt_ids))
        score[roots[i]] = max(s, score.get(roots[i], 0.0))
    held = {k for k, s in score.items() if s < holdout_fraction}
    if len(score) >= 2 and holdout_fraction > 0.0:
        if not held:
            held = {min(score, key=lambda k: (score[k], k))}
        elif len(held) == len(score):
            held.discard(max(score, key=lambda k: (score[k], k)))
    train = [r for i, r in enumerate(recs) if roots[i] not in held]
    heldout = [r for i, r in enumerate(recs) if roots[i] in held]
    return TrafficSplit(
        train=train,
        heldout=heldout,
        seed=int(seed),
        holdout_fraction=float(holdout_fraction),
        groups=len(score),
        heldout_groups=len(held),
        merged=len(recs) - len(score),
    )
