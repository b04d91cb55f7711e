import pytest

from eagle3_trt.convert.embedded import embedded_pair
from eagle3_trt.errors import UserError
from eagle3_trt.pipeline.presets import available, load_preset, load_preset_file, resolve_source


def test_all_presets_load_with_expected_defaults():
    names = available()
    assert {"tiny", "llama3.1-8b", "llama3.3-70b"} <= set(names)
    p = load_preset("llama3.3-70b")
    assert p.quant.hopper == "fp8" and p.quant.blackwell == "nvfp4"
    assert p.target.hf_id == "meta-llama/Llama-3.3-70B-Instruct"
    # TensorRT-LLM's CI runs this pair at K=4 (test_fp8_eagle3_tp8), the preset's default
    assert p.draft.hf_id == "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B" and p.max_draft_len == 4
    assert load_preset("tiny").target.embedded == "tiny"


def test_unknown_preset_lists_what_exists():
    with pytest.raises(UserError) as e:
        load_preset("llama9-1t")
    assert "llama9-1t" in e.value.line() and "tiny" in e.value.line() and "llama3.3-70b" in e.value.line()


def test_unknown_field_rejected_at_load(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("name: x\ntarget: {source: 'hf:a/b'}\ndraft: {source: 'hf:a/c'}\nmax_draft_lenn: 3\n")
    with pytest.raises(UserError) as e:
        load_preset_file(f)
    assert "max_draft_lenn" in e.value.line()


def test_conflicting_sources_rejected(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("name: x\ntarget: {source: 'embedded:tiny'}\ndraft: {source: 'hf:a/c'}\n")
    with pytest.raises(UserError, match="both be embedded"):
        load_preset_file(f)


def test_missing_local_override_and_missing_hub_model(tmp_path, monkeypatch):
    p = load_preset("llama3.1-8b")
    with pytest.raises(UserError, match="does not exist"):
        resolve_source(p.target, str(tmp_path / "nope"), "target")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(UserError) as e:
        resolve_source(p.target, None, "target")
    assert "TARGET=" in e.value.line() and "meta-llama/Llama-3.1-8B-Instruct" in e.value.line()


def test_hf_cache_snapshot_is_found(tmp_path, monkeypatch):
    snap = tmp_path / "models--org--m" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (tmp_path / "models--org--m" / "refs").mkdir()
    (tmp_path / "models--org--m" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    from eagle3_trt.pipeline.presets import Source

    assert resolve_source(Source(source="hf:org/m"), None, "target") == snap


def test_an_absent_embedded_pair_is_a_user_error_naming_it():
    # models/ always ships, so there is no stand-in to make: the name is refused
    with pytest.raises(UserError) as e:
        embedded_pair("no-such-pair")
    assert e.value.where == "embedded:no-such-pair"
