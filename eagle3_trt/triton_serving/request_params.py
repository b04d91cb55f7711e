"""Turn one Triton request's input tensors into checked generation parameters.

Pure Python/numpy (no Triton import) so the same rules run in the model and can be read in
one place. Every rejection names the input tensor, so a client sees which field to fix, and
the model sends it as INVALID_ARG (HTTP 400).

Triton itself answers first (before the model runs) for unknown *input tensors* on gRPC/``/infer``
and a missing required input; what it says then is Triton's (docs/triton.md). A ``/generate`` JSON
value Triton's parser cannot convert to the declared type is refused, naming it, by the project's
HTTP front (``generate_body.py``) before Triton reads it. On HTTP ``/generate``, a JSON key that is not an input
becomes a request *parameter*: ``check_parameters`` refuses those by name, so a typo such as
``max_tokens`` for ``sampling_param_max_tokens`` is not silently ignored.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eagle3_trt.runtime.llm_api import SamplingParamError, validate_sampling
from eagle3_trt.runtime.request_contract import ClientRequest, ServedRequest, check_prompt_text, check_seed, resolve_request
from eagle3_trt.triton_serving.interface import INPUT_BY_NAME

# The one request parameter the model reads (not an input tensor): the request's category, kept with
# captured traffic (`serve --capture`). On HTTP /generate it is a JSON key; on gRPC a request parameter.
CATEGORY_PARAMETER = "eagle3_category"
CATEGORY_MAX_CHARS = 64


class RequestError(ValueError):
    """A bad value in a request; ``field`` is the input tensor name."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


@dataclass(frozen=True)
class GenRequest:
    """One Triton request: the prompt, the sampling fields the client sent (the request contract's
    ``ClientRequest``, shared with Dynamo's front end) and what only this model's interface has."""

    prompt: str
    sampling: ClientRequest = field(default_factory=ClientRequest)
    streaming: bool = False
    exclude_input_from_output: bool = False
    return_perf_metrics: bool = False
    return_stop_reason: bool = False
    speculative: bool = True
    stop_request: bool = False


Getter = Callable[[str], "np.ndarray | None"]


def _scalar(get: Getter, name: str):
    arr = get(name)
    if arr is None:
        return None
    arr = np.asarray(arr)
    if arr.size != 1:
        raise RequestError(name, f"expected one value, got shape {list(arr.shape)}")
    return arr.reshape(-1)[0]


def _bool(get: Getter, name: str, default: bool) -> bool:
    v = _scalar(get, name)
    return default if v is None else bool(v)


def _float(get: Getter, name: str) -> float | None:
    v = _scalar(get, name)
    if v is None:
        return None
    f = float(v)
    if not math.isfinite(f):
        raise RequestError(name, f"must be a finite number, got {f}")
    return f


# The integer inputs are INT64 (interface.py), so a client's value arrives whole; the runtimes take
# 32-bit values (TensorRT-LLM's SamplingConfig), so anything wider is refused here, not truncated.
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _int(get: Getter, name: str) -> int | None:
    v = _scalar(get, name)
    if v is None:
        return None
    i = int(v)
    if not INT32_MIN <= i <= INT32_MAX:
        raise RequestError(name, f"{i} is out of range (at most {INT32_MAX}, a 32-bit integer)")
    return i


def _text(v) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8")
    return str(v)


def check_parameters(params: dict, known_inputs: tuple[str, ...] | None = None) -> None:
    """Refuse request parameters: on /generate they are JSON keys that are not inputs (typos).

    Keys starting with ``triton_`` are the client library's own (tritonclient sends
    ``triton_enable_empty_final_response`` on gRPC streams) and are allowed, and so is ``id``: on
    /generate the request id is a JSON key, which tritonserver also passes on as a parameter
    (``ConvertGenerateRequest`` maps every key that is not an input; triton-inference-server/server
    src/http_server.cc@v2.51.0), and the ``stop`` input finds requests by it.
    """
    if known_inputs is None:
        known_inputs = tuple(INPUT_BY_NAME)
    for key in params:
        if str(key).startswith("triton_") or key == "id":
            continue
        if key == CATEGORY_PARAMETER:
            v = params[key]
            if not isinstance(v, str) or not 0 < len(v) <= CATEGORY_MAX_CHARS:
                raise RequestError(key, f"must be a non-empty string of at most {CATEGORY_MAX_CHARS} characters, got {v!r}")
            continue
        close = difflib.get_close_matches(str(key), known_inputs, n=1, cutoff=0.6)
        close = close or [n for n in known_inputs if n.endswith("_" + str(key))][:1]
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise RequestError(str(key), f"not an input of this model{hint}; unknown fields are refused, not ignored")


