"""The speculation cost model: its simple special case, monotonic behaviour, and the recommendation.

Expected numbers are derived by hand in the comments from the model's definition (module
docstring of eagle3_trt.measure.cost_model), not by calling the code under test.
"""

from __future__ import annotations

import dataclasses

import pytest

from eagle3_trt.errors import UserError
from eagle3_trt.measure.cost_model import (
    CostParams,
    acceptance_gate,
    break_even_alpha,
    draft_len_schedule,
    expected_tokens,
    model_cost,
    predict,
    recommend,
    simple_speedup,
)
from eagle3_trt.pipeline.gpus import get_gpu

# memory-bound, no fixed costs, no KV: the regime of the simple formula
PURE = CostParams(target_step_overhead_us=0.0, draft_step_overhead_us=0.0)


def _infinite_compute(name: str):
    g = get_gpu(name)
    return dataclasses.replace(g, bf16_tflops=1e12, fp8_tflops=1e12, fp4_tflops=1e12)


def test_expected_tokens_is_one_plus_k_alpha():
    c = [0.8, 0.6, 0.3]
    assert expected_tokens(c, 3) == pytest.approx(2.7)  # 1 + 0.8 + 0.6 + 0.3
    # alpha over K positions = mean cumulative acceptance = (2.7 - 1) / 3
    assert (expected_tokens(c, 3) - 1) / 3 == pytest.approx(1.7 / 3)


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("alpha", [0.1, 0.55, 0.9])
def test_simple_form_is_a_special_case(k, alpha):
    gpu = _infinite_compute("h100")
    target_bytes, draft_bytes = 16e9, 0.8e9
    t = model_cost(target_bytes, "bf16", gpu, 1)
    d = model_cost(draft_bytes, "bf16", gpu, 1)
    c = [alpha] * k  # any cumulative list with mean alpha gives the same E_K
    pred = predict(c, gpu, t, d, tp=1, batch=1, k=k, params=PURE)
    overhead = k * draft_bytes / target_bytes  # K draft passes, each reading the draft's weights once
    assert pred.overhead == pytest.approx(overhead)
    assert pred.speedup == pytest.approx(simple_speedup(alpha, k, overhead))
    assert pred.speedup == pytest.approx((1 + k * alpha) / (1 + k * 0.05))


def test_break_even_alpha_gives_speedup_one():
    gpu = _infinite_compute("b200")
    t, d = model_cost(70e9, "fp8", gpu, 1), model_cost(2.8e9, "bf16", gpu, 1)
    for k in (1, 3, 5):
        overhead = k * 2.8e9 / 70e9
        a = break_even_alpha(k, overhead)
        assert a == pytest.approx(0.04)  # overhead / K = draft/target bytes ratio here
        assert predict([a] * k, gpu, t, d, 1, 1, k, PURE).speedup == pytest.approx(1.0)
        assert predict([a + 0.01] * k, gpu, t, d, 1, 1, k, PURE).speedup > 1
        assert predict([a - 0.01] * k, gpu, t, d, 1, 1, k, PURE).speedup < 1


def test_fixed_overheads_raise_break_even():
    gpu = get_gpu("h100")
    t, d = model_cost(1e6, "bf16", gpu, 1), model_cost(0.2e6, "bf16", gpu, 1)  # launch-bound tiny models
    p = predict([0.0], gpu, t, d, 1, 1, 1)
    # target 30 us + 1 MB / 2.68 TB/s; spec adds a 10 us draft step: overhead ~ 10/30.4
    assert 0.3 < p.overhead < 0.35 and p.speedup < 1


