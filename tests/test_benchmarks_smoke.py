"""Every benchmark in benchmarks/ runs, at its smallest size, so none can rot unnoticed (issue 31:
benchmarks/bench_engine.py had failed at once for weeks, its random pair refused by the build's
behaviour check, and nothing said so).

Each script runs as a user runs it: ``python benchmarks/X.py ...`` in a subprocess from the
repository root, with the build's behaviour checks ON (conftest turns them off for the suite's
random pairs; a user has them on) and one torch thread. The test checks the exit status and the
figure or verdict line each benchmark exists to print, not the timings (a shared CPU). A new
benchmark fails ``test_every_benchmark_has_a_smoke_run`` until it gets an entry in ``SMOKE``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"

# script -> the run the suite makes (its smallest options); the tests below hold one per script
SMOKE: dict[str, str] = {
    "bench_alpha_estimator.py": "--prompts 2 --max-tokens 8 --sets short --sweep 1,2 --batch-size 2",
    "bench_runtime_speed.py": "--shape embedded --prompts 2 --max-tokens 8 --repeats 1",
    "bench_large_checkpoint.py": "--size-gb 0.01 --shard-gb 0.004 --out-shard-gb 0.005 --json",
    "bench_engine.py": "--smoke",
    "bench_capture_overhead.py": "--rounds 1 --max-tokens 4 --json",  # + --bundle
    "bench_capture_scale.py": "--smoke --json",
    "bench_hs_convert_memory.py": "--smoke --json",
    "bench_traffic_split.py": "--sizes 200 --json",
    "bench_serving_overhead.py": "--rounds 7 --rounds-high 1 --concurrency 1 --max-tokens 4 --speculate on --json",  # + --bundle
    "compare_aiperf.py": "--concurrency 1 --requests 2 --num-prompts 2 --max-tokens 4 --rounds 1",  # + --bundle
}


def run_bench(name: str, *extra: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "EAGLE3_TRT_SKIP_BEHAVIOUR_CHECKS"} | {"OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, str(BENCH / name), *SMOKE[name].split(), *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{name} exited {p.returncode}\n--- stdout\n{p.stdout[-3000:]}\n--- stderr\n{p.stderr[-3000:]}"
    return p


def _last_json(stdout: str) -> dict:
    """The JSON object a --json run prints (the last top-level one: some print progress lines first)."""
    start = stdout.rindex("\n{\n") + 1 if "\n{\n" in stdout else stdout.index("{")
    return json.loads(stdout[start : stdout.rindex("}") + 1])


def test_every_benchmark_has_a_smoke_run():
    scripts = sorted(p.name for p in BENCH.glob("*.py"))
    assert scripts == sorted(SMOKE), f"benchmarks without a smoke run (add them to SMOKE and a test): {sorted(set(scripts) - set(SMOKE))}"
    tests = {n for n in globals() if n.startswith("test_")}
    for script in SMOKE:
        assert f"test_{script.removesuffix('.py')}_smoke" in tests, script


def test_bench_alpha_estimator_smoke():
    out = run_bench("bench_alpha_estimator.py").stdout
    # the estimator's counts equal speculative generation's, at every K of the sweep (the script exits 1 otherwise)
    assert "acceptance counts identical at every K: True" in out, out[-2000:]


def test_bench_runtime_speed_smoke():
    out = run_bench("bench_runtime_speed.py").stdout
    m = re.search(r"alpha ([\d.]+)\s+AL ([\d.]+) tokens/target forward", out)
    assert m and 0 <= float(m.group(1)) <= 1 and 1 <= float(m.group(2)) <= 4, out[-2000:]  # K=3: AL in [1, K+1]
    assert re.search(r"speedup [\d.]+x", out), out[-2000:]


def test_bench_large_checkpoint_smoke():
    rep = _last_json(run_bench("bench_large_checkpoint.py").stdout)
    phases = rep["phases"] if isinstance(rep, dict) and "phases" in rep else rep
    assert phases and all(ph["within_goal"] for ph in phases), phases


def test_bench_engine_smoke():
    """The random pair builds (the benchmark passes --skip-behaviour-checks: the build refuses random
    weights, and the raw ModelOpt side checks nothing) and both sides are timed."""
    out = run_bench("bench_engine.py", timeout=900).stdout
    rep = _last_json(out[: out.rindex("\nengine ")])
    assert rep["model"]["pair"] == "random" and rep["eagle3_trt_engine"]["wall_s"] > 0 and rep["raw_modelopt"]["wall_s"] > 0, rep
    assert re.search(r"-> time x[\d.]+ \(goal <= 1\.10\), memory x[\d.]+ \(goal <= 1\.2\)", out), out[-1000:]


@pytest.mark.needs("tritonserver", "tritonclient")
def test_bench_capture_overhead_smoke(fp8_bundle):
    rep = _last_json(run_bench("bench_capture_overhead.py", "--bundle", str(fp8_bundle)).stdout)
    # every request the capturing server served was recorded
    assert rep["records_written"] == rep["requests_sent_to_capturing_server"] > 0, rep
    assert rep["off_latency_ms_median"] > 0 and rep["on_latency_ms_median"] > 0, rep


def test_bench_capture_scale_smoke():
    rep = _last_json(run_bench("bench_capture_scale.py").stdout)
    # every step read or wrote every record, each with a rate and a peak RSS
    assert [(r["step"], r["records"]) for r in rep["rows"]] == [(s, 300) for s in ("write", "stream", "alpha-read", "split", "list")], rep
    split = rep["rows"][3]  # train-draft/gate --traffic's read: every record on one side, repeated prompts grouped
    assert split["train"] + split["heldout"] == 300 and split["heldout"] > 0 and split["prompt_groups"] < 300, split
    assert all(r["records_per_s"] > 0 and r["peak_rss_mb"] >= r["rss_after_imports_mb"] > 0 for r in rep["rows"]), rep


def test_bench_hs_convert_memory_smoke():
    rep = _last_json(run_bench("bench_hs_convert_memory.py").stdout)
    # every converter direction ran on the same rows, each with a peak RSS
    assert [r["direction"] for r in rep["rows"]] == ["to-modelopt", "to-speculators", "from-modelopt", "from-speculators", "from-trtllm"], rep
    assert len({r["rows"] for r in rep["rows"]}) == 1 and rep["rows"][0]["rows"] > 1, rep
    assert all(r["peak_rss_mb"] >= r["rss_after_imports_mb"] > 0 and r["input_mb"] > 0 for r in rep["rows"]), rep


def test_bench_traffic_split_smoke():
    out = run_bench("bench_traffic_split.py").stdout
    rows = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
    # both kinds of traffic at the requested size, each held back near the requested 0.2
    assert [(r["kind"], r["records"]) for r in rows] == [("templated", 200), ("distinct", 200)], rows
    assert all(abs(r["heldout_share"] - 0.2) <= 0.05 and r["groups"] <= r["records"] for r in rows), rows
    assert rows[0]["groups"] < rows[1]["groups"], rows  # templated prompts group


@pytest.mark.needs("tritonserver", "tritonclient")
def test_bench_serving_overhead_smoke(fp8_bundle):
    rep = _last_json(run_bench("bench_serving_overhead.py", "--bundle", str(fp8_bundle)).stdout)
    (row,) = rep["rows"]  # concurrency 1, speculation on
    assert (row["concurrency"], row["speculation"], row["rounds"]) == (1, True, 7), row
    assert row["direct_itl_ms"]["median"] > 0 and row["triton"]["itl_ms"]["median"] > 0 and "meets_goal" in row["triton"], row


@pytest.mark.needs("aiperf", "tritonserver", "tritonclient")
def test_compare_aiperf_smoke(fp8_bundle):
    out = run_bench("compare_aiperf.py", "--bundle", str(fp8_bundle)).stdout
    assert re.search(r"(?i)ttft", out), out[-2000:]
