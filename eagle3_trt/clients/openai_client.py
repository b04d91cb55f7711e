"""A client for an OpenAI-compatible endpoint (NVIDIA Dynamo's frontend over the eagle3 workers),
with the interface of ``LLMClient`` (``stream`` / ``generate`` / ``model_config`` / ``server_metadata``),
so that ``eagle3-trt bench`` runs one loop against Triton or Dynamo.

What the Triton model returns as tensors comes from Dynamo's ``nvext`` extension (ai-dynamo 1.6.1):
- tokens per streamed chunk: ``"nvext": {"extra_fields": ["completion_token_ids"]}`` puts the chunk's
  token ids in each event's ``nvext.completion_token_ids``; a speculative step delivers several
  tokens in one event, as on Triton, and the bench's per-token ITL needs the count;
- per-request speculative statistics: ``extra_fields: ["engine_data"]`` returns the worker's
  ``engine_data.eagle3`` (``dynamo_serving/engine.py``) on the final event;
- speculation off for one request: ``"nvext": {"annotations": ["eagle3_speculative=false"]}``, which
  the frontend forwards to the worker (its ``nvext`` refuses unknown keys, so no other field can).

Chat (default) sends ``messages`` to ``/v1/chat/completions`` and the frontend applies the model's
chat template (the bundle's, read from ``target/``); ``chat=False`` sends the text as it is to
``/v1/completions``.

    with OpenAIClient("http://127.0.0.1:8080/v1") as c:
        for chunk in c.stream("Hello", GenerationParams(max_tokens=32)):
            print(chunk.text, end="", flush=True)
"""

from __future__ import annotations

import importlib.metadata
import json
import time
from collections.abc import Iterator

import requests

from eagle3_trt.clients.llm_client import Chunk, GenerationParams, Result, ServerError
from eagle3_trt.errors import UserError
from eagle3_trt.runtime.llm_api import ENGINE_DATA_KEY, SERVED_MODEL_NAME

DEFAULT_PARAMS = GenerationParams()  # frozen: one shared default

SPECULATION_OFF_ANNOTATION = "eagle3_speculative=false"


def normalize_openai_url(url: str) -> str:
    """``http://host:port/v1`` (a bare ``host:port`` gets the scheme and ``/v1``)."""
    u = url.strip().rstrip("/")
    if u.startswith("https://"):
        raise UserError("--openai-url", "https is not supported by this client", "use the frontend's plain HTTP port")
    if not u.startswith("http://"):
        u = "http://" + u
    if not u.endswith("/v1"):
        if u.count("/") > 2:
            raise UserError("--openai-url", f"'{url}' should end in /v1", "e.g. http://127.0.0.1:8080/v1")
        u += "/v1"
    return u


def perf_from_engine_data(stats: dict) -> dict:
    """The worker's ``engine_data.eagle3`` under the names of the Triton model's perf outputs."""
    return {
        "speculative_decoding": bool(stats.get("speculative")),
        "total_draft_tokens": stats.get("draft_tokens"),
        "total_accepted_draft_tokens": stats.get("accepted_draft_tokens"),
        "acceptance_rate": stats.get("acceptance_rate"),
        "acceptance_length": stats.get("acceptance_length"),
    }


def _error_message(r: requests.Response) -> str:
    try:
        body = r.json()
    except ValueError:
        return f"HTTP {r.status_code}: {r.text[:300]}"
    msg = body.get("message") or body.get("error") or body
    if isinstance(msg, dict):
        msg = msg.get("message", msg)
    return f"HTTP {r.status_code}: {msg}"


