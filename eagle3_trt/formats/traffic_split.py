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

``split_traffic`` splits records held in memory; ``split_capture`` makes the same split of a capture
directory in bounded memory (what ``train-draft --traffic`` and ``gate --traffic`` read): pass 1
streams the capture segment by segment keeping a small digest of each record and of each distinct
prompt (``CaptureIndex``); the sides are row numbers, read back from disk record by record. Ties of
the canonical order beyond the digest's line prefix, near-duplicate candidates and the traffic digest
read the lines they need again, so the result is exactly the list-based one.

Pure Python and numpy (formats layer: no torch).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from eagle3_trt.errors import UserError
from eagle3_trt.formats.traffic import TrafficRecord, capture_segments, digest_sorted_lines, line_check, record_at, segment_lines

NEAR_DUP_JACCARD = 0.8
"""Two prompts whose token 4-gram sets have at least this Jaccard similarity are one group."""
SHINGLE = 4
_BANDS, _ROWS = 32, 4
_NUM_HASHES = _BANDS * _ROWS
_REPS = 32  # groups a prompt is compared with per band bucket (merge_near_duplicates)
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
    """The prompt's token 4-grams, each hashed to a 64-bit integer (a shorter prompt is one shingle),
    vectorized: splitmix64 chained over the four ids (the hash's only job is telling 4-grams apart)."""
    v = np.asarray(ids, dtype=np.int64).astype(np.uint64)  # array arithmetic wraps silently, as hashing wants
    if v.size < SHINGLE:
        h = _mix(np.array([(v.size * 0x9E3779B97F4A7C15) % 2**64], dtype=np.uint64))
        for c in range(v.size):
            h = _mix(h ^ v[c : c + 1])
        return h
    n = v.size - SHINGLE + 1
    h = _mix(v[:n] ^ np.uint64(0x243F6A8885A308D3))
    for c in range(1, SHINGLE):
        h = _mix(h ^ v[c : c + n])
    return np.unique(h)


def _mix(z: _U64) -> _U64:
    """splitmix64's finalizer, vectorized (uint64 arithmetic wraps, as it should)."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


_SALTS = _mix(np.arange(1, _NUM_HASHES + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))[:, None]


def _minhash(sh: _U64) -> _U64:
    out: _U64 = _mix(sh[None, :] ^ _SALTS).min(axis=1)
    return out


def _jaccard(a: _U64, b: _U64) -> float:
    inter = np.intersect1d(a, b, assume_unique=True).size
    return float(inter / (a.size + b.size - inter))


class _Groups:
    def __init__(self, n: int = 0) -> None:
        self.parent = list(range(n))

    def add(self) -> int:
        self.parent.append(len(self.parent))
        return len(self.parent) - 1

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, i: int, j: int) -> None:
        a, b = self.find(i), self.find(j)
        if a != b:
            self.parent[max(a, b)] = min(a, b)


def _bands(sig: _U64) -> bytes:
    """One 64-bit hash per band of a MinHash signature (32 x 8 bytes): what is kept per distinct
    prompt to find candidate pairs. Every candidate is confirmed by the exact Jaccard of the two
    prompts' 4-grams, so a hash collision never merges a pair."""
    rows = sig.reshape(_BANDS, _ROWS)
    h = _mix(rows[:, 0])
    for c in range(1, _ROWS):
        h = _mix(h ^ rows[:, c])
    return h.astype("<u8").tobytes()


class _Prompts:
    """The prompt groups of a stream of records, kept small: per distinct ``prompt_ids`` its key (32
    bytes), seeded score input and band hashes (256 bytes); per distinct normalized text a 16-byte
    hash. The partition is the one module doc describes; how it is computed does not depend on the
    order records arrive in."""

    def __init__(self) -> None:
        self.groups = _Groups()
        self.by_ids: dict[bytes, int] = {}
        self.keys: list[bytes] = []
        self.by_text: dict[bytes, int] = {}
        self.bands = bytearray()

    def add(self, r: TrafficRecord) -> int:
        """The distinct-prompt index of ``r`` (new prompts are registered)."""
        k = _ids_key(r.prompt_ids)
        u = self.by_ids.get(k)
        if u is None:
            u = self.by_ids[k] = self.groups.add()
            self.keys.append(k)
            self.bands += _bands(_minhash(_shingles(r.prompt_ids)))
        if r.prompt_text is not None and not r.redacted:
            t = hashlib.blake2b(normalize_text(r.prompt_text).encode("utf-8"), digest_size=16).digest()
            v = self.by_text.setdefault(t, u)
            if v != u:
                self.groups.union(v, u)
        return u

    def merge_near_duplicates(self, ids_of: Callable[[int], Sequence[int]], near_dup_jaccard: float = NEAR_DUP_JACCARD) -> None:
        """Join the distinct prompts that are near-duplicates; ``ids_of(u)`` gives prompt ``u``'s ids
        (read again for the candidate pairs only)."""
        n = len(self.keys)
        if n < 2:
            return
        bands = np.frombuffer(bytes(self.bands), dtype="<u8").reshape(n, _BANDS)
        cache: dict[int, _U64] = {}

        def sh(u: int) -> _U64:
            if u not in cache:
                if len(cache) >= 4096:
                    cache.clear()
                cache[u] = _shingles(ids_of(u))
            return cache[u]

        checked: set[tuple[int, int]] = set()
        for b in range(_BANDS):
            col = bands[:, b]
            order = np.argsort(col, kind="stable")
            sc = col[order]
            starts = np.flatnonzero(np.r_[True, sc[1:] != sc[:-1]])
            ends = np.r_[starts[1:], n]
            many = ends - starts > 1
            for st, en in zip(starts[many].tolist(), ends[many].tolist()):
                # each prompt is compared with one member of each group already met in this bucket (at
                # most _REPS of them), not with every member: templated traffic puts thousands of
                # near-duplicates in one bucket, and all pairs grew as n^2 there
                reps: list[int] = []
                for i in sorted(order[st:en].tolist()):
                    gi = self.groups.find(i)
                    if any(self.groups.find(r) == gi for r in reps):
                        continue
                    for r in reps[-_REPS:]:
                        pair = (r, i)
                        if pair in checked or self.groups.find(r) == self.groups.find(i):
                            continue
                        checked.add(pair)  # a band-hash collision only adds a candidate: the exact Jaccard decides
                        if _jaccard(sh(r), sh(i)) >= near_dup_jaccard:
                            self.groups.union(r, i)
                            break
                    else:
                        reps.append(i)

    def score(self, seed: int, u: int) -> float:
        return _score(seed, self.keys[u])


