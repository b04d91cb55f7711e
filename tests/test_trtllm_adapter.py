"""TensorRT-LLM adapter: bundle options -> LLM(...) kwargs, checked on CPU against the documented
option names and constraints; the checks against an installed TensorRT-LLM run where it exists."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eagle3_trt.errors import UserError
from eagle3_trt.pipeline import bundle as fmt
from eagle3_trt.pipeline import bundle_write, llm_options, other_engines
from eagle3_trt.pipeline import trtllm_adapter as ad
from eagle3_trt.pipeline import trtllm_names as tn
from eagle3_trt.pipeline import trtllm_versions as tv
from eagle3_trt.pipeline.builder import EngineRequest, build_bundle
from eagle3_trt.pipeline.presets import load_preset


def kwargs_for(bundle: Path, **kw) -> ad.LlmKwargs:
    """The adapter on a bundle read the one way every stage reads it (build/bundle.open_bundle)."""
    return ad.to_llm_kwargs(bundle, fmt.open_bundle(bundle).options, **kw)


def write_recommendation(bundle: Path, k: int, **kw) -> llm_options.LlmApiOptions:
    """What `recommend --write` does: the adapter's options, written by bundle.update."""
    return bundle_write.update(bundle, options=ad.recommend(fmt.open_bundle(bundle).options, k, **kw)).options


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    """A real bundle from the builder: Llama-3.1-8B dry run (configs only, no weights), plus the
    tokenizer files a full build copies into target/."""
    import shutil

    from eagle3_trt.testing.tiny_pair import TOKENIZER_DIR

    out = tmp_path_factory.mktemp("adapter") / "llama8b"
    b = build_bundle(EngineRequest(preset=load_preset("llama3.1-8b"), out=str(out), dry_run=True)).bundle
    for f in TOKENIZER_DIR.iterdir():
        shutil.copy(f, b / "target" / f.name)
    return b


@pytest.fixture
def copy(bundle, tmp_path) -> Path:
    import shutil

    dst = tmp_path / "b"
    shutil.copytree(bundle, dst)
    return dst


# --- versions -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "version, key",
    [
        ("1.2.0", "speculative_model_dir"),
        ("1.2.1", "speculative_model_dir"),
        ("1.2.0rc6.post1", "speculative_model_dir"),
        ("1.3.0rc0", "speculative_model"),
        ("1.3.0rc5", "speculative_model"),
        ("1.4.0rc1", "speculative_model"),
        (None, "speculative_model_dir"),
    ],
)
def test_draft_path_key_by_version(version, key):
    assert tv.speculative_model_key(version) == key


def test_installed_field_list_beats_the_version_number():
    assert tv.speculative_model_key("1.2.1", frozenset({"speculative_model", "speculative_model_dir"})) == "speculative_model"
    assert tv.speculative_model_key("9.0", frozenset({"speculative_model_dir", "max_draft_len"})) == "speculative_model_dir"


def test_versions_before_unified_checkpoints_are_refused(bundle):
    with pytest.raises(UserError) as e:
        kwargs_for(bundle, version="1.1.0")
    assert "1.2.0" in e.value.what
    with pytest.raises(UserError):
        tv.parse_version("not-a-version")


# --- kwargs ---------------------------------------------------------------------------------


def test_kwargs_resolve_bundle_paths_and_rename_for_old_releases(bundle):
    res = kwargs_for(bundle, version="1.2.1", use_installed=False)
    kw = res.kwargs
    assert kw["model"] == str((bundle / "target").resolve()) and Path(kw["model"], "config.json").is_file()
    assert Path(kw["tokenizer"]).is_dir()
    spec = kw["speculative_config"]
    assert "speculative_model" not in spec and spec["speculative_model_dir"] == str((bundle / "draft").resolve())
    assert spec["decoding_type"] == "Eagle3" and spec["max_draft_len"] == load_preset("llama3.1-8b").max_draft_len
    assert "eagle3_one_model" not in spec  # True is the default and no longer a field in newer releases
    assert res.names_checked_against.startswith("documented") and res.version == "1.2.1"
    assert any("speculative_model_dir" in n for n in res.notes)
    # The file itself is untouched: the rename happens in the kwargs only.
    assert yaml.safe_load((bundle / ad.OPTIONS_FILE).read_text())["speculative_config"]["speculative_model"] == "draft"