def test_speedup_falls_with_batch_and_compute_bound_verification():
    gpu = get_gpu("h100")
    c = [0.8, 0.6, 0.45]
    t = model_cost(16e9, "bf16", gpu, 1, kv_bytes_per_token=128 * 1024, layers=32, hidden=4096)
    d = model_cost(0.85e9, "bf16", gpu, 1, kv_bytes_per_token=4096)
    short = CostParams(context_len=128)
    s = [predict(c, gpu, t, d, 1, b, 3, short).speedup for b in (1, 8, 64, 256, 1024)]
    # flat while memory-bound (KV reads grow base and speculative steps alike), then falling
    assert abs(s[1] - s[0]) < 0.01 * s[0] and all(x > y for x, y in zip(s[1:], s[2:])), s
    assert s[0] > 2 and s[-1] < 1
    # 4 tokens per sequence * 1024 sequences * 2 * 8e9 params is far past H100's ridge point
    assert predict(c, gpu, t, d, 1, 1024, 3, short).bound == "compute"
    assert predict(c, gpu, t, d, 1, 1, 3, short).bound == "memory"
    # long contexts keep decode KV-bandwidth-bound, so speculation pays to larger batches
    long = CostParams(context_len=4096)
    assert predict(c, gpu, t, d, 1, 256, 3, long).speedup > predict(c, gpu, t, d, 1, 256, 3, short).speedup


def test_recommendation_k_and_concurrency():
    gpu = get_gpu("h100")
    good, poor = [0.85, 0.7, 0.58, 0.48, 0.4], [0.35, 0.1, 0.03, 0.01, 0.0]
    kw = dict(target_format="fp8", target_kv_bytes_per_token=160 * 1024, draft_kv_bytes_per_token=4096, target_layers=80, hidden=8192)
    r_good = recommend(good, gpu, 72.7e9, 2.8e9, 1, **kw)
    r_poor = recommend(poor, gpu, 72.7e9, 2.8e9, 1, **kw)
    # good: going from K=4 to 5 adds c_5 = 0.4 tokens (+11% on E_4 = 3.61) for one more draft pass
    # (2.8/72.7 ~ 4% of a target pass): the largest measured K wins.
    # poor: K=2 adds 0.1 tokens (+7% on 1.35) for ~4% more time; K=3 adds 0.03 (+2%): K=2.
    assert (r_good.max_draft_len, r_poor.max_draft_len) == (5, 2)
    # a better draft keeps paying to larger batches, and both pay at batch 1
    assert r_good.max_concurrency > r_poor.max_concurrency > 0
    # K maximizes the predicted speedup at batch 1 among the table's rows
    rows1 = [r for r in r_good.table if r["batch"] == 1]
    assert max(rows1, key=lambda r: r["speedup"])["k"] == r_good.max_draft_len
    # the crossover: pays at max_concurrency, not one above
    t = model_cost(72.7e9, "fp8", gpu, 1, kv_bytes_per_token=160 * 1024, layers=80, hidden=8192)
    d = model_cost(2.8e9, "bf16", gpu, 1, kv_bytes_per_token=4096)
    mc, k = r_good.max_concurrency, r_good.max_draft_len
    if not r_good.evidence["max_concurrency_is_lower_bound"]:
        assert predict(good, gpu, t, d, 1, mc, k).speedup >= 1 > predict(good, gpu, t, d, 1, mc + 1, k).speedup
    assert r_good.evidence["alpha_by_k"][1] == pytest.approx(0.85)
    assert set(r_good.to_dict()) == {"max_draft_len", "max_concurrency", "cumulative_acceptance", "table", "evidence"}
    assert r_good.cumulative_acceptance == good


def test_recommendation_chooses_among_every_swept_k():
    """With an alpha --sweep, K may be any measured K, each predicted from its own measurement."""
    gpu = get_gpu("h100")
    kw = dict(target_format="fp8", target_kv_bytes_per_token=160 * 1024, draft_kv_bytes_per_token=4096, target_layers=80, hidden=8192)
    run = [0.85, 0.7, 0.58]  # the run's K = 3
    # the sweep measured K = 1, 3 and 5; the K = 5 chain keeps paying (see the test above: K=5 wins)
    sweep = {1: [0.84], 3: run, 5: [0.85, 0.7, 0.58, 0.48, 0.4]}
    only_run = recommend(run, gpu, 72.7e9, 2.8e9, 1, **kw)
    swept = recommend(run, gpu, 72.7e9, 2.8e9, 1, measured_by_k=sweep, **kw)
    assert only_run.max_draft_len == 3 and {r["k"] for r in only_run.table} == {1, 2, 3}
    assert swept.max_draft_len == 5 and {r["k"] for r in swept.table} == {1, 2, 3, 4, 5}
    assert swept.cumulative_acceptance == sweep[5] and swept.evidence["measured_k"] == [1, 3, 5]
    # K=1 is predicted from its own measurement (E_1 = 1.84), K=4 from K=5's first four positions
    assert swept.evidence["expected_tokens_by_k"][1] == pytest.approx(1.84)
    assert swept.evidence["expected_tokens_by_k"][4] == pytest.approx(1 + 0.85 + 0.7 + 0.58 + 0.48)
    # a cap within the measured range; one beyond it is a one-line error naming the fix
    assert recommend(run, gpu, 72.7e9, 2.8e9, 1, measured_by_k=sweep, max_k=4, **kw).max_draft_len == 4
    with pytest.raises(UserError, match=r"K=6 was not measured \(largest measured K: 5\).*--sweep 1-6"):
        recommend(run, gpu, 72.7e9, 2.8e9, 1, measured_by_k=sweep, max_k=6, **kw)
    with pytest.raises(UserError, match="K=5"):
        recommend(run, gpu, 72.7e9, 2.8e9, 1, measured_by_k={5: [0.5, 0.6]}, **kw)  # not non-increasing


