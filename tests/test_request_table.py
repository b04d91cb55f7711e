"""The request table (testing/request_table.py) on both front ends, and the bad-input corpus over HTTP and gRPC.

A real Triton server (nvidia-pytriton's tritonserver: raw HTTP ``/generate`` and tritonclient gRPC) and a
real Dynamo deployment (its Rust frontend and one worker: the ``openai`` package and raw httpx) run side by
side on the tiny bundle. Every row gets the same outcome from every client (the same text, or a 4xx naming
the same contract field in that front end's spelling) except where the row lists a difference, and each
listed difference is in the docs with the upstream source that forces it. No bad body gets a 5xx from
either: on Triton, the bodies tritonserver's own JSON reader answered with a 500 get the project's HTTP
front's 400 naming the field (or the body).
"""

from __future__ import annotations

import json
import queue

import numpy as np
import pytest

from eagle3_trt.testing.pytest_guard import require

require("dynamo", "openai")

import httpx
from openai import APIStatusError, OpenAI

from eagle3_trt.testing.request_table import (
    BAD_BODIES,
    CONTRACT_FIELDS,
    ROW_BY_NAME,
    ROWS,
    SERVED,
    SERVER_ERROR,
    TRITON_BAD_VALUES,
    TRITON_BODY_FIELD,
    Row,
    outcome,
    triton_name,
)
from eagle3_trt.testing.servers import REPO_ROOT, dynamo_served, triton_served

pytestmark = [pytest.mark.triton, pytest.mark.needs("tritonserver")]

TRITON_FIELDS = tuple(triton_name(f) for f in CONTRACT_FIELDS)
GRPC_TYPES = {"max_tokens": "INT64", "top_k": "INT64", "temperature": "FP32", "top_p": "FP32", "seed": "UINT64"}
NP = {"INT64": np.int64, "UINT64": np.uint64, "FP32": np.float32}


def _raw_json(obj: dict, prompt_key: str, prompt: str | bytes) -> bytes:
    """The JSON body with the prompt spliced in as raw bytes (so invalid UTF-8 goes out as it is)."""
    body = json.dumps({**obj, prompt_key: "\x00PROMPT\x00"}).encode()
    raw = prompt if isinstance(prompt, bytes) else json.dumps(prompt)[1:-1].encode()
    return body.replace(b"\\u0000PROMPT\\u0000", raw)


def triton_http(url: str, row: Row) -> tuple[str, str | None]:
    body = {f"sampling_param_{k}": v for k, v in row.sampling().items()} | {"sampling_param_exclude_input_from_output": True}
    r = httpx.post(f"{url}/v2/models/eagle3/generate", content=_raw_json(body, "text_input", row.prompt), timeout=300)
    data = r.json()
    return outcome(r.status_code, data.get("error", ""), TRITON_FIELDS), data.get("text_output")


def triton_grpc(url: str, row: Row) -> tuple[str, str | None] | None:
    """None: the row has a value its declared type cannot hold (a negative or 2**64 seed as UINT64)."""
    import tritonclient.grpc as g

    prompt = row.prompt if isinstance(row.prompt, bytes) else row.prompt.encode()
    tensors = [("text_input", np.array([prompt], dtype=np.object_), "BYTES"), ("sampling_param_exclude_input_from_output", np.array([True]), "BOOL")]
    for k, v in row.sampling().items():
        dtype = GRPC_TYPES[k]
        if dtype == "UINT64" and v < 0:
            dtype = "INT64"  # an upstream-style client's only way to send it: Triton refuses the type, naming the input
        if dtype in ("INT64", "UINT64") and not np.iinfo(NP[dtype]).min <= v <= np.iinfo(NP[dtype]).max:
            return None
        tensors.append((f"sampling_param_{k}", np.array([v], dtype=NP[dtype]), dtype))
    inputs = _infer_inputs(g, tensors)
    q: queue.Queue = queue.Queue()
    c = g.InferenceServerClient(url)
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    text = ""
    try:
        c.async_stream_infer("eagle3", inputs, enable_empty_final_response=True)
        while True:
            res, err = q.get(timeout=300)
            if err is not None:  # a stream's errors come in-band, without a status code: the model's own
                # unexpected failures say "internal error" (model.py), the rest are refusals
                status = 500 if err.message().startswith("internal error") else 400
                return outcome(status, err.message(), TRITON_FIELDS), None
            out = res.as_numpy("text_output")
            text += "".join(t.decode() for t in out) if out is not None else ""
            if res.get_response().parameters["triton_final_response"].bool_param:
                return SERVED, text
    finally:
        c.stop_stream()
        c.close()


