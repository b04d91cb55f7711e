"""Launchers for vLLM, SGLang and trtllm-serve written into a bundle.

The engines are not installed here, so each script is run with a stand-in executable on PATH
that records the argv it receives: that checks the shell (quoting, $BUNDLE from the script's own
location, a moved bundle whose path has a space) and the options against each engine's
documented names. Where vLLM / SGLang are installed, their own argument definitions are used too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eagle3_trt.build import bundle as fmt
from eagle3_trt.build import other_engines as oe
from eagle3_trt.build import trtllm_adapter as ad
from eagle3_trt.build.builder import EngineRequest, build_bundle
from eagle3_trt.build.presets import load_preset
from eagle3_trt.errors import UserError

RECORDER = """#!{python}
import json, os, sys
with open(os.environ["ARGV_OUT"], "w") as f:
    json.dump({{"argv": sys.argv, "cwd": os.getcwd()}}, f)
"""


def write_recommendation(bundle: Path, k: int, **kw) -> None:
    """What `recommend --write` does: new options through bundle.update, which re-renders launch/."""
    fmt.update(bundle, options=ad.recommend(fmt.open_bundle(bundle).options, k, **kw))


@pytest.fixture(scope="module")
def moved_bundle(tmp_path_factory) -> Path:
    """A bundle built in one place, given a recommendation (launchers re-rendered), then moved to a path with a space."""
    root = tmp_path_factory.mktemp("engines")
    b = build_bundle(EngineRequest(preset=load_preset("llama3.1-8b"), out=str(root / "built"), dry_run=True)).bundle
    write_recommendation(b, 4, max_concurrency=16)
    dest = root / "moved here" / "bundle"
    dest.parent.mkdir()
    shutil.move(str(b), dest)
    return dest


@pytest.fixture(scope="module")
def stub_bin(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bin")
    for name in ("vllm", "trtllm-serve", "fake-python"):
        p = d / name
        p.write_text(RECORDER.format(python=sys.executable))
        p.chmod(0o755)
    return d


def run_script(bundle: Path, name: str, stub_bin: Path, tmp_path: Path, *extra: str, env: dict | None = None) -> dict:
    out = tmp_path / f"{name}.json"
    e = {k: v for k, v in os.environ.items() if k not in ("HOST", "PORT")}
    e.update(PATH=f"{stub_bin}:{os.environ['PATH']}", ARGV_OUT=str(out), PYTHON=str(stub_bin / "fake-python"), **(env or {}))
    subprocess.run(["bash", str(bundle / "launch" / name), *extra], check=True, env=e, cwd=tmp_path)
    return json.loads(out.read_text())


def opt(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_files_and_syntax(moved_bundle):
    launch = moved_bundle / "launch"
    assert sorted(p.name for p in launch.iterdir()) == ["README.md", "sglang.sh", "trtllm-serve.sh", "trtllm-serve.yaml", "vllm.sh"]
    for s in launch.glob("*.sh"):
        assert os.access(s, os.X_OK)
        subprocess.run(["bash", "-n", str(s)], check=True)
    readme = (launch / "README.md").read_text()
    assert "K = 4" in readme and "above 16 concurrent requests" in readme


def test_vllm_launch(moved_bundle, stub_bin, tmp_path):
    r = run_script(moved_bundle, "vllm.sh", stub_bin, tmp_path, "--seed", "7")
    argv = r["argv"][1:]
    assert argv[0] == "serve" and argv[1] == str(moved_bundle / "target") and Path(argv[1], "config.json").is_file()
    spec = json.loads(opt(argv, "--speculative-config"))
    assert spec == {"method": "eagle3", "model": str(moved_bundle / "draft"), "num_speculative_tokens": 4}
    assert Path(spec["model"], "config.json").is_file()
    assert opt(argv, "--tokenizer") == str(moved_bundle / "tokenizer")
    assert opt(argv, "--tensor-parallel-size") == "1" and opt(argv, "--kv-cache-dtype") == "fp8"
    opts = fmt.read_options(moved_bundle)
    assert opt(argv, "--max-model-len") == str(opts.max_seq_len) and opt(argv, "--max-num-seqs") == str(opts.max_batch_size)
    assert opt(argv, "--host") == "127.0.0.1" and opt(argv, "--port") == "8000"
    assert argv[-2:] == ["--seed", "7"]  # extra arguments pass through
    assert {a for a in argv if a.startswith("--")} <= oe.VLLM_SERVE_OPTIONS


def test_sglang_launch(moved_bundle, stub_bin, tmp_path):
    r = run_script(moved_bundle, "sglang.sh", stub_bin, tmp_path, env={"HOST": "0.0.0.0", "PORT": "31000"})
    argv = r["argv"][1:]
    assert argv[:2] == ["-m", "sglang.launch_server"]
    assert opt(argv, "--model-path") == str(moved_bundle / "target")
    assert opt(argv, "--speculative-algorithm") == "EAGLE3"
    assert opt(argv, "--speculative-draft-model-path") == str(moved_bundle / "draft")
    # A K-token top-1 chain: K draft steps, K+1 tokens verified.
    assert (opt(argv, "--speculative-num-steps"), opt(argv, "--speculative-eagle-topk"), opt(argv, "--speculative-num-draft-tokens")) == ("4", "1", "5")
    assert opt(argv, "--kv-cache-dtype") == "fp8_e4m3" and opt(argv, "--context-length") == str(fmt.read_options(moved_bundle).max_seq_len)
    assert opt(argv, "--host") == "0.0.0.0" and opt(argv, "--port") == "31000"
    assert {a for a in argv if a.startswith("--")} <= oe.SGLANG_OPTIONS


def test_trtllm_serve_launch(moved_bundle, stub_bin, tmp_path):
    r = run_script(moved_bundle, "trtllm-serve.sh", stub_bin, tmp_path)
    argv = r["argv"][1:]
    assert argv[0] == str(moved_bundle / "target") and r["cwd"] == str(moved_bundle)
    cfg_path = Path(opt(argv, "--extra_llm_api_options"))
    cfg = yaml.safe_load(cfg_path.read_text())
    spec = cfg["speculative_config"]
    assert spec["max_draft_len"] == 4 and spec["max_concurrency"] == 16
    assert (Path(r["cwd"]) / spec["speculative_model_dir"] / "config.json").is_file()  # relative to the bundle
    assert "model" not in cfg and "backend" not in cfg
    ad.check_names(cfg, ad.documented_names())
    assert {a for a in argv if a.startswith("--")} <= oe.TRTLLM_SERVE_OPTIONS


def test_undocumented_options_are_refused():
    with pytest.raises(UserError):
        oe.check_options("vllm", ["--speculative-model", "x"])  # vLLM's removed pre-0.7 flag
    with pytest.raises(UserError):
        oe.check_options("vllm", ["--tensor-parallel-size", "1"], {"method": "eagle", "model": "d", "num_speculative_tokens": 3})
    with pytest.raises(UserError):
        oe.check_options("vllm", ["--kv-cache-dtype", "fp8_e4m3fn"])
    with pytest.raises(UserError):
        oe.check_options("sglang", ["--speculative-draft", "d"])
    with pytest.raises(UserError):
        oe.check_options("sglang", ["--kv-cache-dtype", "fp8"])  # SGLang spells it fp8_e4m3


def test_rewriting_replaces_the_launch_dir(moved_bundle, tmp_path):
    b = tmp_path / "b"
    shutil.copytree(moved_bundle, b)
    write_recommendation(b, 2, draft_len_schedule={1: 2, 8: 1, 32: 0})
    assert "--speculative-num-steps 2" in (b / "launch" / "sglang.sh").read_text()
    assert "above 32 concurrent requests" in (b / "launch" / "README.md").read_text()  # first batch size with K=0
    assert [p.name for p in b.iterdir() if p.name.startswith(".")] == []
    assert fmt.verify(b) == []  # the new launchers are recorded in the manifest


def test_launchers_refuse_a_kv_cache_other_engines_lack(moved_bundle):
    opts = fmt.read_options(moved_bundle)
    nvfp4_kv = opts.model_copy(update={"kv_cache_config": opts.kv_cache_config.model_copy(update={"dtype": "nvfp4"})})
    with pytest.raises(UserError) as e:
        oe.launcher_files(nvfp4_kv, target_format="nvfp4", draft_format="bf16")
    assert e.value.where.endswith("kv_cache_config.dtype")


def test_real_engine_argument_names_where_installed():
    checked = 0
    try:
        from vllm.engine.arg_utils import EngineArgs  # type: ignore[import-not-found]
    except ImportError:
        EngineArgs = None
    if EngineArgs is not None:
        fields = set(EngineArgs.__dataclass_fields__) | {"host", "port"}
        assert {o[2:].replace("-", "_") for o in oe.VLLM_SERVE_OPTIONS} <= fields
        checked += 1
    try:
        from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]
    except ImportError:
        ServerArgs = None
    if ServerArgs is not None:
        fields = set(ServerArgs.__dataclass_fields__)
        assert {o[2:].replace("-", "_") for o in oe.SGLANG_OPTIONS} <= fields
        checked += 1
    if not checked:
        pytest.skip("neither vLLM nor SGLang is installed; checked against their documented names only")