def parse_request(get: Getter) -> GenRequest:
    """Read and check every input; raises RequestError naming the first bad field."""
    stop_request = _bool(get, "stop", False)
    arr = get("text_input")
    if arr is None:
        if stop_request:
            return GenRequest(prompt="", stop_request=True)
        raise RequestError("text_input", "missing (required)")
    prompt = _prompt(arr, stop_request)
    max_tokens, temperature, top_p, top_k = _sampling(get)
    seed = _scalar(get, "sampling_param_seed")
    seed = None if seed is None else int(seed)
    try:
        validate_sampling(None, None, None, seed)
        check_seed(seed)
    except SamplingParamError as e:
        raise _named(e) from None
    stop = _stop_strings(get)
    return GenRequest(
        prompt=prompt,
        sampling=ClientRequest(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=seed,
            stop=stop,
            frequency_penalty=_float(get, "sampling_param_frequency_penalty"),
            presence_penalty=_float(get, "sampling_param_presence_penalty"),
        ),
        streaming=_bool(get, "streaming", False),
        exclude_input_from_output=_bool(get, "sampling_param_exclude_input_from_output", False),
        return_perf_metrics=_bool(get, "sampling_param_return_perf_metrics", False),
        return_stop_reason=_bool(get, "return_stop_reason", False),
        speculative=_bool(get, "speculative_decoding", True),
        stop_request=stop_request,
    )


def _prompt(arr: Any, stop_request: bool) -> str:
    """The one prompt of ``text_input``."""
    arr = np.asarray(arr).reshape(-1)
    if arr.size != 1:
        raise RequestError("text_input", f"exactly one prompt per request is supported, got {arr.size}")
    v = arr[0]
    # Invalid bytes are checked as Dynamo's worker sees them (replaced by U+FFFD), so the refusal is the same.
    prompt = v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)
    if stop_request:  # a stop request's text is not a prompt
        return prompt
    try:
        check_prompt_text(prompt)
    except SamplingParamError as e:
        raise _named(e) from None
    return prompt


def _sampling(get: Getter) -> tuple[int | None, float | None, float | None, int | None]:
    """(max_tokens, temperature, top_p, top_k), each None when not sent; refuses what this model does not support."""
    max_tokens = _int(get, "sampling_param_max_tokens")
    if max_tokens is not None and max_tokens <= 0:
        raise RequestError("sampling_param_max_tokens", f"must be >= 1, got {max_tokens}")
    temperature = _float(get, "sampling_param_temperature")
    top_p = _float(get, "sampling_param_top_p")
    top_k = _int(get, "sampling_param_top_k")
    try:  # TensorRT-LLM's ranges, the request contract's one check (runtime/request_contract.py)
        validate_sampling(temperature, top_p, top_k, None)
    except SamplingParamError as e:
        raise _named(e) from None
    best_of = _int(get, "sampling_param_best_of")
    if best_of is not None and best_of != 1:
        raise RequestError("sampling_param_best_of", f"only 1 is supported, got {best_of}")
    if _bool(get, "return_cumulative_logprob", False):
        raise RequestError("return_cumulative_logprob", "not supported by this model")
    return max_tokens, temperature, top_p, top_k


def _stop_strings(get: Getter) -> tuple[str, ...]:
    stop_arr = get("sampling_param_stop")
    stop: tuple[str, ...] = ()
    if stop_arr is not None:
        try:
            stop = tuple(_text(v) for v in np.asarray(stop_arr).reshape(-1))
        except UnicodeDecodeError:
            raise RequestError("sampling_param_stop", "not valid UTF-8") from None
        if "" in stop:  # would stop nowhere (or, to some runtimes, everywhere): a client mistake
            raise RequestError("sampling_param_stop", f"stop string {stop.index('')} is empty; leave out empty strings")

    return stop


def _named(e: SamplingParamError) -> RequestError:
    """The contract's refusal, naming this model's input: ``sampling_param_<field>``, ``text_input`` for the prompt."""
    name = "text_input" if e.field == "prompt" else f"sampling_param_{e.field}"
    return RequestError(name, str(e).removeprefix(f"{e.field}: "))


def served_request(req: GenRequest, prompt_len: int, max_seq_len: int, default: int | None = None) -> ServedRequest:
    """The request contract (runtime/request_contract.py) for one Triton request; RequestError names the input.
    ``default``: the repository's ``default_max_tokens`` (None: the rest of the context, as on Dynamo)."""
    try:
        return resolve_request(req.sampling, prompt_len=prompt_len, max_seq_len=max_seq_len, default_max_tokens=default)
    except SamplingParamError as e:
        raise _named(e) from None


def resolve_max_tokens(req: GenRequest, prompt_len: int, max_seq_len: int, default: int | None = None) -> int:
    """The bundle's limit: prompt + generated tokens must fit in max_seq_len (the contract's max_tokens)."""
    return served_request(req, prompt_len, max_seq_len, default).max_tokens