def _dynamo_body(row: Row, model: str) -> dict:
    return {"model": model, **row.sampling()}


def dynamo_httpx(url: str, model: str, row: Row) -> tuple[str, str | None]:
    r = httpx.post(
        f"{url}/completions", content=_raw_json(_dynamo_body(row, model), "prompt", row.prompt), headers={"content-type": "application/json"}, timeout=300
    )
    data = r.json()
    text = data["choices"][0]["text"] if r.status_code == 200 else None
    return outcome(r.status_code, str(data.get("message", "")), CONTRACT_FIELDS), text


def dynamo_openai(client: OpenAI, model: str, row: Row) -> tuple[str, str | None] | None:
    """None for a bytes prompt: the openai package sends only str."""
    if isinstance(row.prompt, bytes):
        return None
    kw = dict(row.sampling())
    extra = {"top_k": kw.pop("top_k")} if "top_k" in kw else None  # not an OpenAI field: a body extension
    try:
        r = client.completions.create(model=model, prompt=row.prompt, extra_body=extra, **kw)  # type: ignore[arg-type]
    except APIStatusError as e:
        msg = e.body.get("message", "") if isinstance(e.body, dict) else str(e)
        return outcome(e.status_code, str(msg), CONTRACT_FIELDS), None
    return SERVED, str(r.choices[0].text)


@pytest.fixture(scope="module")
def served(fp8_bundle, tmp_path_factory):
    """Every row through the four clients: {row: {client: (outcome, text) or None}}, plus the servers' URLs."""
    from eagle3_trt.triton_serving.package import package_bundle

    tmp = tmp_path_factory.mktemp("table")
    package_bundle(fp8_bundle, tmp / "repo", torch_threads=1)
    with triton_served(tmp / "repo", tmp / "tstate") as (t, _), dynamo_served(fp8_bundle, tmp / "dstate", workers=1) as (d, _):
        client = OpenAI(base_url=d.url, api_key="none", timeout=300, max_retries=0)
        results = {
            row.name: {
                "triton_http": triton_http(t.http_url, row),
                "triton_grpc": triton_grpc(t.grpc_url, row),
                "dynamo_openai": dynamo_openai(client, d.model, row),
                "dynamo_httpx": dynamo_httpx(d.url, d.model, row),
            }
            for row in ROWS
        }
        yield {"rows": results, "triton": t, "dynamo": d}


def _family(client: str) -> str:
    return "dynamo" if client.startswith("dynamo") else client


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_every_row_same_outcome_on_both_front_ends(served, row):
    got = served["rows"][row.name]
    for client, result in got.items():
        if result is None:
            continue
        want = row.differs.get(_family(client), row.expect)
        want = triton_name(want) if client.startswith("triton") and want in CONTRACT_FIELDS else want
        assert result[0] == want, (client, result, got)
    texts = {result[1] for result in got.values() if result is not None and result[0] == SERVED}
    assert len(texts) <= 1, got  # every client that served the row served the same text
    if row.same_text_as:
        assert texts == {served["rows"][row.same_text_as]["triton_http"][1]}, (row.name, texts)


def test_seeded_rows_are_sampled_not_greedy(served):
    """The seeded rows really sample (else "same text" would say nothing about the seed)."""
    rows = served["rows"]
    greedy = rows["no_sampling_fields"]["triton_http"][1]
    assert (
        len({greedy, rows["top_k_0_seeded"]["triton_http"][1], rows["temperature_0.7_seed_11"]["triton_http"][1], rows["seed_2^63-1"]["triton_http"][1]}) == 4
    )


def test_every_difference_is_documented_with_its_source():
    """A row that differs is named in docs/dynamo.md's table (none is a 5xx); the HTTP front's refusals in docs/bad-inputs.md."""
    dyn = (REPO_ROOT / "docs" / "dynamo.md").read_text()
    bad = (REPO_ROOT / "docs" / "bad-inputs.md").read_text()
    for row in ROWS:
        for family, what in row.differs.items():
            assert what != SERVER_ERROR and f"`{row.name}`" in dyn, (row.name, family)
    for name in TRITON_BODY_FIELD:
        assert f"`{name}`" in bad, name
    for name, (_, field) in TRITON_BAD_VALUES.items():
        assert field is None or f"`{name}`" in bad, name
    assert ROW_BY_NAME["top_p_0"].differs and "validate_top_p" in dyn and "testing/request_table.py" in dyn


