"""``recommend --write`` choosing TensorRT-LLM's dynamic tree against the chain with the cost model
(measure/dynamic_tree_choice.py), and the release table for its keys (speculative/dynamic_tree/release.py).

The choice is checked on synthetic alpha reports (the acceptance lengths are inputs of the cost
model; measuring them is tests/test_dynamic_tree.py's and test_alpha_dynamic_tree.py's job): a tree
that accepts much more wins while verification is memory-bound (small batches) and loses once the
extra tokens it verifies make the target forward compute-bound (large batches); written into a real
bundle, options and manifest agree, and a later measurement where it loses removes the keys.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eagle3_trt.errors import UserError
from eagle3_trt.formats.alpha_report import AlphaReport, report_json
from eagle3_trt.measure.alpha_run import run_alpha
from eagle3_trt.measure.bundle_costs import bundle_cost_inputs, recommendation_batches
from eagle3_trt.measure.cost_model import Recommendation, recommend
from eagle3_trt.measure.dynamic_tree_choice import dynamic_tree_choice
from eagle3_trt.measure.recommendation import write_recommendation_to_bundle
from eagle3_trt.pipeline.bundle import open_bundle
from eagle3_trt.pipeline.gpus import get_gpu
from eagle3_trt.pipeline.trtllm_versions import SPEC_KEYS_BY_RELEASE, spec_for_release
from eagle3_trt.runtime.loader import engine_from_bundle
from eagle3_trt.speculative.dynamic_tree.method import DynamicTreeMethod
from eagle3_trt.speculative.dynamic_tree.rules import DynamicTreeConfig
from eagle3_trt.testing.alpha_reports import alpha_report

ROOT = Path(__file__).resolve().parents[1]
TREE = {"use_dynamic_tree": True, "dynamic_tree_max_topK": 8, "max_total_draft_tokens": 24, "max_draft_len": 3}


def _report(chain_al: float, tree_al: float, k: int = 3, tree: dict = TREE) -> AlphaReport:
    def mode(al: float, verified: float) -> dict:
        return {"overall": {"acceptance_length": al, "tokens_verified_per_forward": verified, "requests": 8}}

    return alpha_report(
        settings={"max_draft_len": k, "prompts": "synthetic"},
        modes={"chain": mode(chain_al, k + 1), "dynamic-tree": {**mode(tree_al, 1 + tree["max_total_draft_tokens"]), "dynamic_tree": tree}},
    )


# an 8B-class dense target in FP8 with a BF16 EAGLE-3 head on one H100
COSTS = {
    "gpu": get_gpu("h100"),
    "tp": 1,
    "target_bytes": 8e9,
    "draft_bytes": 0.5e9,
    "target_format": "fp8",
    "draft_format": "bf16",
    "target_kv_bytes_per_token": 131072.0,
    "draft_kv_bytes_per_token": 4096.0,
    "target_layers": 32,
    "hidden": 4096,
}
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def _rec(conc: int) -> Recommendation:
    return Recommendation(3, 64, [], {"chosen_at_concurrency": conc})


def test_tree_wins_at_low_concurrency_and_loses_when_compute_bound():
    fields, ev = dynamic_tree_choice(_report(2.2, 3.0), _rec(1), COSTS, BATCHES)
    assert ev is not None and ev["written"]
    assert fields == {
        "use_dynamic_tree": True,
        "dynamic_tree_max_topK": 8,
        "max_total_draft_tokens": 24,
        "max_draft_len": 3,
        "draft_len_schedule": {ev["max_concurrency"]: 3},
    }
    s = ev["predicted_speedup_by_batch"]
    assert s["dynamic-tree"]["1"] > s["chain"]["1"] * 1.03
    # 25 tokens verified per sequence per forward: at 256 sequences the target is compute-bound and the tree costs more than it gains
    assert s["dynamic-tree"]["256"] < s["chain"]["256"]
    assert 1 <= ev["max_concurrency"] < 256
    fields, ev = dynamic_tree_choice(_report(2.2, 3.0), _rec(256), COSTS, BATCHES)
    assert ev is not None and not ev["written"] and fields == {"use_dynamic_tree": None, "dynamic_tree_max_topK": None, "max_total_draft_tokens": None}


def test_no_choice_without_both_modes_or_at_another_k():
    assert dynamic_tree_choice(alpha_report(modes={"chain": {}}), _rec(1), COSTS, BATCHES)[1] is None
    rep = _report(2.2, 3.0, k=3, tree={**TREE, "max_draft_len": 4})
    fields, ev = dynamic_tree_choice(rep, _rec(1), COSTS, BATCHES)
    assert ev is not None and not ev["written"] and "not measured at the same K" in ev["reason"] and fields["use_dynamic_tree"] is None


def test_tree_against_the_chain_at_the_recommended_k():
    # the recommendation chose a chain of K=2 predicted at 2.5x: the tree (depth 3) must beat that instead
    rec = Recommendation(2, 64, [{"k": 2, "batch": 1, "speedup": 2.5}], {"chosen_at_concurrency": 1})
    fields, ev = dynamic_tree_choice(_report(2.2, 3.0), rec, COSTS, BATCHES)
    assert ev is not None and ev["chain_at_recommended_k"] == {"k": 2, "speedup": 2.5} and not ev["written"]
    rec.table[0]["speedup"] = 1.2
    fields, ev = dynamic_tree_choice(_report(2.2, 3.0), rec, COSTS, BATCHES)
    assert ev is not None and ev["written"] and fields["max_draft_len"] == 3  # written with the tree's depth


def test_release_table_and_refusal_for_1_2():
    assert SPEC_KEYS_BY_RELEASE["1.2"]["use_dynamic_tree"] is None
    for band in ("1.3", "1.4"):
        assert SPEC_KEYS_BY_RELEASE[band]["dynamic_tree_max_topK"] == "dynamic_tree_max_topK"
    spec = {"max_draft_len": 3, "use_dynamic_tree": True, "dynamic_tree_max_topK": 4, "max_total_draft_tokens": 8}
    with pytest.raises(UserError, match="no dynamic tree"):
        spec_for_release(spec, "1.2.1")
    assert spec_for_release(spec, "1.3.0rc27")[0]["use_dynamic_tree"] is True


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dt") / "b"
    exe = str(Path(sys.executable).with_name("eagle3-trt"))
    r = subprocess.run([exe, "engine", "--model", "tiny", "-o", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    return out


def _write(bundle: Path, chain_al: float, tree_al: float):
    b = open_bundle(bundle)
    rec = recommend([0.9, 0.8, 0.7], concurrency=1, **bundle_cost_inputs(b), batches=recommendation_batches(b))
    k = rec.max_draft_len  # the tree measured at the K the recommendation chose
    write_recommendation_to_bundle(bundle, rec, "synthetic", _report(chain_al, tree_al, k, {**TREE, "max_draft_len": k, "max_total_draft_tokens": 8 * k}))
    b = open_bundle(bundle)
    opts = yaml.safe_load((bundle / "llm_api_options.yaml").read_text())["speculative_config"]
    return b, opts


def test_write_then_remove(bundle):
    b, opts = _write(bundle, 2.0, 3.5)
    spec, man = b.options.speculative_config, b.manifest.recommendation
    assert man is not None and man.evidence["dynamic_tree"]["written"]
    k = spec.max_draft_len
    assert (opts["use_dynamic_tree"], opts["dynamic_tree_max_topK"], opts["max_total_draft_tokens"]) == (True, 8, 8 * k)
    assert (man.use_dynamic_tree, man.dynamic_tree_max_topK, man.max_total_draft_tokens) == (True, 8, 8 * k)
    assert spec.draft_len_schedule == man.draft_len_schedule and set(spec.draft_len_schedule.values()) == {k}
    # no gate: this synthetic report holds no per-verification counts of the tree (the line says which run gives them)
    assert spec.acceptance_rate_threshold is None and man.acceptance_rate_threshold is None
    # the reference runtime serving the bundle drafts the tree it was written with
    assert engine_from_bundle(bundle).method == DynamicTreeMethod(DynamicTreeConfig(8, 8 * k))
    # a new measurement where the tree does not pay: the keys go from both files
    b, opts = _write(bundle, 2.0, 2.01)
    man = b.manifest.recommendation
    assert not {"use_dynamic_tree", "dynamic_tree_max_topK", "max_total_draft_tokens"} & set(opts)
    assert man is not None and man.use_dynamic_tree is None and not man.evidence["dynamic_tree"]["written"]


def test_alpha_modes_chain_and_dynamic_tree(bundle, tmp_path):
    rep = run_alpha(
        bundle,
        ROOT / "examples" / "code_edit.jsonl",
        bf16=False,
        limit=2,
        max_tokens=24,
        turns="first",
        diagnostics=False,
        modes=("chain", "dynamic-tree"),
        dynamic_tree_topk=3,
        max_total_draft_tokens=5,
    )
    rep = report_json(rep)  # as report.json holds it
    m = rep["modes"]
    k = rep["settings"]["max_draft_len"]
    assert m["dynamic-tree"]["dynamic_tree"] == {"use_dynamic_tree": True, "dynamic_tree_max_topK": 3, "max_total_draft_tokens": 5, "max_draft_len": k}
    assert m["dynamic-tree"]["method"] == "generate"
    for mode in ("chain", "dynamic-tree"):
        assert set(m[mode]["by_category"]) == {"repeat"}
        assert m[mode]["overall"]["acceptance_length"] > 1
    # the cost side: the chain verifies at most K drafted tokens per forward, the tree its 5 nodes
    assert m["chain"]["overall"]["tokens_verified_per_forward"] <= k + 1 < m["dynamic-tree"]["overall"]["tokens_verified_per_forward"] <= 6
    # greedy: the same tokens either way, so the same number generated
    assert m["chain"]["overall"]["generated_tokens"] == m["dynamic-tree"]["overall"]["generated_tokens"]


def _gate_report(k: int) -> dict:
    """A synthetic report.json where the tree wins at K=k: 24 turns per mode of 12 verifications, the tree
    accepting K and K-1 drafts in turn (AL K + 0.5), the chain 1 (AL 2)."""
    tree = {**TREE, "max_draft_len": k, "max_total_draft_tokens": 8 * k}
    rep = report_json(_report(2.0, k + 0.5, k, tree))
    tree_seq = [k, k - 1] * 6
    rep["modes"]["dynamic-tree"]["accepted_seqs"] = [tree_seq[i % 2 :] + tree_seq[: i % 2] for i in range(24)]
    rep["modes"]["chain"]["accepted_seqs"] = [[1] * 12] * 24
    rep["pairs"]["bundle"]["overall"]["cumulative_acceptance"] = [0.9, 0.8, 0.7][:k]
    return rep


def _gate_lines(out: str) -> list[str]:
    return [ln.removeprefix("wrote ") for ln in out.splitlines() if ln.removeprefix("wrote ").startswith("acceptance gate")]


def test_recommend_and_write_print_the_trees_gate_and_the_options_match_it(bundle, tmp_path, capsys):
    """The tree wins: recommend and recommend --write print the same gate line, the tree's (its break-even
    acceptance through its own cost hook at its depth, replayed on its measured turns), and the bundle's
    options carry that window and threshold (they used to print the chain's gate and write none)."""
    import json

    from eagle3_trt.cli import main
    from eagle3_trt.measure.cost_model import break_even_alpha, model_costs, predict_from_tokens
    from eagle3_trt.measure.gate_replay import choose_gate

    b = open_bundle(bundle)
    k = recommend([0.9, 0.8, 0.7], concurrency=1, **bundle_cost_inputs(b), batches=recommendation_batches(b)).max_draft_len
    raw = _gate_report(k)
    f = tmp_path / "report.json"
    f.write_text(json.dumps(raw))
    capsys.readouterr()
    assert main(["recommend", str(bundle), "--report", str(f)]) == 0
    shown = _gate_lines(capsys.readouterr().out)
    assert main(["recommend", str(bundle), "--report", str(f), "--write"]) == 0
    written = _gate_lines(capsys.readouterr().out)
    assert shown == written and len(shown) == 1 and "of dynamic-tree" in shown[0], (shown, written)
    # the threshold, worked out here: the tree's iteration cost at its depth and concurrency 1
    gpu, tp, tcost, dcost = model_costs(bundle_cost_inputs(b))
    mode = raw["modes"]["dynamic-tree"]
    shape = {"dynamic_tree_max_topK": 8, "max_total_draft_tokens": 8 * k, "max_draft_len": k}
    from types import SimpleNamespace

    pred = predict_from_tokens(mode["overall"]["acceptance_length"], gpu, tcost, dcost, tp, 1, k, method="dynamic-tree", options=SimpleNamespace(**shape))
    threshold = round(min(1.0, break_even_alpha(k, pred.overhead)), 4)
    choice = choose_gate(mode["accepted_seqs"], k, threshold, 1)
    spec, man = open_bundle(bundle).options.speculative_config, open_bundle(bundle).manifest.recommendation
    assert spec.use_dynamic_tree and man is not None
    if choice.window is None:
        assert spec.acceptance_rate_window_size is None and "not written" in shown[0]
    else:
        assert (spec.acceptance_rate_window_size, spec.acceptance_rate_threshold) == (choice.window, choice.threshold)
        assert (man.acceptance_rate_window_size, man.acceptance_rate_threshold) == (choice.window, choice.threshold)
        assert f"window {choice.window} iterations, threshold {threshold:.4f} (break-even acceptance of dynamic-tree at K={k})" in shown[0]


def test_the_trees_threshold_is_its_own_break_even_and_needs_its_turns():
    """On an 8B-class target at concurrency 64 the tree's break-even acceptance (its 24 verified nodes and its
    expansion make the verification compute-bound) is above the chain's at the same K (at batch 1 both are
    memory-bound and equal); a report without the tree's per-verification counts writes no gate
    and says which measurement to run."""
    from eagle3_trt.measure.method_gate import mode_gate

    rep = _report(2.0, 3.5)
    tree, chain = mode_gate("dynamic-tree", _rec(64), rep, COSTS, 3), mode_gate("chain", _rec(64), rep, COSTS, 3)
    assert tree.threshold > chain.threshold > 0
    assert tree.window is None and "alpha --modes ...,dynamic-tree" in tree.line() and "of dynamic-tree at K=3" in tree.line()


def _trip(samples: list[float], window: int, threshold: float) -> int | None:
    """By hand, TensorRT-LLM's SpeculationGate on one sample per iteration: the index of the sample whose
    window of the last ``window`` samples first has a mean below ``threshold`` (None: never)."""
    for j in range(window - 1, len(samples)):
        if sum(samples[j - window + 1 : j + 1]) / window < threshold:
            return j
    return None


def test_the_reference_runtime_counts_a_tree_iteration_as_accepted_over_its_depth(bundle, tmp_path):
    """One request on a tree bundle with a gate, served by the reference runtime's scheduler: each iteration
    that verified gives the sample accepted / K (K the tree's depth, not its 2K nodes), as TensorRT-LLM's
    executor counts paths; the gate trips where the hand-worked trace of those samples says, and the
    overlap scheduler's extra iteration still drafts."""
    import shutil

    from eagle3_trt.core.engine import SamplingParams
    from eagle3_trt.pipeline import bundle_write
    from eagle3_trt.pipeline.llm_options import validate_options
    from eagle3_trt.runtime.llm_api import SamplingParams as ServedParams
    from eagle3_trt.runtime.reference_llm import ReferenceLLM

    mine = tmp_path / "b"
    shutil.copytree(bundle, mine)
    b = open_bundle(mine)
    k = b.options.speculative_config.max_draft_len
    tree = {"use_dynamic_tree": True, "dynamic_tree_max_topK": 2, "max_total_draft_tokens": 2 * k, "sa_config": None}

    def with_spec(**extra) -> None:
        o = open_bundle(mine).options
        spec = {**o.speculative_config.model_dump(), "draft_len_schedule": None, "max_concurrency": None, **tree, **extra}
        bundle_write.update(mine, options=validate_options({**o.model_dump(), "speculative_config": spec}, "test"))

    with_spec(acceptance_rate_window_size=None, acceptance_rate_threshold=None)
    ids = [0, 17, 42, 99, 7, 3, 250, 17, 42, 99, 7]
    (res,) = engine_from_bundle(mine).generate([ids], SamplingParams(max_tokens=32))
    seq = list(res.stats.accepted_seq)  # accepted drafts per verification, greedy: what the served run verifies
    by_depth, by_nodes = [a / k for a in seq], [a / (2 * k) for a in seq]
    # a threshold where counting paths and counting nodes trip at different iterations
    window = 2
    pick = next(
        (t / 100 for t in range(5, 100, 5) if _trip(by_depth, window, t / 100) != _trip(by_nodes, window, t / 100)),
        None,
    )
    assert pick is not None, seq

    def served(threshold: float) -> dict:
        with_spec(acceptance_rate_window_size=window, acceptance_rate_threshold=threshold)
        llm = ReferenceLLM(mine, device="cpu", single_process=True)
        try:
            out = llm.generate_async(ids, ServedParams(max_tokens=32, temperature=0.0)).result(timeout=120)
            state = llm.speculation_state()
        finally:
            llm.shutdown()
        assert list(out.outputs[0].token_ids) == list(res.token_ids)  # greedy: the same tokens, gate or not
        assert state is not None
        return state

    # iteration 0 is the prefill (no sample); verification i is iteration i + 1; the overlap scheduler
    # drafts once more after the tripping iteration
    for threshold in (pick, next(t / 100 for t in range(100, 0, -5) if _trip(by_depth, window, t / 100) is not None)):
        j = _trip(by_depth, window, threshold)
        state = served(threshold)
        assert state["tripped_on_iteration"] == (None if j is None else j + 1), (state, seq, threshold)
        if j is not None:
            assert state["speculation_off_from_iteration"] == j + 3 and state["gate_samples"] == j + 1
