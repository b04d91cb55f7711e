"""Statistics over captured traffic count distinct prompts: a prompt sent twice is one unit for the
gate's minimum and for its bootstrap (core/paired_ci.py's cluster bootstrap, measure/traffic_gate.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3_trt.cli import main
from eagle3_trt.core.paired_ci import paired_ratio_diff
from eagle3_trt.formats.traffic import read_traffic
from eagle3_trt.formats.traffic_split import split_traffic
from eagle3_trt.testing.id_capture import write_id_capture

# 13 requests: tokens and target forwards of NEW and OLD on each
NEW_T = [30, 22, 41, 18, 25, 33, 27, 19, 40, 21, 35, 24, 29]
NEW_F = [12, 11, 14, 10, 11, 12, 13, 10, 15, 11, 12, 12, 12]
OLD_T = [30, 22, 41, 18, 25, 33, 27, 19, 40, 21, 35, 24, 29]
OLD_F = [14, 11, 16, 10, 13, 13, 13, 11, 15, 12, 14, 12, 13]


def test_a_prompt_sent_twice_is_one_unit_of_the_bootstrap():
    single = paired_ratio_diff(NEW_T, NEW_F, OLD_T, OLD_F, seed=3)
    twice = (
        [x for x in NEW_T for _ in range(2)],
        [x for x in NEW_F for _ in range(2)],
        [x for x in OLD_T for _ in range(2)],
        [x for x in OLD_F for _ in range(2)],
    )
    labels = [i for i in range(13) for _ in range(2)]
    clustered = paired_ratio_diff(*twice, seed=3, groups=labels)
    # each group's sums are its two copies': ratios, resample draws and so the interval are the 13 prompts' own
    assert (clustered.lo, clustered.hi, clustered.diff) == pytest.approx((single.lo, single.hi, single.diff))
    assert (clustered.n, clustered.n_groups, single.n_groups) == (26, 13, 13)
    naive = paired_ratio_diff(*twice, seed=3)  # copies resampled as independent requests: too narrow
    assert naive.hi - naive.lo < 0.85 * (single.hi - single.lo)
    with pytest.raises(ValueError, match="one label per request"):
        paired_ratio_diff(NEW_T, NEW_F, OLD_T, OLD_F, groups=[0, 1])


def _capture(dirpath: Path, fingerprint: str, prompts: list[list[int]]) -> Path:
    write_id_capture(dirpath, prompts, fingerprint=fingerprint, segment_records=8, time0=1e9).flush()
    return dirpath


def test_gate_refuses_thirteen_prompts_sent_twice(fp8_bundle, tmp_path, capsys):
    fp = json.loads((fp8_bundle / "manifest.json").read_text())["fingerprint"]
    distinct = [[5 + i, 6 + 2 * i, 7 + 3 * i, 11 + i, 13, 17 + i, 40 + 5 * i] for i in range(13)]
    cap = _capture(tmp_path / "cap", fp, [p for p in distinct for _ in range(2)])
    held = split_traffic(read_traffic(cap), seed=0, holdout_fraction=0.99).heldout
    n_prompts = len({tuple(r.prompt_ids) for r in held})
    assert len(held) == 2 * n_prompts >= 24  # nearly every prompt held back, each with both its copies
    rc = main(["gate", str(fp8_bundle), "--against", str(fp8_bundle), "--traffic", str(cap), "--holdout-fraction", "0.99", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"the held-back split has {len(held)} requests from {n_prompts} distinct prompts" in err and "at least 20 distinct prompts" in err
    assert len(err.strip().splitlines()) == 1
    assert "hint: capture traffic with more distinct prompts or raise --holdout-fraction" in err  # NEW has no lineage: gate's own option


def test_too_few_held_back_prompts_on_a_retrained_head_names_the_option_that_sets_the_split(tmp_path):
    """NEW's manifest lineage fixes the split (gate --holdout-fraction may not change it), so the hint
    names the command whose option does: train-draft --traffic --holdout-fraction."""
    from eagle3_trt.errors import UserError
    from eagle3_trt.measure.traffic_gate import heldout_records

    cap = _capture(tmp_path / "cap", "f" * 64, [[5 + i, 6, 7 + i] for i in range(10)])
    with pytest.raises(UserError) as e:
        heldout_records(read_traffic(cap), 0, 0.5, cap, from_lineage=True)
    assert "train-draft --traffic ... --holdout-fraction" in e.value.line() and "raise --holdout-fraction" not in e.value.line()
