"""Model repository generation and validation (no server): config.pbtxt parsed by Triton's own
ModelConfig protobuf, model.yaml schema, packaging rules, TensorRT-LLM options resolution,
request value checks, incremental detokenization."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from eagle3_trt.testing.pytest_guard import require

require("tritonclient")

from eagle3_trt.errors import UserError
from eagle3_trt.triton_serving.model_yaml import load_model_yaml
from eagle3_trt.triton_serving.package import BASELINE_SUFFIX, check_repository, package_bundle
from eagle3_trt.triton_serving.pbtxt import TEMPLATE, render_config, render_template, validate_config_text


@pytest.fixture()
def repo(fp8_bundle, tmp_path) -> Path:
    package_bundle(fp8_bundle, tmp_path / "repo")
    return tmp_path / "repo"


def test_package_writes_a_valid_repository(repo, fp8_bundle):
    from tritonclient.grpc import model_config_pb2 as mc

    m = repo / "eagle3"
    assert sorted(p.name for p in m.iterdir()) == ["1", "config.pbtxt", "eagle3-package.json"]
    assert sorted(p.name for p in (m / "1").iterdir()) == ["eagle3.yaml", "model.py", "model.yaml"]
    cfg = validate_config_text((m / "config.pbtxt").read_text(), expected_name="eagle3")
    assert cfg.backend == "python" and cfg.max_batch_size == 0
    assert cfg.model_transaction_policy.decoupled is True  # in config.pbtxt itself, not auto-complete
    assert [(g.kind, g.count) for g in cfg.instance_group] == [(mc.ModelInstanceGroup.KIND_CPU, 1)]
    # The llmapi names and types (upstream NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/
    # tensorrt_llm/config.pbtxt), spelled out here independently of the interface table; the integer
    # inputs are INT64 where upstream's are INT32 (Triton's JSON reader truncates into 32 bits).
    ins = {t.name: (mc.DataType.Name(t.data_type), list(t.dims), t.optional) for t in cfg.input}
    assert ins["text_input"] == ("TYPE_STRING", [-1], False)
    assert ins["streaming"] == ("TYPE_BOOL", [1], True)
    assert ins["sampling_param_max_tokens"] == ("TYPE_INT64", [1], True)
    assert ins["sampling_param_temperature"] == ("TYPE_FP32", [1], True)
    assert ins["sampling_param_top_p"] == ("TYPE_FP32", [1], True)
    assert ins["sampling_param_top_k"] == ("TYPE_INT64", [1], True)
    assert ins["sampling_param_best_of"] == ("TYPE_INT64", [1], True)
    assert ins["sampling_param_seed"] == ("TYPE_UINT64", [1], True)
    assert ins["sampling_param_stop"] == ("TYPE_STRING", [-1], True)
    assert ins["sampling_param_exclude_input_from_output"] == ("TYPE_BOOL", [1], True)
    assert ins["sampling_param_return_perf_metrics"] == ("TYPE_BOOL", [1], True)
    assert ins["speculative_decoding"] == ("TYPE_BOOL", [1], True)
    outs = {t.name: (mc.DataType.Name(t.data_type), list(t.dims)) for t in cfg.output}
    assert outs["text_output"] == ("TYPE_STRING", [-1])
    assert outs["finish_reason"] == ("TYPE_STRING", [-1])
    assert outs["acceptance_rate"] == ("TYPE_FP32", [1])
    assert outs["total_accepted_draft_tokens"] == ("TYPE_INT32", [1])
    assert outs["total_draft_tokens"] == ("TYPE_INT32", [1])
    for t in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns"):
        assert outs[t] == ("TYPE_INT64", [1])
    sv = yaml.safe_load((m / "1" / "eagle3.yaml").read_text())
    assert sv["runtime"] == "reference" and sv["bundle"] == str(Path(fp8_bundle).resolve()) and sv["speculation"] is True
    assert cfg.parameters["eagle3_bundle"].string_value == sv["bundle"]
    my = yaml.safe_load((m / "1" / "model.yaml").read_text())
    assert my["triton_config"] == {"max_batch_size": 0, "decoupled": True, "cancellation_check_period_ms": 50}
    assert my["model"] == str(Path(fp8_bundle).resolve() / "target")
    assert my["speculative_config"]["speculative_model_dir"] == str(Path(fp8_bundle).resolve() / "draft")
    assert (m / "1" / "model.py").read_text().lstrip().startswith("# The Triton Python-backend model")
    assert check_repository(repo) == ["eagle3"]


def test_model_py_sets_locale_before_other_imports():
    src = (Path(__file__).resolve().parents[1] / "triton_repo" / "model" / "model.py").read_text()
    imports = [m.start() for m in re.finditer(r"^(import|from) ", src, re.M)]
    assert src.index('locale.setlocale(locale.LC_ALL, "C.UTF-8")') < imports[1]
    assert src[imports[0] :].startswith("import locale")


def test_package_updates_its_models_and_adds_others_beside_them(repo, fp8_bundle):
    # an unedited model of ours is simply rewritten (tests/test_triton_package_ownership.py: edits are refused)
    package_bundle(fp8_bundle, repo)
    with pytest.raises(UserError, match="--gpus"):  # two TensorRT-LLM models on the same GPUs
        package_bundle(fp8_bundle, repo, with_baseline=True, model_name="llm", runtime="trtllm")
    models = package_bundle(fp8_bundle, repo, with_baseline=True, model_name="llm", runtime="trtllm", gpus=2)
    assert [(m.name, m.speculation, m.gpu_device_ids) for m in models] == [("llm", True, "0"), ("llm" + BASELINE_SUFFIX, False, "1")]
    assert sorted(p.name for p in repo.iterdir()) == ["eagle3", "llm", "llm" + BASELINE_SUFFIX]  # eagle3 was not ours to remove
    base = yaml.safe_load((repo / ("llm" + BASELINE_SUFFIX) / "1" / "eagle3.yaml").read_text())
    assert base["speculation"] is False and base["runtime"] == "trtllm"
    assert "speculative_config" not in yaml.safe_load((repo / ("llm" + BASELINE_SUFFIX) / "1" / "model.yaml").read_text())
    assert check_repository(repo) == ["eagle3", "llm", "llm" + BASELINE_SUFFIX]
    assert not [p for p in [*repo.iterdir(), *repo.parent.iterdir()] if p.name.startswith(".")]  # no temp dirs left behind


def test_package_rejects_a_non_bundle(tmp_path):
    (tmp_path / "b").mkdir()
    with pytest.raises(UserError, match="manifest.json"):
        package_bundle(tmp_path / "b", tmp_path / "repo")
    assert not (tmp_path / "repo").exists()
    with pytest.raises(UserError, match="--name"):
        package_bundle(tmp_path / "b", tmp_path / "repo", model_name="bad/name")


def test_template_placeholders_are_never_silent():
    with pytest.raises(UserError, match="left unfilled: B"):
        render_template("a {{A}} b {{B}}", {"A": "1"})
    with pytest.raises(UserError, match="lacks: C"):
        render_template("a {{A}}", {"A": "1", "C": "2"})
    with pytest.raises(UserError, match="cannot hold"):
        render_template('name: "{{A}}"', {"A": 'x"y'})
    # A placeholder left in a config (hand edit, half-rendered template) fails validation.
    text = TEMPLATE.read_text().replace("{{MODEL_NAME}}", "eagle3").replace("{{BUNDLE_DIR}}", "/b").replace("{{RUNTIME}}", "reference")
    with pytest.raises(UserError, match=r"config.pbtxt:\d+: unfilled template placeholder"):
        validate_config_text(text)


GOOD = render_config("eagle3", "/b", "reference")


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t.replace("model_transaction_policy {\n  decoupled: true\n}", ""), "model_transaction_policy"),
        (
            lambda t: t.replace("count: 1", "count: 2").replace(
                '"eagle3_runtime"\n    value: { string_value: "reference"', '"eagle3_runtime"\n    value: { string_value: "trtllm"'
            ),
            "gpu_device_ids",
        ),
        (
            lambda t: t.replace('name: "sampling_param_max_tokens"\n    data_type: TYPE_INT64', 'name: "sampling_param_max_tokens"\n    data_type: TYPE_FP32'),
            "sampling_param_max_tokens' has data_type TYPE_FP32",
        ),
        (lambda t: t.replace("kind: KIND_CPU", "kind: KIND_GPU"), "KIND_GPU"),
        (lambda t: t.replace("max_batch_size: 0", "max_batch_size: 8"), "max_batch_size"),
        (lambda t: t.replace('backend: "python"', 'backend: "python"\ndecoupled: true'), "not a valid Triton ModelConfig"),
        (lambda t: t.replace('name: "text_input"', 'name: "prompt"'), "'text_input' missing"),
        (lambda t: t.replace('name: "eagle3"', 'name: "other"'), "model directory is 'eagle3'"),
        (
            lambda t: t.replace('dims: [ -1 ]\n  },\n  {\n    name: "streaming"', 'dims: [ -1 ]\n    optional: true\n  },\n  {\n    name: "streaming"'),
            "'text_input' must be required",
        ),
        (lambda t: t.replace("kind: KIND_CPU", "kind: KIND_GPUS"), "not a valid Triton ModelConfig"),
    ],
    ids=[
        "no-policy",
        "trtllm-instances-share-gpus",
        "wrong-dtype",
        "gpu-kind",
        "batching",
        "unknown-field",
        "missing-input",
        "name-mismatch",
        "text-optional",
        "bad-enum",
    ],
)
def test_validation_catches_broken_configs(edit, message):
    bad = edit(GOOD)
    assert bad != GOOD
    with pytest.raises(UserError) as e:
        validate_config_text(bad, expected_name="eagle3")
    assert message in str(e.value)


def test_check_repository_catches_yaml_problems(repo):
    sv = repo / "eagle3" / "1" / "eagle3.yaml"
    d = yaml.safe_load(sv.read_text())
    sv.write_text(yaml.safe_dump(d | {"speculative": False}))
    with pytest.raises(UserError, match="speculative: Extra inputs are not permitted"):
        check_repository(repo)
    sv.write_text(yaml.safe_dump(d | {"bundle": "/elsewhere"}))
    with pytest.raises(UserError, match="differs from eagle3.yaml 'bundle'"):
        check_repository(repo)
    sv.write_text(yaml.safe_dump(d))
    my = repo / "eagle3" / "1" / "model.yaml"
    m = yaml.safe_load(my.read_text())
    my.write_text(yaml.safe_dump(m | {"max_tokens_per_batch": 4}))  # not an LLM() option
    with pytest.raises(UserError, match="unknown TensorRT-LLM option"):
        check_repository(repo)
    my.write_text(yaml.safe_dump(m | {"triton_config": m["triton_config"] | {"decoupled": False}}))
    with pytest.raises(UserError, match="config.pbtxt says decoupled: true, model.yaml triton_config says decoupled: false"):
        check_repository(repo)
    my.write_text(yaml.safe_dump({k: v for k, v in m.items() if k != "triton_config"}))
    with pytest.raises(UserError, match="no triton_config"):
        check_repository(repo)


def test_serving_llm_kwargs_one_translation_for_model_yaml_and_the_trtllm_runtime(fp8_bundle, tmp_path):
    """The trtllm runtime's LLM() kwargs and the model.yaml `package` writes come from one function:
    the same options, differing only in what each asks for (installed names vs portable, paths)."""
    from eagle3_trt.pipeline.bundle import open_bundle
    from eagle3_trt.pipeline.trtllm_adapter import serving_llm_kwargs

    b = open_bundle(Path(fp8_bundle).resolve())
    res = serving_llm_kwargs(b.path, b.options, overrides={"kv_cache_config": {"free_gpu_memory_fraction": 0.5}})
    kw = res.kwargs
    assert kw["model"] == str(b.path / "target")
    spec = kw["speculative_config"]
    assert spec["decoding_type"] == "Eagle3" and str(b.path / "draft") in (spec.get("speculative_model"), spec.get("speculative_model_dir"))
    assert kw["kv_cache_config"]["free_gpu_memory_fraction"] == 0.5 and kw["kv_cache_config"]["dtype"] == "fp8"  # merged
    assert "speculative_config" not in serving_llm_kwargs(b.path, b.options, speculation=False).kwargs
    with pytest.raises(UserError):
        serving_llm_kwargs(b.path, b.options, overrides={"no_such_llm_option": 1})

    # what `package` writes into model.yaml is that translation, for both the spec and the baseline model
    repo = tmp_path / "repo"
    package_bundle(b.path, repo, with_baseline=True)
    for name, speculation in (("eagle3", True), ("eagle3_nospec", False)):
        written = load_model_yaml(repo / name / "1" / "model.yaml").llm_kwargs
        assert written == serving_llm_kwargs(b.path, b.options, speculation=speculation, portable=True).kwargs
    # and for a bundle the server sees elsewhere: the same options, paths joined onto that directory
    moved = serving_llm_kwargs(b.path, b.options, portable=True, bundle_path="/srv/bundle").kwargs
    assert moved["model"] == "/srv/bundle/target" and moved["speculative_config"]["max_draft_len"] == kw["speculative_config"]["max_draft_len"]


# ---- request values -----------------------------------------------------------------------------
def _get(d):
    return lambda name: None if name not in d else np.asarray(d[name])


@pytest.mark.parametrize(
    "inputs, field",
    [
        ({}, "text_input"),
        ({"text_input": [b"  "]}, "text_input"),
        ({"text_input": [b"a", b"b"]}, "text_input"),
        ({"text_input": [b"\xff"]}, "text_input"),
        ({"text_input": [b"hi"], "sampling_param_max_tokens": [0]}, "sampling_param_max_tokens"),
        ({"text_input": [b"hi"], "sampling_param_temperature": [-0.1]}, "sampling_param_temperature"),
        ({"text_input": [b"hi"], "sampling_param_temperature": [float("nan")]}, "sampling_param_temperature"),
        ({"text_input": [b"hi"], "sampling_param_top_p": [-0.1]}, "sampling_param_top_p"),  # 0 is greedy (TensorRT-LLM)
        ({"text_input": [b"hi"], "sampling_param_top_k": [-1]}, "sampling_param_top_k"),
        ({"text_input": [b"hi"], "sampling_param_best_of": [2]}, "sampling_param_best_of"),
        ({"text_input": [b"hi"], "return_cumulative_logprob": [True]}, "return_cumulative_logprob"),
        ({"text_input": [b"hi"], "sampling_param_max_tokens": [1, 2]}, "sampling_param_max_tokens"),
        # INT64 inputs arrive whole; what would not fit the runtimes' 32 bits is refused, not wrapped
        ({"text_input": [b"hi"], "sampling_param_max_tokens": np.array([2**32 + 5], np.int64)}, "sampling_param_max_tokens"),
        ({"text_input": [b"hi"], "sampling_param_max_tokens": np.array([2**31], np.int64)}, "sampling_param_max_tokens"),
        ({"text_input": [b"hi"], "sampling_param_top_k": np.array([2**32 + 5], np.int64)}, "sampling_param_top_k"),
        ({"text_input": [b"hi"], "sampling_param_top_k": np.array([2**31], np.int64)}, "sampling_param_top_k"),
        ({"text_input": [b"hi"], "sampling_param_best_of": np.array([2**32 + 1], np.int64)}, "sampling_param_best_of"),
        ({"text_input": [b"hi"], "sampling_param_stop": [b""]}, "sampling_param_stop"),
        ({"text_input": [b"hi"], "sampling_param_stop": [b"x", b""]}, "sampling_param_stop"),
    ],
)
def test_request_values_rejected_with_field_name(inputs, field):
    from eagle3_trt.triton_serving.request_params import RequestError, parse_request

    with pytest.raises(RequestError) as e:
        parse_request(_get(inputs))
    assert e.value.field == field and str(e.value).startswith(field + ": ")


def test_request_limits_and_defaults():
    from eagle3_trt.triton_serving.request_params import RequestError, parse_request, resolve_max_tokens

    r = parse_request(_get({"text_input": [b"hi"], "speculative_decoding": [False], "sampling_param_stop": [b"x"]}))
    assert (r.speculative, r.streaming, r.sampling.stop, r.exclude_input_from_output) == (False, False, ("x",), False)
    assert resolve_max_tokens(r, prompt_len=10, max_seq_len=512, default=64) == 64
    assert resolve_max_tokens(r, prompt_len=500, max_seq_len=512, default=64) == 12
    r = parse_request(
        _get({"text_input": [b"hi"], "sampling_param_max_tokens": np.array([2**31 - 1], np.int64), "sampling_param_top_k": np.array([2**31 - 1], np.int64)})
    )
    assert (r.sampling.max_tokens, r.sampling.top_k) == (2**31 - 1, 2**31 - 1)  # the largest 32-bit values pass the range check
    r = parse_request(_get({"text_input": [b"hi"], "sampling_param_max_tokens": [503]}))
    with pytest.raises(RequestError, match="max_seq_len 512 - prompt 10 tokens = 502"):
        resolve_max_tokens(r, prompt_len=10, max_seq_len=512, default=64)
    with pytest.raises(RequestError, match="text_input"):
        resolve_max_tokens(r, prompt_len=512, max_seq_len=512, default=64)


# ---- streaming text ---------------------------------------------------------------------------
@pytest.mark.needs("shared")
def test_incremental_detokenizer_matches_full_decode(shared_dir):
    from transformers import AutoTokenizer

    from eagle3_trt.runtime.detok import IncrementalDetokenizer

    tok = AutoTokenizer.from_pretrained(str(shared_dir / "data" / "llama3_tokenizer"))
    text = "Grüße aus Köln 🌍🚀 — naïve café, 東京タワー. <|eot_id|> done"
    ids = tok.encode(text, add_special_tokens=False)
    for step in (1, 2, 3):
        d = IncrementalDetokenizer(tok)
        parts = [d.add(ids[i : i + step]) for i in range(0, len(ids), step)] + [d.flush()]
        assert all("\ufffd" not in p for p in parts)  # never half a character
        assert "".join(parts) == tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def test_stop_matcher_holds_back_partial_stop():
    from eagle3_trt.runtime.detok import StopMatcher

    m = StopMatcher(("END", "\n\n"))
    out = [m.feed(x) for x in ("abc E", "N", "xyz EN", "D tail")]
    assert out == ["abc", " ", "ENxyz ", ""]  # "EN" held back until it turned out to be "END"
    assert m.matched == "END" and m.feed("more") == "" and m.flush() == ""
    m = StopMatcher(("END",))
    assert m.feed("abcEN") == "abc" and m.flush() == "EN"
