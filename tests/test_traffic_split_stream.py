"""formats/traffic_split.split_capture (two passes over a capture directory, bounded memory) makes
exactly the split the list-based split_traffic made before it streamed: the same held-back records,
the same training records in the same order, the same traffic digest. The oracle below is that
list-based implementation as it was (commit e58c5db, formats/traffic_split.py), kept verbatim but for
the side assignment, which is the module's ``_assign`` (groups drawn to the requested share since)."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Sequence

import numpy as np
import pytest

from eagle3_trt.errors import UserError
from eagle3_trt.formats.traffic import CapturedSampling, SegmentWriter, ServedAcceptance, TrafficRecord, read_traffic, traffic_digest
from eagle3_trt.formats.traffic_split import (
    _BANDS,
    _NUM_HASHES,
    _ROWS,
    _U64,
    NEAR_DUP_JACCARD,
    PREFIX_CHARS,
    SHINGLE,
    TrafficSplit,
    _assign,
    group_prompts,
    line_prefix,
    normalize_text,
    split_capture,
    split_traffic,
)

# ---- the list-based implementation before issue 30 (oracle) ----


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


def old_group_prompts(records: Sequence[TrafficRecord], *, near_dup_jaccard: float = NEAR_DUP_JACCARD) -> list[int]:
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


def old_split_traffic(records: Iterable[TrafficRecord], *, seed: int = 0, holdout_fraction: float = 0.2) -> TrafficSplit:
    """Split captured traffic into a training side and a held-back side (see the module doc)."""
    if not 0.0 <= float(holdout_fraction) < 1.0:
        raise UserError("--holdout-fraction", f"is {holdout_fraction}, not in [0, 1)", "hold back a fraction such as 0.2; 0 trains on everything")
    # a canonical order first, so nothing below depends on the order the records came in
    recs = sorted(records, key=lambda r: (r.time_unix, r.request_id, r.to_line()))
    roots = old_group_prompts(recs)
    score: dict[int, float] = {}
    for i, r in enumerate(recs):
        s = _score(seed, _ids_key(r.prompt_ids))
        score[roots[i]] = max(s, score.get(roots[i], 0.0))
    size = {g: roots.count(g) for g in score}
    held = _assign(score, size, {}, holdout_fraction)  # the assignment rule is the module's (it draws to the share since)
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


# ---- the test ----


def _rec(rid: str, t: float, ids: list[int], text: str | None, *, out: list[int] | None = None, redacted: bool = False) -> TrafficRecord:
    return TrafficRecord(
        request_id=rid,
        time_unix=t,
        bundle_fingerprint="f" * 64,
        model="eagle3",
        frontend="triton",
        chat=False,
        prompt_text=text,
        prompt_ids=ids,
        output_ids=out if out is not None else [1, 2, 3],
        sampling=CapturedSampling(max_tokens=8),
        acceptance=ServedAcceptance(speculative=True, draft_tokens=3, accepted_draft_tokens=1, target_forwards=2, completion_tokens=3),
        redacted=redacted,
    )


def _capture(tmp, n_prompts: int = 150, seed: int = 0) -> list[TrafficRecord]:
    """Records with every kind of duplicate, written by two writers whose segments interleave in time."""
    rng = random.Random(seed)
    base = [[rng.randrange(1000) for _ in range(rng.randrange(3, 90))] for _ in range(n_prompts)]
    recs: list[TrafficRecord] = []
    long_id = "chatcmpl-" + "x" * 120  # past the index's line prefix: ties are resolved by whole lines
    for p, ids in enumerate(base):
        t = 1.7e9 + rng.randrange(400) * 0.5  # many records share a time
        recs.append(_rec(f"r{p}", t, ids, f"Prompt {p}"))
        kind = p % 6
        if kind == 0:  # asked again, exactly
            recs += [_rec(f"r{p}-again{k}", t + k, ids, f"Prompt {p}") for k in range(1, 3)]
        elif kind == 1:  # another tokenization of the same text (case and spaces differ)
            recs.append(_rec(f"r{p}-text", t + 1, [rng.randrange(1000) for _ in range(5)], f"  prompt   {p} "))
        elif kind == 2 and len(ids) > 20:  # a near-duplicate, and one of that (a chain)
            near = ids[:]
            near[len(ids) // 2] = (near[len(ids) // 2] + 1) % 1000
            recs.append(_rec(f"r{p}-near", t + 2, near, None))
            near2 = near[:]
            near2[-3] = (near2[-3] + 1) % 1000
            recs.append(_rec(f"r{p}-near2", t + 3, near2, None, redacted=True))
        elif kind == 3:  # the same request id and time, different records: ordered by their lines
            recs.append(_rec(long_id, 1.7e9, ids, None, out=[p, 1]))
            recs.append(_rec(long_id, 1.7e9, ids, None, out=[p, 0]))
        elif kind == 4:  # an identical record twice (two writers recorded it)
            recs.append(recs[-1])
    rng.shuffle(recs)
    w1, w2 = SegmentWriter(tmp, segment_records=7), SegmentWriter(tmp, segment_records=11)  # two writers' segments
    for i, r in enumerate(recs):
        assert (w1 if i % 3 else w2).write(r)
    w1.close()
    w2.close()
    return recs


def _lines(rs: Iterable[TrafficRecord]) -> list[str]:
    return [r.to_line() for r in rs]


@pytest.mark.parametrize("seed,fraction", [(0, 0.2), (3, 0.5), (11, 0.05), (5, 0.0)])
def test_streamed_split_equals_list_based_split(tmp_path, seed: int, fraction: float) -> None:
    cap = tmp_path / "cap"
    recs = _capture(cap)
    assert len(list(cap.glob("traffic-*.jsonl"))) > 20
    assert all(line_prefix(r) == r.to_line()[:PREFIX_CHARS] for r in recs)  # the index's shortcut is the line's start
    old = old_split_traffic(read_traffic(cap), seed=seed, holdout_fraction=fraction)
    assert old.merged > 50 and old.heldout_groups >= (1 if fraction else 0)
    new = split_capture(cap, seed=seed, holdout_fraction=fraction)
    assert _lines(new.train) == _lines(old.train)
    assert _lines(new.heldout) == _lines(old.heldout)
    assert (new.records, new.groups, new.heldout_groups) == (len(recs), old.groups, old.heldout_groups)
    assert new.train_digest() == traffic_digest(old.train) == traffic_digest(list(new.train))
    # the in-memory split (the same code as the streamed one since issue 30) agrees too
    mem = split_traffic(recs, seed=seed, holdout_fraction=fraction)
    assert _lines(mem.train) == _lines(old.train) and _lines(mem.heldout) == _lines(old.heldout)
    assert group_prompts(old.train + old.heldout) == old_group_prompts(old.train + old.heldout)
    # and from a previous split's sides (a grown capture): the same again
    prev = split_traffic(recs[: len(recs) // 2], seed=seed, holdout_fraction=fraction).sides
    a, b = split_capture(cap, seed=seed, holdout_fraction=fraction, previous=prev), split_traffic(recs, seed=seed, holdout_fraction=fraction, previous=prev)
    assert _lines(a.train) == _lines(b.train) and _lines(a.heldout) == _lines(b.heldout) and a.sides == b.sides


def test_capture_changed_between_passes_is_one_line(tmp_path) -> None:
    cap = tmp_path / "cap"
    _capture(cap, n_prompts=30)
    s = split_capture(cap, seed=0, holdout_fraction=0.3)
    first = sorted(cap.glob("traffic-*.jsonl"))[0]
    first.write_bytes(first.read_bytes().replace(b'"r', b'"R', 1))
    with pytest.raises(UserError, match="changed while it was being read"):
        list(s.train) + list(s.heldout)
    with pytest.raises(UserError, match="holdout-fraction"):
        split_capture(cap, holdout_fraction=1.0)
