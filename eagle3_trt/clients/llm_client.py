"""A small client for the eagle3 Triton model (llmapi tensor interface): gRPC or HTTP, streaming or not.

gRPC goes through Triton's streaming API even for a single response, because Triton's
unary ModelInfer refuses decoupled models. HTTP uses the generate extension
(``/generate`` and ``/generate_stream`` with server-sent events).

    from eagle3_trt.clients.llm_client import LLMClient, GenerationParams
    with LLMClient("127.0.0.1:8001") as c:
        for chunk in c.stream(prompt, GenerationParams(max_tokens=64)):
            print(chunk.text, end="", flush=True)
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import requests

from eagle3_trt.errors import UserError
from eagle3_trt.runtime.llm_api import SERVED_MODEL_NAME
from eagle3_trt.triton_serving.interface import PERF_OUTPUTS

# The final response's perf tensors, as the model declares them.
PERF_FIELDS = PERF_OUTPUTS


class ServerError(RuntimeError):
    """The server answered with an error (bad input, cancelled, generation failed)."""


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    speculative: bool | None = None  # None: server default (on); False: this request without the draft
    perf_metrics: bool = True
    exclude_input: bool = True


@dataclass
class Chunk:
    text: str
    n_tokens: int
    t: float  # time.perf_counter() when it arrived
    final: bool = False
    finish_reason: str | None = None
    perf: dict = field(default_factory=dict)


class Timed:
    """Time to first token and end-to-end latency from ``t_send``/``t_first``/``t_end`` (perf_counter s)."""

    t_send: float
    t_first: float
    t_end: float

    @property
    def ttft_s(self) -> float:
        return self.t_first - self.t_send

    @property
    def latency_s(self) -> float:
        return self.t_end - self.t_send


@dataclass
class Result(Timed):
    text: str
    n_tokens: int
    finish_reason: str | None
    perf: dict
    t_send: float
    t_first: float
    t_end: float
    chunks: list[Chunk]


def normalize_url(url: str, http: bool) -> str:
    u = url.strip().rstrip("/")
    for scheme in ("grpc://", "http://", "https://"):
        if u.startswith(scheme):
            if scheme == "https://":
                raise UserError("--url", "https is not supported by this client", "use the server's plain HTTP/gRPC port")
            u = u[len(scheme) :]
    if "/" in u:
        raise UserError("--url", f"'{url}' should be host:port", "e.g. 127.0.0.1:8001 (gRPC) or 127.0.0.1:8000 (--http)")
    return ("http://" + u) if http else u


# The integer inputs' type, unless the model's metadata says otherwise: this project's model
# declares INT64, upstream's llmapi model INT32 (interface.py says why they differ).
INT_INPUTS = ("sampling_param_max_tokens", "sampling_param_top_k")
_NP_INT: dict[str, type[np.signedinteger]] = {"INT32": np.int32, "INT64": np.int64}


def _int_tensor(name: str, value: int, datatype: str) -> tuple[str, np.ndarray, str]:
    """An integer input in the type the model declares; a value that would not fit is refused
    here (Triton would reject the dtype, and a narrower numpy array would wrap it)."""
    np_type = _NP_INT.get(datatype, np.int64)
    info = np.iinfo(np_type)
    if not info.min <= value <= info.max:
        raise UserError(name, f"{value} does not fit the model's {datatype} input", f"at most {info.max}")
    return name, np.array([value], dtype=np_type), datatype if datatype in _NP_INT else "INT64"


def infer_inputs(items: list[tuple[str, np.ndarray, str]]) -> list:
    """tritonclient gRPC ``InferInput``s of (name, array, Triton datatype)."""
    import tritonclient.grpc as g  # local: the optional [triton] extra; an HTTP-only client does not need it

    out = []
    for name, arr, dt in items:
        t = g.InferInput(name, list(arr.shape), dt)
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


def _grpc_inputs(prompt: str, p: GenerationParams, streaming: bool, int_types: dict[str, str] | None = None):
    types = int_types or {}

    items: list[tuple[str, np.ndarray, str]] = [
        ("text_input", np.array([prompt.encode("utf-8")], dtype=np.object_), "BYTES"),
        ("streaming", np.array([streaming], dtype=np.bool_), "BOOL"),
        ("sampling_param_exclude_input_from_output", np.array([p.exclude_input], dtype=np.bool_), "BOOL"),
        ("sampling_param_return_perf_metrics", np.array([p.perf_metrics], dtype=np.bool_), "BOOL"),
    ]
    if p.max_tokens is not None:
        items.append(_int_tensor("sampling_param_max_tokens", p.max_tokens, types.get("sampling_param_max_tokens", "INT64")))
    if p.temperature is not None:
        items.append(("sampling_param_temperature", np.array([p.temperature], dtype=np.float32), "FP32"))
    if p.top_p is not None:
        items.append(("sampling_param_top_p", np.array([p.top_p], dtype=np.float32), "FP32"))
    if p.top_k is not None:
        items.append(_int_tensor("sampling_param_top_k", p.top_k, types.get("sampling_param_top_k", "INT64")))
    if p.seed is not None:
        items.append(("sampling_param_seed", np.array([p.seed], dtype=np.uint64), "UINT64"))
    if p.stop:
        items.append(("sampling_param_stop", np.array([s.encode() for s in p.stop], dtype=np.object_), "BYTES"))
    if p.speculative is not None:
        items.append(("speculative_decoding", np.array([p.speculative], dtype=np.bool_), "BOOL"))
    return infer_inputs(items)


def _http_payload(prompt: str, p: GenerationParams, streaming: bool) -> dict:
    d: dict = {
        "text_input": prompt,
        "streaming": streaming,
        "sampling_param_exclude_input_from_output": p.exclude_input,
        "sampling_param_return_perf_metrics": p.perf_metrics,
    }
    for key, val in (
        ("sampling_param_max_tokens", p.max_tokens),
        ("sampling_param_temperature", p.temperature),
        ("sampling_param_top_p", p.top_p),
        ("sampling_param_top_k", p.top_k),
        ("sampling_param_seed", p.seed),
        ("speculative_decoding", p.speculative),
    ):
        if val is not None:
            d[key] = val
    if p.stop:
        d["sampling_param_stop"] = list(p.stop)
    return d


def _error_text(body: str) -> str:
    """The message from an error body: plain JSON, or an SSE ``data: {...}`` event."""
    text = body.strip()
    if text.startswith("data:"):
        text = text[5:].strip()
    try:
        return str(json.loads(text).get("error", body))
    except (ValueError, AttributeError):
        return body


def _scalar(v):
    if isinstance(v, np.ndarray):
        v = v.reshape(-1)[0] if v.size else None
    if isinstance(v, bytes):
        v = v.decode("utf-8")
    if isinstance(v, list):
        v = v[0] if v else None
    if isinstance(v, np.generic):
        v = v.item()
    return v


class LLMClient:
    """One connection (one gRPC stream at a time); use one client per thread."""

    server_kind = "triton"  # what the bench's report names (OpenAIClient: "dynamo")

    def __init__(self, url: str = "127.0.0.1:8001", model: str = SERVED_MODEL_NAME, http: bool = False, timeout_s: float = 600.0):
        self.http = http
        self.url = normalize_url(url, http)
        self.model = model
        self.timeout_s = timeout_s
        self._grpc = None
        self._int_types: dict[str, str] | None = None
        self._session = None
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()

    # -- plumbing -----------------------------------------------------------
    def _grpc_client(self):
        if self._grpc is None:
            import tritonclient.grpc as g  # local: the optional [triton] extra; an HTTP-only client does not need it

            self._grpc = g.InferenceServerClient(self.url)
            self._grpc.start_stream(callback=lambda result, error: self._queue.put((result, error, time.perf_counter())))
        return self._grpc

    def _grpc_int_types(self) -> dict[str, str]:
        """The datatypes the model declares for its integer inputs (read once)."""
        if self._int_types is None:
            from tritonclient.utils import InferenceServerException  # local: the optional [triton] extra

            try:
                meta = self._grpc_client().get_model_metadata(self.model, as_json=True)
            except InferenceServerException:  # no such model: the request itself reports it
                return {}
            self._int_types = {i["name"]: i["datatype"] for i in meta.get("inputs", []) if i.get("name") in INT_INPUTS}
        return self._int_types

    def _http_session(self):
        if self._session is None:
            self._session = requests.Session()
        return self._session

    def close(self, cancel: bool = False) -> None:
        """Close the connection; ``cancel=True`` cancels requests still in flight (the server frees them)."""
        if self._grpc is not None:
            try:
                self._grpc.stop_stream(cancel_requests=cancel)
            finally:
                self._grpc.close()
                self._grpc = None
        if self._session is not None:
            self._session.close()
            self._session = None

    def __enter__(self) -> LLMClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def model_config(self) -> dict:
        """The served model's config (JSON form of its config.pbtxt)."""
        if self.http:
            r = self._http_session().get(f"{self.url}/v2/models/{self.model}/config", timeout=30)
            if r.status_code != 200:
                raise ServerError(r.text)
            return r.json()
        cfg = self._grpc_client().get_model_config(self.model, as_json=True)
        return cfg.get("config", cfg)

    def server_metadata(self) -> dict:
        """The server's name, version and extensions (Triton's /v2 metadata)."""
        if self.http:
            r = self._http_session().get(f"{self.url}/v2", timeout=30)
            if r.status_code != 200:
                raise ServerError(r.text)
            return r.json()
        return self._grpc_client().get_server_metadata(as_json=True)

    def bundle_path(self) -> str | None:
        """Where the server says the bundle is (useful for the chat template when it is local)."""
        params = self.model_config().get("parameters", {})
        v = params.get("eagle3_bundle", {})
        return v.get("string_value") or v.get("stringValue") or None

    # -- generation ---------------------------------------------------------
    def stream(self, prompt: str, params: GenerationParams = GenerationParams(), streaming: bool = True) -> Iterator[Chunk]:
        """Yield responses as they arrive; the last one has ``final=True``. Raises ServerError."""
        if self.http:
            yield from self._http_stream(prompt, params, streaming)
        else:
            yield from self._grpc_stream(prompt, params, streaming)

    def generate(self, prompt: str, params: GenerationParams = GenerationParams(), stream: bool = False) -> Result:
        t_send = time.perf_counter()
        chunks = list(self.stream(prompt, params, streaming=stream))
        if not chunks:
            raise ServerError("no response")
        last = chunks[-1]
        first = next((c.t for c in chunks if c.n_tokens > 0), last.t)
        return Result(
            "".join(c.text for c in chunks),
            sum(c.n_tokens for c in chunks),
            last.finish_reason,
            last.perf,
            t_send,
            first,
            last.t,
            chunks,
        )

    def _grpc_stream(self, prompt: str, params: GenerationParams, streaming: bool) -> Iterator[Chunk]:
        with self._lock:  # one request at a time on this stream
            client = self._grpc_client()
            rid = uuid.uuid4().hex
            inputs = _grpc_inputs(prompt, params, streaming, self._grpc_int_types())
            client.async_stream_infer(self.model, inputs, request_id=rid, enable_empty_final_response=True)
            deadline = time.monotonic() + self.timeout_s
            while True:
                try:
                    result, error, t = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    raise ServerError(f"no response within {self.timeout_s:.0f} s") from None
                if error is not None:
                    raise ServerError(str(error.message() if hasattr(error, "message") else error))
                resp = result.get_response()
                final = bool(resp.parameters["triton_final_response"].bool_param) if "triton_final_response" in resp.parameters else False
                names = {o.name for o in resp.outputs}
                if not names and final:  # empty final marker after a final data response
                    return
                text = result.as_numpy("text_output")
                n = result.as_numpy("num_output_tokens")
                fr = result.as_numpy("finish_reason")
                perf = {k: _scalar(result.as_numpy(k)) for k in PERF_FIELDS if k in names}
                yield Chunk(
                    _scalar(text) or "" if text is not None else "",
                    int(_scalar(n)) if n is not None else 0,
                    t,
                    final,
                    _scalar(fr) if fr is not None else None,
                    perf,
                )
                if final:
                    return

    def _http_stream(self, prompt: str, params: GenerationParams, streaming: bool) -> Iterator[Chunk]:
        s = self._http_session()
        payload = _http_payload(prompt, params, streaming)
        if not streaming:
            r = s.post(f"{self.url}/v2/models/{self.model}/generate", json=payload, timeout=self.timeout_s)
            t = time.perf_counter()
            if r.status_code != 200:
                raise ServerError(_error_text(r.text))
            body = r.json()
            if "error" in body:
                raise ServerError(str(body["error"]))
            yield self._http_chunk(body, t, True)
            return
        with s.post(f"{self.url}/v2/models/{self.model}/generate_stream", json=payload, stream=True, timeout=self.timeout_s) as r:
            if r.status_code != 200:
                raise ServerError(_error_text(r.text))
            for line in r.iter_lines():
                if not line or not line.startswith(b"data:"):
                    continue
                t = time.perf_counter()
                body = json.loads(line[5:])
                if "error" in body:
                    raise ServerError(body["error"])
                c = self._http_chunk(body, t, "finish_reason" in body)
                yield c
                if c.final:
                    return

    @staticmethod
    def _http_chunk(body: dict, t: float, final: bool) -> Chunk:
        perf = {k: _scalar(body[k]) for k in PERF_FIELDS if k in body}
        return Chunk(
            str(_scalar(body.get("text_output")) or ""),
            int(_scalar(body.get("num_output_tokens")) or 0),
            t,
            final,
            _scalar(body.get("finish_reason")),
            perf,
        )