def group_prompts(records: Sequence[TrafficRecord], *, near_dup_jaccard: float = NEAR_DUP_JACCARD) -> list[int]:
    """Each record's group root (an index into ``records``, the group's first record): same ids,
    same normalized text and near-duplicate token 4-gram sets are merged. The partition does not
    depend on record order."""
    p = _Prompts()
    uniq = [p.add(r) for r in records]
    first: dict[int, int] = {}
    for i, u in enumerate(uniq):
        first.setdefault(u, i)
    p.merge_near_duplicates(lambda u: records[first[u]].prompt_ids, near_dup_jaccard)
    root: dict[int, int] = {}
    for i, u in enumerate(uniq):
        root.setdefault(p.groups.find(u), i)
    return [root[p.groups.find(u)] for u in uniq]


def _held_groups(score: dict[int, float], holdout_fraction: float) -> set[int]:
    """The held-back groups (keys of ``score``, each group's score; the module doc's rule)."""
    held = {k for k, s in score.items() if s < holdout_fraction}
    if len(score) >= 2 and holdout_fraction > 0.0:
        if not held:
            held = {min(score, key=lambda k: (score[k], k))}
        elif len(held) == len(score):
            held.discard(max(score, key=lambda k: (score[k], k)))
    return held


def _check_fraction(holdout_fraction: float) -> None:
    if not 0.0 <= float(holdout_fraction) < 1.0:
        raise UserError("--holdout-fraction", f"is {holdout_fraction}, not in [0, 1)", "hold back a fraction such as 0.2; 0 trains on everything")


def split_traffic(records: Iterable[TrafficRecord], *, seed: int = 0, holdout_fraction: float = 0.2) -> TrafficSplit:
    """Split captured traffic held in memory into a training side and a held-back side (see the module
    doc); ``split_capture`` makes the same split of a capture directory without holding it."""
    _check_fraction(holdout_fraction)
    # a canonical order first, so nothing below depends on the order the records came in
    recs = sorted(records, key=lambda r: (r.time_unix, r.request_id, r.to_line()))
    roots = group_prompts(recs)
    score: dict[int, float] = {}
    for i, r in enumerate(recs):
        s = _score(seed, _ids_key(r.prompt_ids))
        score[roots[i]] = max(s, score.get(roots[i], 0.0))
    held = _held_groups(score, holdout_fraction)
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


PREFIX_CHARS = 96
"""How much of each record's canonical line a capture's index keeps to order records (ties read the lines again)."""


def line_prefix(r: TrafficRecord) -> str:
    """``r.to_line()[:PREFIX_CHARS]``, from the line's leading fields alone when they reach that far
    (dumping the whole record is most of pass 1's time otherwise)."""
    if math.isfinite(r.time_unix):
        head = {"schema": r.schema_, "request_id": r.request_id, "time_unix": r.time_unix, "bundle_fingerprint": r.bundle_fingerprint}
        text = json.dumps(head, separators=(",", ":"), ensure_ascii=False)[:-1] + ","
        if len(text) >= PREFIX_CHARS:
            return text[:PREFIX_CHARS]
    return r.to_line()[:PREFIX_CHARS]


class CaptureRecords:
    """Some records of a capture, in canonical order, read from disk each time they are iterated
    (``record_at``: one record in memory at a time)."""

    def __init__(self, index: CaptureIndex, rows: Sequence[int]) -> None:
        self._index, self.rows = index, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[TrafficRecord]:
        return (self._index.record(i) for i in self.rows)


