"""The suffix-automaton (SA) draft enhancer (TensorRT-LLM ``sa_config``): the automaton against a
brute-force search, hand-worked traces of each serving rule (the first decode's drafts stay neural,
the prefill's token never enters the automaton, stale buffer slots, the buffer indexed by decoding
position, the global pool with a completed request and its 64-token cap, no rejection sampling with
sa_config), greedy identity with SA on, ``alpha --modes chain,sa`` on the repetitive prompt set, and
``recommend --write`` writing ``sa_config`` only where SA wins. Sources: speculative/sa/automaton.py."""

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
from eagle3_trt.core.spec_sampling import REJECTION_SAMPLING, SpecSamplingConfig
from eagle3_trt.errors import UserError
from eagle3_trt.formats.alpha_report import read_alpha_report
from eagle3_trt.measure.recommendation import SA_MIN_GAIN_ABS, sa_choice
from eagle3_trt.pipeline.trtllm_versions import spec_for_release
from eagle3_trt.speculative.sa.automaton import SAConfig, SAEnhancer, SuffixAutomaton, without_rejection_sampling
from eagle3_trt.speculative.sa.method import SuffixAutomatonMethod
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
    # text 1 2 3 4 9 1 2 3: the suffix "1 2 3" occurred at indices 0..2 (followed by 4 9 1)
    a = SuffixAutomaton([1, 2, 3, 4, 9, 1, 2, 3])
    assert a.longest_suffix_match() == (3, 2)
    assert a.continuation(2, 3) == [4, 9, 1]
    # 5 5 5 5: "5 5 5" first ends at index 2, one token follows it
    assert SuffixAutomaton([5, 5, 5, 5]).longest_suffix_match() == (3, 2)
    assert SuffixAutomaton([1, 2, 3]).longest_suffix_match() == (0, -1)


def test_trace_one_request():
    """Prompt 1 2 3 4 1 2, K=3, threshold 2. Its prefill samples 3, which never enters the automaton
    (only tokens accepted at decode steps are extended); the drafts of the first decode are neural."""
    e = SAEnhancer(SAConfig(threshold=2), [[1, 2, 3, 4, 1, 2]], 3)
    assert e.drafts(0) is None  # the first decode verifies the prefill iteration's (neural) drafts
    # decode 1 accepts 4 1 2. Text 1 2 3 4 1 2 | 4 1 2: "4 1 2" ended at index 5, followed by 4 1 2.
    # (Had the prefill's 3 entered, 1 2 3 4 1 2 3 4 1 2 would match "1 2 3 4 1 2" and propose 3 4 1.)
    e.update([0], {0: [4, 1, 2]})
    assert (e.match_len[0], e.drafts(0)) == (3, [4, 1, 2])
    # decode 2 accepts 5 alone: no earlier 5, no match; nothing is written, no override
    e.update([0], {0: [5]})
    assert (e.match_len[0], e.drafts(0), e.buf[0]) == (0, None, [4, 1, 2])
    # decode 3 accepts 1 2: "1 2" first ended at index 1, followed by 3 4 1
    e.update([0], {0: [1, 2]})
    assert (e.match_len[0], e.drafts(0)) == (2, [3, 4, 1])
    # decode 4 accepts 7 7: "7" ended at index 12, ONE token (7) follows: slot 0 is written, slots 1-2
    # keep 4 1 from before; match 1 < threshold: no override
    e.update([0], {0: [7, 7]})
    assert (e.match_len[0], e.buf[0], e.drafts(0)) == (1, [7, 4, 1], None)
    # decode 5 accepts 7: "7 7" ended at 13, one token follows; the stale 4 1 are drafted as well
    e.update([0], {0: [7]})
    assert (e.match_len[0], e.drafts(0)) == (2, [7, 4, 1])


def test_trace_buffer_by_decoding_position():
    """The [batch, K] buffer is indexed by a row's position among the step's decoding rows: once row 0
    has finished, row 1 writes (and reads stale slots of) position 0."""
    e = SAEnhancer(SAConfig(threshold=1), [[5, 6, 5], [1, 2, 3]], 3)
    # row 0: 5 6 5 | 6 5 6: "5 6 5 6" ended at index 3, followed by 5 6 (two tokens); row 1: 1 2 3 | 9: no match
    e.update([0, 1], {0: [6, 5, 6], 1: [9]})
    assert (e.drafts(0), e.drafts(1), e.buf[0], e.buf[1]) == ([5, 6, 0], None, [5, 6, 0], [0, 0, 0])
    # row 0 finished; row 1 (now position 0) accepts 9: "9" ended at 3, one token follows; slots 1-2 are row 0's
    e.update([1], {1: [9]})
    assert e.drafts(1) == [9, 6, 0]


