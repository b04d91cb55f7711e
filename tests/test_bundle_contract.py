"""The bundle contract (build/bundle.py): one reader, each fact stored once, updates that keep the
digests and the fingerprint true, cache hits only for bundles that verify, strict manifests.

The pipeline test drives the real CLI on the embedded tiny pair: build -> alpha --sweep ->
recommend --write -> rebuild with the same inputs, then asks every reader of a bundle for K.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eagle3_trt import cli
from eagle3_trt.errors import UserError
from eagle3_trt.measure.cost_model import break_even_alpha
from eagle3_trt.pipeline import bundle as fmt
from eagle3_trt.pipeline import bundle_write
from eagle3_trt.pipeline import compile as comp
from eagle3_trt.pipeline.builder import EngineRequest, build_bundle
from eagle3_trt.pipeline.bundle import open_bundle
from eagle3_trt.pipeline.presets import load_preset
from eagle3_trt.pipeline.trtllm_adapter import serving_llm_kwargs, to_llm_kwargs
from eagle3_trt.runtime.loader import engine_from_bundle
from eagle3_trt.triton_serving.model_yaml import read_bundle

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "convert" / "data" / "calib_prompts.jsonl"
# paste-and-edit chats: the embedded pair accepts deep drafts there, so the sweep's K can win
SWEEP_PROMPTS = ROOT / "examples" / "code_edit.jsonl"


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def every_reader_k(b: Path) -> dict[str, int]:
    """K as each stage that reads a bundle sees it."""
    launch = b / "launch"
    sglang = launch / "sglang.sh"
    steps = sglang.read_text().split("--speculative-num-steps ")[1].split()[0]
    vllm_k = (launch / "vllm.sh").read_text().split('"$BUNDLE/draft" ')[1].split(")")[0]
    return {
        "open_bundle": fmt.open_bundle(b).k,
        "yaml on disk": yaml.safe_load((b / fmt.OPTIONS_FILE).read_text())["speculative_config"]["max_draft_len"],
        "reference runtime (bundle)": engine_from_bundle(b).max_draft_len,
        "reference runtime (BF16 sources)": engine_from_bundle(b, reference=True).max_draft_len,
        "triton read_bundle": read_bundle(b).max_draft_len,
        "serving LLM() kwargs": serving_llm_kwargs(b, fmt.open_bundle(b).options).kwargs["speculative_config"]["max_draft_len"],
        "compile preflight": comp.preflight(b, "h100", require_runtime=False).llm.kwargs["speculative_config"]["max_draft_len"],
        "launch/trtllm-serve.yaml": yaml.safe_load((launch / "trtllm-serve.yaml").read_text())["speculative_config"]["max_draft_len"],
        "launch/sglang.sh": int(steps),
        "launch/vllm.sh": int(vllm_k),
    }


def manifest_ks_disagreeing_with_options(b: Path) -> list[str]:
    """Every K manifest.json states that is not the options' K, unless its record says which K it measured."""
    k = fmt.open_bundle(b).k
    man = json.loads((b / fmt.MANIFEST_FILE).read_text())
    bad = []
    acc = man.get("acceptance")
    if acc and acc["max_draft_len"] != k and not acc["measured_on"].startswith(f"measured at K={acc['max_draft_len']}, not at the options' K={k}"):
        bad.append(f"acceptance K={acc['max_draft_len']}")
    if man.get("recommendation") and man["recommendation"]["max_draft_len"] != k:
        bad.append(f"recommendation K={man['recommendation']['max_draft_len']}")
    return bad


