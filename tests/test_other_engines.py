"""Launchers for vLLM, SGLang and trtllm-serve written into a bundle, and the table of options
that differ between TensorRT-LLM releases.

The engines are not installed here, so each script is run with a stand-in executable on PATH
that records the argv it receives (and its working directory): that checks the shell (quoting,
$BUNDLE from the script's own location, a moved bundle whose path has a space, quote, & and |),
the options against each engine's documented names, and that the trtllm-serve options file it
hands over has absolute paths that resolve from any working directory, as the ranks other than
0 of a multi-node launch need. Where vLLM / SGLang are installed, their own argument definitions
are used too. The TensorRT-LLM release is detected from package metadata, which a test fakes
with a real dist-info folder on PYTHONPATH.
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

from eagle3_trt.errors import UserError
from eagle3_trt.pipeline import bundle as fmt
from eagle3_trt.pipeline import bundle_write
from eagle3_trt.pipeline import other_engines as oe
from eagle3_trt.pipeline import trtllm_adapter as ad
from eagle3_trt.pipeline import trtllm_versions as tv
from eagle3_trt.pipeline.builder import EngineRequest, build_bundle
from eagle3_trt.pipeline.presets import load_preset

RECORDER = """#!{python}
import json, os, sys
with open(os.environ["ARGV_OUT"], "w") as f:
    json.dump({{"argv": sys.argv, "cwd": os.getcwd()}}, f)