def test_trace_global_pool():
    """enable_global_pool: the own last <= 64 tokens searched in every request's automaton of the
    batch, a completed one included; the longest match wins, then the own one."""
    pool = SAConfig(threshold=2, enable_global_pool=True)
    e = SAEnhancer(pool, [[7, 1, 2, 3, 8, 6], [9, 4]], 3)
    # row 1: 9 4 | 1 2 3 has no earlier suffix of its own; row 0's text holds "1 2 3" followed by 8 6 0
    e.update([0, 1], {0: [0], 1: [1, 2, 3]})
    assert (e.match_len[1], e.drafts(1), e.drafts(0)) == (3, [8, 6, 0], None)
    # row 0 has finished (it keeps its slot); row 1: 9 4 1 2 3 | 7 1 2: its own "1 2" (length 2)
    # loses to "7 1 2" in row 0's text, followed by 3 8 6
    e.update([1], {1: [7, 1, 2]})
    assert (e.match_len[1], e.drafts(1)) == (3, [3, 8, 6])
    # equal lengths: the own text wins. Row 1: 1 2 6 1 | 2: own "1 2" ended at 1 (6 1 2 follow);
    # row 0's 1 2 5 | 9 has "1 2" too (5 9 follow)
    e = SAEnhancer(pool, [[1, 2, 5], [1, 2, 6, 1]], 3)
    e.update([0, 1], {0: [9], 1: [2]})
    assert (e.match_len[1], e.drafts(1), e.drafts(0)) == (2, [6, 1, 2], None)


def test_trace_global_pool_caps_the_suffix_at_64():
    block = list(range(1000, 1070))  # 70 distinct tokens
    text = block[6:] + [500] + block + [600] + block  # the block's last 64 tokens first stand alone
    own = SAEnhancer(SAConfig(threshold=2), [text[:-1]], 3)
    own.update([0], {0: text[-1:]})
    # alone: the whole 70-token block first ended at index 134: 600 1000 1001 follow
    assert (own.match_len[0], own.drafts(0)) == (70, [600, 1000, 1001])
    glob = SAEnhancer(SAConfig(threshold=2, enable_global_pool=True), [text[:-1]], 3)
    glob.update([0], {0: text[-1:]})
    # pooled: only the last 64 tokens are searched; they first ended at index 63: 500 1000 1001 follow
    assert (glob.match_len[0], glob.drafts(0)) == (64, [500, 1000, 1001])


def test_sa_config_turns_rejection_sampling_off():
    # llm_args.validate_rejection_sampling_config: sampled requests accept exact matches only
    assert REJECTION_SAMPLING.served == "rejection"
    assert without_rejection_sampling(REJECTION_SAMPLING).served == "match"
    greedy_flags = SpecSamplingConfig()
    assert without_rejection_sampling(greedy_flags) == greedy_flags


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
    engine.method = SuffixAutomatonMethod(SAConfig(threshold=1, enable_global_pool=pool))
    try:
        got = engine.generate(prompts, params)
        one = [engine.generate([p], params)[0].token_ids for p in prompts]
    finally:
        engine.method = None
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
    for mode in ("chain", "sa"):
        assert set(m[mode]["by_category"]) == {"repeat"}
        assert m[mode]["overall"]["tokens_verified_per_forward"] > 1
    # loops of period < K: the automaton proposes only the p tokens after the oldest match, where the copying
    # target's head proposes K (docs/acceptance.md): on the embedded pair SA is behind the chain on these 4 turns,
    # or (on the pair before, which did not copy) ahead by less than its paired interval; either way not written
    al_c, al_s = m["chain"]["overall"]["acceptance_length"], m["sa"]["overall"]["acceptance_length"]
    threshold, ev = sa_choice(read_alpha_report(tmp_path / "rep" / "report.json"))
    assert threshold is None and ev is not None and not ev["written"]
    assert al_s - al_c < SA_MIN_GAIN_ABS or ev["gain_ci95"][0] <= 0, (al_c, al_s, ev)

    r = _cli("recommend", str(bundle), "--report", str(tmp_path / "rep" / "report.json"), "--write", cwd=ROOT)
    assert r.returncode == 0, r.stderr
    opts = yaml.safe_load((bundle / "llm_api_options.yaml").read_text())
    assert "sa_config" not in opts["speculative_config"]
    man = json.loads((bundle / "manifest.json").read_text())
    assert man["recommendation"]["evidence"]["sa"]["sa_acceptance_length"] == round(m["sa"]["overall"]["acceptance_length"], 4)


def test_global_pool_slot_limit_refused():
    # SuffixAutomatonGlobalSearchParams: one CUDA thread per slot, at most 1,024 slots
    with pytest.raises(UserError) as e:
        SAEnhancer(SAConfig(enable_global_pool=True), [[1, 2]] * 1025, 3)
    assert e.value.where == "sa_config.enable_global_pool"
    SAEnhancer(SAConfig(enable_global_pool=True), [[1, 2]] * 1024, 3)
