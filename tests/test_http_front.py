"""The HTTP front of `serve` (triton_serving/http_front.py): bad /generate bodies get a 400 naming the field,
everything else reaches tritonserver unchanged (streaming and cancellation included), and `stop` ends it.

The body check runs against the inputs a written config.pbtxt declares; the served tests use a real
tritonserver (nvidia-pytriton) on the tiny bundle and clients this project did not write (curl, httpx,
tritonclient.http).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest

from eagle3_trt.triton_serving.generate_body import check_generate_body
from eagle3_trt.triton_serving.interface import INPUTS
from eagle3_trt.triton_serving.pbtxt import declared_inputs, render_config
from eagle3_trt.triton_serving.request_params import RequestError


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "config.pbtxt"
    path.write_text(render_config("eagle3", "/b", "reference"))
    return declared_inputs(path)


def test_declared_inputs_are_the_interface(inputs):
    assert {n: (s.data_type, s.dims) for n, s in inputs.items()} == {s.name: (s.data_type, s.dims) for s in INPUTS}


@pytest.mark.parametrize(
    "body",
    [
        b'{"text_input": "hi"}',
        b'{"text_input": ["hi"], "sampling_param_max_tokens": [3], "sampling_param_seed": 18446744073709551615, "id": "r1"}',
        b'{"text_input": "hi", "sampling_param_temperature": 1, "sampling_param_top_p": 0.5, "streaming": true, "sampling_param_stop": ["a", "b"]}',
        b'{"text_input": "hi", "max_tokens": 3, "foo": {"a": 1}}',  # not inputs: Triton's and the model's to refuse by name
        b'{"text_input": "caf\xe9"}',  # invalid UTF-8: passed on, the model refuses it naming text_input
        b'{"text_input": "\\ud83d\\ude00"}',  # a surrogate pair is one character
    ],
)
def test_convertible_bodies_pass(inputs, body):
    assert isinstance(check_generate_body(body, inputs), dict)


@pytest.mark.parametrize(
    "body, field, says",
    [
        (b"", "body", "is empty"),
        (b"   ", "body", "is empty"),
        (b"hello", "body", "is not valid JSON"),
        (b"[1]", "body", "is an array, not a JSON object"),
        (b'{"text_input": NaN}', "body", "NaN is not JSON"),
        (b'{"text_input": "hi", "sampling_param_temperature": 1e999}', "sampling_param_temperature", "overflows a double"),
        (b'{"text_input": "hi", "text_input": "ho"}', "text_input", "appears twice"),
        (b'{"text_input": "\\udc00"}', "text_input", "lone UTF-16 surrogate"),
        (b'{"text_input": "hi", "id": null}', "id", "must be a JSON string"),
        (b'{"text_input": []}', "text_input", "is an empty array"),
        (b'{"text_input": [["hi"]]}', "text_input", "holds an array"),
        (b'{"text_input": "hi", "streaming": 1}', "streaming", "the input is TYPE_BOOL"),
        (b'{"text_input": "hi", "sampling_param_top_k": 2.0}', "sampling_param_top_k", "is the number 2.0, but the input is TYPE_INT64"),
        (b'{"text_input": "hi", "sampling_param_top_k": 9223372036854775808}', "sampling_param_top_k", "out of the range of TYPE_INT64"),
        (b'{"text_input": "hi", "sampling_param_seed": -1}', "sampling_param_seed", "out of the range of TYPE_UINT64"),
        (b'{"text_input": "hi", "sampling_param_top_p": true}', "sampling_param_top_p", "the input is TYPE_FP32"),
        (b'{"text_input": "hi", "sampling_param_top_p": [0.5, 0.6]}', "sampling_param_top_p", "takes one value"),
    ],
)
def test_unconvertible_bodies_are_refused_naming_the_field(inputs, body, field, says):
    with pytest.raises(RequestError) as e:
        check_generate_body(body, inputs)
    assert e.value.field == field and says in e.value.message and "send" in e.value.message, str(e.value)


# ---- served: a real tritonserver behind the front --------------------------------------------------
def _have_tritonserver() -> bool:
    import importlib.util

    return bool(shutil.which("tritonserver") or importlib.util.find_spec("pytriton"))


served = pytest.mark.skipif(not _have_tritonserver(), reason="needs tritonserver (nvidia-pytriton)")


def _cancelled(metrics_url: str) -> float:
    import httpx

    for line in httpx.get(metrics_url, timeout=10).text.splitlines():
        if line.startswith('eagle3_requests_total{model="eagle3",status="cancelled"}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no cancelled counter")


@served
@pytest.mark.triton
def test_front_passes_through_streams_cancels_and_stops(fp8_bundle, tmp_path):
    import httpx
    import tritonclient.http as th

    from eagle3_trt.procs import pid_alive, port_is_free
    from eagle3_trt.testing.servers import run_cli, serve_triton
    from eagle3_trt.triton_serving.package import package_bundle

    package_bundle(fp8_bundle, tmp_path / "repo", torch_threads=1)
    h, _ = serve_triton(tmp_path / "repo", tmp_path / "state")
    try:
        assert h.front_pid and pid_alive(h.front_pid) and h.triton_http_port not in (h.http_port, h.grpc_port, h.metrics_port)
        gen = f"{h.http_url}/v2/models/eagle3/generate"
        body = {"text_input": "def fibonacci(n):", "sampling_param_max_tokens": 6, "sampling_param_exclude_input_from_output": True}
        direct = httpx.post(f"http://127.0.0.1:{h.triton_http_port}/v2/models/eagle3/generate", json=body, timeout=120)
        # a good body: the same answer as tritonserver's own endpoint (curl, httpx)
        curl = subprocess.run(["curl", "-s", "-X", "POST", gen, "--data-binary", json.dumps(body)], capture_output=True, text=True, timeout=120)
        assert json.loads(curl.stdout) == direct.json() == httpx.post(gen, json=body, timeout=120).json()
        with_id = httpx.post(gen, json={**body, "id": "req-1"}, timeout=120)  # a request id is a good key
        assert with_id.status_code == 200 and with_id.json()["text_output"] == direct.json()["text_output"], with_id.text
        # every other path passes through: tritonclient.http's health, metadata, repository index, and /infer's own refusal
        c = th.InferenceServerClient(h.http_url[len("http://") :])
        assert c.is_server_ready() and c.is_model_ready("eagle3") and c.get_model_metadata("eagle3")["name"] == "eagle3"
        assert [m["name"] for m in c.get_model_repository_index()] == ["eagle3"]
        with pytest.raises(th.InferenceServerException) as e:
            inp = th.InferInput("text_input", [1], "BYTES")
            inp.set_data_from_numpy(__import__("numpy").array([b"hi"], dtype=object))
            c.infer("eagle3", [inp])
        assert "decoupled" in str(e.value)  # tritonserver's own answer, unchanged
        # streaming: curl -N gets one SSE event per decoding step, ending with the finish reason
        sse = subprocess.run(
            ["curl", "-sN", f"{gen}_stream", "-d", json.dumps({**body, "streaming": True})], capture_output=True, text=True, timeout=120
        ).stdout
        events = [json.loads(ln[len("data: ") :]) for ln in sse.splitlines() if ln.startswith("data: ")]
        assert len(events) >= 2 and events[-1]["finish_reason"] == "length" and "".join(e["text_output"] for e in events) == direct.json()["text_output"]
        # a client that goes away mid-stream: tritonserver cancels the request, as without the front
        before = _cancelled(h.metrics_url)
        long = json.dumps({"text_input": "hi", "sampling_param_max_tokens": 400, "streaming": True})
        p = subprocess.Popen(["curl", "-sN", f"{gen}_stream", "-d", long], stdout=subprocess.PIPE)
        assert p.stdout is not None and p.stdout.readline().startswith(b"data: ")
        p.kill()
        p.wait()
        deadline = time.monotonic() + 30
        while _cancelled(h.metrics_url) == before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _cancelled(h.metrics_url) == before + 1
        # a bad body never reaches tritonserver: 400 naming the field, on both endpoints
        for path in ("generate", "generate_stream"):
            r = httpx.post(f"{gen[: -len('generate')]}{path}", content=b'{"text_input": "hi", "sampling_param_seed": -1}', timeout=60)
            assert r.status_code == 400 and r.json()["error"].startswith("sampling_param_seed: -1 is out of the range"), r.text
        # an idle keep-alive client connection to the front does not hold `stop` (it held tritonserver's HTTP
        # service for its whole exit timeout when the front kept pooled connections to it)
        keep = httpx.Client()
        assert keep.get(f"{h.http_url}/v2/health/ready").status_code == 200
        t0 = time.monotonic()
        r = run_cli("stop", "--state-dir", str(tmp_path / "state"))
        took = time.monotonic() - t0
        keep.close()
    finally:
        run_cli("stop", "--state-dir", str(tmp_path / "state"))
    assert r.returncode == 0 and "stopped tritonserver" in r.stdout, r.stdout + r.stderr
    assert took < 15, took
    assert not pid_alive(h.front_pid) and not pid_alive(h.pid)
    assert all(port_is_free(p) for p in (h.http_port, h.triton_http_port, h.grpc_port, h.metrics_port))