"""


def write_recommendation(bundle: Path, k: int, **kw) -> None:
    """What `recommend --write` does: new options through bundle.update, which re-renders launch/."""
    bundle_write.update(bundle, options=ad.recommend(fmt.open_bundle(bundle).options, k, **kw))


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
    e = {k: v for k, v in os.environ.items() if k not in ("HOST", "PORT", "TRTLLM_VERSION", "PYTHONPATH")}
    e.update(PATH=f"{stub_bin}:{os.environ['PATH']}", ARGV_OUT=str(out), PYTHON=str(stub_bin / "fake-python"), TMPDIR=str(tmp_path), **(env or {}))
    r = subprocess.run(["bash", str(bundle / "launch" / name), *extra], env=e, cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text()) | {"stderr": r.stderr}


def context_len(bundle: Path) -> int:
    """The smaller of the bundle's max_seq_len and the draft's max_position_embeddings."""
    draft_positions = json.loads((bundle / "draft" / "config.json").read_text())["max_position_embeddings"]
    return min(fmt.read_options(bundle).max_seq_len, draft_positions)


def opt(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_files_and_syntax(moved_bundle):
    launch = moved_bundle / "launch"
    dynamo = [
        "dynamo-k8s.yaml",
        "dynamo-trtllm-decode.yaml",
        "dynamo-trtllm-disagg.sh",
        "dynamo-trtllm-prefill.yaml",
        "dynamo-trtllm.sh",
        "dynamo-trtllm.yaml",
    ]  # build/dynamo_launch.py (tests/test_dynamo_launch.py)
    assert sorted(p.name for p in launch.iterdir()) == sorted(
        ["README.md", "sglang.sh", "trtllm-serve-1.2.yaml", "trtllm-serve.sh", "trtllm-serve.yaml", "vllm.sh", *dynamo]
    )
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
    # a context the draft supports (vLLM #48894: a device assert past the draft's positions)
    assert opt(argv, "--max-model-len") == str(context_len(moved_bundle)) and opt(argv, "--max-num-seqs") == str(opts.max_batch_size)
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
    assert opt(argv, "--kv-cache-dtype") == "fp8_e4m3" and opt(argv, "--context-length") == str(context_len(moved_bundle))
    assert opt(argv, "--host") == "0.0.0.0" and opt(argv, "--port") == "31000"
    assert {a for a in argv if a.startswith("--")} <= oe.SGLANG_OPTIONS


def absolute_options(bundle: Path, shipped: str) -> dict:
    """The shipped options file with its bundle-relative paths made absolute (what the script must pass)."""
    d = yaml.safe_load((bundle / "launch" / shipped).read_text())
    d["tokenizer"] = str(bundle / d["tokenizer"])
    d["speculative_config"]["speculative_model_dir"] = str(bundle / d["speculative_config"]["speculative_model_dir"])
    return d


def passed_options(r: dict) -> dict:
    return yaml.safe_load(Path(opt(r["argv"][1:], "--extra_llm_api_options")).read_text())


def test_trtllm_serve_launch(moved_bundle, stub_bin, tmp_path):
    r = run_script(moved_bundle, "trtllm-serve.sh", stub_bin, tmp_path)
    argv = r["argv"][1:]
    assert argv[0] == str(moved_bundle / "target") and r["cwd"] == str(tmp_path)  # no cd: every path is absolute
    cfg_path = Path(opt(argv, "--extra_llm_api_options"))
    assert cfg_path.parent == tmp_path and cfg_path.name.startswith("eagle3-trtllm-serve.")  # in $TMPDIR
    cfg = yaml.safe_load(cfg_path.read_text())
    assert cfg == absolute_options(moved_bundle, "trtllm-serve.yaml")  # the shipped file, paths resolved, nothing else
    spec = cfg["speculative_config"]
    assert spec["max_draft_len"] == 4 and spec["max_concurrency"] == 16
    # A worker rank of a multi-node launch starts elsewhere: the paths must not depend on the cwd.
    for p in (cfg["tokenizer"], spec["speculative_model_dir"]):
        assert Path(p).is_absolute() and (Path(p) / "config.json").is_file()
    assert "model" not in cfg and "backend" not in cfg
    ad.check_names(cfg, ad.documented_names())
    assert {a for a in argv if a.startswith("--")} <= oe.TRTLLM_SERVE_OPTIONS
    assert "version unknown: launch/trtllm-serve.yaml" in r["stderr"]


def test_trtllm_serve_paths_with_quotes_and_sed_characters(moved_bundle, stub_bin, tmp_path):
    b = tmp_path / "it's a & b|c \\ d" / "bundle"
    shutil.copytree(moved_bundle, b)
    r = run_script(b, "trtllm-serve.sh", stub_bin, tmp_path)
    assert passed_options(r) == absolute_options(b, "trtllm-serve.yaml")


def test_trtllm_serve_picks_the_options_of_the_installed_release(moved_bundle, stub_bin, tmp_path):
    b = tmp_path / "b"
    shutil.copytree(moved_bundle, b)
    write_recommendation(b, 4, draft_len_schedule={4: 4, 8: 2, 32: 1})
    # Release detected from package metadata (a real dist-info folder, as pip writes it).
    site = tmp_path / "site" / "tensorrt_llm-1.2.1.dist-info"
    site.mkdir(parents=True)
    (site / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: 1.2.1\n")
    r = run_script(b, "trtllm-serve.sh", stub_bin, tmp_path, env={"PYTHONPATH": str(site.parent)})
    assert "TensorRT-LLM 1.2.1: launch/trtllm-serve-1.2.yaml" in r["stderr"]
    old = passed_options(r)
    assert old == absolute_options(b, "trtllm-serve-1.2.yaml")
    # 1.2.x reads keys as lower bounds and requires batch size 1 (pre-PR #10860 llm_args.py)
    assert old["speculative_config"]["draft_len_schedule"] == {1: 4, 5: 2, 9: 1, 33: 0}
    assert "do not switch speculation off" in (b / "launch" / "trtllm-serve-1.2.yaml").read_text()
    new = passed_options(run_script(b, "trtllm-serve.sh", stub_bin, tmp_path, env={"TRTLLM_VERSION": "1.3.0rc27"}))
    assert new["speculative_config"]["draft_len_schedule"] == {4: 4, 8: 2, 32: 1}
    e = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    e.update(PATH=f"{stub_bin}:{os.environ['PATH']}", TRTLLM_VERSION="1.1.0", ARGV_OUT=str(tmp_path / "x.json"))
    bad = subprocess.run(["bash", str(b / "launch" / "trtllm-serve.sh")], env=e, capture_output=True, text=True)
    assert bad.returncode == 2 and "older than 1.2.0" in bad.stderr and not (tmp_path / "x.json").exists()


def effective_draft_len(schedule: dict[int, int], batch: int, lower_bounds: bool) -> int:
    """What a release does with a schedule: pre-#10860 keys are lower bounds, later ones upper bounds."""
    if lower_bounds:
        return [k for b, k in sorted(schedule.items()) if b <= batch][-1]
    return next((k for b, k in sorted(schedule.items()) if batch <= b), 0)


