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

Sides are assigned per group, statefully: a group holding a prompt the ``previous`` split trained on is
trained on (so a held-back group merging with a trained one goes to training, the allowed direction),
else one holding a prompt it held back is held back; each new group, in the order of its score (the
largest seeded hash, sha256 of ``seed`` and the prompt ids, over its members), is held back when that
brings the held-back records nearer ``holdout_fraction`` of all records. So the share holds whatever the
near-duplicate structure, the split depends only on the records, the seed and ``previous``, and a
prompt trained on is never held back later. ``SplitSides`` records every prompt's side (a retrained
bundle's ``traffic_split.json``; ``gate --traffic`` and the next retrain start from it). With at least
two groups and 0 < fraction neither side is left empty when new groups allow it (the lowest-scoring
new group is held back, or the highest-scoring held-back group trained on).

``split_traffic`` splits records held in memory; ``split_capture`` makes the same split of a capture
directory in bounded memory (what ``train-draft --traffic`` and ``gate --traffic`` read): pass 1
streams the capture segment by segment keeping a small digest of each record and of each distinct
prompt (``CaptureIndex``); the sides are row numbers, read back from disk record by record. Ties of
the canonical order beyond the digest's line prefix, near-duplicate candidates and the traffic digest
read the lines they need again, so the result is exactly the list-based one.

Pure Python and numpy (formats layer: no torch).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from eagle3_trt.errors import UserError
from eagle3_trt.formats.traffic import LineReader, TrafficRecord, capture_segments, digest_sorted_lines, line_check, record_at, segment_lines

NEAR_DUP_JACCARD = 0.8
"""Two prompts whose token 4-gram sets have at least this Jaccard similarity are one group."""
SHINGLE = 4
_BANDS, _ROWS = 32, 4
_NUM_HASHES = _BANDS * _ROWS
_BATCH_TOKENS = 16384  # prompt tokens hashed per batch (_band_hashes): bounds its (hashes x tokens) temporaries to ~16 MiB
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
    sides: SplitSides | None = None
    """every prompt's side, the previous split's included: the next split's ``previous``"""


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


# MinHash's permutations: x -> a*x + b mod 2**64 with a odd (a bijection of the already mixed shingle
# hashes); two operations per element where a salted splitmix took nine
_MUL = _mix(np.arange(1, _NUM_HASHES + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))[:, None] | np.uint64(1)
_ADD = _mix(np.arange(_NUM_HASHES + 1, 2 * _NUM_HASHES + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))[:, None]


def _minhash(sh: _U64) -> _U64:
    out: _U64 = (sh[None, :] * _MUL + _ADD).min(axis=1)
    return out


def _grams(ids: Sequence[int]) -> frozenset[tuple[int, ...]]:
    """The prompt's token 4-grams themselves (a shorter prompt is one gram): what the exact Jaccard
    compares (a Python set: faster than numpy on prompts of a few hundred tokens, and no hash)."""
    if len(ids) < SHINGLE:
        return frozenset([tuple(ids)])
    return frozenset(zip(*(ids[c : len(ids) - SHINGLE + 1 + c] for c in range(SHINGLE))))


def _jaccard(a: frozenset[tuple[int, ...]], b: frozenset[tuple[int, ...]]) -> float:
    inter = len(a & b)
    return inter / (len(a) + len(b) - inter)


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

    def roots(self) -> npt.NDArray[np.int64]:
        """Every element's root, vectorized (pointer jumping on a copy; the lists are left as they are)."""
        par = np.array(self.parent, dtype=np.int64)
        while True:
            nxt = par[par]
            if np.array_equal(nxt, par):
                return par
            par = nxt

    def union(self, i: int, j: int) -> None:
        a, b = self.find(i), self.find(j)
        if a != b:
            self.parent[max(a, b)] = min(a, b)


