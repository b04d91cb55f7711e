"""formats/traffic_split.split_traffic: seeded, order-independent, no prompt on both sides, near-duplicates grouped."""

from __future__ import annotations

import random

import pytest

from eagle3_trt.errors import UserError
from eagle3_trt.formats.traffic import CapturedSampling, ServedAcceptance, TrafficRecord
from eagle3_trt.formats.traffic_split import NEAR_DUP_JACCARD, SplitSides, group_prompts, split_traffic


def rec(n: int, ids: list[int], text: str | None = None) -> TrafficRecord:
    return TrafficRecord(
        request_id=f"r{n}",
        time_unix=1_700_000_000.0 + n,
        bundle_fingerprint="f" * 16,
        model="eagle3",
        frontend="triton",
        chat=False,
        prompt_text=text,
        prompt_ids=ids,
        output_ids=[1, 2],
        sampling=CapturedSampling(max_tokens=8),
        acceptance=ServedAcceptance(speculative=True, draft_tokens=3, accepted_draft_tokens=1, target_forwards=2, completion_tokens=2),
    )


def distinct(n: int, rng: random.Random, length: int = 40) -> list[list[int]]:
    return [[rng.randrange(1000) for _ in range(length)] for _ in range(n)]


def prompts_of(rs: list[TrafficRecord]) -> set[tuple[int, ...]]:
    return {tuple(r.prompt_ids) for r in rs}


def test_deterministic_order_independent_and_fraction() -> None:
    rng = random.Random(1)
    rs = [rec(i, ids) for i, ids in enumerate(distinct(400, rng))]
    a = split_traffic(rs, seed=7, holdout_fraction=0.25)
    shuffled = rs[:]
    rng.shuffle(shuffled)
    b = split_traffic(shuffled, seed=7, holdout_fraction=0.25)
    assert [r.request_id for r in a.train] == [r.request_id for r in b.train]
    assert [r.request_id for r in a.heldout] == [r.request_id for r in b.heldout]
    assert len(a.train) + len(a.heldout) == 400 and a.groups == 400 and a.merged == 0
    assert 0.17 < len(a.heldout) / 400 < 0.33  # in expectation 0.25 over 400 independent groups
    assert [r.time_unix for r in a.train] == sorted(r.time_unix for r in a.train)
    c = split_traffic(rs, seed=8, holdout_fraction=0.25)
    assert prompts_of(c.heldout) != prompts_of(a.heldout)  # the seed matters
    # a prompt keeps its side as more traffic arrives
    more = rs + [rec(1000 + i, ids) for i, ids in enumerate(distinct(50, random.Random(2)))]
    d = split_traffic(more, seed=7, holdout_fraction=0.25)
    assert prompts_of(a.heldout) <= prompts_of(d.heldout)


def test_no_prompt_on_both_sides_with_duplicates_and_near_duplicates() -> None:
    rng = random.Random(3)
    base = distinct(60, rng, length=80)
    rs: list[TrafficRecord] = []
    n = 0
    for ids in base:
        for _ in range(3):  # the same prompt asked three times
            rs.append(rec(n, ids))
            n += 1
        near = ids[:]
        near[40] = (near[40] + 1) % 1000  # one token edited: 4 of 77 4-grams differ, Jaccard 73/81 > 0.8
        rs.append(rec(n, near))
        n += 1
    s = split_traffic(rs, seed=0, holdout_fraction=0.3)
    assert prompts_of(s.train).isdisjoint(prompts_of(s.heldout))
    assert s.groups == 60 and s.merged == 240 - 60
    held = prompts_of(s.heldout)
    for ids in base:
        near = ids[:]
        near[40] = (near[40] + 1) % 1000
        assert (tuple(ids) in held) == (tuple(near) in held)


def test_near_duplicate_threshold_and_text_grouping() -> None:
    rng = random.Random(4)
    (ids,) = distinct(1, rng, length=100)
    half = ids[:50] + distinct(1, rng, length=50)[0]  # Jaccard about 47/147 < 0.8
    roots = group_prompts([rec(0, ids), rec(1, half)])
    assert roots[0] != roots[1]
    assert NEAR_DUP_JACCARD == 0.8
    # different token ids, the same text after case and whitespace normalization: one group
    a, b = rec(0, [5, 6, 7], "Write a  Python\nfunction"), rec(1, [8, 9], "write a python function ")
    assert group_prompts([a, b])[0] == group_prompts([a, b])[1]
    # a chain of near-duplicates is one group
    c1 = ids[:]
    c1[30] += 1
    c2 = c1[:]
    c2[70] += 1
    assert len(set(group_prompts([rec(0, ids), rec(1, c1), rec(2, c2)]))) == 1


