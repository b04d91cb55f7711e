"""Every speculative option the bundle sets reaches each launcher unchanged.

The tiny bundle gets the issue-22 knobs (suffix automaton, draft_len_schedule, acceptance gate,
spec_dec_variant, eagle3_model_arch) through ``bundle_write.update`` (what ``recommend --write``
uses, which re-renders launch/), then: the trtllm-serve options file for TensorRT-LLM 1.3+, the
Dynamo TensorRT-LLM engine files (aggregated, prefill, decode) and a Triton repository written by
the real ``eagle3-trt package`` must carry them as written. The 1.2 launch file leaves out what
1.2 lacks and says so, naming the release.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eagle3_trt.pipeline import bundle_write
from eagle3_trt.pipeline.bundle import open_bundle
from eagle3_trt.speculative.sa.options import SAEnhancerOptions

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> subprocess.CompletedProcess:
    exe = str(Path(sys.executable).with_name("eagle3-trt"))
    return subprocess.run([exe, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("pass") / "b"
    r = _cli("engine", "--model", "tiny", "-o", str(out))
    assert r.returncode == 0, r.stderr
    opts = open_bundle(out).options
    k = opts.speculative_config.max_draft_len
    knobs = {
        "sa_config": SAEnhancerOptions(threshold=6, enable_global_pool=True),
        "max_concurrency": None,
        "draft_len_schedule": {2: k, 8: 1},
        "acceptance_rate_window_size": 32,
        "acceptance_rate_threshold": 0.35,
        "spec_dec_variant": 2,
        "eagle3_model_arch": "llama3",
    }
    spec = opts.speculative_config.model_copy(update=knobs)
    bundle_write.update(out, options=opts.model_copy(update={"speculative_config": spec}))
    want = {
        "sa_config": {"threshold": 6, "enable_global_pool": True},
        "draft_len_schedule": {2: k, 8: 1},
        "acceptance_rate_window_size": 32,
        "acceptance_rate_threshold": 0.35,
        "spec_dec_variant": 2,
        "eagle3_model_arch": "llama3",
        "max_draft_len": k,
    }
    return out, want


def _carries(spec: dict, want: dict) -> None:
    got = {key: spec.get(key) for key in want}
    if got.get("draft_len_schedule"):
        got["draft_len_schedule"] = {int(b): v for b, v in got["draft_len_schedule"].items()}
    assert got == want


def test_options_file_and_launchers_carry_the_knobs(bundle):
    b, want = bundle
    _carries(yaml.safe_load((b / "llm_api_options.yaml").read_text())["speculative_config"], want)
    _carries(yaml.safe_load((b / "launch" / "trtllm-serve.yaml").read_text())["speculative_config"], want)
    for name in ("dynamo-trtllm.yaml", "dynamo-trtllm-prefill.yaml", "dynamo-trtllm-decode.yaml"):
        _carries(yaml.safe_load((b / "launch" / name).read_text())["speculative_config"], want)


def test_release_1_2_file_leaves_out_what_it_lacks_and_says_so(bundle):
    b, _ = bundle
    text = (b / "launch" / "trtllm-serve-1.2.yaml").read_text()
    spec = yaml.safe_load(text)["speculative_config"]
    for key in ("sa_config", "spec_dec_variant", "eagle3_model_arch", "acceptance_rate_threshold", "acceptance_rate_window_size"):
        assert key not in spec
    assert "# NOTE: TensorRT-LLM 1.2: spec_dec_variant: 2 left out" in text
    assert "# NOTE: TensorRT-LLM 1.2: eagle3_model_arch: llama3 left out" in text
    assert spec["draft_len_schedule"] == {1: want_k(b), 3: 1, 9: 0}  # lower-bound keys, batch size 1 first


def want_k(b: Path) -> int:
    return open_bundle(b).options.speculative_config.max_draft_len


def test_triton_repository_carries_the_knobs(bundle, tmp_path):
    b, want = bundle
    r = _cli("package", str(b), "-o", str(tmp_path / "repo"), "--runtime", "trtllm")
    assert r.returncode == 0, r.stderr
    model = yaml.safe_load((tmp_path / "repo" / "eagle3" / "1" / "model.yaml").read_text())
    _carries(model["speculative_config"], want)