# ---- the bad-input corpus over HTTP and gRPC --------------------------------------------------------
@pytest.mark.parametrize("name", sorted(BAD_BODIES))
def test_bad_bodies_4xx_on_both_front_ends(served, name):
    body = BAD_BODIES[name]
    d = served["dynamo"]
    for path in ("/completions", "/chat/completions"):
        r = httpx.post(f"{d.url}{path}", content=body, headers={"content-type": "application/json"}, timeout=60)
        assert 400 <= r.status_code < 500, (path, r.status_code, r.text)
    for path in ("generate", "generate_stream", "versions/1/generate"):
        r = httpx.post(f"{served['triton'].http_url}/v2/models/eagle3/{path}", content=body, timeout=60)
        # the HTTP front's 400, in Triton's error shape, naming the field (or the body) with a hint
        assert r.status_code == 400 and r.json()["error"].startswith(f"{TRITON_BODY_FIELD[name]}: "), (path, r.text)
        assert "; send " in r.json()["error"], r.text


@pytest.mark.parametrize("name", sorted(TRITON_BAD_VALUES))
def test_bad_values_triton_http(served, name):
    obj, field = TRITON_BAD_VALUES[name]
    r = httpx.post(f"{served['triton'].http_url}/v2/models/eagle3/generate", content=json.dumps(obj).encode(), timeout=60)
    if field is not None:  # the HTTP front's 400 (tritonserver's own reader answered 500)
        assert r.status_code == 400 and r.json()["error"].startswith(f"{field}: ") and "send " in r.json()["error"], r.text
        return
    assert 400 <= r.status_code < 500, r.text
    msg = r.json()["error"]
    # the field (or the key, or Triton's "missing required input") is named
    assert any(k in msg for k in [*obj, "required input"]), msg


def _infer_inputs(g, tensors: list[tuple[str, np.ndarray, str]]) -> list:
    """tritonclient InferInputs of (name, array, Triton datatype) tensors."""
    inputs = []
    for name, arr, dtype in tensors:
        i = g.InferInput(name, list(arr.shape), dtype)
        i.set_data_from_numpy(arr)
        inputs.append(i)
    return inputs


def _grpc_error(url: str, tensors: list[tuple[str, np.ndarray, str]]) -> tuple[str, str] | None:
    import tritonclient.grpc as g

    inputs = _infer_inputs(g, tensors)
    q: queue.Queue = queue.Queue()
    c = g.InferenceServerClient(url)
    c.start_stream(callback=lambda result, error: q.put((result, error)))
    try:
        c.async_stream_infer("eagle3", inputs, enable_empty_final_response=True)
        while True:
            res, err = q.get(timeout=120)
            if err is not None:  # in-band on a stream: no status code, so the message is what counts
                return str(err.status()), err.message()
            if res.get_response().parameters["triton_final_response"].bool_param:
                return None
    finally:
        c.stop_stream()
        c.close()


def _wrong_type(declared: str) -> tuple[np.ndarray, str]:
    return (np.array([1.5], np.float64), "FP64") if declared != "TYPE_FP32" else (np.array([1], np.int32), "INT32")


def test_grpc_wrong_types_and_shapes_are_invalid_argument_naming_the_input(served):
    """Every input sent with another type, and FP32 scalar inputs with two values: refused naming the input (never the
    model's "internal error")."""
    from eagle3_trt.triton_serving.interface import INPUTS

    url = served["triton"].grpc_url
    prompt = ("text_input", np.array([b"hi"], dtype=np.object_), "BYTES")
    for spec in INPUTS:
        arr, dtype = _wrong_type(spec.data_type)
        tensors = [(spec.name, arr, dtype)] + ([prompt] if spec.name != "text_input" else [])
        err = _grpc_error(url, tensors)
        assert err is not None and spec.name in err[1] and not err[1].startswith("internal error"), (spec.name, err)
        if spec.dims == (1,) and spec.data_type == "TYPE_FP32":
            err = _grpc_error(url, [prompt, (spec.name, np.array([0.5, 0.6], np.float32), "FP32")])
            assert err is not None and spec.name in err[1] and not err[1].startswith("internal error"), (spec.name, err)
