"""Behaviour checks (eagle3_trt/convert/behaviour.py): what file checks cannot show.

A tokenizer whose ids were shuffled and a head trained for another target of the same shape pass
`validate`; the build and `validate --deep` run the pair on the calibration prompts and refuse them
with the figure they measured, writing nothing. The embedded pairs pass, with their figures in the
bundle's validation record. Every run is the real command line in a new process, with the
suite-wide skip (tests/conftest.py) removed from its environment.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3_trt.convert import behaviour
from eagle3_trt.testing.behaviour_cases import copy_embedded, permute_vocab

ENV = {k: v for k, v in os.environ.items() if k != behaviour.SKIP_ENV} | {"OMP_NUM_THREADS": "1"}
LOSS_LINE = re.compile(
    r"^error: (?P<where>\S+/tokenizer\.json): the target's next-token loss on \d+ calibration prompts is (?P<nats>[\d.]+) nats, "
    r"(?P<ratio>[\d.]+) of log V = (?P<logv>[\d.]+) .*is the tokenizer the model's own\? \(hint: .+\)$"
)
AGREEMENT_LINE = re.compile(
    r"^error: (?P<where>\S+/draft): the draft's top-1 agreement with the target's next token on \d+ calibration prompts is "
    r"(?P<agreement>[\d.]+), (?P<x>[\d.]+)x chance \(1/512 = .*was this head trained for this target\? \(hint: .+\)$"
)


def _cli(*argv: str, env: dict[str, str] = ENV) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eagle3_trt.cli", *argv], capture_output=True, text=True, env=env, timeout=300)


def _refused(p: subprocess.CompletedProcess, pattern: re.Pattern) -> re.Match:
    """One error line, exit 2, no traceback."""
    assert p.returncode == 2, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, p.stderr
    m = pattern.match(lines[0])
    assert m, lines[0]
    return m


def _engine(t: Path, d: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return _cli("engine", "--target", str(t), "--draft", str(d), "--target-gpu", "h100", "--quant", "bf16", "--kv-cache", "auto", "-o", str(out), *extra)


def _nothing_written(out: Path) -> None:
    assert not out.exists()
    assert sorted(p.name for p in out.parent.iterdir()) == ["target_and_draft"], "a staging directory or lock file was left"


def test_permuted_tokenizer_is_refused_by_build_and_validate_deep(tmp_path):
    t, d = copy_embedded("tiny", tmp_path / "target_and_draft")
    permute_vocab(t)
    # the hole: every file check passes
    plain = _cli("validate", "--target", str(t), "--draft", str(d))
    assert plain.returncode == 0, plain.stderr

    out = tmp_path / "bundle"
    m = _refused(_engine(t, d, out), LOSS_LINE)
    assert m["where"] == str(t / "tokenizer.json")
    # measured 1.45 (the trained pair: 0.97); refused above 1.1
    assert float(m["ratio"]) > behaviour.MAX_LOSS_RATIO + 0.2
    assert float(m["logv"]) == pytest.approx(7.62, abs=0.01)  # log 2048
    _nothing_written(out)

    deep = _refused(_cli("validate", "--deep", "--target", str(t), "--draft", str(d)), LOSS_LINE)
    assert deep["ratio"] == m["ratio"]  # the same prompts, the same figure

    # the escape hatch builds it anyway and says so in the validation record
    ok = _engine(t, d, out, "--skip-behaviour-checks")
    assert ok.returncode == 0, ok.stderr[-2000:]
    man = json.loads((out / "manifest.json").read_text())
    assert "--skip-behaviour-checks" in man["validation"]["behaviour"]["skipped"]
    assert "behaviour" not in man["validation"]["checks"]


def test_head_of_another_target_is_refused(tmp_path):
    """tiny-gpt-oss's head on the tiny-qwen3 target: same vocabulary, hidden size, draft vocabulary and aux
    layers, so `validate` passes; trained for another target, it agrees with this one 70x chance (0.138;
    its own head: 226x, 0.442)."""
    t, d = copy_embedded("tiny-qwen3", tmp_path / "target_and_draft", draft_from="tiny-gpt-oss")
    assert _cli("validate", "--target", str(t), "--draft", str(d)).returncode == 0

    out = tmp_path / "bundle"
    m = _refused(_engine(t, d, out), AGREEMENT_LINE)
    assert m["where"] == str(d)
    assert float(m["x"]) < behaviour.MIN_AGREEMENT_OVER_CHANCE * 0.75
    _nothing_written(out)

    deep = _refused(_cli("validate", "--deep", "--target", str(t), "--draft", str(d)), AGREEMENT_LINE)
    assert deep["agreement"] == m["agreement"]


@pytest.mark.parametrize("model", ["tiny", "tiny-qwen3", "tiny-gpt-oss"])
def test_embedded_pairs_pass_and_record_their_figures(model, tmp_path):
    out = tmp_path / "b"
    p = _cli("engine", "--model", model, "--target-gpu", "h100", "-o", str(out))
    assert p.returncode == 0, p.stderr[-2000:]
    man = json.loads((out / "manifest.json").read_text())
    beh = man["validation"]["behaviour"]
    assert "skipped" not in beh
    assert "behaviour" in man["validation"]["checks"]
    # measured: loss 0.94-0.97 of log V, agreement 226x-444x chance
    assert beh["loss_ratio"] < behaviour.MAX_LOSS_RATIO - 0.1
    assert beh["agreement_over_chance"] > behaviour.MIN_AGREEMENT_OVER_CHANCE * 1.5
    assert beh["prompts_file"].endswith("calib_prompts.jsonl")
    assert beh["loss_tokens"] > 100 and beh["agreement_positions"] > 100
    record = json.loads((out / "validation.json").read_text())
    assert record["behaviour"] == beh


def test_dry_run_says_the_checks_were_skipped(tmp_path):
    out = tmp_path / "dry"
    p = _cli("engine", "--model", "tiny", "--target-gpu", "h100", "--dry-run", "-o", str(out))
    assert p.returncode == 0, p.stderr[-2000:]
    man = json.loads((out / "manifest.json").read_text())
    assert man["validation"]["behaviour"]["skipped"].startswith("dry run")
    assert "behaviour" not in man["validation"]["checks"]
    assert json.loads((out / "validation.json").read_text())["behaviour"] == man["validation"]["behaviour"]