def _band_hashes(batch: Sequence[Sequence[int]]) -> bytes:
    """``_bands(_minhash(_shingles(ids)))`` of every prompt of ``batch``, concatenated, computed for the
    whole batch at once (per prompt, numpy's call overhead on ~100-element arrays was most of the split's time)."""
    lens = np.fromiter((len(ids) for ids in batch), dtype=np.int64, count=len(batch))
    if int(lens.min()) < SHINGLE:  # rare: a prompt shorter than a shingle is one shingle of its own
        return b"".join(_bands(_minhash(_shingles(ids))) for ids in batch)
    v = np.fromiter((t for ids in batch for t in ids), dtype=np.int64, count=int(lens.sum())).astype(np.uint64)
    m = v.size - SHINGLE + 1
    h = _mix(v[:m] ^ np.uint64(0x243F6A8885A308D3))
    for c in range(1, SHINGLE):
        h = _mix(h ^ v[c : c + m])
    starts = np.r_[0, np.cumsum(lens)[:-1]]
    n_sh = lens - SHINGLE + 1
    pos = np.repeat(starts, n_sh) + (np.arange(int(n_sh.sum())) - np.repeat(np.r_[0, np.cumsum(n_sh)[:-1]], n_sh))
    sig = np.minimum.reduceat(h[pos][None, :] * _MUL + _ADD, np.r_[0, np.cumsum(n_sh)[:-1]], axis=1)  # (hashes, prompts)
    rows = sig.T.reshape(len(batch), _BANDS, _ROWS)
    b = _mix(rows[:, :, 0])
    for c in range(1, _ROWS):
        b = _mix(b ^ rows[:, :, c])
    return b.astype("<u8").tobytes()


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
        self.pending: list[Sequence[int]] = []  # prompts whose band hashes are not computed yet (a batch)
        self.pending_tokens = 0

    def flush(self) -> None:
        if self.pending:
            self.bands += _band_hashes(self.pending)
            self.pending, self.pending_tokens = [], 0

    def add(self, r: TrafficRecord) -> int:
        """The distinct-prompt index of ``r`` (new prompts are registered)."""
        k = _ids_key(r.prompt_ids)
        u = self.by_ids.get(k)
        if u is None:
            u = self.by_ids[k] = self.groups.add()
            self.keys.append(k)
            self.pending.append(r.prompt_ids)
            self.pending_tokens += len(r.prompt_ids)
            if self.pending_tokens >= _BATCH_TOKENS:
                self.flush()
        if r.prompt_text is not None and not r.redacted:
            t = hashlib.blake2b(normalize_text(r.prompt_text).encode("utf-8"), digest_size=16).digest()
            v = self.by_text.setdefault(t, u)
            if v != u:
                self.groups.union(v, u)
        return u

    def merge_near_duplicates(self, ids_of: Callable[[int], Sequence[int]], near_dup_jaccard: float = NEAR_DUP_JACCARD) -> None:
        """Join the distinct prompts that are near-duplicates; ``ids_of(u)`` gives prompt ``u``'s ids
        (read again for the candidate pairs only)."""
        self.flush()
        n = len(self.keys)
        if n < 2:
            return
        bands = np.frombuffer(bytes(self.bands), dtype="<u8").reshape(n, _BANDS)
        cache: dict[int, frozenset[tuple[int, ...]]] = {}

        def sh(u: int) -> frozenset[tuple[int, ...]]:
            if u not in cache:
                if len(cache) >= 4096:
                    cache.clear()
                cache[u] = _grams(ids_of(u))
            return cache[u]

        checked: set[tuple[int, int]] = set()
        for b in range(_BANDS):
            col = bands[:, b]
            order = np.argsort(col, kind="stable")
            sc = col[order]
            starts = np.flatnonzero(np.r_[True, sc[1:] != sc[:-1]])
            ends = np.r_[starts[1:], n]
            # a bucket whose members are one group already has nothing to merge (most buckets after the
            # first bands on templated traffic); unions later in this band only make a bucket more uniform
            rs = self.groups.roots()[order]
            many = (ends - starts > 1) & (np.minimum.reduceat(rs, starts) != np.maximum.reduceat(rs, starts))
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


