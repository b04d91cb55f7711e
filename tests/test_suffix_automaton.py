"""The suffix-automaton (SA) draft enhancer (TensorRT-LLM ``sa_config``): the automaton against a
brute-force search and a hand-worked example, greedy identity with SA on, ``alpha --modes chain,sa``
on the repetitive prompt set, and ``recommend --write`` writing ``sa_config`` only where SA wins."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from eagle3_trt.convert.load import load_engine
from eagle3_trt.core.engine import SamplingParams
from eagle3_trt.core.suffix_automaton import SAConfig, SuffixAutomaton, overrides, propose
from eagle3_trt.errors import UserError
from eagle3_trt.pipeline.trtllm_versions import spec_for_release
from eagle3_trt.runtime.recommendation import sa_choice
from eagle3_trt.testing.tiny_pair import make_pair

ROOT = Path(__file__).resolve().parents[1]


def _brute(text: list[int]) -> tuple[int, int]:
    """Longest suffix that also ends before the last index; its oldest end index."""
    n = len(text)
    for L in range(n - 1, 0, -1):
        suf = text[n - L :]
        for s in range(0, n - L):
            if text[s : s + L] == suf:
                return L, s + L - 1
    return 0, -1


def test_hand_worked_example():
    # text 1 2 3 4 9 1 2 3: the suffix "1 2 3" occurred at indices 0..2, followed by 4 9 1
    a = SuffixAutomaton([1, 2, 3, 4, 9, 1, 2, 3])
    assert a.longest_suffix_match() == (3, 2)
    p = propose(a, 3, pad=0)
    assert (p.match_len, p.tokens) == (3, [4, 9, 1])
    assert overrides(p, 3) and not overrides(p, 4)
    # 5 5 5 5: "5 5 5" first ends at index 2, one token follows; the rest is padding (TensorRT-LLM leaves 0)
    assert propose(SuffixAutomaton([5, 5, 5, 5]), 3, pad=0).tokens == [5, 0, 0]
    assert SuffixAutomaton([1, 2, 3]).longest_suffix_match() == (0, -1)


def test_incremental_matches_brute_force():
    rng = random.Random(0)
    for _ in range(60):
        a = SuffixAutomaton()
        text: list[int] = []
        for _ in range(rng.randrange(1, 40)):
            t = rng.randrange(3)
            a.extend(t)
            text.append(t)
            assert a.longest_suffix_match() == _brute(text)


def test_global_pool_takes_the_longest_match_elsewhere():
    own = SuffixAutomaton([9, 1, 2, 3])
    other = SuffixAutomaton([7, 1, 2, 3, 8, 6])
    assert propose(own, 2, pad=0).match_len == 0
    p = propose(own, 2, pad=0, pool=[other])
    assert (p.match_len, p.tokens) == (3, [8, 6])


def test_threshold_must_be_positive():
    with pytest.raises(UserError):
        SAConfig(threshold=0)


def test_sa_config_refused_before_trtllm_1_3():
    spec = {"max_draft_len": 3, "sa_config": {"threshold": 4}}
    with pytest.raises(UserError):
        spec_for_release(spec, "1.2.1")
    assert spec_for_release(spec, "1.3.0rc27")[0]["sa_config"] == {"threshold": 4}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    t, d = make_pair(tmp_path_factory.mktemp("pair"))
    return load_engine(t, d, dtype=torch.float32, max_draft_len=3)


@pytest.mark.parametrize("pool", [False, True])
def test_greedy_identity_with_sa(engine, pool):
    rng = random.Random(3)
    # repetitive prompts, so the automaton matches (threshold 1 overrides whenever anything matches)
    prompts = [[0] + [rng.randrange(6, 60) for _ in range(5)] * rng.randrange(2, 4) for _ in range(4)]
    params = SamplingParams(max_tokens=32)
    ref = [r.token_ids for r in engine.generate(prompts, params, speculate=False)]
    chain = engine.generate(prompts, params)
    engine.sa = SAConfig(threshold=1, enable_global_pool=pool)
    try:
        got = engine.generate(prompts, params)
        one = [engine.generate([p], params)[0].token_ids for p in prompts]
    finally:
        engine.sa = None
    assert [r.token_ids for r in got] == ref
    assert one == ref
    # the automaton did draft: acceptance differs from the neural chain's
    assert [r.stats.accepted_tokens for r in got] != [r.stats.accepted_tokens for r in chain]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = str(Path(sys.executable).with_name("eagle3-trt"))
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sa") / "b"
    r = _cli("engine", "--model", "tiny", "-o", str(out), cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return out


def _alpha(bundle: Path, prompts: str, out: Path, *extra: str) -> dict:
    r = _cli("alpha", str(bundle), "--prompts", prompts, "--modes", "chain,sa", "--max-tokens", "64", "--no-bf16", "-o", str(out), *extra, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "speculation modes" in r.stdout
    return json.loads((out / "report.json").read_text())


def test_alpha_modes_and_recommend_write(bundle, tmp_path):
    # the "repeat" records of the repetitive set (the first four)
    rep = _alpha(bundle, "examples/code_edit.jsonl", tmp_path / "rep", "--limit", "4")
    m = rep["modes"]
    assert m["sa"]["overall"]["acceptance_length"] > m["chain"]["overall"]["acceptance_length"]
    for mode in ("chain", "sa"):
        assert set(m[mode]["by_category"]) == {"repeat"}
        assert m[mode]["overall"]["tokens_verified_per_forward"] > 1
    # +0.13 AL over 4 turns clears both margins, but its paired 95% interval reaches 0: noise, not written
    threshold, ev = sa_choice(rep)
    assert threshold is None and ev is not None and not ev["written"] and ev["gain_ci95"][0] <= 0 < ev["gain_ci95"][1]

    r = _cli("recommend", str(bundle), "--report", str(tmp_path / "rep" / "report.json"), "--write", cwd=ROOT)
    assert r.returncode == 0, r.stderr
    opts = yaml.safe_load((bundle / "llm_api_options.yaml").read_text())
    assert "sa_config" not in opts["speculative_config"]
    man = json.loads((bundle / "manifest.json").read_text())
    assert man["recommendation"]["evidence"]["sa"]["sa_acceptance_length"] == round(m["sa"]["overall"]["acceptance_length"], 4)