class OpenAIClient:
    """One HTTP session; use one client per thread (as with ``LLMClient``)."""

    server_kind = "dynamo"

    def __init__(
        self,
        url: str = "http://127.0.0.1:8080/v1",
        model: str = SERVED_MODEL_NAME,
        timeout_s: float = 600.0,
        chat: bool = True,
        system: str | None = None,
        bundle: str | None = None,
    ):
        self.url = normalize_openai_url(url)
        self.model = model
        self.timeout_s = timeout_s
        self.chat = chat
        self.system = system
        self.bundle = bundle  # where the served bundle is, when known (serve-dynamo's state): for the report
        self._session: requests.Session | None = None

    def _http(self) -> requests.Session:
        if self._session is None:
            self._session = requests.Session()
        return self._session

    def close(self, cancel: bool = False) -> None:
        """Close the session (an open stream is dropped: the frontend cancels its request)."""
        del cancel
        if self._session is not None:
            self._session.close()
            self._session = None

    def __enter__(self) -> OpenAIClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- what the bench's environment record reads (the shape of LLMClient's answers) ---------------
    def model_config(self) -> dict:
        """The served model from ``/v1/models``, with the bundle path as a parameter when known."""
        r = self._http().get(f"{self.url}/models", timeout=30)
        if r.status_code != 200:
            raise ServerError(_error_message(r))
        found = next((m for m in r.json().get("data", []) if m.get("id") == self.model), None)
        if found is None:
            raise ServerError(f"model '{self.model}' is not listed at {self.url}/models")
        params = {"eagle3_runtime": {"string_value": "reference (Dynamo workers)"}}
        if self.bundle:
            params["eagle3_bundle"] = {"string_value": self.bundle}
        return {"name": self.model, "context_window": found.get("context_window"), "owned_by": found.get("owned_by"), "parameters": params}

    def server_metadata(self) -> dict:
        """The frontend has no version endpoint: the ai-dynamo version installed here, when the
        frontend is on this machine (the bench refuses remote servers unless --allow-remote)."""
        try:
            version = importlib.metadata.version("ai-dynamo")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
        return {"name": "NVIDIA Dynamo (OpenAI frontend)", "version": version, "kind": self.server_kind, "url": self.url}

    def bundle_path(self) -> str | None:
        return self.bundle

    # -- generation -----------------------------------------------------------------------------
    def _body(self, prompt: str, p: GenerationParams, streaming: bool) -> dict:
        nvext: dict = {"extra_fields": (["completion_token_ids"] if streaming else []) + (["engine_data"] if p.perf_metrics else [])}
        if p.speculative is False:
            nvext["annotations"] = [SPECULATION_OFF_ANNOTATION]
        body: dict = {"model": self.model, "stream": streaming, "nvext": nvext}
        if self.chat:
            msgs = ([{"role": "system", "content": self.system}] if self.system else []) + [{"role": "user", "content": prompt}]
            body["messages"] = msgs
        else:
            body["prompt"] = prompt
        for key, val in (("max_tokens", p.max_tokens), ("temperature", p.temperature), ("top_p", p.top_p), ("top_k", p.top_k), ("seed", p.seed)):
            if val is not None:
                body[key] = val
        if p.temperature is None:
            body["temperature"] = 0.0  # GenerationParams' None means greedy (the Triton model's default); OpenAI's is 1.0
        if p.stop:
            body["stop"] = list(p.stop)
        return body

    def _text(self, choice: dict) -> str:
        if self.chat:
            part = choice.get("delta") if "delta" in choice else choice.get("message")
            return (part or {}).get("content") or ""
        return choice.get("text") or ""

    def stream(self, prompt: str, params: GenerationParams = DEFAULT_PARAMS, streaming: bool = True) -> Iterator[Chunk]:
        """Yield one Chunk per server-sent event; the one with the finish reason is ``final``. Raises ServerError."""
        path = "/chat/completions" if self.chat else "/completions"
        body = self._body(prompt, params, streaming)
        s = self._http()
        if not streaming:
            r = s.post(self.url + path, json=body, timeout=self.timeout_s)
            t = time.perf_counter()
            if r.status_code != 200:
                raise ServerError(_error_message(r))
            d = r.json()
            choice = (d.get("choices") or [{}])[0]
            stats = ((d.get("nvext") or {}).get("engine_data") or {}).get(ENGINE_DATA_KEY)
            yield Chunk(
                self._text(choice),
                int((d.get("usage") or {}).get("completion_tokens") or 0),
                t,
                True,
                choice.get("finish_reason"),
                perf_from_engine_data(stats) if stats else {},
            )
            return
        final_seen = False
        with s.post(self.url + path, json=body, stream=True, timeout=self.timeout_s) as r:
            if r.status_code != 200:
                raise ServerError(_error_message(r))
            for line in r.iter_lines():
                if not line or not line.startswith(b"data:"):
                    continue  # blank separators and SSE comments / event names
                t = time.perf_counter()
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                d = json.loads(data)
                if "choices" not in d:
                    raise ServerError(str(d.get("message") or d.get("error") or d))
                if not d["choices"]:
                    continue  # a usage-only event
                choice = d["choices"][0]
                nv = d.get("nvext") or {}
                fr = choice.get("finish_reason")
                stats = (nv.get("engine_data") or {}).get(ENGINE_DATA_KEY)
                final_seen = final_seen or fr is not None
                # The final chunk is yielded at once (its arrival time is the request's end); reading on
                # to [DONE] afterwards keeps the connection reusable for the next request.
                yield Chunk(self._text(choice), len(nv.get("completion_token_ids") or []), t, fr is not None, fr, perf_from_engine_data(stats) if stats else {})
        if not final_seen:
            raise ServerError("the stream ended without a finish reason")

    def generate(self, prompt: str, params: GenerationParams = DEFAULT_PARAMS, stream: bool = False) -> Result:
        t_send = time.perf_counter()
        chunks = list(self.stream(prompt, params, streaming=stream))
        if not chunks:
            raise ServerError("no response")
        last = chunks[-1]
        first = next((c.t for c in chunks if c.n_tokens > 0), last.t)
        return Result("".join(c.text for c in chunks), sum(c.n_tokens for c in chunks), last.finish_reason, last.perf, t_send, first, last.t, chunks)
