"""The one rope block (issue 27): every bundle config.json, whatever ``--quant``, carries the rope the reference
runtime measured in every spelling, and every TensorRT-LLM release reads it back the same way.

- the simulated loaders of formats/rope_releases.py equal the installed transformers' ``AutoConfig`` (5.x in .venv,
  4.57 in .venv-compat: both run this file), so the per-release readings below rest on the real library;
- the normalised block reads as the measured rope under transformers 4.57 and 5 rules (TensorRT-LLM 1.2, the
  4.57-pinned 1.3 candidates, 1.3.0rc15+), and through the installed ``AutoConfig`` itself;
- the bf16, fp8 and nvfp4 builds, the native copy and the dry run write the same block from one source;
- a value spelled twice with two values is refused on the command line in one line naming both;
- ``compile --check-only --trtllm-version V`` catches a hand-edited bundle the way V would load it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import transformers
from transformers import AutoConfig

from eagle3_trt.errors import UserError
from eagle3_trt.formats import rope_block, rope_params, rope_releases
from eagle3_trt.formats.families import family_named, family_of_config
from eagle3_trt.formats.hf_compat import flat_rope_parameters
from eagle3_trt.pipeline.trtllm_versions import rope_reader

INSTALLED = "5" if transformers.__version__.startswith("5") else "4.57"
TINY = dict(
    model_type="llama",
    architectures=["LlamaForCausalLM"],
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=101,
    max_position_embeddings=1024,
    rms_norm_eps=1e-5,
)
L3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor", "original_max_position_embeddings")

# configs a user may bring (each spelling once, or twice with one value); the normalised block must read alike
SOURCES = {
    "plain 4.57 spelling": {"rope_theta": 500000.0},
    "plain 5 spelling": {"rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}},
    "llama3 original at the top level only": {"rope_theta": 500000.0, "original_max_position_embeddings": 128, "rope_scaling": dict(L3)},
    "llama3 in rope_parameters only": {"rope_parameters": {"rope_theta": 500000.0, **L3, "original_max_position_embeddings": 128}},
    "llama3 both spellings agreeing": {
        "rope_theta": 500000.0,
        "original_max_position_embeddings": 128,
        "rope_scaling": {**L3, "original_max_position_embeddings": 128},
        "rope_parameters": {"rope_theta": 500000.0, **L3, "original_max_position_embeddings": 128},
    },
    "yarn without original": {"rope_theta": 10000.0, "max_position_embeddings": 4096, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
    "linear under type beside rope_type": {"rope_theta": 10000.0, "rope_scaling": {"type": "linear", "rope_type": "llama3", "factor": 2.0}},
    "partial rotary at the top level": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    "partial rotary in rope_parameters only": {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default", "partial_rotary_factor": 0.5}},
    "partial rotary as rotary_dim": {"rope_theta": 10000.0, "rotary_dim": 8},
}
# the three configs, and their relatives: a value spelled twice with two values
DISAGREE = {
    "partial_rotary_factor": (
        {"rope_theta": 10000.0, "partial_rotary_factor": 0.5, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default", "partial_rotary_factor": 1.0}},
        "partial_rotary_factor: 0.5, but rope_parameters.partial_rotary_factor is 1.0",
    ),
    "original_max_position_embeddings": (
        {
            "rope_theta": 10000.0,
            "original_max_position_embeddings": 128,
            "rope_parameters": {"rope_theta": 10000.0, **L3, "original_max_position_embeddings": 200000},
        },
        "original_max_position_embeddings: 128, but rope_parameters.original_max_position_embeddings is 200000",
    ),
    "rope_theta": (
        {"rope_theta": 500000.0, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}},
        "rope_theta: 500000.0, but rope_parameters.rope_theta is 10000.0",
    ),
    "original in rope_scaling": (
        {"rope_theta": 10000.0, "original_max_position_embeddings": 128, "rope_scaling": {**L3, "original_max_position_embeddings": 200000}},
        "original_max_position_embeddings: 128, but rope_scaling.original_max_position_embeddings is 200000",
    ),
    "rope_scaling against rope_parameters": (
        {
            "rope_theta": 10000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "linear", "factor": 4.0},
        },
        "rope_scaling.factor: 2.0, but rope_parameters.factor is 4.0",
    ),
}
READERS = [rope_releases.Reader("4.57", False, "1.2"), rope_releases.Reader("4.57", True, "1.3rc<15 merging"), rope_releases.Reader("5", True, "1.3.0rc15+")]


def _autoconfig(cfg: dict, tmp_path: Path):
    d = tmp_path / f"c{len(list(tmp_path.iterdir()))}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return AutoConfig.from_pretrained(str(d))


def _simulated(cfg: dict) -> dict | str:
    try:
        attrs = rope_releases.attributes_5(cfg) if INSTALLED == "5" else rope_releases.attributes_4_57(cfg, "c")
    except UserError as e:
        return "refused: " + e.what.split(":")[0]
    return {k: attrs.get(k) for k in KEYS}


@pytest.mark.parametrize("name", [*SOURCES, *DISAGREE])
def test_simulated_loading_is_the_installed_transformers(name, tmp_path):
    """What rope_releases says the installed generation's AutoConfig holds is what it holds (both venvs run this)."""
    extra = SOURCES[name] if name in SOURCES else DISAGREE[name][0]
    cfg = {**TINY, **json.loads(json.dumps(extra))}
    try:
        real = _autoconfig(cfg, tmp_path)
    except KeyError as e:  # a required key missing: which ones, as the simulation names them
        missing = sorted(str(e).split("{")[1].split("}")[0].replace("'", "").split(", "))
        assert _simulated(cfg) == f"refused: has no {', '.join(missing)}"
        return
    assert {k: getattr(real, k, None) for k in KEYS} == _simulated(cfg)