class SplitSides(BaseModel):
    """The side every prompt of a split went to (``PROMPT_KEY`` bytes of sha256 of its ids per prompt,
    base64, sorted): what the next split of the grown capture starts from (``previous``). A bundle
    retrained on traffic keeps its split's in ``SPLIT_SIDES_FILE``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_: Literal[1] = Field(1, alias="schema")
    seed: int
    holdout_fraction: float = Field(ge=0.0, lt=1.0)
    train: str = Field("", description="the trained prompts' keys, base64")
    heldout: str = Field("", description="the held-back prompts' keys, base64")

    def keys(self) -> tuple[set[bytes], set[bytes]]:
        """(trained, held back) prompt keys."""
        return _unpack(self.train), _unpack(self.heldout)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, indent=1) + "\n"


SPLIT_SIDES_FILE = "traffic_split.json"
PROMPT_KEY = 16


def _pack(keys: Iterable[bytes]) -> str:
    return base64.b64encode(b"".join(sorted(keys))).decode("ascii")


def _unpack(text: str) -> set[bytes]:
    raw = base64.b64decode(text.encode("ascii"), validate=True)
    if len(raw) % PROMPT_KEY:
        raise ValueError(f"{len(raw)} bytes is not a whole number of {PROMPT_KEY}-byte prompt keys")
    return {raw[i : i + PROMPT_KEY] for i in range(0, len(raw), PROMPT_KEY)}


def read_split_sides(f: Path) -> SplitSides | None:
    """``f``'s split sides, None when there is no such file, a one-line UserError when it is not one."""
    f = Path(f)
    if not f.is_file():
        return None
    try:
        sides = SplitSides.model_validate_json(f.read_bytes())
        sides.keys()
    except (ValidationError, ValueError) as e:
        what = e.errors()[0]["msg"] if isinstance(e, ValidationError) else str(e)
        raise UserError(f, f"not a traffic split record ({what})", "it is written by train-draft --traffic; restore it from the bundle it came with") from None
    return sides


def _assign(score: dict[int, float], size: dict[int, int], inherited: dict[int, bool], holdout_fraction: float) -> set[int]:
    """The held-back groups (the module doc's rule). ``score``: each group's seeded score; ``size``: its
    records; ``inherited``: its side in the previous split (True held back), absent for a new group."""
    held = {g for g, h in inherited.items() if h}
    target = holdout_fraction * sum(size.values())
    n = sum(size[g] for g in held)
    new = sorted((g for g in score if g not in inherited), key=lambda g: (score[g], g))
    for g in new:
        if n + size[g] / 2 <= target:  # held back when that brings the held-back records nearer the target
            held.add(g)
            n += size[g]
    if len(score) >= 2 and holdout_fraction > 0.0:
        if not held and new:
            held.add(new[0])
        elif len(held) == len(score):  # a held-back group may always move to the training side
            held.discard(max(held, key=lambda g: (score[g], g)))
    return held


def _sides(prev: SplitSides | None, seed: int, holdout_fraction: float, train: Iterable[bytes], heldout: Iterable[bytes]) -> SplitSides:
    """The record of this split: the previous one's prompts (those gone from the capture too) and this one's."""
    t, h = prev.keys() if prev is not None else (set(), set())
    t |= set(train)
    return SplitSides(seed=seed, holdout_fraction=holdout_fraction, train=_pack(t), heldout=_pack((h | set(heldout)) - t))


def _inherited(prev: SplitSides | None, group_keys: Iterable[tuple[int, bytes]]) -> dict[int, bool]:
    """Each group's side in ``prev`` (from its prompts' keys): trained when any prompt was, else held back when any was."""
    if prev is None:
        return {}
    t, h = prev.keys()
    out: dict[int, bool] = {}
    for g, k in group_keys:
        if k in t:
            out[g] = False
        elif k in h:
            out.setdefault(g, True)
    return out


def _check_fraction(holdout_fraction: float) -> None:
    if not 0.0 <= float(holdout_fraction) < 1.0:
        raise UserError("--holdout-fraction", f"is {holdout_fraction}, not in [0, 1)", "hold back a fraction such as 0.2; 0 trains on everything")