def test_build_alpha_sweep_recommend_write_rebuild_every_reader_agrees(tmp_path, capsys):
    b = tmp_path / "bundle"
    # built at K=6, the longest draft the sweep measures: the cost model picks a shorter one for any pair whose
    # acceptance falls along the draft (every embedded pair, on either library generation), so K moves
    req = EngineRequest(preset=load_preset("tiny"), target_gpu="h100", max_draft_len=6, out=str(b))
    first = build_bundle(req)
    assert not first.cache_hit and set(every_reader_k(b).values()) == {6}

    rep = tmp_path / "rep"
    # measured at the bundle's K=6; the sweep alone measures K=1..5
    assert (
        cli.main(
            [
                "alpha",
                str(b),
                "--prompts",
                str(SWEEP_PROMPTS),
                "--limit",
                "4",
                "--turns",
                "first",
                "--max-tokens",
                "16",
                "--sweep",
                "1-5",
                "--no-bf16",
                "-o",
                str(rep),
                "--json",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["settings"]["max_draft_len"] == 6 and len(report["pairs"]["bundle"]["overall"]["cumulative_acceptance"]) == 6
    assert sorted(report["pairs"]["bundle"]["sweep"], key=int) == ["1", "2", "3", "4", "5", "6"]
    assert cli.main(["recommend", str(b), "--report", str(rep / "report.json"), "--write", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    k = rec["max_draft_len"]
    # The test can only catch a stale reader if the recommendation moves K off the built one, and it
    # shows recommend choosing among every swept K only if it picks one the run at K=6 did not measure.
    assert k < 6, "the recommendation did not pick a K only the sweep measured"
    assert {r["k"] for r in rec["table"]} == set(range(1, 7)) and rec["evidence"]["measured_k"] == [1, 2, 3, 4, 5, 6]
    assert rec["cumulative_acceptance"] == report["pairs"]["bundle"]["sweep"][str(k)]["cumulative_acceptance"]
    # a K beyond the sweep is refused in one line, and nothing is written
    before = (b / fmt.MANIFEST_FILE).read_bytes()
    assert cli.main(["recommend", str(b), "--report", str(rep / "report.json"), "--max-draft-len", "7", "--write"]) == 2
    assert "K=7 was not measured" in capsys.readouterr().err and (b / fmt.MANIFEST_FILE).read_bytes() == before
    assert fmt.verify(b) == []  # recommend --write went through bundle.update: digests and fingerprint follow
    man = json.loads((b / fmt.MANIFEST_FILE).read_text())
    assert man["recommendation"]["max_draft_len"] == k and "max_draft_len" not in man
    assert man["recommendation"]["cumulative_acceptance"] == rec["cumulative_acceptance"] and len(rec["cumulative_acceptance"]) == k
    assert man["fingerprint"] != first.manifest.fingerprint and man["inputs_fingerprint"] == first.manifest.inputs_fingerprint
    readers = every_reader_k(b)
    assert set(readers.values()) == {k}, readers
    # one truth per bundle: the acceptance record is now the sweep's measurement at the new K
    swept = report["pairs"]["bundle"]["sweep"][str(k)]
    assert man["acceptance"]["max_draft_len"] == k and man["acceptance"]["alpha"] == pytest.approx(swept["alpha"], abs=1e-4)
    assert man["acceptance"]["target_forwards"] == swept["target_forwards"] and str(rep / "report.json") in man["acceptance"]["measured_on"]
    assert manifest_ks_disagreeing_with_options(b) == []
    # no max_concurrency above what the server batches (the grid stops at max_batch_size)
    opts = yaml.safe_load((b / fmt.OPTIONS_FILE).read_text())
    assert rec["max_concurrency"] <= opts["max_batch_size"] and max(r["batch"] for r in rec["table"]) == opts["max_batch_size"]
    # recommend --write sets a draft_len_schedule (it replaces max_concurrency): batch 1 at K, K never
    # rising with batch, keys on the prediction grid, the last key max_concurrency
    spec = opts["speculative_config"]
    sched = spec["draft_len_schedule"]
    assert "max_concurrency" not in spec and min(sched) == 1 and sched[1] == k and max(sched) == rec["max_concurrency"]
    ks = [sched[x] for x in sorted(sched)]
    assert ks == sorted(ks, reverse=True) and set(sched) - {rec["max_concurrency"]} <= {r["batch"] for r in rec["table"]}
    # the gate: the break-even acceptance recomputed here from the cost model's own functions
    conc = rec["evidence"]["chosen_at_concurrency"]
    row = next(r for r in rec["table"] if r["k"] == k and r["batch"] == conc)
    assert spec["acceptance_rate_threshold"] == pytest.approx(break_even_alpha(k, row["overhead"]), abs=1e-4)
    assert 0 < spec["acceptance_rate_threshold"] < row["alpha"] <= 1  # the measured K pays, so it is above break-even
    # the window: the smallest whose replay of the measured requests at K through TensorRT-LLM's rule
    # switches speculation off at most 1% of the time (measure/gate_replay.py; tests/test_gate_replay.py)
    gate = rec["evidence"]["acceptance_gate"]
    assert gate["written"] and spec["acceptance_rate_window_size"] == gate["window"] and gate["k"] == k
    assert gate["trips_at_window"] / gate["replays"] <= gate["max_trip_probability"] and gate["requests"] == swept["turns"]
    # the manifest records the same choice
    mrec = man["recommendation"]
    assert {int(x): v for x, v in mrec["draft_len_schedule"].items()} == sched
    assert (mrec["acceptance_rate_threshold"], mrec["acceptance_rate_window_size"]) == (spec["acceptance_rate_threshold"], spec["acceptance_rate_window_size"])
    # and each release gets its own form: 1.2 leaves the rate gate out with a note naming it and takes
    # the schedule in its lower-bound form (batch 1 first, 0 past max_concurrency); 1.3/1.4 take every key unchanged
    bo = open_bundle(b).options
    res = to_llm_kwargs(b, bo, version="1.2.0", use_installed=False)
    old = res.kwargs["speculative_config"]
    assert "acceptance_rate_threshold" not in old and "acceptance_window" not in old and any("1.2.0" in n and "acceptance_rate" in n for n in res.notes)
    assert old["draft_len_schedule"][1] == k and old["draft_len_schedule"][max(old["draft_len_schedule"])] == 0
    for release in ("1.3.0", "1.4.0rc1"):
        new = to_llm_kwargs(b, bo, version=release, use_installed=False).kwargs["speculative_config"]
        assert new["draft_len_schedule"] == sched and new["acceptance_rate_threshold"] == spec["acceptance_rate_threshold"]
    # the trtllm-serve and Dynamo launchers carry them unchanged (the 1.2 band without the gate)
    knobs = ("draft_len_schedule", "acceptance_rate_window_size", "acceptance_rate_threshold")
    for launcher in ("trtllm-serve.yaml", "dynamo-trtllm.yaml"):
        launched = yaml.safe_load((b / "launch" / launcher).read_text())["speculative_config"]
        assert {x: launched[x] for x in knobs} == {x: spec[x] for x in knobs}, launcher
    assert "acceptance_rate_threshold" not in yaml.safe_load((b / "launch" / "trtllm-serve-1.2.yaml").read_text())["speculative_config"]
    assert cli.main(["recommend", str(b), "--report", str(rep / "report.json"), "--concurrency", "256"]) == 2
    assert "--concurrency: 256 exceeds the bundle's max_batch_size 128" in capsys.readouterr().err

    # a report without counts at the chosen K (an older alpha): the record keeps its figure and says which K it is
    old_report = json.loads((rep / "report.json").read_text())
    for v in old_report["pairs"]["bundle"]["sweep"].values():
        for key in ("turns", "generated_tokens", "target_forwards"):
            v.pop(key)
    (tmp_path / "old-report.json").write_text(json.dumps(old_report))
    assert cli.main(["recommend", str(b), "--report", str(tmp_path / "old-report.json"), "--max-draft-len", "2", "--write", "--json"]) == 0
    k2 = json.loads(capsys.readouterr().out)["max_draft_len"]
    man = json.loads((b / fmt.MANIFEST_FILE).read_text())
    assert k2 <= 2 and man["acceptance"]["max_draft_len"] == k and man["acceptance"]["measured_on"].startswith(f"measured at K={k}, not at the options' K={k2}")
    assert manifest_ks_disagreeing_with_options(b) == [] and fmt.verify(b) == []
    # back to the sweep's choice, measured again at that K
    assert cli.main(["recommend", str(b), "--report", str(rep / "report.json"), "--write", "--json"]) == 0
    capsys.readouterr()
    assert json.loads((b / fmt.MANIFEST_FILE).read_text())["acceptance"]["max_draft_len"] == k

    logs: list[str] = []
    again = build_bundle(req, log=logs.append)  # the same inputs: a verified cache hit that keeps the recommendation
    assert again.cache_hit and not logs, logs
    readers = every_reader_k(b)
    assert set(readers.values()) == {k}, readers


@pytest.fixture()
def small_request(tiny_pair_session, tmp_path) -> EngineRequest:
    t, d = tiny_pair_session
    return EngineRequest(preset=load_preset("tiny"), target=str(t), draft=str(d), target_gpu="h100", calib_samples=2, out=str(tmp_path / "b"))


def test_a_cache_hit_is_verified(small_request, tmp_path):
    b = tmp_path / "b"
    first = build_bundle(small_request)
    weights = {p: _sha(b / p) for p in ("target/model.safetensors", "draft/model.safetensors")}
    assert build_bundle(small_request).cache_hit

    (b / "draft" / "model.safetensors").unlink()
    assert fmt.verify(b) == ["draft/model.safetensors: missing"]
    logs: list[str] = []
    res = build_bundle(small_request, log=logs.append)
    assert not res.cache_hit and "draft/model.safetensors: missing" in res.reason and any("rebuilding" in line for line in logs)
    assert fmt.verify(b) == [] and {p: _sha(b / p) for p in weights} == weights  # rebuilt, byte-identical

    # A hand edit of the options (not through bundle.update) is not a hit: the rebuild restores the build's K.
    opts = (b / fmt.OPTIONS_FILE).read_text()
    (b / fmt.OPTIONS_FILE).write_text(opts.replace("max_draft_len: 3", "max_draft_len: 2"))
    assert fmt.open_bundle(b).k == 2 and fmt.verify(b) == ["llm_api_options.yaml: changed since the build"]
    res = build_bundle(small_request)
    assert not res.cache_hit and "llm_api_options.yaml: changed" in res.reason and fmt.open_bundle(b).k == 3

    # Same size, other bytes: caught by the digest, not the size.
    cfg = b / "target" / "config.json"
    text = cfg.read_text()
    assert "  " in text
    cfg.write_text(text.replace("  ", " \t", 1))  # still valid JSON, same size
    assert fmt.verify(b, content=False) == [] and fmt.verify(b) == ["target/config.json: changed since the build"]
    assert not build_bundle(small_request).cache_hit

    # A file nobody recorded, and a manifest whose digests were edited.
    (b / "draft" / "extra.bin").write_bytes(b"x")
    assert fmt.verify(b) == ["draft/extra.bin: not recorded in manifest.json"]
    assert not build_bundle(small_request).cache_hit and not (b / "draft" / "extra.bin").exists()
    man = json.loads((b / fmt.MANIFEST_FILE).read_text())
    man["outputs"]["validation.json"]["sha256"] = "0" * 64
    (b / fmt.MANIFEST_FILE).write_text(json.dumps(man))
    assert fmt.verify(b)[0].startswith("manifest.json: fingerprint does not match")
    assert not build_bundle(small_request).cache_hit
    assert build_bundle(small_request).cache_hit and first.manifest.inputs_fingerprint == fmt.open_bundle(b).manifest.inputs_fingerprint


def test_update_refuses_a_bundle_that_does_not_match_its_manifest(fp8_bundle, tmp_path):
    b = tmp_path / "b"
    shutil.copytree(fp8_bundle, b)
    f = b / "draft" / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-8])
    before = (b / fmt.OPTIONS_FILE).read_text()
    with pytest.raises(UserError) as e:
        bundle_write.update(b, options=fmt.read_options(b))
    assert "draft/model.safetensors: changed" in e.value.what and "--force" in e.value.hint
    assert (b / fmt.OPTIONS_FILE).read_text() == before


def _copy(fp8_bundle: Path, tmp_path: Path) -> Path:
    b = tmp_path / "b"
    shutil.copytree(fp8_bundle, b)
    return b


def _edit_manifest(b: Path, change) -> None:
    man = json.loads((b / fmt.MANIFEST_FILE).read_text())
    change(man)
    (b / fmt.MANIFEST_FILE).write_text(json.dumps(man))


@pytest.mark.parametrize(
    "change, where, what",
    [
        (lambda m: m.update(max_draft_len=3), "manifest.json:max_draft_len", "Extra inputs are not permitted"),
        (lambda m: m["quant"].update(kv_cache="fp8"), "manifest.json:quant.kv_cache", "Extra inputs are not permitted"),
        (lambda m: m["target_gpu"].update(sm="ninety"), "manifest.json:target_gpu.sm", "valid integer"),
        (lambda m: m["quant"].update(target="int4"), "manifest.json:quant.target", "'fp8', 'nvfp4', 'bf16' or 'native'"),
        (lambda m: m.pop("sources"), "manifest.json:sources", "Field required"),
        (lambda m: m.update(schema=1), "manifest.json:schema", "schema 1"),
    ],
)
def test_manifest_fields_and_types_are_strict(fp8_bundle, tmp_path, capsys, change, where, what):
    b = _copy(fp8_bundle, tmp_path)
    _edit_manifest(b, change)
    with pytest.raises(UserError) as e:
        fmt.open_bundle(b)
    assert str(e.value.where).endswith(where) and what in e.value.what, e.value.line()
    # Every stage reads through open_bundle: the CLI prints the same single line.
    assert cli.main(["alpha", str(b), "--prompts", str(PROMPTS)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and where in err


def test_an_old_schema_says_rebuild_with_force(fp8_bundle, tmp_path):
    b = _copy(fp8_bundle, tmp_path)
    _edit_manifest(b, lambda m: m.update(schema=1))
    for reader in (fmt.open_bundle, read_bundle, engine_from_bundle):
        with pytest.raises(UserError) as e:
            reader(b)
        assert "eagle3-trt engine --force" in e.value.hint


def test_missing_or_corrupt_manifest_names_the_file(fp8_bundle, tmp_path):
    b = _copy(fp8_bundle, tmp_path)
    (b / fmt.MANIFEST_FILE).write_text("{not json")
    with pytest.raises(UserError) as e:
        fmt.open_bundle(b)
    assert str(e.value.where) == str(b / fmt.MANIFEST_FILE) and "not valid JSON" in e.value.what
    (b / fmt.MANIFEST_FILE).unlink()
    with pytest.raises(UserError) as e:
        fmt.open_bundle(b)
    assert str(e.value.where) == str(b / fmt.MANIFEST_FILE) and "not found" in e.value.what


def test_derived_facts_come_from_where_they_are_stored(fp8_bundle, tmp_path):
    b = fmt.open_bundle(fp8_bundle)
    assert b.k == b.options.speculative_config.max_draft_len == 3
    assert b.aux_layers_are_default and b.aux_layer_ids == (1, 3, 4)  # TensorRT-LLM's default rule for 8 layers
    assert b.max_seq_len == b.options.max_seq_len and b.kv_cache == b.options.kv_cache_config.dtype == "fp8"
    assert (b.quant.target, b.quant.draft, b.target_gpu.name, b.quantized) == ("fp8", "bf16", "h100", True)
    assert (b.target_dir, b.draft_dir, b.tokenizer_dir) == (fp8_bundle / "target", fp8_bundle / "draft", fp8_bundle / "tokenizer")
    # An override of K for a measurement does not touch the bundle.
    assert engine_from_bundle(b, max_draft_len=5).max_draft_len == 5 and fmt.open_bundle(fp8_bundle).k == 3


# --- the CLI's lazy command table ---------------------------------------------------------------


def test_lazy_commands_match_their_modules():
    for name, (_module, _attr, short) in cli.LAZY_COMMANDS.items():
        cmd = cli.load_command(name)
        assert cmd.name == name and cmd.get_short_help_str(limit=400) == short, name


def test_a_broken_command_entry_fails_loudly(monkeypatch):
    monkeypatch.setitem(cli.LAZY_COMMANDS, "alpha", ("eagle3_trt.measure.commands", "no_such_cmd", "x"))
    with pytest.raises(AttributeError):
        cli.main(["alpha", "--help"])


def test_help_does_not_import_the_stages():
    code = (
        "import sys; from eagle3_trt.cli import main; rc = main(['--help']); "
        "heavy = [m for m in ('torch', 'transformers', 'eagle3_trt.measure.commands') if m in sys.modules]; "
        "assert rc == 0 and not heavy, heavy"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "recommend" in r.stdout and "train-draft" in r.stdout
