"""`train-draft --traffic DIR --from BUNDLE` (issue 23 part C) on the embedded tiny FP8 bundle.

Traffic: SQL prompts (examples/traffic_domain.jsonl, a domain the tiny pair, trained on Python
source, never saw) served by the bundle's reference runtime and written through the capture
SegmentWriter. The retrained bundle must name its parent, train on none of the held-back prompts,
and decode the held-back prompts with a longer acceptance length than its parent (both measured
by `alpha`'s own run_alpha on the bundles as built).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3_trt.cli import main
from eagle3_trt.formats.checkpoint_io import sha256_file
from eagle3_trt.formats.traffic import read_traffic, traffic_digest
from eagle3_trt.formats.traffic_split import split_traffic
from eagle3_trt.pipeline.bundle import open_bundle, verify

N_PROMPTS = 32
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> tuple[Path, Path]:
    """(the tiny FP8 bundle, its captured traffic directory)."""
    from transformers import AutoTokenizer

    from eagle3_trt.pipeline.builder import EngineRequest, build_bundle
    from eagle3_trt.pipeline.presets import load_preset
    from eagle3_trt.testing.served_traffic import served_records, write_traffic

    root = tmp_path_factory.mktemp("loop")
    bundle = build_bundle(EngineRequest(preset=load_preset("tiny"), out=str(root / "tiny"))).bundle
    tok = AutoTokenizer.from_pretrained(bundle / "tokenizer")
    rows = [json.loads(line) for line in (EXAMPLES / "traffic_domain.jsonl").read_text().splitlines()][:N_PROMPTS]
    prompts = [tok(r["text"], add_special_tokens=True)["input_ids"] for r in rows]
    prompts += prompts[:2]  # the same prompt asked twice: one group, one side of the split
    recs = served_records(bundle, prompts, max_tokens=MAX_TOKENS, categories=[r["category"] for r in rows] + [rows[0]["category"], rows[1]["category"]])
    return bundle, write_traffic(root / "traffic", recs)


def _alpha_al(bundle: Path, prompts_file: Path) -> float:
    from eagle3_trt.measure.alpha_run import run_alpha

    rep = run_alpha(bundle, prompts_file, max_tokens=MAX_TOKENS, diagnostics=False, bf16=False)  # the bundle as built only
    return rep.pairs.bundle.overall.acceptance_length


def test_retrained_bundle_names_parent_trains_on_no_heldout_prompt_and_accepts_more(served, tmp_path, capsys):
    parent, traffic = served
    child = tmp_path / "child"
    args = ["train-draft", "--traffic", str(traffic), "--from", str(parent), "-o", str(child)]
    args += ["--steps", "50", "--lr", "3e-4", "--eval-samples", "8", "--eval-tokens", str(MAX_TOKENS), "--threads", "1", "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)

    b, p = open_bundle(child), open_bundle(parent)
    assert verify(b) == []
    lin = b.manifest.lineage
    assert lin is not None and lin.parent_fingerprint == p.manifest.fingerprint
    assert (lin.heldout_seed, lin.heldout_fraction, lin.traffic_dir) == (0, 0.2, str(traffic))
    assert lin.training["settings"]["steps"] == 50 and lin.training["regenerated_by"].startswith("reference runtime")
    # the regeneration is the target's greedy decoding as served: it reproduces every greedy served reply
    assert lin.training["served_greedy_compared"] == lin.training["served_greedy_reproduced"] > 0
    assert lin.training["replay_prompts"] > 0
    split = split_traffic(read_traffic(traffic), seed=lin.heldout_seed, holdout_fraction=lin.heldout_fraction)
    assert lin.traffic_digest == traffic_digest(split.train) != traffic_digest(split.train + split.heldout)
    held = {tuple(r.prompt_ids) for r in split.heldout}
    assert held and held.isdisjoint(tuple(r.prompt_ids) for r in split.train)

    # exactly the training side's distinct prompts were regenerated and trained on
    from eagle3_trt.train.from_traffic import prompt_sha256

    trained = set(json.loads((Path(report["head"]) / "train_report.json").read_text())["trained_prompt_sha256"])
    assert trained == {prompt_sha256(list(r.prompt_ids)) for r in split.train}
    assert trained.isdisjoint(prompt_sha256(list(h)) for h in held)
    # the split's sides are sealed in the bundle, where gate --traffic and the next retrain start from
    from eagle3_trt.formats.traffic_split import SPLIT_SIDES_FILE, read_split_sides

    sides = read_split_sides(child / SPLIT_SIDES_FILE)
    assert sides is not None and sides == split.sides and SPLIT_SIDES_FILE in b.manifest.outputs

    # same target, options and tokenizer; a new draft; the BF16 head is the manifest's draft source
    for rel in ("target/model.safetensors", "llm_api_options.yaml", "tokenizer/tokenizer.json"):
        assert sha256_file(child / rel) == sha256_file(parent / rel)
    assert sha256_file(child / "draft/model.safetensors") != sha256_file(parent / "draft/model.safetensors")
    assert Path(b.manifest.sources.draft.path) == Path(report["head"]).resolve()
    assert b.manifest.acceptance is not None  # re-measured on the embedded pair's held-out text

    # the held-back prompts decode with a longer acceptance length on the child (alpha's measurement)
    hf = tmp_path / "heldout.json"
    hf.write_text(json.dumps({"about": "held-back traffic", "prompts": sorted(list(h) for h in held)}))
    before, after = _alpha_al(parent, hf), _alpha_al(child, hf)
    print(f"held-back traffic acceptance length: parent {before:.3f} -> retrained {after:.3f}")
    assert after > before + 0.05
    assert lin.training["heldout_acceptance_length_after"] > lin.training["heldout_acceptance_length_before"]


def test_refusals_are_one_line(served, tmp_path, capsys):
    parent, traffic = served
    out = tmp_path / "new"

    def run(*extra: str) -> str:
        assert main(["train-draft", *extra, "-o", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("error: ")
        return err

    # traffic another bundle served
    foreign = tmp_path / "foreign"
    from eagle3_trt.testing.served_traffic import write_traffic

    write_traffic(foreign, [r.model_copy(update={"bundle_fingerprint": "0" * 64}) for r in read_traffic(traffic)])
    assert "served by another bundle" in run("--traffic", str(foreign), "--from", str(parent))
    # too few records to train on
    assert "at least 1000 are needed" in run("--traffic", str(traffic), "--from", str(parent), "--min-records", "1000")
    # --from that is not a bundle, and --traffic without --from
    assert "is not an engine bundle" in run("--traffic", str(traffic), "--from", str(traffic))
    assert "--from" in run("--traffic", str(traffic))
    # inputs of plain train-draft do not mix with --traffic, and traffic options need it
    assert "--data" in run("--traffic", str(traffic), "--from", str(parent), "--data", str(EXAMPLES / "code.jsonl"))
    assert "only applies with --traffic" in run("--from", str(parent))
    assert not out.exists()


def test_forgetting_is_measured_on_the_prompts_of_the_new_figure(served, tmp_path):
    """recommend --write leaves the alpha report's figure (e.g. examples/code.jsonl) in the parent's
    manifest; the new bundle's figure is measured on the embedded pair's held-out prompts. The parent
    is measured again on those same prompts and K, and the line says which prompts; the manifest
    figure from elsewhere is printed apart, never as the 'before'."""
    import shutil

    from eagle3_trt.pipeline import bundle_write
    from eagle3_trt.train.from_traffic import _parent_on_child_prompts, summary_lines

    parent, _ = served
    own = open_bundle(parent).manifest.acceptance
    assert own is not None and own.measured_on.startswith("heldout_prompts.json")
    moved = tmp_path / "parent"
    shutil.copytree(parent, moved)
    elsewhere = own.model_copy(
        update={"acceptance_length": 2.91, "prompts": 4, "measured_on": "examples/code.jsonl (alpha measurement at K=3, taken by recommend --write)"}
    )
    bundle_write.update(moved, acceptance=elsewhere)
    same = _parent_on_child_prompts(open_bundle(moved), own)
    assert same is not None and same["acceptance_length"] == own.acceptance_length and same["prompts"] == own.prompts
    child = own.model_copy(update={"acceptance_length": 2.0})
    report = {
        "training": {
            "records": 10,
            "train_records": 8,
            "train_prompts": 8,
            "regenerated_by": "x",
            "heldout_records": 2,
            "heldout_acceptance_length_after": None,
            "heldout_acceptance_length_before": None,
            "warnings": [],
        },
        "acceptance": child.model_dump(),
        "parent_acceptance": elsewhere.model_dump(),
        "parent_acceptance_same_prompts": same,
        "bundle": "new",
        "parent": "old",
        "head": "h",
    }
    lines = summary_lines(report)
    assert f"acceptance length parent {own.acceptance_length:.2f} -> new 2.00" in lines[1] and f"{own.prompts} prompts, K={own.max_draft_len}" in lines[1]
    assert "AL 2.91, was measured on other prompts: examples/code.jsonl" in lines[2] and "not compared" in lines[2]
