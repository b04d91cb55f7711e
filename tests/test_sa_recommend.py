"""``recommend --write`` and the suffix-automaton enhancer (issue 22).

sa_config goes into llm_api_options.yaml (and the launch files, and the manifest's evidence) only
when the alpha report shows SA beating the chain by >= 3%, >= 0.05 acceptance length and with the
gain's paired 95% interval above 0 (measure/recommendation.sa_choice, measure/mode_compare.py); a
later write from traffic where SA does not win removes a stale one; a report without the modes
keeps it. The chat prompts are measured for real on the embedded tiny pair. The winning report is
that real report with its "modes" section replaced by one in which SA wins (real wins, on
examples/edit_paste.jsonl, take minutes to measure: README, "By kind of prompt and by context length").
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eagle3_trt.runtime.loader import engine_from_bundle
from eagle3_trt.speculative.sa.automaton import SAConfig
from eagle3_trt.speculative.sa.method import SuffixAutomatonMethod

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> subprocess.CompletedProcess:
    exe = str(Path(sys.executable).with_name("eagle3-trt"))
    return subprocess.run([exe, *args], cwd=ROOT, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> tuple[Path, dict]:
    """The tiny bundle and a real alpha report on the chat prompts, both modes measured."""
    tmp = tmp_path_factory.mktemp("sarec")
    r = _cli("engine", "--model", "tiny", "-o", str(tmp / "b"))
    assert r.returncode == 0, r.stderr
    args = ("--limit", "2", "--modes", "chain,sa", "--max-tokens", "32", "--no-bf16", "-o", str(tmp / "chat"))
    r = _cli("alpha", str(tmp / "b"), "--prompts", "examples/prompts.jsonl", *args)
    assert r.returncode == 0, r.stderr
    return tmp / "b", json.loads((tmp / "chat" / "report.json").read_text())


def _spec(bundle: Path) -> dict:
    return yaml.safe_load((bundle / "llm_api_options.yaml").read_text())["speculative_config"]


def _sa_evidence(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())["recommendation"]["evidence"]["sa"]


def _write(bundle: Path, report: dict, path: Path) -> None:
    from eagle3_trt.cli import main  # in-process: a subprocess per write spent seconds importing torch

    path.write_text(json.dumps(report))
    assert main(["recommend", str(bundle), "--report", str(path), "--write"]) == 0


def _winning(report: dict) -> dict:
    rep = copy.deepcopy(report)
    chain = rep["modes"]["chain"]
    sa = rep["modes"]["sa"]
    sa["overall"] = dict(chain["overall"], acceptance_length=chain["overall"]["acceptance_length"] + 0.4)
    sa["vs_chain"] = {
        "a": sa["overall"]["acceptance_length"],
        "b": chain["overall"]["acceptance_length"],
        "diff": 0.4,
        "ci": [0.2, 0.6],
        "level": 0.95,
        "n": 2,
        "n_groups": 2,
    }
    sa["sa_config"] = {"threshold": 6, "enable_global_pool": False}
    return rep


def test_chat_report_has_the_paired_interval(measured):
    _, rep = measured
    sa, chain = rep["modes"]["sa"], rep["modes"]["chain"]
    lo, hi = sa["vs_chain"]["ci"]
    assert lo <= sa["vs_chain"]["diff"] <= hi
    assert sa["vs_chain"]["diff"] == pytest.approx(sa["overall"]["acceptance_length"] - chain["overall"]["acceptance_length"])
    assert sa["method"] == chain["method"] == "estimator"  # greedy chain and sa: the estimator replays the automaton exactly


def test_sa_written_when_it_wins_then_removed_when_it_does_not(measured, tmp_path, capsys):
    bundle, chat = measured
    # SA measurably wins: sa_config in the options, every launch file, and the manifest's evidence
    _write(bundle, _winning(chat), tmp_path / "win.json")
    assert _spec(bundle)["sa_config"] == {"threshold": 6, "enable_global_pool": False}
    # and the reference runtime serves it (Triton, Dynamo and alpha load bundles through engine_from_bundle)
    assert engine_from_bundle(bundle, device="cpu").method == SuffixAutomatonMethod(SAConfig(threshold=6, enable_global_pool=False))
    assert yaml.safe_load((bundle / "launch" / "trtllm-serve.yaml").read_text())["speculative_config"]["sa_config"]["threshold"] == 6
    ev = _sa_evidence(bundle)
    assert ev["written"] and ev["gain_ci95"] == [0.2, 0.6]
    # gate measures what the options serve, and says so
    from eagle3_trt.cli import main

    capsys.readouterr()
    rc = main(["gate", str(bundle), "--prompts", str(ROOT / "examples/prompts.jsonl"), "--limit", "1", "--max-tokens", "8", "--threshold", "0"])
    out = capsys.readouterr().out
    assert rc in (0, 3) and ", mode sa (as the bundle's options serve it)" in out, out  # 3: 8 tokens may not pay
    # the 1.2 launch file serves the same bundle without the enhancer, and says so
    old = (bundle / "launch" / "trtllm-serve-1.2.yaml").read_text()
    assert "sa_config" not in yaml.safe_load(old)["speculative_config"] and "no suffix-automaton enhancer" in old

    # a report without the modes says nothing about SA: the enhancer and its evidence stay
    plain = {k: v for k, v in chat.items() if k != "modes"}
    _write(bundle, plain, tmp_path / "plain.json")
    assert _spec(bundle)["sa_config"]["threshold"] == 6
    assert _sa_evidence(bundle)["written"]

    # the chat traffic, where SA does not win (on the tiny pair the automaton overrides a neural
    # draft that is already right): the stale sa_config leaves the options and the launch files
    assert not (chat["modes"]["sa"]["vs_chain"]["ci"][0] > 0 and chat["modes"]["sa"]["vs_chain"]["diff"] >= 0.05)
    _write(bundle, chat, tmp_path / "chat.json")
    assert "sa_config" not in _spec(bundle)
    assert engine_from_bundle(bundle, device="cpu").method is None
    assert "sa_config" not in yaml.safe_load((bundle / "launch" / "trtllm-serve.yaml").read_text())["speculative_config"]
    ev = _sa_evidence(bundle)
    assert not ev["written"] and ev["sa_acceptance_length"] == round(chat["modes"]["sa"]["overall"]["acceptance_length"], 4)
    r = _cli("compile", str(bundle), "--check-only")  # the bundle still matches its manifest
    assert r.returncode == 0, r.stderr


def test_gain_within_noise_is_not_written(measured, tmp_path):
    """A gain above both margins whose interval still reaches 0 (few turns, wide spread) is noise."""
    bundle, chat = measured
    rep = _winning(chat)
    rep["modes"]["sa"]["vs_chain"]["ci"] = [-0.05, 0.85]
    _write(bundle, rep, tmp_path / "noise.json")
    assert "sa_config" not in _spec(bundle)
    ev = _sa_evidence(bundle)
    assert not ev["written"] and ev["gain_ci95"] == [-0.05, 0.85]


@pytest.fixture(scope="module")
def peagle_bundle(tmp_path_factory) -> Path:
    """A bundle of the tiny target with its P-EAGLE head; the tests below leave it unchanged."""
    pe = tmp_path_factory.mktemp("sarec-peagle") / "b"
    r = _cli("engine", "--model", "tiny", "--draft", "models/tiny/draft-peagle", "-o", str(pe))
    assert r.returncode == 0, r.stderr
    return pe


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _refused(argv: list[str], capsys) -> str:
    """The one error line of an in-process CLI run that must exit 2."""
    from eagle3_trt.cli import main

    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    [line] = err.strip().splitlines()
    return line


def test_a_refused_write_changes_no_file(measured, peagle_bundle, tmp_path, capsys):
    """sa_config beside a P-EAGLE head is options no engine serves: recommend --write refuses them in one
    line before it writes anything (it used to write llm_api_options.yaml, then fail on the launch files)."""
    _, chat = measured
    before = _files(peagle_bundle)
    # the chat report as if measured on this bundle (no weights recorded), SA winning: the options check refuses
    mine = _winning(chat) | {"bundle": str(peagle_bundle), "bundle_weights": None}
    (tmp_path / "win.json").write_text(json.dumps(mine))
    line = _refused(["recommend", str(peagle_bundle), "--report", str(tmp_path / "win.json"), "--write"], capsys)
    assert line.startswith("error: speculative_config:") and "hint:" in line, line
    assert _files(peagle_bundle) == before


def test_a_report_measured_on_other_weights_is_refused(measured, peagle_bundle, tmp_path, capsys):
    """recommend applies an alpha report only to the weights it measured (``bundle_weights``): a copy of
    the bundle takes it, a bundle with another draft head is refused in one line, nothing written."""
    from eagle3_trt.cli import main

    bundle, chat = measured
    assert chat["bundle_weights"]
    copy_dir = tmp_path / "copy"
    shutil.copytree(bundle, copy_dir)
    (tmp_path / "chat.json").write_text(json.dumps(chat))
    assert main(["recommend", str(copy_dir), "--report", str(tmp_path / "chat.json")]) == 0
    before = _files(peagle_bundle)
    line = _refused(["recommend", str(peagle_bundle), "--report", str(tmp_path / "chat.json"), "--write"], capsys)
    assert line.startswith(f"error: {tmp_path / 'chat.json'}: measured on {bundle}") and f"eagle3-trt alpha {peagle_bundle}" in line, line
    assert _files(peagle_bundle) == before


def _gate_lines(argv: list[str], capsys) -> list[str]:
    """The acceptance-gate lines an in-process recommend prints ("wrote " taken off)."""
    from eagle3_trt.cli import main

    capsys.readouterr()
    assert main(argv) == 0
    out = capsys.readouterr().out
    return [ln.removeprefix("wrote ") for ln in out.splitlines() if ln.removeprefix("wrote ").startswith("acceptance gate")]


def test_when_sa_wins_recommend_and_write_print_its_gate_and_the_options_match(measured, tmp_path, capsys):
    """SA wins: the gate both commands print is SA's (its break-even through its cost hook, replayed on the
    SA mode's measured turns), and the options --write leaves hold exactly that gate (or none, as said)."""
    import re

    bundle, chat = measured
    mine = tmp_path / "b"
    shutil.copytree(bundle, mine)  # the module's bundle stays as the other tests expect it
    win = _winning(chat)
    assert win["modes"]["sa"]["accepted_seqs"] and len(win["modes"]["sa"]["accepted_seqs"]) == win["modes"]["sa"]["overall"]["requests"]
    (tmp_path / "win.json").write_text(json.dumps(win))
    argv = ["recommend", str(mine), "--report", str(tmp_path / "win.json")]
    shown, written = _gate_lines(argv, capsys), _gate_lines([*argv, "--write"], capsys)
    assert shown == written and len(shown) == 1 and "of sa at K=" in shown[0], (shown, written)
    spec = _spec(mine)
    assert spec["sa_config"]["threshold"] == 6
    m = re.search(r"window (\d+) iterations, threshold ([0-9.]+)", shown[0])
    if m is None:
        assert "acceptance_rate_window_size" not in spec and "not written" in shown[0]
    else:
        assert (spec["acceptance_rate_window_size"], spec["acceptance_rate_threshold"]) == (int(m.group(1)), float(m.group(2)))


def test_a_peagle_bundle_gets_one_line_and_no_gate(measured, peagle_bundle, tmp_path, capsys):
    """No TensorRT-LLM release serves P-EAGLE and vLLM has no acceptance-rate switch-off: both commands say so
    in the same one line and --write leaves no acceptance_rate_* keys (it used to write the chain's gate)."""
    _, chat = measured
    pe = tmp_path / "pe"
    shutil.copytree(peagle_bundle, pe)
    mine = {k: v for k, v in chat.items() if k != "modes"} | {"bundle": str(pe), "bundle_weights": None}
    (tmp_path / "pe.json").write_text(json.dumps(mine))
    argv = ["recommend", str(pe), "--report", str(tmp_path / "pe.json")]
    shown, written = _gate_lines(argv, capsys), _gate_lines([*argv, "--write"], capsys)
    assert shown == written == ["acceptance gate: none for peagle: " + shown[0].split(": ", 2)[2]], shown
    assert "vLLM" in shown[0] and "no acceptance-rate switch-off" in shown[0]
    spec = _spec(pe)
    assert "acceptance_rate_window_size" not in spec and "acceptance_rate_threshold" not in spec