def test_never_pays_gives_zero_concurrency():
    gpu = get_gpu("h100")
    r = recommend([0.01, 0.0], gpu, 1e6, 0.5e6, 1, target_format="bf16")  # tiny model, useless draft
    assert r.max_concurrency == 0 and not r.speculation_pays
    assert r.evidence["speedup_at_batch_1"] < 1


def test_tp_splits_weights_and_adds_allreduce():
    gpu = get_gpu("h200")
    c = [0.7, 0.5]
    r1 = recommend(c, gpu, 141e9, 2.8e9, 1, target_format="bf16", target_layers=80, hidden=8192)
    r8 = recommend(c, gpu, 141e9, 2.8e9, 8, target_format="bf16", target_layers=80, hidden=8192)
    base1 = next(r for r in r1.table if r["batch"] == 1 and r["k"] == 1)["t_base_us"]
    base8 = next(r for r in r8.table if r["batch"] == 1 and r["k"] == 1)["t_base_us"]
    assert base8 < base1 / 4  # weights split 8 ways, plus all-reduce latency


def test_rejects_bad_inputs():
    gpu = get_gpu("h100")
    with pytest.raises(UserError, match="non-increasing"):
        recommend([0.3, 0.5], gpu, 1e9, 1e8)
    with pytest.raises(UserError, match="no per-position"):
        recommend([], gpu, 1e9, 1e8)
    with pytest.raises(UserError, match="unknown GPU"):
        recommend([0.5], "v100", 1e9, 1e8)
    with pytest.raises(UserError, match="measured for 1"):
        expected_tokens([0.5], 2)


# ---- mixture of experts (gpt-oss): a verification forward touches more experts than a decode step -------
def test_moe_verification_reads_the_experts_its_tokens_route_to():
    """gpt-oss-120b at TP1 (whole-model figures), memory-bound with no fixed costs: a forward over n tokens
    reads the dense part plus E * (1 - (1 - a/E)^n) of the 128 experts, by hand."""
    from eagle3_trt.measure.cost_model import forward_time_s
    from eagle3_trt.pipeline.model_size import count_target, moe_cost_inputs, parse_shape, read_config
    from eagle3_trt.pipeline.presets import PRESET_DIR

    cfg = read_config(PRESET_DIR.parent / "model_configs" / "gpt-oss-120b" / "target" / "config.json")
    s = parse_shape(cfg)
    moe = moe_cost_inputs(s, "mxfp4")
    per_expert_weights = 3 * 2880 * 2880  # gate_up [2I, H] + down [H, I]
    assert moe["experts"] == 128 and moe["active_experts"] == 4
    assert moe["expert_params"] == 36 * 128 * per_expert_weights
    assert moe["expert_bytes"] == pytest.approx(moe["expert_params"] * (0.5 + 1 / 32))
    gpu = _infinite_compute("h100")
    dense_bytes = 5e9  # attention, router, embeddings, lm_head (BF16), whatever the exact figure
    total = dense_bytes + moe["expert_bytes"]
    m = model_cost(total, "mxfp4", gpu, 1, params=count_target(s).total, moe=moe)
    t1, _ = forward_time_s(m, gpu, 1, 0, 1, PURE, 0.0)
    t4, _ = forward_time_s(m, gpu, 4, 0, 1, PURE, 0.0)
    f1, f4 = 4 / 128, 1 - (124 / 128) ** 4  # 3.1 % and 11.9 % of the experts
    assert t4 / t1 == pytest.approx((dense_bytes + moe["expert_bytes"] * f4) / (dense_bytes + moe["expert_bytes"] * f1))
    # (5 + 60.9 GB x 0.119) / (5 + 60.9 GB x 0.031) = 1.78; a dense model of the same bytes: 1.0 (read once either way)
    assert 1.7 < t4 / t1 < 1.9
    # hence speculation buys less on the MoE target than on a dense model of the same bytes, same acceptance
    c = [0.8, 0.6, 0.45]
    dense = recommend(c, gpu, total, 1.2e9, 1, target_format="mxfp4", draft_format="bf16", params=PURE)
    sparse = recommend(
        c, gpu, total, 1.2e9, 1, target_format="mxfp4", draft_format="bf16", params=PURE, target_params=float(count_target(s).total), target_moe=moe
    )
    assert sparse.evidence["speedup_at_batch_1"] < dense.evidence["speedup_at_batch_1"]
    assert sparse.evidence["target"]["moe"]["experts"] == 128