def test_llama3_without_its_key_is_a_load_error_in_4_57_only(tmp_path):
    cfg = {**TINY, **SOURCES["llama3 original at the top level only"]}
    if INSTALLED == "4.57":
        with pytest.raises(KeyError, match="original_max_position_embeddings"):
            _autoconfig(cfg, tmp_path)
    else:  # transformers 5 fills max_position_embeddings, not the top-level 128
        assert _autoconfig(cfg, tmp_path).rope_parameters["original_max_position_embeddings"] == 1024
    with pytest.raises(UserError, match="rope_scaling: has no original_max_position_embeddings: transformers 4.57 raises KeyError"):
        rope_releases.served(cfg, READERS[0], "t/config.json", None)
    # the source itself is measured with TensorRT-LLM 1.2's rule (top level first), which the block writes out
    assert rope_params.from_raw_config(cfg).original_max_positions == 128
    assert rope_block.normalised(cfg)["rope_scaling"]["original_max_position_embeddings"] == 128


@pytest.mark.parametrize("name", SOURCES)
def test_block_reads_as_measured_in_every_release(name):
    src = {**TINY, **SOURCES[name]}
    measured = rope_params.from_raw_config(src)
    out = rope_block.normalised(src)
    assert rope_params.same_function(rope_params.from_raw_config(out), measured)
    for reader in READERS:
        for p in rope_releases.served(out, reader, "c", None):
            assert rope_params.same_function(p, measured), (reader, rope_params.describe(p), rope_params.describe(measured))
    assert rope_block.normalised(out) == out  # idempotent: a bundle's config is its own normal form


SHIPPED_TARGETS = sorted((Path(__file__).resolve().parents[1] / "models").glob("*/target/config.json"))


@pytest.mark.parametrize("path", SHIPPED_TARGETS, ids=lambda p: p.parent.parent.name)
def test_shipped_targets_spell_their_rope_every_way(path):
    """The embedded targets are saved by transformers 5 (rope_parameters alone); make_tiny_pair rewrites their
    config.json in every spelling, so transformers 4.57 (TensorRT-LLM 1.2's containers, make test-compat)
    builds the same model: before, it read theta 10,000 (gpt-oss: its class's yarn) and the cross-checks
    against transformers failed there. Every release reads the rope the runtime measures, and so does the
    installed AutoConfig."""
    cfg = json.loads(path.read_text())
    fam = family_of_config(cfg, str(path))
    assert rope_block.normalised(cfg, family=fam) == cfg
    measured = rope_params.from_raw_config(cfg, str(path), fam)
    for reader in READERS:
        for served in rope_releases.served(cfg, reader, str(path), fam):
            assert rope_params.same_function(served, measured), (reader, rope_params.describe(served))
    real = AutoConfig.from_pretrained(str(path.parent))
    theta = real.rope_theta if INSTALLED == "4.57" else flat_rope_parameters(real.to_dict())["rope_theta"]
    assert theta == measured.theta


