"""Per-request statistics are consistent with what the runtime emitted.

Runs the reference runtime on an in-memory random pair with a 16-token vocabulary (a random draft
there is accepted often enough to exercise every counter), greedy and sampled, chain and tree,
batch 1 and batched, and checks the accounting identities; plus the arithmetic of aggregation.
"""

from __future__ import annotations

import pytest

from eagle3_trt.core.engine import SamplingParams
from eagle3_trt.core.stats import RequestStats, aggregate
from eagle3_trt.testing.toy_pair import toy_engine


@pytest.fixture(scope="module")
def eng():
    _, e = toy_engine(16, 12, max_draft_len=3, seed=3)
    return e


PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10, 11], [2]]


def _check(res, k_max: int, stop_ids=()):
    for r in res:
        s = r.stats
        assert len(r.token_ids) == s.generated_tokens
        assert 0 <= s.accepted_tokens <= s.draft_tokens
        assert s.acceptance_length == pytest.approx(s.generated_tokens / s.target_forwards)
        assert s.acceptance_rate == (s.accepted_tokens / s.draft_tokens if s.draft_tokens else 0.0)
        assert sum(s.drafted_per_position) == s.draft_tokens
        assert sum(s.accepted_per_position) == s.accepted_tokens
        assert len(s.drafted_per_position) <= k_max
        assert len(s.accepted_per_position) == len(s.reached_per_position) == len(s.drafted_per_position)
        for k in range(len(s.drafted_per_position)):
            assert s.accepted_per_position[k] <= s.reached_per_position[k] <= s.drafted_per_position[k]
            if k:
                assert s.drafted_per_position[k] <= s.drafted_per_position[k - 1]
                assert s.accepted_per_position[k] <= s.accepted_per_position[k - 1]
                # reaching position k means positions 0..k-1 were accepted
                assert s.reached_per_position[k] <= s.accepted_per_position[k - 1]
        # every target forward emits its accepted drafts plus one token, except a final run
        # that ends on an accepted stop token (no bonus token after it)
        ends_in_accepted_stop = r.finish_reason == "stop" and s.generated_tokens == s.target_forwards + s.accepted_tokens - 1
        assert s.generated_tokens == s.target_forwards + s.accepted_tokens or ends_in_accepted_stop
        # accept_hist counts the iterations that drafted something, by number accepted
        assert sum(s.accept_hist) == (s.drafted_per_position[0] if s.drafted_per_position else 0)
        assert sum(a * n for a, n in enumerate(s.accept_hist)) == s.accepted_tokens
        assert sum(s.accept_hist) <= s.target_forwards - 1


@pytest.mark.parametrize(
    "temperature,tree", [(0.0, None), (1.0, None), (0.0, [(0,), (1,), (0, 0), (1, 0), (0, 0, 0)])], ids=["greedy-chain", "sampled-chain", "greedy-tree"]
)
def test_stats_identities(eng, temperature, tree):
    params = SamplingParams(max_tokens=20, temperature=temperature, seed=0)
    batched = eng.generate(PROMPTS, params, tree=tree)
    single = [eng.generate([p], params, tree=tree)[0] for p in PROMPTS]
    _check(batched, 3)
    _check(single, 3)
    assert sum(r.stats.accepted_tokens for r in batched) > 0
    if temperature == 0:
        assert [r.token_ids for r in batched] == [r.token_ids for r in single]
        assert [r.stats.accepted_per_position for r in batched] == [r.stats.accepted_per_position for r in single]


def test_stats_with_stop_tokens(eng):
    res = eng.generate(PROMPTS, SamplingParams(max_tokens=30, temperature=1.0, seed=1, stop_token_ids=(5, 9)))
    _check(res, 3)
    assert any(r.finish_reason == "stop" for r in res)
    for r in res:
        if r.finish_reason == "stop":
            assert r.token_ids[-1] in (5, 9) and not set(r.token_ids[:-1]) & {5, 9}


def test_k0_stats(eng):
    res = eng.generate(PROMPTS, SamplingParams(max_tokens=10), speculate=False)
    for r in res:
        s = r.stats
        assert not s.speculation and s.draft_tokens == 0 and s.accepted_tokens == 0
        assert s.target_forwards == s.generated_tokens == 10 and s.acceptance_length == 1.0
        assert s.drafted_per_position == [] and s.acceptance_rate == 0.0


def test_record_iteration_and_aggregate():
    a = RequestStats()
    a.target_forwards, a.generated_tokens = 1, 1
    for drafted, accepted in ((3, 3), (3, 1), (3, 0), (2, 2)):
        reached = min(accepted + 1, drafted)
        a.record_iteration(drafted, reached, accepted)
        a.target_forwards += 1
        a.generated_tokens += accepted + 1
    assert a.drafted_per_position == [4, 4, 3]
    assert a.reached_per_position == [4, 3, 1]
    assert a.accepted_per_position == [3, 2, 1]
    assert a.accept_hist == [1, 1, 1, 1]
    assert (a.draft_tokens, a.accepted_tokens) == (11, 6)
    assert a.acceptance_length == 11 / 5
    b = RequestStats()
    b.record_iteration(1, 1, 1)
    assert b.accepted_per_position == [1]
    agg = aggregate([a, b])
    assert agg.drafted_per_position == [5, 4, 3] and agg.accepted_per_position == [4, 2, 1]
    assert agg.alpha == 7 / 12
    assert agg.conditional_acceptance == [4 / 5, 2 / 3, 1 / 1]
    # P(first k+1 accepted) as the product of the conditionals: the iterations cut short by the
    # end of the request (drafted < 3) still count for the positions they reached
    assert agg.cumulative_acceptance == pytest.approx([4 / 5, 4 / 5 * 2 / 3, 4 / 5 * 2 / 3])
    full = aggregate([a])  # without b; a's last iteration drafted only 2
    assert full.cumulative_acceptance == pytest.approx([3 / 4, 3 / 4 * 2 / 3, 3 / 4 * 2 / 3 * 1 / 1])
    with pytest.raises(AssertionError):
        a.record_iteration(2, 1, 2)  # accepted more than were offered


def test_cumulative_acceptance_equals_the_plain_ratio_when_every_iteration_drafts_k():
    s = RequestStats()
    for accepted in (3, 1, 0, 2, 3, 0):
        s.record_iteration(3, min(accepted + 1, 3), accepted)
    ratio = [a / d for a, d in zip(s.accepted_per_position, s.drafted_per_position)]
    assert aggregate([s]).cumulative_acceptance == pytest.approx(ratio)
