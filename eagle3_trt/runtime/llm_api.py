"""The part of TensorRT-LLM's LLM API the Triton model relies on, and the reference runtime's copy of it.

The Triton model (``model/model.py`` through ``job.LlmServing``) and the Dynamo worker drive
exactly one interface, the shape of ``tensorrt_llm.LLM``, and get it from ``factory.open_llm``; in
production that object wraps ``tensorrt_llm.LLM``, in ``make test`` it is
``reference_llm.ReferenceLLM`` over the toolkit's PyTorch engine. The same driver code therefore
runs behind a real Triton server in CI.

What is relied on (read in NVIDIA/TensorRT-LLM; the 1.2.x release tags themselves could not be read,
so these are the commits the source index holds):

* ``LLM.generate_async(inputs, sampling_params, streaming=...) -> RequestOutput`` where ``inputs`` is
  a list of prompt token ids (``PromptInputs``) — tensorrt_llm/llmapi/llm.py @ 4c05a748.
* ``RequestOutput`` (``GenerationResult``): ``async for`` yields the same object after each
  response; ``finished``; ``abort()``; ``outputs[0]`` is a ``CompletionOutput`` with ``text``
  (detokenized, stop strings already cut, ``include_stop_str_in_output`` False),
  ``token_ids`` (all generated ids so far), ``finish_reason`` ('stop' | 'length' | 'timeout' |
  'cancelled'), ``stop_reason`` and ``request_perf_metrics`` — tensorrt_llm/executor/result.py
  @ a678b91a.
* ``request_perf_metrics`` (``tllm.RequestPerfMetrics``, sent when ``SamplingParams(
  return_perf_metrics=True)``): ``timing_metrics.{arrival_time, first_scheduled_time,
  first_token_time, last_token_time}`` (timedeltas on the steady clock), ``kv_cache_metrics.{
  num_total_allocated_blocks, num_new_allocated_blocks, num_reused_blocks, num_missed_blocks,
  kv_cache_hit_rate}`` and ``speculative_decoding.{acceptance_rate, total_accepted_draft_tokens,
  total_draft_tokens}`` — the fields upstream's Triton llmapi model reads
  (triton_backend/all_models/llmapi/tensorrt_llm/1/model.py @ 044a90d2, ``_create_response``).
* ``SamplingParams`` keyword names: max_tokens, temperature, top_p, top_k, seed, stop,
  frequency_penalty, presence_penalty, return_perf_metrics (tensorrt_llm/sampling_params.py).
* ``LLM.shutdown()``.

Not relied on: ``LLM.generate`` (sync), ``get_stats``, logprobs, LoRA, multimodal inputs.

The reference runtime adds a few fields TensorRT-LLM does not have, all prefixed ``eagle3_`` so the
driver can tell them apart (it falls back to deriving them from the stream when they are absent):
``speculative_decoding.eagle3_drafted_per_position`` / ``eagle3_accepted_per_position`` /
``eagle3_acceptance_lengths`` and ``request_perf_metrics.eagle3_target_forwards``, and the
``SamplingParams`` field ``eagle3_speculative`` (per-request speculation off, for A/B runs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, Protocol

# The name clients address the served model by (Triton model directory, Dynamo served_model_name,
# the clients' defaults): every front end and client takes its default from here.
SERVED_MODEL_NAME = "eagle3"
# The runtimes ``factory.open_llm`` opens (and a Triton repository's eagle3.yaml may name).
RuntimeName = Literal["reference", "trtllm"]
# Where the reference runtime runs ("auto": CUDA when available).
DeviceName = Literal["auto", "cpu", "cuda"]
# The key a response's per-request speculative statistics travel under (Dynamo's ``engine_data``).
ENGINE_DATA_KEY = "eagle3"


class SamplingParamError(ValueError):
    """A ``SamplingParams`` value the runtime refuses; ``field`` is the parameter's name, so a
    server can name the request field without parsing the message."""

    def __init__(self, field: str, what: str):
        self.field = field
        super().__init__(f"{field}: {what}")


# ---- the interface the driver uses (structural: tensorrt_llm.LLM satisfies it) -------------------
class CompletionOutputLike(Protocol):
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: Any
    request_perf_metrics: Any


class RequestOutputLike(Protocol):
    outputs: list[Any]
    finished: bool

    def abort(self) -> None: ...
    def __aiter__(self) -> Any: ...


class LlmLike(Protocol):
    def generate_async(self, inputs: Any, sampling_params: Any = None, streaming: bool = False) -> RequestOutputLike: ...
    def shutdown(self) -> None: ...


class ServingLlm(LlmLike, Protocol):
    """What ``runtime.factory.open_llm`` returns: the LLM plus what a server needs beside it."""

    tokenizer: Any  # a Hugging Face tokenizer for the bundle (prompt text -> ids)
    sampling_params_cls: Any  # the runtime's SamplingParams class (ours or tensorrt_llm's)
    per_request_speculation: bool  # whether SamplingParams(eagle3_speculative=False) is honoured


# ---- the reference runtime's objects --------------------------------------------------------
@dataclass
class SamplingParams:
    """The subset of ``tensorrt_llm.SamplingParams`` the reference runtime implements; values it
    cannot honour are refused (ValueError naming the field) instead of being ignored."""

    max_tokens: int = 32
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    return_perf_metrics: bool = False
    eagle3_speculative: bool = True  # not a TensorRT-LLM field: speculation off for this request

    def __post_init__(self) -> None:
        validate_sampling(self.temperature, self.top_p, self.top_k, self.seed)
        if self.frequency_penalty:
            raise SamplingParamError("frequency_penalty", "not supported by the reference runtime (use runtime: trtllm)")
        if self.presence_penalty:
            raise SamplingParamError("presence_penalty", "not supported by the reference runtime (use runtime: trtllm)")

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def greedy(self) -> bool:
        return implies_greedy(self.temperature, self.top_k, self.top_p)


def implies_greedy(temperature: float | None, top_k: int | None, top_p: float | None) -> bool:
    """TensorRT-LLM's rule (``SamplingParams.params_imply_greedy_decoding``, tensorrt_llm/sampling_params.py
    @a98a9061): temperature, top_p and top_k all unset, or temperature 0, top_k 1 or top_p 0, each mean
    greedy decoding. The one definition for the runtime (requests), the request contract
    (runtime/request_contract.py) and captured traffic (measure/traffic_measure.py)."""
    return (temperature is None and top_p is None and top_k is None) or temperature == 0.0 or top_k == 1 or top_p == 0.0


def effective_sampling(temperature: float | None, top_p: float | None, top_k: int | None) -> tuple[float, float, int]:
    """(temperature, top_p, top_k) as TensorRT-LLM's sampler resolves a request's values: greedy (above) is
    (0, 1, 0); otherwise ``temperature or 1.0``, ``top_p or 1.0`` and ``top_k or vocab_size`` (0 here: the
    whole vocabulary) — ``resolve_sampling_strategy``, tensorrt_llm/_torch/pyexecutor/sampling_utils.py
    @c20322ff. What the reference runtime samples with and what a captured record keeps."""
    if implies_greedy(temperature, top_k, top_p):
        return 0.0, 1.0, 0
    return float(temperature or 1.0), float(top_p or 1.0), int(top_k or 0)


# TensorRT-LLM's seed is a uint64 (the executor's SamplingConfig randomSeed; the Triton input
# sampling_param_seed is UINT64): every value in [0, 2**64) is a distinct seed, anything else is refused.
SEED_SPAN = 2**64


def validate_sampling(temperature: float | None, top_p: float | None, top_k: int | None, seed: int | None) -> None:
    """TensorRT-LLM's ``SamplingParams._validate`` ranges (tensorrt_llm/sampling_params.py @a98a9061:
    temperature >= 0, 0 <= top_p <= 1, top_k >= 0) and the uint64 seed; SamplingParamError names the field."""
    for name, v in (("temperature", temperature), ("top_p", top_p)):
        if v is not None and not math.isfinite(v):
            raise SamplingParamError(name, f"{v} is not a finite number")
    if temperature is not None and temperature < 0:
        raise SamplingParamError("temperature", f"{temperature} is negative; use 0 for greedy decoding")
    if top_p is not None and not 0.0 <= top_p <= 1.0:
        raise SamplingParamError("top_p", f"{top_p} is outside [0, 1]; 1 disables nucleus sampling, 0 is greedy")
    if top_k is not None and top_k < 0:
        raise SamplingParamError("top_k", f"{top_k} is negative; 0 disables top-k, 1 is greedy")
    if seed is not None and not 0 <= seed < SEED_SPAN:
        raise SamplingParamError("seed", f"{seed} is out of range: TensorRT-LLM's seed is a 64-bit unsigned integer (0 to {SEED_SPAN - 1})")


@dataclass
class TimingMetrics:
    arrival_time: timedelta = timedelta(0)
    first_scheduled_time: timedelta = timedelta(0)
    first_token_time: timedelta = timedelta(0)
    last_token_time: timedelta = timedelta(0)


@dataclass
class KvCacheMetrics:
    num_total_allocated_blocks: int = 0
    num_new_allocated_blocks: int = 0
    num_reused_blocks: int = 0
    num_missed_blocks: int = 0
    kv_cache_hit_rate: float = 0.0


@dataclass
class SpeculativeDecodingMetrics:
    acceptance_rate: float = 0.0
    total_accepted_draft_tokens: int = 0
    total_draft_tokens: int = 0
    eagle3_drafted_per_position: list[int] = field(default_factory=list)
    eagle3_accepted_per_position: list[int] = field(default_factory=list)
    eagle3_acceptance_lengths: list[int] = field(default_factory=list)  # one per verification step


@dataclass
class RequestPerfMetrics:
    timing_metrics: TimingMetrics = field(default_factory=TimingMetrics)
    kv_cache_metrics: KvCacheMetrics = field(default_factory=KvCacheMetrics)
    speculative_decoding: SpeculativeDecodingMetrics = field(default_factory=SpeculativeDecodingMetrics)
    eagle3_target_forwards: int = 0


@dataclass
class CompletionOutput:
    index: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    request_perf_metrics: RequestPerfMetrics | None = None

    @property
    def length(self) -> int:
        return len(self.token_ids)


def to_ns(v: Any) -> int:
    """TensorRT-LLM timing metrics are timedeltas (steady clock) or plain seconds; 0 when absent."""
    if v is None:
        return 0
    if hasattr(v, "total_seconds"):
        return int(round(v.total_seconds() * 1e9))
    return int(float(v) * 1e9)


def ns_to_timedelta(ns: int) -> timedelta:
    return timedelta(microseconds=ns / 1000)


# ---- perf metrics -> acceptance statistics (both serving front ends) -------------------------------
@dataclass(frozen=True)
class SpecStats:
    """One request's speculative-decoding totals, read from its ``RequestPerfMetrics``."""

    speculative: bool  # speculation was on for the request and drafted at least one token
    draft_tokens: int
    accepted_draft_tokens: int
    target_forwards: int
    completion_tokens: int

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_draft_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def acceptance_length(self) -> float:
        # Tokens per target forward, prefill included: the definition of core/stats.py, so one
        # request reports one AL on both serving paths (the mean of the per-step lengths would
        # leave the prefill forward out and read higher).
        return self.completion_tokens / self.target_forwards if self.target_forwards else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The documented ``engine_data.eagle3`` fields (Dynamo) in one place."""
        return {
            "speculative": self.speculative,
            "draft_tokens": self.draft_tokens,
            "accepted_draft_tokens": self.accepted_draft_tokens,
            "acceptance_rate": self.acceptance_rate,
            "acceptance_length": round(self.acceptance_length, 4),
            "target_forwards": self.target_forwards,
            "completion_tokens": self.completion_tokens,
        }


def spec_stats(perf: Any, n_tokens: int, speculative: bool, forwards_seen: int = 0) -> SpecStats:
    """Acceptance totals from a ``RequestPerfMetrics`` (TensorRT-LLM's field names, plus ours).

    ``speculative``: whether the request ran with the draft; without it drafts count as none.
    ``forwards_seen``: target forwards counted from the stream (iterations that added tokens),
    used when the runtime does not report ``eagle3_target_forwards`` (TensorRT-LLM)."""
    spec = getattr(perf, "speculative_decoding", None) if perf is not None else None
    drafted = int(getattr(spec, "total_draft_tokens", 0) or 0) if speculative else 0
    accepted = int(getattr(spec, "total_accepted_draft_tokens", 0) or 0) if speculative else 0
    forwards = int(getattr(perf, "eagle3_target_forwards", 0) or 0) if perf is not None else 0
    return SpecStats(bool(speculative and drafted), drafted, accepted, forwards or int(forwards_seen), int(n_tokens))
