"""One runtime factory: servers and clients get their LLM from ``runtime.factory.open_llm`` only.

The import rule is checked on the source (ast), so a lazy import inside a function counts too; a
planted violation shows the check can fail. The factory itself is run on a real bundle.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from eagle3_trt.errors import UserError
from eagle3_trt.runtime.factory import open_llm
from eagle3_trt.runtime.llm_api import RequestPerfMetrics, SpeculativeDecodingMetrics, spec_stats

ROOT = Path(__file__).resolve().parents[1]
FRONT_ENDS = [ROOT / "eagle3_trt" / d for d in ("triton_serving", "dynamo_serving", "clients")]
MODEL_TEMPLATE = ROOT / "triton_repo" / "model" / "model.py"
FORBIDDEN = ("reference_llm", "ReferenceLLM", "tensorrt_llm")


def runtime_names(source: str) -> list[str]:
    """Every import (at any depth) or name that reaches a runtime class past the factory."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [a.name for a in node.names]
        elif isinstance(node, ast.Name | ast.Attribute):
            names = [node.id if isinstance(node, ast.Name) else node.attr]
        else:
            continue
        hits += [n for n in names if any(part in FORBIDDEN for part in n.split("."))]
    return hits


def _front_end_files() -> list[Path]:
    files = [p for d in FRONT_ENDS for p in sorted(d.rglob("*.py"))] + [MODEL_TEMPLATE]
    assert len(files) > 15 and MODEL_TEMPLATE.is_file()
    return files


def test_front_ends_name_no_runtime_class():
    bad = {str(p.relative_to(ROOT)): hits for p in _front_end_files() if (hits := runtime_names(p.read_text()))}
    assert bad == {}


def test_front_ends_open_their_llm_through_the_factory():
    for p in (MODEL_TEMPLATE, ROOT / "eagle3_trt" / "dynamo_serving" / "engine.py"):
        # called, or handed to asyncio.to_thread (Dynamo loads the model off its event loop)
        calls = [
            n
            for n in ast.walk(ast.parse(p.read_text()))
            if isinstance(n, ast.Call) and any(isinstance(a, ast.Name) and a.id == "open_llm" for a in [n.func, *n.args])
        ]
        assert calls, p


def test_the_import_check_can_fail():
    planted = "def f():\n    from eagle3_trt.runtime.reference_llm import ReferenceLLM\n    return ReferenceLLM\nimport tensorrt_llm.llmapi\n"
    assert set(runtime_names(planted)) == {"eagle3_trt.runtime.reference_llm", "ReferenceLLM", "tensorrt_llm.llmapi"}
    assert runtime_names("from eagle3_trt.runtime.factory import open_llm\nopen_llm('b')\n") == []


@pytest.fixture(scope="module")
def llms(fp8_bundle):
    on = open_llm(fp8_bundle, device="cpu", torch_threads=1)
    off = open_llm(fp8_bundle, "reference", device="cpu", torch_threads=1, speculation=False)
    yield on, off
    on.shutdown()
    off.shutdown()


def _greedy(llm, prompt: str, n: int):
    ids = list(llm.tokenizer.encode(prompt))
    sp = llm.sampling_params_cls(max_tokens=n, top_k=1, return_perf_metrics=True)

    async def go():
        last = None
        async for o in llm.generate_async(ids, sp, streaming=True):
            last = o
        return last

    return asyncio.run(go())


def test_open_llm_generates_and_speculation_keeps_greedy_output(llms):
    on, off = llms
    assert on.per_request_speculation
    a, b = _greedy(on, "The quick brown fox", 12), _greedy(off, "The quick brown fox", 12)
    ca, cb = a.outputs[0], b.outputs[0]
    assert a.finished and ca.finish_reason in ("stop", "length") and len(ca.token_ids) > 0
    # greedy speculative decoding returns exactly what the target alone returns
    assert ca.token_ids == cb.token_ids and ca.text == cb.text
    st = spec_stats(ca.request_perf_metrics, len(ca.token_ids), True)
    assert st.speculative and st.draft_tokens > 0 and st.target_forwards <= len(ca.token_ids)
    assert not spec_stats(cb.request_perf_metrics, len(cb.token_ids), False).speculative


def test_unknown_runtime_or_option_is_a_user_error(fp8_bundle):
    with pytest.raises(UserError, match="unknown runtime 'vllm'.*reference, trtllm"):
        open_llm(fp8_bundle, "vllm")
    with pytest.raises(UserError, match="reference takes no option llm_kwargs"):
        open_llm(fp8_bundle, "reference", llm_kwargs={})
    with pytest.raises(UserError, match="trtllm takes no option device"):
        open_llm(fp8_bundle, "trtllm", device="cpu")


def test_spec_stats_from_either_runtimes_metrics():
    # the reference runtime counts target forwards; TensorRT-LLM does not, so the stream's count is used
    ours = RequestPerfMetrics(speculative_decoding=SpeculativeDecodingMetrics(0.25, 12, 48), eagle3_target_forwards=18)
    st = spec_stats(ours, 30, True, forwards_seen=99)
    assert (st.draft_tokens, st.accepted_draft_tokens, st.target_forwards) == (48, 12, 18)
    assert st.acceptance_rate == 0.25 and st.acceptance_length == pytest.approx(30 / 18)
    trt = RequestPerfMetrics(speculative_decoding=SpeculativeDecodingMetrics(0.5, 10, 20))
    trt.eagle3_target_forwards = 0
    assert spec_stats(trt, 20, True, forwards_seen=10).acceptance_length == 2.0
    # speculation off for the request: whatever the metrics hold, no drafts are counted
    off = spec_stats(ours, 30, False)
    assert not off.speculative and off.draft_tokens == 0 and off.acceptance_rate == 0.0
    assert spec_stats(None, 5, True).as_dict() == {
        "speculative": False,
        "draft_tokens": 0,
        "accepted_draft_tokens": 0,
        "acceptance_rate": 0.0,
        "acceptance_length": 0.0,
        "target_forwards": 0,
        "completion_tokens": 5,
    }
