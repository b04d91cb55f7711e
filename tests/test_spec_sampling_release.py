"""The speculative sampling flags through the toolkit: the options schema, the release table
(speculative/eagle3/sampling_release.py), ``recommend --write`` (measure/sampling_choice.py), and the
engine a bundle is served / measured with (runtime/loader.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from eagle3_trt.core.spec_sampling import SpecSamplingConfig
from eagle3_trt.errors import UserError
from eagle3_trt.measure.sampling_choice import sampling_choice
from eagle3_trt.pipeline import bundle as fmt
from eagle3_trt.pipeline import bundle_write
from eagle3_trt.pipeline import trtllm_adapter as ad
from eagle3_trt.pipeline import trtllm_versions as versions
from eagle3_trt.pipeline.builder import EngineRequest, build_bundle
from eagle3_trt.pipeline.other_engines import trtllm_serve_yamls
from eagle3_trt.pipeline.presets import load_preset

SPEC = {"decoding_type": "Eagle3", "max_draft_len": 3}


@pytest.fixture(scope="module")
def dry(tmp_path_factory) -> Path:
    """A dry-run bundle (configs only) from the builder."""
    out = tmp_path_factory.mktemp("ssr") / "llama8b"
    return build_bundle(EngineRequest(preset=load_preset("llama3.1-8b"), out=str(out), dry_run=True)).bundle


def _with_flags(src: Path, dst: Path, **flags) -> Path:
    shutil.copytree(src, dst)
    opts = fmt.open_bundle(dst).options
    spec = opts.speculative_config.model_copy(update=flags)
    bundle_write.update(dst, options=opts.model_copy(update={"speculative_config": spec}))
    return dst


@pytest.mark.parametrize("version", ["1.3.0rc27", "1.4.0rc1", None])
def test_releases_with_every_flag_keep_them(version):
    spec = {**SPEC, "allow_advanced_sampling": True, "use_rejection_sampling": True, "advanced_sampling_mode": "no_topp"}
    out, notes = versions.spec_for_release(spec, version)
    assert {k: out[k] for k in ("allow_advanced_sampling", "use_rejection_sampling", "advanced_sampling_mode")} == {
        "allow_advanced_sampling": True,
        "use_rejection_sampling": True,
        "advanced_sampling_mode": "no_topp",
    }
    assert not any("sampling" in n for n in notes)


def test_release_table_names_the_keys():
    table = versions.SPEC_KEYS_BY_RELEASE
    assert table["1.2"]["allow_advanced_sampling"] == "allow_advanced_sampling"
    assert table["1.2"]["use_rejection_sampling"] is None and table["1.2"]["advanced_sampling_mode"] is None
    for band in ("1.3", "1.4"):
        assert all(table[band][k] == k for k in ("allow_advanced_sampling", "use_rejection_sampling", "advanced_sampling_mode"))


def test_1_2_drops_defaults_with_a_note_and_refuses_what_changes_the_measured_behaviour():
    spec = {**SPEC, "allow_advanced_sampling": True, "use_rejection_sampling": False, "advanced_sampling_mode": "full"}
    out, notes = versions.spec_for_release(spec, "1.2.1")
    assert out["allow_advanced_sampling"] is True and "use_rejection_sampling" not in out and "advanced_sampling_mode" not in out
    assert any("1.2.1: use_rejection_sampling left out" in n for n in notes) and any("1.2.1: advanced_sampling_mode left out" in n for n in notes)
    with pytest.raises(UserError, match=r"speculative_config\.use_rejection_sampling: TensorRT-LLM 1\.2\.1 has no use_rejection_sampling") as e:
        versions.spec_for_release({**spec, "use_rejection_sampling": True}, "1.2.1")
    assert "\n" not in e.value.line()
    with pytest.raises(UserError, match=r"advanced_sampling_mode: TensorRT-LLM 1\.2\.0 has no advanced_sampling_mode.*top_k and top_p"):
        versions.spec_for_release({**spec, "advanced_sampling_mode": "no_topk"}, "1.2.0")
    # an installed field list decides over the version number
    out, _ = versions.spec_for_release({**spec, "use_rejection_sampling": True}, "1.2.1", spec_fields=frozenset({"use_rejection_sampling"}))
    assert out["use_rejection_sampling"] is True


def test_adapter_and_launchers_per_release(dry, tmp_path):
    b = _with_flags(dry, tmp_path / "b", allow_advanced_sampling=True, use_rejection_sampling=True)
    opts = fmt.open_bundle(b).options
    kw = ad.to_llm_kwargs(b, opts, version="1.4.0rc1", use_installed=False, check_files=False).kwargs
    assert kw["speculative_config"]["use_rejection_sampling"] is True and kw["speculative_config"]["allow_advanced_sampling"] is True
    with pytest.raises(UserError, match=r"use_rejection_sampling: TensorRT-LLM 1\.2\.0 has no use_rejection_sampling"):
        ad.to_llm_kwargs(b, opts, version="1.2.0", use_installed=False, check_files=False)
    # the trtllm-serve files: the 1.2 band leaves the key out (with a note), the current band keeps it
    files = {name: yaml.safe_load(text.split("\n---", 1)[0]) for name, text in trtllm_serve_yamls(opts).items()}
    specs = {name: d["speculative_config"] for name, d in files.items() if isinstance(d, dict) and "speculative_config" in d}
    assert any("use_rejection_sampling" not in s and s.get("allow_advanced_sampling") for s in specs.values())
    assert any(s.get("use_rejection_sampling") is True for s in specs.values())


def test_schema_defaults_and_flags():
    from eagle3_trt.pipeline.llm_options import Eagle3Options

    o = Eagle3Options(max_draft_len=3)
    assert o.sampling_flags() == SpecSamplingConfig() and o.sampling_flags().served == "greedy"
    assert "allow_advanced_sampling" not in o.model_dump(exclude_none=True)  # unset: not written, the release's default
    o = Eagle3Options(max_draft_len=3, allow_advanced_sampling=True, advanced_sampling_mode="no_topk")
    assert o.sampling_flags() == SpecSamplingConfig(allow_advanced_sampling=True, advanced_sampling_mode="no_topk")


def test_recommend_writes_the_measured_flags(dry, tmp_path):
    from eagle3_trt.pipeline.llm_options import Eagle3Options

    spec = Eagle3Options(max_draft_len=3)
    from eagle3_trt.testing.alpha_reports import alpha_report

    flags = {"allow_advanced_sampling": True, "use_rejection_sampling": True, "advanced_sampling_mode": "full", "served": "rejection"}
    measured = alpha_report(settings={"temperature": 0.7, "spec_sampling": flags})
    fields, ev = sampling_choice(measured, spec)
    assert fields == {"allow_advanced_sampling": True, "use_rejection_sampling": True, "advanced_sampling_mode": "full"}
    assert ev["served_at_temperature_above_0"] == "rejection" and "warning" not in ev
    fields, ev = sampling_choice(alpha_report(settings={"decoding": "greedy"}), spec)
    assert fields == {"allow_advanced_sampling": True, "use_rejection_sampling": False, "advanced_sampling_mode": "full"}
    off = alpha_report(
        settings={"temperature": 0.7, "spec_sampling": {**flags, "allow_advanced_sampling": False, "use_rejection_sampling": False, "served": "greedy"}}
    )
    fields, ev = sampling_choice(off, spec)
    assert fields["allow_advanced_sampling"] is False and "greedily" in ev["warning"]


def test_served_engine_follows_the_bundle_flags(fp8_bundle, tmp_path, capfd):
    """The reference runtime serves a bundle's temperature > 0 requests as TensorRT-LLM would: TensorRT-LLM's
    defaults (greedy, with a warning when served) unless the options say otherwise."""
    from eagle3_trt.core.engine import SamplingParams
    from eagle3_trt.runtime.loader import engine_from_bundle
    from eagle3_trt.runtime.reference_llm import ReferenceLLM

    # the toolkit builds bundles whose temperature > 0 requests follow the target's distribution
    assert engine_from_bundle(fp8_bundle).sampling.served == "match"
    off = _with_flags(fp8_bundle, tmp_path / "off", allow_advanced_sampling=None)  # a bundle from elsewhere: no flags
    eng = engine_from_bundle(off)
    assert eng.sampling == SpecSamplingConfig()
    prompt = [1, 2, 3, 4]
    sampled = [r.token_ids for r in eng.generate([prompt] * 6, SamplingParams(max_tokens=6, temperature=1.0, seed=3))]
    (greedy,) = eng.generate([prompt], SamplingParams(max_tokens=6))
    assert all(t == greedy.token_ids for t in sampled)  # temperature ignored, as TensorRT-LLM does with the flags off
    llm = ReferenceLLM(off, device="cpu")
    llm.shutdown()
    err = capfd.readouterr().err
    assert err.count("allow_advanced_sampling is off") == 1 and "warning: speculative_config" in err

    b = _with_flags(fp8_bundle, tmp_path / "b", allow_advanced_sampling=True)
    eng = engine_from_bundle(b)
    assert eng.sampling.served == "match"
    sampled = [tuple(r.token_ids) for r in eng.generate([prompt] * 6, SamplingParams(max_tokens=6, temperature=1.0, seed=3))]
    assert len(set(sampled)) > 1
    llm = ReferenceLLM(b, device="cpu")
    llm.shutdown()
    assert "warning" not in capfd.readouterr().err


def test_alpha_at_temperature_and_recommend_write(fp8_bundle, tmp_path, capsys):
    """`alpha --temperature` measures with the bundle's flags (one warning line when they do not serve
    the target's sampling); `recommend --write` writes the flags measured into options and manifest alike."""
    import json

    from eagle3_trt.cli import main

    p = tmp_path / "p.jsonl"
    p.write_text('{"turns": ["Write a haiku about the sea."]}\n{"turns": ["Name three colours."]}\n')
    b = _with_flags(fp8_bundle, tmp_path / "b", allow_advanced_sampling=True, use_rejection_sampling=True)
    argv = ["alpha", str(b), "--prompts", str(p), "--method", "generate", "--max-tokens", "8", "--no-bf16", "--temperature", "0.8", "--json"]
    assert main([*argv, "-o", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert report["settings"]["temperature"] == 0.8 and "sampling_warning" not in report and "warning" not in out.err
    assert report["settings"]["spec_sampling"] == {
        "use_rejection_sampling": True,
        "allow_advanced_sampling": True,
        "advanced_sampling_mode": "full",
        "served": "rejection",
    }
    assert report["pairs"]["bundle"]["overall"]["draft_tokens"] > 0
    # TensorRT-LLM's defaults: measured greedily, and said so once
    off = _with_flags(fp8_bundle, tmp_path / "off", allow_advanced_sampling=None)
    assert main([*argv[:1], str(off), *argv[2:], "-o", str(tmp_path / "rep0")]) == 0
    out = capsys.readouterr()
    assert out.err.count("allow_advanced_sampling is off") == 1 and "greedily" in json.loads(out.out)["sampling_warning"]

    # recommend --write from a report measured at temperature > 0 with the flags on (acceptance high enough to pay)
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    rep["pairs"]["bundle"]["overall"]["cumulative_acceptance"] = [0.9, 0.8, 0.7]
    (tmp_path / "rep.json").write_text(json.dumps(rep))
    c = _with_flags(fp8_bundle, tmp_path / "c", allow_advanced_sampling=None)  # flags unset (TensorRT-LLM's defaults) before the write
    assert main(["recommend", str(c), "--report", str(tmp_path / "rep.json"), "--write", "--json"]) == 0
    capsys.readouterr()
    spec = yaml.safe_load((c / "llm_api_options.yaml").read_text())["speculative_config"]
    written = {k: spec[k] for k in ("allow_advanced_sampling", "use_rejection_sampling", "advanced_sampling_mode")}
    assert written == {"allow_advanced_sampling": True, "use_rejection_sampling": True, "advanced_sampling_mode": "full"}
    man = json.loads((c / "manifest.json").read_text())
    assert man["recommendation"]["evidence"]["spec_sampling"]["written"] == written
    assert fmt.open_bundle(c).options.speculative_config.sampling_flags().served == "rejection"