def test_kwargs_for_new_releases_use_speculative_model(bundle):
    spec = kwargs_for(bundle, version="1.3.0rc5", use_installed=False).kwargs["speculative_config"]
    assert spec["speculative_model"] == str((bundle / "draft").resolve()) and "speculative_model_dir" not in spec


def test_unknown_names_are_refused_with_suggestions_before_any_import(bundle):
    with pytest.raises(UserError) as e:
        kwargs_for(bundle, overrides={"max_batch_sise": 8, "kv_cache_config": {"free_gpu_memory_fractio": 0.5}}, use_installed=False)
    msg = e.value.what
    assert "max_batch_sise (did you mean max_batch_size?)" in msg
    assert "kv_cache_config.free_gpu_memory_fractio (did you mean kv_cache_config.free_gpu_memory_fraction?)" in msg
    with pytest.raises(UserError) as e:
        kwargs_for(bundle, overrides={"speculative_config": {"num_speculative_tokens": 4}}, use_installed=False)
    assert "speculative_config.num_speculative_tokens" in e.value.what  # vLLM's name, not TensorRT-LLM's
    # The check never imports TensorRT-LLM (it may not exist, and importing it takes seconds).
    code = (
        f"import sys; from eagle3_trt.pipeline import trtllm_adapter as a; from eagle3_trt.pipeline.bundle import open_bundle; "
        f"a.to_llm_kwargs({str(bundle)!r}, open_bundle({str(bundle)!r}).options, use_installed=False); "
        "assert 'tensorrt_llm' not in sys.modules and 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_overrides_merge_and_keep_the_schema_rules(bundle):
    kw = kwargs_for(bundle, overrides={"kv_cache_config": {"free_gpu_memory_fraction": 0.6}, "enable_iter_perf_stats": True}, use_installed=False).kwargs
    assert kw["kv_cache_config"]["free_gpu_memory_fraction"] == 0.6 and kw["kv_cache_config"]["dtype"] == "fp8"  # merged, not replaced
    assert kw["enable_iter_perf_stats"] is True
    with pytest.raises(UserError) as e:
        kwargs_for(bundle, overrides={"speculative_config": {"max_concurrency": 8, "draft_len_schedule": {1: 3}}}, use_installed=False)
    assert "cannot both be set" in e.value.what
    with pytest.raises(UserError) as e:
        kwargs_for(bundle, overrides={"pipeline_parallel_size": 2}, use_installed=False)
    assert "pipeline parallelism" in e.value.what
    # Either name of the draft path is accepted in an override.
    kw = kwargs_for(bundle, overrides={"speculative_config": {"speculative_model_dir": "draft"}}, version="1.3.0", use_installed=False).kwargs
    assert kw["speculative_config"]["speculative_model"].endswith("draft")


def test_missing_files_and_bad_yaml_name_the_field(copy):
    import shutil

    shutil.rmtree(copy / "draft")
    with pytest.raises(UserError) as e:
        kwargs_for(copy, use_installed=False)
    assert e.value.where.endswith("llm_api_options.yaml:speculative_config.speculative_model_dir")
    (copy / ad.OPTIONS_FILE).write_text("model: target\nspeculative_config: {max_draft_len: 0}\n")
    with pytest.raises(UserError) as e:
        fmt.read_options(copy)
    assert "speculative_config.max_draft_len" in e.value.where
    (copy / ad.OPTIONS_FILE).write_text("tensor_parallel_size: 1\nspeculative_config: {max_draft_len: 3}\nsampler: x\n")
    with pytest.raises(UserError) as e:
        fmt.read_options(copy)
    assert e.value.where.endswith(":sampler")


def test_documented_table_covers_every_option_the_bundle_schema_writes():
    top = set(llm_options.LlmApiOptions.model_fields)
    assert top <= tn.DOCUMENTED_TOP_LEVEL, top - tn.DOCUMENTED_TOP_LEVEL
    for key, cls in (
        ("speculative_config", llm_options.Eagle3Options),
        ("kv_cache_config", llm_options.KvCacheOptions),
        ("cuda_graph_config", llm_options.CudaGraphOptions),
    ):
        names = set(cls.model_fields) - tn.NOT_TRTLLM_NESTED.get(key, frozenset())
        assert names <= tn.DOCUMENTED_NESTED[key], (key, names - tn.DOCUMENTED_NESTED[key])
    # the fields that are not TensorRT-LLM's select a method every TensorRT-LLM path refuses
    assert set(tn.NOT_TRTLLM_NESTED) == {"speculative_config"}
    for name in tn.NOT_TRTLLM_NESTED["speculative_config"]:
        opts = llm_options.LlmApiOptions(speculative_config=llm_options.Eagle3Options(max_draft_len=3, **{name: True}))
        assert other_engines.trtllm_refusal(opts) is not None, name


def test_serve_yaml_is_version_agnostic_and_bundle_relative(bundle):
    y = ad.serve_yaml(fmt.open_bundle(bundle).options)
    assert "model" not in y and "backend" not in y
    assert y["speculative_config"]["speculative_model_dir"] == "draft" and y["tokenizer"] == "target"
    tn.check_names(y, tn.documented_names())


# --- writing the recommendation ---------------------------------------------------------------


def test_recommendation_is_written_atomically_and_validated(copy):
    opts = write_recommendation(copy, 5, max_concurrency=16)
    assert opts.speculative_config.max_draft_len == 5 and opts.speculative_config.max_concurrency == 16
    again = fmt.read_options(copy)
    assert again.speculative_config.max_draft_len == 5 and again.speculative_config.max_concurrency == 16
    assert again.model == "target" and again.cuda_graph_config == opts.cuda_graph_config  # the rest is kept
    assert sorted(p.name for p in copy.iterdir() if p.name.startswith(".")) == []  # no temp files left
    assert fmt.open_bundle(copy).k == 5 and "K = 5" in (copy / "launch" / "README.md").read_text()  # launchers follow

    opts = write_recommendation(copy, 4, draft_len_schedule={1: 4, 32: 2, 64: 0})
    sc = fmt.read_options(copy).speculative_config
    assert sc.draft_len_schedule == {1: 4, 32: 2, 64: 0} and sc.max_concurrency is None
    assert fmt.read_options(copy).cuda_graph_config.enable_padding  # TensorRT-LLM turns padding on with a schedule
    kw = kwargs_for(copy, use_installed=False).kwargs["speculative_config"]
    assert kw["draft_len_schedule"] == {1: 4, 32: 2, 64: 0}

    for bad in ({1: 3, 8: 4}, {1: 2, 8: 1}):  # smallest key must map to K; no value above K
        with pytest.raises(UserError):
            write_recommendation(copy, 4, draft_len_schedule=bad)
    with pytest.raises(UserError):
        write_recommendation(copy, 4, max_concurrency=8, draft_len_schedule={1: 4})
    with pytest.raises(UserError):
        write_recommendation(copy, 0)
    assert fmt.read_options(copy).speculative_config.draft_len_schedule == {1: 4, 32: 2, 64: 0}  # refusals changed nothing
    assert fmt.verify(copy, unrecorded=False) == []  # digests and fingerprint follow every update


# --- against an installed TensorRT-LLM (GPU machines) ------------------------------------------


@pytest.mark.needs("tensorrt_llm")
def test_installed_tensorrt_llm_knows_every_name_we_emit(bundle):
    table = tn.installed_names()
    assert table is not None, "tensorrt_llm is installed but does not import (no GPU driver?)"
    res = kwargs_for(bundle)
    assert res.names_checked_against.startswith("installed")
    key = tv.speculative_model_key(res.version, table.nested.get("speculative_config"))
    assert key in res.kwargs["speculative_config"]