@pytest.mark.parametrize("schedule", [{4: 4, 8: 2, 32: 1}, {1: 3}, {16: 4}, {2: 5, 3: 0}])
def test_old_schedule_means_the_same(schedule):
    old = tv.old_schedule(schedule)
    assert min(old) == 1 and old[1] == schedule[min(schedule)]
    for batch in range(1, 80):
        assert effective_draft_len(old, batch, True) == effective_draft_len(schedule, batch, False), batch


def test_release_gates():
    spec = {"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": "draft"}
    assert tv.spec_for_release(spec, None) == (spec, [])
    assert tv.spec_for_release(spec, "1.3.0rc27") == (spec, [])
    rate = spec | {"acceptance_rate_window_size": 16, "acceptance_rate_threshold": 0.3}
    assert tv.spec_for_release(rate, "1.4.0rc1")[0] == rate
    # 1.2 has no rate gate: left out (the measured K does not depend on it), with a note naming the release
    out, notes = tv.spec_for_release(rate, "1.2.1")
    assert out == spec and any("1.2.1" in n and "acceptance_rate_threshold" in n for n in notes)
    # An installed field list decides over the version number.
    out, notes = tv.spec_for_release(rate, None, frozenset({"acceptance_window", "acceptance_length_threshold", "max_draft_len"}))
    assert out == spec and notes
    with pytest.raises(UserError, match="only one-model"):
        tv.spec_for_release(spec | {"eagle3_one_model": False}, "1.4.0rc1")
    assert tv.spec_for_release(spec | {"eagle3_one_model": False}, "1.3.0rc5")[0]["eagle3_one_model"] is False
    out, notes = tv.spec_for_release(spec | {"max_concurrency": 8}, "1.2.1")
    assert out["max_concurrency"] == 8 and "do not switch speculation off" in notes[0]


def test_adapter_writes_each_release_s_form(moved_bundle):
    opts = ad.recommend(fmt.read_options(moved_bundle), 4, draft_len_schedule={4: 4, 16: 0})
    old = ad.to_llm_kwargs(moved_bundle, opts, version="1.2.1", use_installed=False, check_files=False)
    assert old.kwargs["speculative_config"]["draft_len_schedule"] == {1: 4, 5: 0, 17: 0}
    assert any("do not switch speculation off" in n for n in old.notes)
    new = ad.to_llm_kwargs(moved_bundle, opts, version="1.3.0", use_installed=False, check_files=False)
    assert new.kwargs["speculative_config"]["draft_len_schedule"] == {4: 4, 16: 0}


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
    # the bundle's schedule is TensorRT-LLM 1.3+'s (keys are upper bounds): 9-32 draft 0, so speculation stops above 8
    assert "above 8 concurrent requests" in (b / "launch" / "README.md").read_text()
    assert [p.name for p in b.iterdir() if p.name.startswith(".")] == []
    assert fmt.verify(b) == []  # the new launchers are recorded in the manifest


def test_launchers_refuse_a_kv_cache_other_engines_lack(moved_bundle):
    opts = fmt.read_options(moved_bundle)
    nvfp4_kv = opts.model_copy(update={"kv_cache_config": opts.kv_cache_config.model_copy(update={"dtype": "nvfp4"})})
    with pytest.raises(UserError) as e:
        oe.launcher_files(nvfp4_kv, target_format="nvfp4", draft_format="bf16")
    assert e.value.where.endswith("kv_cache_config.dtype")


@pytest.mark.needs("vllm_or_sglang")
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
        raise AssertionError("needs('vllm_or_sglang') guards this test")