def test_sources_are_read_differently_by_the_releases_before_normalising():
    """Not vacuous: most sources above load as another rope (or not at all) in some release as they are."""
    differ = []
    for name, extra in SOURCES.items():
        src = {**TINY, **extra}
        measured = rope_params.from_raw_config(src)
        try:
            readings = [p for r in READERS for p in rope_releases.served(src, r, "c", None)]
        except UserError:
            differ.append(name)
            continue
        if not all(rope_params.same_function(p, measured) for p in readings):
            differ.append(name)
    assert set(differ) >= {
        "plain 5 spelling",  # 4.57 defaults rope_theta to 10000
        "llama3 original at the top level only",  # 4.57 KeyError, 5 fills max_position_embeddings
        "llama3 in rope_parameters only",
        "partial rotary in rope_parameters only",  # 1.2 rotates the whole head
        "yarn without original",  # transformers 5 fills max_position_embeddings, TensorRT-LLM 1.2 takes 1024
    }


@pytest.mark.parametrize("name", SOURCES)
def test_block_round_trips_through_autoconfig(name, tmp_path):
    """The normalised config loaded by the installed transformers, its attributes read as TensorRT-LLM's
    RopeParams.from_config reads them (with and without merging rope_parameters: every release on this
    generation), and saved again by transformers and re-normalised: the measured rope throughout."""
    src = {**TINY, **SOURCES[name]}
    measured = rope_params.from_raw_config(src)
    out = rope_block.normalised(src)
    real = _autoconfig(out, tmp_path)
    attrs = {**out, **{k: getattr(real, k) for k in KEYS if getattr(real, k, None) is not None}}
    if INSTALLED == "5":
        attrs.pop("rope_theta", None)  # no attribute in 5.x (rope_parameters holds it)
    for merge in (False, True) if INSTALLED == "4.57" else (True,):
        view = {**attrs, **(flat_rope_parameters(attrs) or {})} if merge else attrs
        p = rope_params.from_attributes(view, float(view.get("rope_theta") or 1e4), view.get("rope_scaling") or None, "c", merge=False)
        assert rope_params.same_function(p, measured), (merge, rope_params.describe(p))
    real.save_pretrained(str(tmp_path / "saved"))
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert rope_params.same_function(rope_params.from_raw_config(rope_block.normalised(saved)), measured)


@pytest.mark.parametrize("name", DISAGREE)
def test_a_value_spelled_twice_with_two_values_is_refused(name):
    cfg, text = DISAGREE[name]
    with pytest.raises(UserError) as e:
        rope_params.from_raw_config({**TINY, **cfg}, "t/config.json")
    assert text in e.value.line() and e.value.where.startswith("t/config.json:") and "\n" not in e.value.line()
    with pytest.raises(UserError):
        rope_block.normalised({**TINY, **cfg}, where="t/config.json")


def test_families_keep_their_rules_in_the_block():
    """Qwen3 (partial_rotary_factor only) and gpt-oss (yarn from rope_scaling alone) read the block as measured."""
    q = {**TINY, "model_type": "qwen3", "partial_rotary_factor": 0.5, "rope_theta": 1e6}
    go = {
        **TINY,
        "model_type": "gpt_oss",
        "rope_theta": 150000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096},
    }
    for cfg, fam in ((q, family_named("qwen3")), (go, family_named("gpt-oss"))):
        measured = rope_params.from_raw_config(cfg, family=fam)
        out = rope_block.normalised(cfg, family=fam)
        for reader in READERS:
            for p in rope_releases.served(out, reader, "c", fam):
                assert rope_params.same_function(p, measured)
    assert rope_block.normalised(go, family=family_named("gpt-oss"))["rope_scaling"]["truncate"] is False  # keys TensorRT-LLM reads kept


