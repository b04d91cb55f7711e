"""The reference runtime as a NVIDIA Dynamo backend: ``dynamo.common.backend.LLMEngine`` over ``runtime.factory.open_llm``.

Dynamo's frontend tokenizes (chat template included), routes, detokenizes and applies stop
strings; a backend receives token ids and streams token ids back (contract:
``dynamo/common/backend/engine.py`` and ``README.md`` in the ``ai-dynamo`` 1.6.1 wheel). This engine
drives exactly the LLM-API-shaped interface the Triton model drives (``generate_async`` with
``SamplingParams``, an async-iterable ``RequestOutput``, ``abort``, ``request_perf_metrics``), so
Triton and Dynamo sit on one serving path. On a GPU box the same interface is
``tensorrt_llm.LLM`` behind ``python -m dynamo.trtllm`` (see ``launch/dynamo-*.sh`` of a bundle).

Per-request speculative statistics go out twice:
  * on the last chunk as ``engine_data.eagle3`` (draft tokens, accepted draft tokens, acceptance
    rate and length, target forwards); the frontend returns it in ``nvext.engine_data`` when the
    request asks for it with ``"nvext": {"extra_fields": ["engine_data"]}``;
  * as Prometheus counters and a histogram prefixed ``eagle3_`` on the worker's ``/metrics``
    (Dynamo's system server, ``DYN_SYSTEM_PORT``), bridged with
    ``dynamo.common.backend.metrics.register_engine_registry``.

Per request, speculation is switched off with the annotation ``eagle3_speculative=false``
(``"nvext": {"annotations": ["eagle3_speculative=false"]}``): the frontend's ``nvext`` accepts no
other free-form field (unknown keys are a 400), and it forwards ``nvext.annotations`` unchanged
as the request's ``annotations`` (seen with Dynamo 1.6.1). It maps to the ``eagle3_speculative``
sampling flag the Triton model's ``speculative_decoding`` input sets, so A/B runs (``eagle3-trt
bench --openai-url``) switch the same thing on both serving paths.

Requests the reference runtime cannot honour (n > 1, beam search, guided decoding, penalties,
min_tokens, ignore_eos, logprobs, echo, a prompt plus max_tokens over the bundle's max_seq_len) are refused with
``InvalidArgument`` naming the field, which the frontend answers as a 4xx. (``logit_bias``, ``suffix`` and
``tools`` do not reach the worker as fields it could refuse; README's Dynamo section lists them.)

A request the runtime ends before its natural end (worker shutdown, abort) ends with an exception,
never with a finish_reason: see ``_cut_off`` and ``launcher.stop``.

Traffic capture (``serve-dynamo --capture DIR``: the launcher puts the settings in the worker's
environment): each request that ended naturally is handed to ``runtime.capture.Capturer`` with the
token ids the frontend sent, the runtime's output, the sampling options and the ``engine_data``
figures; the annotation ``eagle3_category=NAME`` rides along as the record's category.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from collections.abc import AsyncGenerator, Mapping
from pathlib import Path
from typing import Any, get_args

from dynamo._core import Context
from dynamo.common.backend import EngineConfig, LLMEngine, WorkerConfig
from dynamo.common.backend.engine import GenerateChunk, GenerateRequest, LlmRegistration
from dynamo.common.backend.metrics import register_engine_registry
from dynamo.common.backend.run import run
from dynamo.llm.exceptions import Cancelled, EngineShutdown, InvalidArgument
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from eagle3_trt.dynamo_serving.drain import own_deadline
from eagle3_trt.dynamo_serving.launcher import INFLIGHT_METRIC, NAMESPACE
from eagle3_trt.pipeline.bundle import open_bundle
from eagle3_trt.runtime.capture import Capturer, CaptureSource, config_from_env, load_tokenizer
from eagle3_trt.runtime.factory import open_llm
from eagle3_trt.runtime.llm_api import ENGINE_DATA_KEY, SERVED_MODEL_NAME, DeviceName, SamplingParamError, SamplingParams, ServingLlm, spec_stats
from eagle3_trt.runtime.request_contract import ClientRequest, ServedRequest, check_prompt_text, resolve_request

log = logging.getLogger("eagle3_trt.dynamo")

DEFAULT_COMPONENT = "backend"
METRIC_PREFIX = "eagle3_"

# Sampling options the reference runtime implements; everything else must be absent or neutral.
# The per-request speculation switch carried in ``annotations`` (see the module docstring).
SPECULATION_ANNOTATION = "eagle3_speculative"
# The request's category for traffic capture (``serve-dynamo --capture``): ``eagle3_category=NAME``.
CATEGORY_ANNOTATION = "eagle3_category"

# The runtime's finish reasons of an answer that ended by itself (EOS / stop string, max_tokens);
# anything else ("cancelled", "timeout", ...) is an answer cut off and ends as an error.
NATURAL_FINISH = ("stop", "length")

_NEUTRAL = {
    "n": (None, 1),
    "best_of": (None, 1),
    "use_beam_search": (None, False),
    "repetition_penalty": (None, 1.0),
    "min_p": (None, 0.0),
    "length_penalty": (None, 1.0),
    "guided_decoding": (None,),
}


class SpecMetrics:
    """The worker's speculative-decoding counters (one private registry, bridged into /metrics)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        p = METRIC_PREFIX
        self.requests = Counter(f"{p}requests", "finished requests", ["finish_reason"], registry=self.registry)
        self.output_tokens = Counter(f"{p}output_tokens", "tokens returned to clients", registry=self.registry)
        self.draft_tokens = Counter(f"{p}draft_tokens", "draft tokens proposed", registry=self.registry)
        self.accepted = Counter(f"{p}accepted_draft_tokens", "draft tokens accepted by the target", registry=self.registry)
        self.forwards = Counter(f"{p}target_forwards", "target forward passes", registry=self.registry)
        self.cut_off = Counter(f"{p}cut_off_requests", "requests ended with an error before their natural end", registry=self.registry)
        # Read by `stop-dynamo` when its grace period runs out, to report what it has to cut off.
        self.inflight = Gauge(INFLIGHT_METRIC, "requests being generated", registry=self.registry)
        self.acceptance_length = Histogram(
            f"{p}request_acceptance_length",
            "per request: tokens per target forward (prefill included)",
            buckets=(1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0),
            registry=self.registry,
        )

    def record(self, finish_reason: str, n_tokens: int, stats: dict[str, Any]) -> None:
        self.requests.labels(finish_reason=finish_reason).inc()
        self.output_tokens.inc(n_tokens)
        self.forwards.inc(stats["target_forwards"])
        if stats["speculative"]:
            self.draft_tokens.inc(stats["draft_tokens"])
            self.accepted.inc(stats["accepted_draft_tokens"])
            if stats["acceptance_length"]:
                self.acceptance_length.observe(stats["acceptance_length"])