def test_small_traffic_keeps_both_sides_and_bad_fraction_is_one_line() -> None:
    rs = [rec(i, ids) for i, ids in enumerate(distinct(3, random.Random(5)))]
    s = split_traffic(rs, seed=0, holdout_fraction=0.01)
    assert len(s.heldout) == 1 and len(s.train) == 2
    s = split_traffic(rs, seed=0, holdout_fraction=0.99)
    assert len(s.train) >= 1
    assert split_traffic(rs, holdout_fraction=0.0).heldout == []
    with pytest.raises(UserError, match="holdout-fraction"):
        split_traffic(rs, holdout_fraction=1.0)


def test_growing_traffic_never_moves_a_trained_prompt_to_the_held_back_side() -> None:
    """The grown capture's split starts from the previous one's sides: a trained prompt stays trained, a
    new near-duplicate joins its group's side, so what is held back from the grown capture and was
    already captured was held back before (gate --traffic on a capture that kept growing after
    train-draft --traffic measures no prompt the head was trained on)."""
    rng = random.Random(6)
    base = distinct(120, rng, length=60)
    old = [rec(i, ids) for i, ids in enumerate(base)]
    before = split_traffic(old, seed=3, holdout_fraction=0.3)
    grown = list(old)
    near_of: dict[tuple[int, ...], tuple[int, ...]] = {}
    for i, ids in enumerate(base):  # a near-duplicate of every old prompt, and some new prompts
        near = ids[:]
        near[30] = (near[30] + 7) % 1000
        grown.append(rec(1000 + i, near))
        near_of[tuple(near)] = tuple(ids)
    grown += [rec(2000 + i, ids) for i, ids in enumerate(distinct(40, random.Random(7), length=60))]
    after = split_traffic(grown, seed=3, holdout_fraction=0.3, previous=before.sides)
    old_prompts = prompts_of(old)
    assert prompts_of(after.heldout) & old_prompts == prompts_of(before.heldout)
    assert prompts_of(after.train) & old_prompts == prompts_of(before.train)
    assert all(near_of[p] in prompts_of(before.heldout) for p in prompts_of(after.heldout) if p in near_of)
    assert 0.2 <= len(after.heldout) / len(grown) <= 0.4  # the new groups fill the held-back side to the share
    # the record survives a round trip, and without it a fresh split may well hold back trained prompts
    assert after.sides is not None and SplitSides.model_validate_json(after.sides.to_json()) == after.sides
    fresh = split_traffic(grown, seed=3, holdout_fraction=0.3)
    assert prompts_of(fresh.heldout) & prompts_of(before.train)


def test_merging_a_held_back_group_with_a_trained_one_goes_to_the_training_side() -> None:
    rng = random.Random(8)
    base = distinct(60, rng, length=40)
    before = split_traffic([rec(i, ids) for i, ids in enumerate(base)], seed=1, holdout_fraction=0.3)
    h, t = sorted(prompts_of(before.heldout))[0], sorted(prompts_of(before.train))[0]
    bridge = rec(500, list(h), text="one text")  # the same normalized text joins the two groups
    other = rec(501, list(t), text="  ONE   text ")
    after = split_traffic(list(before.train) + list(before.heldout) + [bridge, other], seed=1, holdout_fraction=0.3, previous=before.sides)
    assert h in prompts_of(after.train) and t in prompts_of(after.train)
    assert prompts_of(after.heldout) <= prompts_of(before.heldout)
    assert after.sides is not None
    trained, held = after.sides.keys()
    assert not trained & held


def templated(n: int, rng: random.Random, templates: int = 60) -> list[list[int]]:
    """Prompts filled into templates of Zipf-like popularity (benchmarks/bench_traffic_split.py's kind)."""
    bodies = distinct(templates, rng, length=62)
    picks = rng.choices(range(templates), weights=[1 / (k + 1) for k in range(templates)], k=n)
    return [bodies[t][:30] + [rng.randrange(1000), rng.randrange(1000)] + bodies[t][30:] for t in picks]


@pytest.mark.parametrize("fraction", [0.1, 0.2, 0.5])
def test_held_back_share_holds_on_templated_traffic(fraction: float) -> None:
    """Each template is one near-duplicate group of many distinct prompts: the held-back share of the
    records stays at the requested fraction (it fell to 0.2**m per group of m prompts when a group was
    held back only if all its prompts hashed so)."""
    rs = [rec(i, ids) for i, ids in enumerate(templated(1500, random.Random(9)))]
    s = split_traffic(rs, seed=0, holdout_fraction=fraction)
    assert s.groups <= 60 and s.merged > 1400
    assert abs(len(s.heldout) / len(rs) - fraction) <= 0.05