def test_mxfp4_runs_at_bf16_rate_on_hopper_and_fp8_rate_on_blackwell():
    from eagle3_trt.measure.cost_model import peak_tflops

    assert peak_tflops(get_gpu("h100"), "mxfp4") == get_gpu("h100").bf16_tflops
    assert peak_tflops(get_gpu("b200"), "mxfp4") == get_gpu("b200").fp8_tflops


def test_draft_len_schedule_falls_with_batch_and_stops_at_max_concurrency():
    gpu = get_gpu("h100")
    good = [0.85, 0.7, 0.58, 0.48, 0.4]
    kw = dict(target_format="fp8", target_kv_bytes_per_token=160 * 1024, draft_kv_bytes_per_token=4096, target_layers=80, hidden=8192)
    r = recommend(good, gpu, 72.7e9, 2.8e9, 1, **kw)
    sched = draft_len_schedule(r)
    ks = [sched[b] for b in sorted(sched)]
    assert sched[1] == r.max_draft_len and max(sched) == r.max_concurrency and ks == sorted(ks, reverse=True)
    # at each grid batch size below max_concurrency: the best K there (capped at K, running minimum)
    for b in sorted(sched)[:-1]:
        best = max((row for row in r.table if row["batch"] == b), key=lambda row: (row["speedup"], -row["k"]))["k"]
        assert sched[b] <= min(best, r.max_draft_len) or b == 1
    assert len(set(ks)) > 1, "on this target K should fall with batch; the test needs a falling schedule"
    # a grid where the best K rises with batch (noise) still gives a non-increasing schedule
    fell = min(b for b in sched if sched[b] < r.max_draft_len)
    later = min(b for b in sched if b > fell)
    rows = [dict(row) for row in r.table]
    for row in rows:
        if row["batch"] == later:
            row["speedup"] = 9.0 if row["k"] == r.max_draft_len else 0.5
    noisy = draft_len_schedule(dataclasses.replace(r, table=rows))
    assert noisy[later] == noisy[fell] < r.max_draft_len


def test_acceptance_gate_is_the_break_even_acceptance():
    gpu = get_gpu("h100")
    r = recommend([0.85, 0.7, 0.58, 0.48, 0.4], gpu, 72.7e9, 2.8e9, 1, concurrency=4, target_format="fp8", target_layers=80, hidden=8192)
    thr, how = acceptance_gate(r)
    row = next(x for x in r.table if x["batch"] == 4 and x["k"] == r.max_draft_len)
    assert thr == pytest.approx(break_even_alpha(r.max_draft_len, row["overhead"]), abs=1e-4) and how["batch"] == 4
    # at the threshold the simple form breaks even: (1 + K * thr) / (1 + overhead) = 1
    assert simple_speedup(thr, r.max_draft_len, row["overhead"]) == pytest.approx(1.0, abs=1e-3)
    assert 0 < thr < row["alpha"]