def test_release_readers_follow_the_pinned_transformers():
    assert [r.transformers for r in rope_reader("1.2.1")] == ["4.57"] and rope_reader("1.2.1")[0].merges is False
    assert [(r.transformers, r.merges) for r in rope_reader("1.3.0rc8")] == [("4.57", None)]
    assert [(r.transformers, r.merges) for r in rope_reader("1.3.0rc15")] == [("5", True)]
    assert [(r.transformers, r.merges) for r in rope_reader("1.4.0rc1")] == [("5", True)]
    assert {r.transformers for r in rope_reader(None)} == {"4.57", "5"}


# ---------------------------------------------------------------------------------------------
# Bundles: every writer, the CLI, compile --check-only
# ---------------------------------------------------------------------------------------------
ROPE_TARGET = {"rope_theta": 500000.0, "original_max_position_embeddings": 64, "rope_scaling": dict(L3)}  # the BF16 case


@pytest.fixture(scope="module")
def rope_pair(tmp_path_factory) -> tuple[Path, Path]:
    from eagle3_trt.testing.tiny_pair import make_pair

    t, d = make_pair(tmp_path_factory.mktemp("rope-pair"))
    cfg = json.loads((t / "config.json").read_text())
    for k in KEYS:
        cfg.pop(k, None)
    (t / "config.json").write_text(json.dumps({**cfg, **ROPE_TARGET}))
    dcfg = json.loads((d / "config.json").read_text())
    dcfg["rope_scaling"] = {"rope_type": "yarn", "factor": 2.0}  # no original: TensorRT-LLM's 1024 made explicit
    (d / "config.json").write_text(json.dumps(dcfg))
    return t, d


@pytest.fixture(scope="module")
def bundles(rope_pair, tmp_path_factory) -> dict[str, Path]:
    from eagle3_trt.pipeline.builder import EngineRequest, build_bundle
    from eagle3_trt.pipeline.presets import load_preset

    t, d = rope_pair
    out = tmp_path_factory.mktemp("rope-bundles")
    runs = {
        "bf16": dict(target_gpu="h100", quant="bf16"),
        "fp8": dict(target_gpu="h100", quant="fp8"),
        "nvfp4": dict(target_gpu="b200", quant="nvfp4", quantize_draft=True),
        "dry": dict(target_gpu="h100", quant="fp8", dry_run=True),
    }
    return {
        name: build_bundle(
            EngineRequest(preset=load_preset("tiny"), target=str(t), draft=str(d), out=str(out / name), calib_samples=2, calib_max_length=32, **kw)
        ).bundle
        for name, kw in runs.items()
    }


def _block(cfg: dict) -> dict:
    return {k: cfg[k] for k in rope_block.ROPE_KEYS if k in cfg}


def test_every_quant_path_writes_the_same_block(rope_pair, bundles, tmp_path):
    from eagle3_trt.convert import export

    t, d = rope_pair
    src = json.loads((t / "config.json").read_text())
    want = rope_block.rope_block(src)
    export.export_target_native(t, tmp_path / "native")  # --quant native's writer (gpt-oss's MXFP4 path)
    written = {name: json.loads((b / "target" / "config.json").read_text()) for name, b in bundles.items()}
    written["native"] = json.loads((tmp_path / "native" / "config.json").read_text())
    for name, cfg in written.items():
        assert _block(cfg) == want, name
    assert want["rope_scaling"]["original_max_position_embeddings"] == 64 == want["rope_parameters"]["original_max_position_embeddings"]
    drafts = {name: _block(json.loads((b / "draft" / "config.json").read_text())) for name, b in bundles.items()}
    assert all(v == drafts["bf16"] for v in drafts.values()), drafts
    assert drafts["bf16"]["rope_scaling"]["original_max_position_embeddings"] == 1024 == drafts["bf16"]["rope_parameters"]["original_max_position_embeddings"]
    # what was measured: the runtime's reading of the bundle is the source's
    measured = rope_params.from_raw_config(src)
    assert measured.original_max_positions == 64 and measured.kind == "llama3"
    assert all(rope_params.same_function(rope_params.from_raw_config(cfg), measured) for cfg in written.values())


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eagle3_trt.cli", *argv], capture_output=True, text=True, timeout=300)


