"""One request, two front ends: the same request gives the same text and the same captured record on a
real Triton server (nvidia-pytriton's tritonserver, queried over plain HTTP ``/generate``) and a real
NVIDIA Dynamo deployment (its Rust frontend and one reference-runtime worker, queried with the
``openai`` package), both capturing traffic (runtime/request_contract.py is the one contract).

Variants: no sampling fields (greedy on both, TensorRT-LLM's all-unset rule: the same text as
temperature 0), ``top_k=50`` alone (sampled at temperature 1: differs from greedy), temperature 0.7
with a seed, and ``max_tokens`` unset (the rest of the bundle's context on both). Bad values are refused
in one line naming the field; seeds up to 2**63 - 1 are honoured through the server.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from eagle3_trt.testing.pytest_guard import require

require("dynamo", "openai")

from openai import BadRequestError, OpenAI

from eagle3_trt.testing.readme_blocks import doc_pages
from eagle3_trt.testing.served_traffic import captured_records
from eagle3_trt.testing.servers import dynamo_served, serve_triton, stop_triton

pytestmark = [pytest.mark.triton, pytest.mark.needs("tritonserver")]

PROMPT = "def fibonacci(n):"
# name -> the request's sampling fields (None: not sent); max_tokens 20 unless the variant leaves it out
VARIANTS: dict[str, dict] = {
    "none": {"max_tokens": 20},
    "greedy": {"max_tokens": 20, "temperature": 0.0},
    "top_k_alone": {"max_tokens": 20, "top_k": 50, "seed": 7},
    "t07_seed": {"max_tokens": 20, "temperature": 0.7, "seed": 11},
    "no_max_tokens": {},
}


def _triton_generate(url: str, fields: dict) -> str:
    body = {"text_input": PROMPT, "sampling_param_exclude_input_from_output": True}
    body.update({f"sampling_param_{k}": v for k, v in fields.items()})
    req = urllib.request.Request(f"{url}/v2/models/eagle3/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return str(json.loads(r.read())["text_output"])


def _dynamo_generate(client: OpenAI, model: str, fields: dict) -> str:
    kw = {k: v for k, v in fields.items() if k in ("max_tokens", "temperature", "seed")}
    extra = {k: v for k, v in fields.items() if k not in kw}  # top_k: not an OpenAI field, sent as a body extension
    r = client.completions.create(model=model, prompt=PROMPT, extra_body=extra or None, **kw)
    return str(r.choices[0].text)


@pytest.fixture(scope="module")
def served(fp8_bundle, tmp_path_factory):
    """Every variant through both front ends, each capturing: {variant: (triton text, dynamo text)}, and the records."""
    from eagle3_trt.triton_serving.package import package_bundle

    tmp = tmp_path_factory.mktemp("contract")
    package_bundle(fp8_bundle, tmp / "repo", torch_threads=1)
    h, _ = serve_triton(tmp / "repo", tmp / "tstate", "--capture", str(tmp / "tcap"))
    try:
        triton = {name: _triton_generate(h.http_url, f) for name, f in VARIANTS.items()}
        triton["seeds"] = [_triton_generate(h.http_url, {"max_tokens": 16, "temperature": 1.0, "seed": s}) for s in (1, 2**32 + 1, 2**40 + 1, 2**63 - 1, 1)]
        trecs = captured_records(tmp / "tcap", len(VARIANTS) + 5)
    finally:
        stop_triton(tmp / "tstate")
    with dynamo_served(fp8_bundle, tmp / "dstate", "--capture", str(tmp / "dcap"), workers=1) as (d, _):
        client = OpenAI(base_url=d.url, api_key="none", timeout=300)
        dynamo = {name: _dynamo_generate(client, d.model, f) for name, f in VARIANTS.items()}
        repeats = [_dynamo_generate(client, d.model, VARIANTS["none"]) for _ in range(3)]
        drecs = captured_records(tmp / "dcap", len(VARIANTS) + 3)
        refusals = _dynamo_refusals(client, d)
    yield {"triton": triton, "dynamo": dynamo, "repeats": repeats, "trecs": trecs, "drecs": drecs, "refusals": refusals}


def _dynamo_refusals(client: OpenAI, d) -> dict[str, str]:
    out = {}
    # (top_k -1 is Dynamo's "no top-k", served as 0: docs/dynamo.md, tests/test_request_table.py)
    for name, kw in {"seed": {"seed": -1}, "prompt": {"prompt": " \n "}, "max_tokens": {"max_tokens": 100_000}}.items():
        with pytest.raises(BadRequestError) as e:
            client.completions.create(model=d.model, **{"prompt": PROMPT, **kw})
        out[name] = str(e.value)
    return out


def test_same_request_same_text_on_triton_and_dynamo(served):
    t, d = served["triton"], served["dynamo"]
    for name in VARIANTS:
        assert t[name] == d[name], (name, t[name], d[name])
    # no sampling fields is greedy on both: the temperature-0 answer, and the same every time
    assert t["none"] == t["greedy"] and served["repeats"] == [d["none"]] * 3
    # top_k alone is sampled (TensorRT-LLM: temperature 1 among 50), not greedy as Triton's model used to serve it
    assert t["top_k_alone"] != t["greedy"]


def test_same_request_same_captured_record(served):
    t = {r.output_text: r for r in served["trecs"]}
    d = {r.output_text: r for r in served["drecs"]}
    for name in VARIANTS:
        a, b = t[served["triton"][name]], d[served["dynamo"][name]]
        assert a.prompt_ids == b.prompt_ids and a.output_ids == b.output_ids, name
        sa, sb = a.sampling, b.sampling
        assert (sa.top_p, sa.top_k, sa.max_tokens, sa.seed) == (sb.top_p, sb.top_k, sb.max_tokens, sb.seed), name
        assert sa.temperature == pytest.approx(sb.temperature, rel=1e-6), name  # FP32 on both wires
    rec = t[served["triton"]["none"]].sampling
    assert (rec.temperature, rec.top_p, rec.top_k, rec.seed) == (0.0, 1.0, 0, None)  # recorded as served: greedy
    rec = t[served["triton"]["top_k_alone"]].sampling
    assert (rec.temperature, rec.top_p, rec.top_k, rec.seed) == (1.0, 1.0, 50, 7)
    a = t[served["triton"]["no_max_tokens"]]
    assert a.sampling.max_tokens == 512 - len(a.prompt_ids)  # the tiny bundle's max_seq_len 512: the rest of the context


def test_63_bit_seeds_are_honoured_through_triton(served):
    """Every seed both front ends serve (0 .. 2**63 - 1: Dynamo's frontend reads an i64) is its own stream."""
    s1, s2, s3, s4, s1_again = served["triton"]["seeds"]
    assert len({s1, s2, s3, s4}) == 4 and s1_again == s1
    seeds = sorted(r.sampling.seed for r in served["trecs"] if r.sampling.max_tokens == 16)
    assert seeds == sorted([1, 1, 2**32 + 1, 2**40 + 1, 2**63 - 1])


def test_bad_values_refused_in_one_line_naming_the_field(served):
    """The worker's refusals (the frontend forwards a negative seed as i64 unchecked, and a whitespace-only prompt)."""
    r = served["refusals"]
    assert "seed: -1 is out of range: TensorRT-LLM's seed is a 64-bit unsigned integer" in r["seed"]
    assert "prompt: is empty or only whitespace" in r["prompt"] and "max_tokens" in r["max_tokens"] and "max_seq_len" in r["max_tokens"]
    assert all("\n" not in m.strip() for m in r.values()), r


@pytest.mark.parametrize(
    ("fields", "field"),
    [({"seed": -1}, "sampling_param_seed"), ({"top_k": -1}, "sampling_param_top_k"), ({"top_p": 1.5}, "sampling_param_top_p")],
)
def test_triton_refuses_bad_values_naming_the_input(fields, field):
    """The request contract's check as the Triton model applies it (parse_request), without a server."""
    import numpy as np

    from eagle3_trt.triton_serving.request_params import RequestError, parse_request

    arrays = {"text_input": np.array([PROMPT.encode()], dtype=object)}
    arrays.update({f"sampling_param_{k}": np.array([v]) for k, v in fields.items()})
    with pytest.raises(RequestError) as e:
        parse_request(arrays.get)
    assert e.value.field == field and "\n" not in str(e.value)


def test_readme_states_the_contract():
    text = "".join(p.read_text() for p in doc_pages(Path(__file__).resolve().parents[1]))
    assert "runtime/request_contract.py" in text