def split_traffic(records: Iterable[TrafficRecord], *, seed: int = 0, holdout_fraction: float = 0.2, previous: SplitSides | None = None) -> TrafficSplit:
    """Split captured traffic held in memory into a training side and a held-back side (see the module
    doc), starting from the ``previous`` split's sides; ``split_capture`` makes the same split of a
    capture directory without holding it."""
    _check_fraction(holdout_fraction)
    # a canonical order first, so nothing below depends on the order the records came in
    recs = sorted(records, key=lambda r: (r.time_unix, r.request_id, r.to_line()))
    roots = group_prompts(recs)
    keys = [_ids_key(r.prompt_ids) for r in recs]
    score: dict[int, float] = {}
    size: dict[int, int] = {}
    for i, k in enumerate(keys):
        score[roots[i]] = max(_score(seed, k), score.get(roots[i], 0.0))
        size[roots[i]] = size.get(roots[i], 0) + 1
    held = _assign(score, size, _inherited(previous, ((roots[i], k[:PROMPT_KEY]) for i, k in enumerate(keys))), holdout_fraction)
    train = [r for i, r in enumerate(recs) if roots[i] not in held]
    heldout = [r for i, r in enumerate(recs) if roots[i] in held]
    sides = _sides(
        previous,
        int(seed),
        float(holdout_fraction),
        (k[:PROMPT_KEY] for i, k in enumerate(keys) if roots[i] not in held),
        (k[:PROMPT_KEY] for i, k in enumerate(keys) if roots[i] in held),
    )
    return TrafficSplit(
        train=train,
        heldout=heldout,
        seed=int(seed),
        holdout_fraction=float(holdout_fraction),
        groups=len(score),
        heldout_groups=len(held),
        merged=len(recs) - len(score),
        sides=sides,
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
        lines = LineReader()
        try:
            self.prompts.merge_near_duplicates(lambda u: self._prompt_ids(lines, first[u]))
        finally:
            lines.close()

    def __len__(self) -> int:
        return len(self.time)

    def _prompt_ids(self, lines: LineReader, i: int) -> list[int]:
        """Record ``i``'s prompt ids, read back without validating the whole record (pass 1 did)."""
        raw = lines.line(self.segments[self.seg[i]], self.off[i], self.size[i], bytes(self.check[8 * i : 8 * i + 8]))
        ids: list[int] = json.loads(raw)["prompt_ids"]
        return ids

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
    sides: SplitSides

    @property
    def records(self) -> int:
        return len(self.index)

    def train_digest(self) -> str:
        return self.index.digest(self.train.rows)


def split_capture(
    d: Path,
    *,
    seed: int = 0,
    holdout_fraction: float = 0.2,
    previous: SplitSides | None = None,
    visit: Callable[[TrafficRecord], None] | None = None,
) -> CaptureSplit:
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
    size: dict[int, int] = {}
    ps: dict[int, float] = {}
    for i in order:
        u = idx.uniq[i]
        if u not in ps:
            ps[u] = idx.prompts.score(seed, u)
        g = root[group[i]]
        score[g] = max(ps[u], score.get(g, 0.0))
        size[g] = size.get(g, 0) + 1
    keys = idx.prompts.keys
    ug = [root[idx.prompts.groups.find(u)] for u in range(len(keys))]  # each distinct prompt's group
    held = _assign(score, size, _inherited(previous, ((ug[u], k[:PROMPT_KEY]) for u, k in enumerate(keys))), holdout_fraction)
    train = [i for i in order if root[group[i]] not in held]
    heldout = [i for i in order if root[group[i]] in held]
    sides = _sides(
        previous,
        int(seed),
        float(holdout_fraction),
        (k[:PROMPT_KEY] for u, k in enumerate(keys) if ug[u] not in held),
        (k[:PROMPT_KEY] for u, k in enumerate(keys) if ug[u] in held),
    )
    return CaptureSplit(
        index=idx,
        train=CaptureRecords(idx, array("I", train)),
        heldout=CaptureRecords(idx, array("I", heldout)),
        seed=int(seed),
        holdout_fraction=float(holdout_fraction),
        groups=len(score),
        heldout_groups=len(held),
        sides=sides,
    )