def _one_line_refusal(res: subprocess.CompletedProcess, *texts: str) -> None:
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, res.stderr
    for text in texts:
        assert text in errors[0], errors[0]


def test_cli_refuses_two_values_naming_both(rope_pair, tmp_path):
    """The issue's partial-rotary config through `validate`: one line, both fields, both values, a hint."""
    t, d = rope_pair
    tt = tmp_path / "target"
    shutil.copytree(t, tt)
    cfg = json.loads((tt / "config.json").read_text())
    cfg.update(DISAGREE["partial_rotary_factor"][0])
    for k in ("rope_scaling", "original_max_position_embeddings"):
        cfg.pop(k)
    (tt / "config.json").write_text(json.dumps(cfg))
    res = _cli("validate", "--target", str(tt), "--draft", str(d))
    _one_line_refusal(res, f"{tt / 'config.json'}:partial_rotary_factor: 0.5, but rope_parameters.partial_rotary_factor is 1.0", "hint: ")


def test_compile_check_only_reads_as_the_release(bundles, tmp_path, capsys):
    """A hand-edited bundle: each release's transformers rules decide (1.2: 4.57; 1.4: 5.x). In process
    (eagle3_trt.cli.main, what the console script runs): a new interpreter per call would cost seconds each."""
    from eagle3_trt.cli import main as cli_main

    def _cli(*argv: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        rc = cli_main(list(argv))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(argv, 0 if rc is None else rc, out, err)

    b = tmp_path / "b"
    shutil.copytree(bundles["dry"], b)
    cfg_path = b / "target" / "config.json"
    good = json.loads(cfg_path.read_text())
    for v in ("1.2.1", "1.3.0rc8", "1.4.0rc1"):
        res = _cli("compile", str(b), "--check-only", "--trtllm-version", v)
        assert res.returncode == 0, res.stderr
    # the llama3 key dropped from rope_scaling (the BF16 bundle): 4.57 cannot load it, 5.x fills 1024
    cfg_path.write_text(json.dumps({**good, "rope_scaling": dict(L3)}))
    _one_line_refusal(_cli("compile", str(b), "--check-only", "--trtllm-version", "1.2.1"), "rope_scaling: has no original_max_position_embeddings")
    cfg_path.write_text(json.dumps({**good, "rope_scaling": dict(L3), "rope_parameters": None}))
    _one_line_refusal(
        _cli("compile", str(b), "--check-only", "--trtllm-version", "1.4.0rc1"),
        "TensorRT-LLM 1.4.0rc1 (transformers 5) serves rope_theta 500000, llama3 factor 8, original_max_position_embeddings 1024",
        "measured rope_theta 500000, llama3 factor 8, original_max_position_embeddings 64",
    )
    # the rope left in rope_parameters only (the transformers-5 spelling): 1.2 (transformers 4.57) serves plain rope
    # at its default theta 10000, 1.4 reads it
    cfg_path.write_text(json.dumps({k: v for k, v in good.items() if k not in ("rope_theta", "rope_scaling")}))
    _one_line_refusal(
        _cli("compile", str(b), "--check-only", "--trtllm-version", "1.2.1"), "TensorRT-LLM 1.2.1 (transformers 4.57) serves rope_theta 10000, none;"
    )
    assert _cli("compile", str(b), "--check-only", "--trtllm-version", "1.4.0rc1").returncode == 0
    # rope_theta dropped from the top level alone: transformers 5 rebuilds rope_parameters from rope_scaling, so 1.4
    # too serves its default theta
    cfg_path.write_text(json.dumps({k: v for k, v in good.items() if k != "rope_theta"}))
    _one_line_refusal(_cli("compile", str(b), "--check-only", "--trtllm-version", "1.4.0rc1"), "serves rope_theta 10000, llama3")
    # the partial-rotary spelling written into a bundle by hand: refused whatever the release
    cfg_path.write_text(json.dumps({**good, "partial_rotary_factor": 0.5, "rope_parameters": {**good["rope_parameters"], "partial_rotary_factor": 1.0}}))
    _one_line_refusal(
        _cli("compile", str(b), "--check-only", "--trtllm-version", "1.2.1"), "partial_rotary_factor: 0.5, but rope_parameters.partial_rotary_factor is"
    )
