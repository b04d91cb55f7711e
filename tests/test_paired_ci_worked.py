"""core/paired_ci.py on an example worked by hand (alpha --against's paired intervals rest on it).

Two prompts, each measured by bundle A and bundle B:

    prompt 0: A 4 tokens / 2 forwards, B 2 / 2      (AL 2.0 vs 1.0)
    prompt 1: A 3 tokens / 3 forwards, B 3 / 3      (AL 1.0 vs 1.0)

Pooled: AL_A = 7/5 = 1.4, AL_B = 5/5 = 1.0, difference 0.4. A bootstrap resample draws two prompts
with replacement, so it is one of {0,0} (difference 8/4 - 4/4 = 1.0, probability 1/4), {1,1}
(6/6 - 6/6 = 0.0, 1/4) or a mix (7/5 - 5/5 = 0.4, 1/2): with thousands of resamples the 2.5 % and
97.5 % quantiles are the two extremes, 0.0 and 1.0.
"""

from __future__ import annotations

import pytest

from eagle3_trt.core.paired_ci import paired_ratio_diff

TOK_A, FWD_A = [4, 3], [2, 3]
TOK_B, FWD_B = [2, 3], [2, 3]


def test_the_hand_worked_interval():
    d = paired_ratio_diff(TOK_A, FWD_A, TOK_B, FWD_B)
    assert (d.a, d.b) == pytest.approx((1.4, 1.0))
    assert d.diff == pytest.approx(0.4)
    assert (d.lo, d.hi) == pytest.approx((0.0, 1.0))
    assert d.n == 2 and d.n_groups == 2 and d.level == 0.95


def test_a_transform_maps_each_side_before_the_difference():
    """f_a(AL) = 2 AL, f_b(AL) = AL + 1: point 2.8 - 2.0 = 0.8; resamples {0,0}: 4 - 2 = 2, {1,1}: 2 - 2 = 0."""
    d = paired_ratio_diff(TOK_A, FWD_A, TOK_B, FWD_B, transform_a=lambda x: 2 * x, transform_b=lambda x: x + 1)
    assert (d.a, d.b, d.diff) == pytest.approx((2.8, 2.0, 0.8))
    assert (d.lo, d.hi) == pytest.approx((0.0, 2.0))


def test_grouped_turns_move_together():
    """Both requests in one group: every resample is the whole set, so the interval is the point."""
    d = paired_ratio_diff(TOK_A, FWD_A, TOK_B, FWD_B, groups=["p", "p"])
    assert d.n_groups == 1 and (d.lo, d.diff, d.hi) == pytest.approx((0.4, 0.4, 0.4))


def test_identical_measurements_give_zero_width():
    d = paired_ratio_diff(TOK_A, FWD_A, TOK_A, FWD_A)
    assert (d.lo, d.diff, d.hi) == (0.0, 0.0, 0.0)