class CaptureIndex:
    """Pass 1 over a capture directory (``iter_traffic``'s segment-at-a-time read): a small digest of
    every record (where its line is, its time, request id, the first ``PREFIX_CHARS`` characters of
    its canonical line, its distinct-prompt index) and the prompt groups (``_Prompts``): about 260
    bytes per record plus 490 per distinct prompt of 128 tokens (tracemalloc; benchmarks/bench_capture_scale.py
    measures the whole read's peak RSS); the records themselves are read again only when asked for (``record``)."""

    def __init__(self, d: Path, visit: Callable[[TrafficRecord], None] | None = None) -> None:
        self.dir = Path(d)
        self.segments = capture_segments(self.dir)
        self.seg, self.off, self.size = array("I"), array("Q"), array("I")
        self.time = array("d")
        self.uniq = array("I")
        self.check = bytearray()
        self.request_id: list[str] = []
        self.prefix: list[str] = []
        self.prompts = _Prompts()
        first: dict[int, int] = {}
        for s, f in enumerate(self.segments):
            for off, raw, r in segment_lines(f):
                if visit is not None:
                    visit(r)
                i = len(self.time)
                self.seg.append(s)
                self.off.append(off)
                self.size.append(len(raw))
                self.check += line_check(raw)
                self.time.append(r.time_unix)
                self.request_id.append(r.request_id)
                self.prefix.append(line_prefix(r))
                u = self.prompts.add(r)
                self.uniq.append(u)
                first.setdefault(u, i)
        self.prompts.merge_near_duplicates(lambda u: self.record(first[u]).prompt_ids)

    def __len__(self) -> int:
        return len(self.time)

    def record(self, i: int) -> TrafficRecord:
        return record_at(self.segments[self.seg[i]], self.off[i], self.size[i], bytes(self.check[8 * i : 8 * i + 8]))

    def _line(self, i: int) -> str:
        return self.record(i).to_line()

    def _resolve_ties(self, rows: list[int], key: Callable[[int], object]) -> list[int]:
        """``rows`` sorted by ``key`` (which ends with the line prefix) are in full-line order once each
        run of equal keys whose prefix was cut is sorted by its whole lines (read again: only ties)."""
        out: list[int] = []
        i = 0
        while i < len(rows):
            j = i + 1
            k = key(rows[i])
            while j < len(rows) and key(rows[j]) == k:
                j += 1
            run = rows[i:j]
            if len(run) > 1 and len(self.prefix[run[0]]) == PREFIX_CHARS:
                run = sorted(run, key=self._line)
            out += run
            i = j
        return out

    def canonical(self) -> list[int]:
        """Every record's index, in split_traffic's canonical order (time, request id, canonical line)."""

        def key(i: int) -> tuple[float, str, str]:
            return self.time[i], self.request_id[i], self.prefix[i]

        return self._resolve_ties(sorted(range(len(self)), key=key), key)

    def digest(self, rows: Sequence[int]) -> str:
        """formats/traffic.traffic_digest of these records, streamed (lines hashed in sorted order)."""
        order = self._resolve_ties(sorted(rows, key=lambda i: self.prefix[i]), lambda i: self.prefix[i])
        return digest_sorted_lines(self._line(i) for i in order)


@dataclass(frozen=True)
class CaptureSplit:
    """``split_traffic``'s split of a capture directory, its sides read from disk when iterated."""

    index: CaptureIndex
    train: CaptureRecords
    heldout: CaptureRecords
    seed: int
    holdout_fraction: float
    groups: int
    heldout_groups: int

    @property
    def records(self) -> int:
        return len(self.index)

    def train_digest(self) -> str:
        return self.index.digest(self.train.rows)


def split_capture(d: Path, *, seed: int = 0, holdout_fraction: float = 0.2, visit: Callable[[TrafficRecord], None] | None = None) -> CaptureSplit:
    """``split_traffic`` of every record under the capture directory ``d``, in bounded memory: pass 1
    (``CaptureIndex``) keeps a digest of each record and groups the prompts; the sides are index rows,
    read again from disk record by record. ``visit`` sees every record once during pass 1 (checks)."""
    _check_fraction(holdout_fraction)
    idx = CaptureIndex(d, visit)
    order = idx.canonical()
    group = [idx.prompts.groups.find(u) for u in idx.uniq]
    root: dict[int, int] = {}  # group -> its first record in canonical order (as split_traffic's roots)
    for pos, i in enumerate(order):
        root.setdefault(group[i], pos)
    score: dict[int, float] = {}
    ps: dict[int, float] = {}
    for i in order:
        u = idx.uniq[i]
        if u not in ps:
            ps[u] = idx.prompts.score(seed, u)
        g = root[group[i]]
        score[g] = max(ps[u], score.get(g, 0.0))
    held = _held_groups(score, holdout_fraction)
    train = [i for i in order if root[group[i]] not in held]
    heldout = [i for i in order if root[group[i]] in held]
    return CaptureSplit(
        index=idx,
        train=CaptureRecords(idx, array("I", train)),
        heldout=CaptureRecords(idx, array("I", heldout)),
        seed=int(seed),
        holdout_fraction=float(holdout_fraction),
        groups=len(score),
        heldout_groups=len(held),
    )