class Eagle3ReferenceEngine(LLMEngine):
    """The reference runtime (the toolkit's PyTorch EAGLE-3 engine, opened with ``open_llm``) behind Dynamo's backend contract."""

    def __init__(self, bundle: Path, *, served_model_name: str, device: str, torch_threads: int | None, speculation: bool):
        self.bundle = bundle
        self.served_model_name = served_model_name
        self.device = device
        self.torch_threads = torch_threads
        self.speculation = speculation
        self.llm: ServingLlm | None = None
        self.max_seq_len = 0
        self.metrics = SpecMetrics()
        self._inflight: dict[str, Any] = {}
        self.card_dir: Path | None = None  # from_args: --card-dir (rolling.py)
        self._closing = False
        self.capture: Capturer | None = None
        self.tokenizer: Any = None  # start(): the bundle's tokenizer, for the contract's prompt checks

    @classmethod
    async def from_args(cls, argv: list[str] | None = None) -> tuple[Eagle3ReferenceEngine, WorkerConfig]:
        p = argparse.ArgumentParser(prog="python -m eagle3_trt.dynamo_serving.worker", description="eagle3-trt reference runtime as a Dynamo worker")
        p.add_argument("--bundle", required=True, type=Path)
        p.add_argument("--served-model-name", default=SERVED_MODEL_NAME)
        p.add_argument("--namespace", default=NAMESPACE)
        p.add_argument("--component", default=DEFAULT_COMPONENT)
        p.add_argument("--endpoint", default="generate")
        p.add_argument("--discovery-backend", default=os.environ.get("DYN_DISCOVERY_BACKEND", "file"))
        p.add_argument("--request-plane", default=os.environ.get("DYN_REQUEST_PLANE", "tcp"))
        p.add_argument("--device", choices=get_args(DeviceName), default="auto")
        p.add_argument("--torch-threads", type=int, default=None)
        p.add_argument("--no-speculation", action="store_true", help="serve the target alone (A/B baseline)")
        # `deploy-dynamo` (rolling.py): a replacement worker registers the model card of the workers it
        # replaces (the same target checkpoint): the frontend keeps one model and routes to both.
        p.add_argument("--card-dir", type=Path, default=None, help="the model card's directory (default: BUNDLE/target)")
        a = p.parse_args(argv)
        bundle = a.bundle.resolve()
        card = (a.card_dir or bundle / "target").resolve()
        engine = cls(bundle, served_model_name=a.served_model_name, device=a.device, torch_threads=a.torch_threads, speculation=not a.no_speculation)
        engine.card_dir = card
        wc = WorkerConfig(
            namespace=a.namespace,
            component=a.component,
            endpoint=a.endpoint,
            # The model card (tokenizer, chat template, generation config) is read from the
            # bundle's target directory; clients address the model by served_model_name.
            model_name=str(card),
            served_model_name=a.served_model_name,
            endpoint_types="chat,completions",
            discovery_backend=a.discovery_backend,
            request_plane=a.request_plane,
            # No KV events: the reference runtime has no paged KV cache to report.
            enable_kv_routing=False,
        )
        return engine, wc

    async def start(self, worker_id: int) -> EngineConfig:
        del worker_id
        b = open_bundle(self.bundle)
        self.max_seq_len = b.max_seq_len
        self.llm = await asyncio.to_thread(open_llm, b, "reference", device=self.device, torch_threads=self.torch_threads, speculation=self.speculation)
        self.capture = self._capturer(b)
        self.tokenizer = await asyncio.to_thread(load_tokenizer, b.tokenizer_dir)
        log.info("eagle3 reference runtime ready: %s (max_seq_len %d, speculation %s)", self.bundle, self.max_seq_len, self.speculation)
        return EngineConfig(
            model=str(self.card_dir or self.bundle / "target"),
            served_model_name=self.served_model_name,
            llm=LlmRegistration(context_length=self.max_seq_len, enable_eagle=self.speculation),
        )

    def _capturer(self, b: Any) -> Capturer | None:
        """`serve-dynamo --capture`: the capture settings the launcher put in this worker's environment."""
        try:
            cfg = config_from_env()
            if cfg is None:
                return None
            tok_dir = b.tokenizer_dir
            source = CaptureSource(b.manifest.fingerprint, self.served_model_name, "dynamo")
            return Capturer(cfg, source, tokenizer=lambda: load_tokenizer(tok_dir), warn=log.warning)
        except Exception as e:  # capture must not keep the worker from serving
            log.warning("capture off: %s: %s", type(e).__name__, e)
            return None

    async def register_prometheus(self, metrics: Any) -> None:
        register_engine_registry(metrics, self.metrics.registry, prefix_filters=[METRIC_PREFIX])

    # -- request mapping --------------------------------------------------------------------------
    @staticmethod
    def request_speculative(request: Mapping[str, Any]) -> bool:
        """False when the request carries ``eagle3_speculative=false``; a malformed value is refused
        rather than read as "on", so a typo cannot silently turn an A/B baseline into speculation."""
        speculative = True
        for a in request.get("annotations") or []:
            name, sep, value = str(a).partition("=")
            if name != SPECULATION_ANNOTATION:
                continue  # the frontend's own annotations and anything else are not ours
            if not sep or value.lower() not in ("true", "false"):
                raise InvalidArgument(f"annotation {a!r}: expected {SPECULATION_ANNOTATION}=true or {SPECULATION_ANNOTATION}=false")
            speculative = value.lower() == "true"
        return speculative

    @staticmethod
    def request_category(request: Mapping[str, Any]) -> str | None:
        """The ``eagle3_category=NAME`` annotation (recorded with captured traffic), if any."""
        for a in request.get("annotations") or []:
            name, sep, value = str(a).partition("=")
            if name == CATEGORY_ANNOTATION and sep and value:
                return value
        return None

    def sampling_params(self, request: Mapping[str, Any]) -> tuple[ServedRequest, SamplingParams]:
        """Dynamo's PreprocessedRequest (sampling_options, stop_conditions) -> (the contract's ServedRequest, SamplingParams)."""
        so = request.get("sampling_options") or {}
        sc = request.get("stop_conditions") or {}
        for name, neutral in _NEUTRAL.items():
            if so.get(name) not in neutral:
                raise InvalidArgument(f"{name}={so.get(name)!r}: not supported by the eagle3-trt reference runtime")
        if sc.get("ignore_eos"):
            raise InvalidArgument("ignore_eos: not supported by the eagle3-trt reference runtime")
        if sc.get("min_tokens"):
            raise InvalidArgument("min_tokens: not supported by the eagle3-trt reference runtime")
        # The frontend puts OpenAI's logprobs / top_logprobs (and, for completions' echo, prompt_logprobs)
        # in output_options and builds that part of the answer from what the engine returns; the reference
        # runtime returns no logprobs, so without this the request would be answered as if they were absent
        # (seen with Dynamo 1.6.1: logprobs=2 gave none, echo=true gave no prompt text).
        oo = request.get("output_options") or {}
        if oo.get("logprobs") is not None:
            raise InvalidArgument(f"logprobs={oo['logprobs']!r}: not supported by the eagle3-trt reference runtime")
        if oo.get("prompt_logprobs") is not None:
            raise InvalidArgument("echo / prompt_logprobs: not supported by the eagle3-trt reference runtime")
        top_k = so.get("top_k")
        client = ClientRequest(
            max_tokens=sc.get("max_tokens"),
            temperature=so.get("temperature"),
            top_p=so.get("top_p"),
            # The frontend's "no top-k" is -1 (its validate_top_k takes k >= -1, and a request's top_k 0 reaches
            # the worker as -1: seen with Dynamo 1.6.1); TensorRT-LLM's is 0. Without this, top_k 0 was a 400.
            top_k=0 if top_k == -1 else top_k,
            seed=so.get("seed"),
            stop=tuple(sc.get("stop") or ()),
            frequency_penalty=so.get("frequency_penalty"),
            presence_penalty=so.get("presence_penalty"),
        )
        try:
            self.check_prompt(request.get("token_ids") or [])
            # The one request contract (runtime/request_contract.py), as Triton's model applies it: unset
            # sampling fields stay unset (greedy when all are), max_tokens unset is the rest of the context.
            served = resolve_request(client, prompt_len=len(request.get("token_ids") or []), max_seq_len=self.max_seq_len)
            return served, SamplingParams(**served.sampling_kwargs(), return_perf_metrics=True, eagle3_speculative=self.request_speculative(request))
        except SamplingParamError as e:  # names the field it refuses
            raise InvalidArgument(str(e)) from None

    def check_prompt(self, token_ids: list[int]) -> None:
        """The contract's prompt checks on the text the frontend tokenized (the worker gets token ids only): a
        whitespace-only completions prompt, or invalid UTF-8 (the frontend hands it on replaced by U+FFFD).
        Special tokens (BOS, a chat template's markers) are not text; a chat prompt's template text is."""
        if self.tokenizer is not None and token_ids:
            text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
            # U+FFFD is refused only where the ids are the tokenized text itself (the frontend replaced invalid
            # bytes before tokenizing); token-id prompts (e.g. regenerated traffic) may split a character
            special = set(self.tokenizer.all_special_ids)
            tokenized = list(self.tokenizer.encode(text, add_special_tokens=False)) == [t for t in token_ids if t not in special]
            check_prompt_text(text, utf8=tokenized)

    # -- the contract ---------------------------------------------------------------------------
    async def generate(self, request: GenerateRequest, context: Context) -> AsyncGenerator[GenerateChunk, None]:
        assert self.llm is not None, "generate() before start()"
        served, sp = self.sampling_params(request)
        ids = [int(t) for t in request["token_ids"]]
        out = self.llm.generate_async(ids, sp, streaming=True)
        rid = context.id()
        self._inflight[rid] = out
        self.metrics.inflight.set(len(self._inflight))
        sent = 0
        try:
            async for o in out:
                c = o.outputs[0]
                new = list(c.token_ids[sent:])
                sent = len(c.token_ids)
                if not o.finished:
                    if new:
                        yield {"token_ids": new, "index": 0}
                    if context.is_stopped():
                        out.abort()
                    continue
                reason = c.finish_reason or "stop"
                if reason not in NATURAL_FINISH:
                    raise self._cut_off(reason, sent, sp.max_tokens)
                spec = spec_stats(c.request_perf_metrics, sent, self.speculation and sp.eagle3_speculative)
                stats = spec.as_dict()
                self.metrics.record(reason, sent, stats)
                if self.capture is not None:
                    self._capture(rid, ids, c, reason, served, spec, request)
                yield {
                    "token_ids": new,
                    "index": 0,
                    "finish_reason": reason,
                    "completion_usage": {"prompt_tokens": len(ids), "completion_tokens": sent, "total_tokens": len(ids) + sent},
                    "engine_data": {ENGINE_DATA_KEY: stats},
                }
        finally:
            if not out.finished:  # the consumer went away (client disconnect, worker shutdown)
                out.abort()
            self._inflight.pop(rid, None)
            self.metrics.inflight.set(len(self._inflight))

    def _capture(self, rid: str, ids: list[int], c: Any, reason: str, served: ServedRequest, spec: Any, request: Mapping[str, Any]) -> None:
        """Hand the finished request to the capturer (a queue put; decoding and writing happen on its thread)."""
        assert self.capture is not None
        try:
            self.capture.record(
                request_id=rid,
                prompt_ids=ids,
                output_ids=list(c.token_ids),
                output_text=c.text,
                finish_reason=reason,
                sampling=served.captured(),
                stats=spec,
                category=self.request_category(request),
            )
        except Exception as e:
            log.warning("capture: request %s not recorded: %s: %s", rid, type(e).__name__, e)

    async def abort(self, context: Context) -> None:
        out = self._inflight.get(context.id())
        if out is not None:
            out.abort()

    def _cut_off(self, reason: str, sent: int, max_tokens: int) -> Exception:
        """The error a request the runtime ended early (aborted, shut down, timed out) ends with.

        Never a final chunk: Dynamo 1.6.1's frontend answers a backend finish_reason of
        "cancelled" as OpenAI "stop", so a cut-off answer reached the client as a finished one
        (32 streams stopped after 1.5 s: HTTP 200, "stop", a tenth of their tokens). An exception
        does not: the frontend moves the request to another live worker (EngineShutdown is
        migratable, --migration-limit), or sends a streaming client ``data: {"error": {...,
        "code": 503}}`` after the tokens it has and a non-streaming one a 503 (seen with 1.6.1)."""
        self.metrics.cut_off.inc()
        what = f"cut off after {sent} of at most {max_tokens} tokens ({reason})"
        if self._closing:
            log.warning("request %s by the worker shutting down", what)
            return EngineShutdown(f"the eagle3-trt worker is shutting down: the answer was {what}")
        return Cancelled(f"the request was {what}")

    async def cleanup(self) -> None:
        # Replaced by `eagle3-trt deploy --dynamo` (drain.py): out of discovery already, so let the
        # requests in flight finish, until the marker's deadline.
        deadline = own_deadline()
        while deadline is not None and self._inflight and time.time() < deadline:
            await asyncio.sleep(0.05)
        # Set before shutdown() cancels what is still running, so those requests say why.
        self._closing = True
        if self.llm is not None:
            llm, self.llm = self.llm, None
            await asyncio.to_thread(llm.shutdown)
        if self.capture is not None:
            await asyncio.to_thread(self.capture.close)


def main(argv: list[str] | None = None) -> None:
    run(Eagle3ReferenceEngine, argv)
