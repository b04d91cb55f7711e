"""The one request contract: what a client sent -> what it is served with, and what a capture records.

Both front ends call ``resolve_request`` (Triton: ``triton_serving/job.py`` through
``request_params.served_request``; Dynamo: ``dynamo_serving/engine.py``), build the runtime's
``SamplingParams`` from ``ServedRequest.sampling_kwargs()`` and hand ``ServedRequest.captured()`` to the
traffic capture (``runtime/capture.py``, what ``alpha --traffic`` replays). One request therefore gets one
answer on both front ends, and its record says how it was served.

TensorRT-LLM's rules, read in NVIDIA/TensorRT-LLM (the serving stacks this toolkit predicts):

* Unset stays unset. TensorRT-LLM's front ends pass on only what the client set and leave the rest to
  ``SamplingParams``' own defaults (``None`` for temperature, top_p, top_k and seed): the Triton llmapi
  model (``get_sampling_params_from_request``, triton_backend/all_models/llmapi/tensorrt_llm/1/helpers.py
  @0df60f9a) and Dynamo's TensorRT-LLM worker (``_override_sampling_params`` keeps the request's non-None
  ``sampling_options``: ai-dynamo/dynamo components/src/dynamo/trtllm/request_handlers/handler_base.py
  @0192e704). ``sampling_kwargs`` does the same, so ``tensorrt_llm.SamplingParams`` applies its own rules.
* Greedy: ``params_imply_greedy_decoding`` (tensorrt_llm/sampling_params.py @a98a9061): temperature,
  top_p and top_k all unset, or temperature 0, top_k 1 or top_p 0 (``llm_api.implies_greedy``). A request
  without sampling fields is greedy.
* Otherwise sampled with ``temperature or 1.0``, ``top_p or 1.0`` and ``top_k or vocab_size``
  (``resolve_sampling_strategy``, tensorrt_llm/_torch/pyexecutor/sampling_utils.py @c20322ff;
  ``llm_api.effective_sampling``): ``top_k=50`` alone samples at temperature 1 among 50 tokens.
* ``max_tokens`` unset: the rest of the context, ``max_seq_len - prompt tokens`` (Dynamo's TensorRT-LLM
  worker: ``max(1, max_seq_len - input_length)``, handler_base.py @0192e704). Upstream's Triton llmapi
  model would leave ``SamplingParams``' default of 32 instead; both front ends here take the Dynamo rule,
  so the same request gets the same answer on both. A Triton repository's ``default_max_tokens``
  (model.yaml, unset by default) caps it on that repository: an operator's stated choice.
* Ranges as ``SamplingParams._validate`` refuses them (temperature >= 0, 0 <= top_p <= 1, top_k >= 0),
  ``max_tokens`` >= 1 and within ``max_seq_len`` (refused, not clamped), and the seed a uint64 (the
  executor's ``SamplingConfig`` randomSeed; Triton's ``sampling_param_seed`` is UINT64): 0 .. 2**64 - 1,
  honoured whole by the reference runtime (``core/sampling.seeded_generator``). Each refusal is a
  ``SamplingParamError`` naming the field (``prompt`` for a prompt that leaves no room).

Where the two front ends' own parsers differ, the contract takes what both can serve (``SERVED_SEED_MAX``,
``check_prompt_text``); what one parser refuses before this code runs is listed, with its upstream
source, in docs/dynamo.md ("One contract, two front ends"), row by row of ``testing/request_table.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from eagle3_trt.runtime.llm_api import SamplingParamError, effective_sampling, implies_greedy, validate_sampling

# Dynamo's OpenAI frontend deserialises ``seed`` as an i64 (``seed: Option<i64>`` in its request types;
# 2**63 is a 400 "expected i64" before any worker sees it), so seeds past 2**63 - 1 cannot reach a
# Dynamo worker. Triton refuses them too, naming the field: a seed either front end serves, the other
# serves with the same stream; none is served by one and refused by the other.
SERVED_SEED_MAX = 2**63 - 1

# U+FFFD: what a lossy decoder makes of invalid UTF-8. Dynamo's frontend hands the worker token ids of
# the text with the bad bytes already replaced, so "invalid UTF-8" can only be seen as this character;
# Triton's model refuses both (text_input arrives as bytes there).
REPLACEMENT_CHARACTER = "\ufffd"


def check_seed(seed: int | None) -> None:
    """A seed both front ends serve (``SERVED_SEED_MAX``); SamplingParamError names ``seed``."""
    if seed is not None and seed > SERVED_SEED_MAX:
        raise SamplingParamError("seed", f"{seed} is past {SERVED_SEED_MAX} (2**63 - 1), the largest seed both front ends serve (hint: use seed % 2**63)")


def check_prompt_text(text: str, utf8: bool = True) -> None:
    """The prompt checks both front ends apply to the prompt's text; SamplingParamError names ``prompt``.
    ``utf8=False``: the text was decoded from token ids that may split a character, so U+FFFD is not refused."""
    if not text.strip():
        raise SamplingParamError("prompt", "is empty or only whitespace (hint: send the text to continue)")
    if utf8 and REPLACEMENT_CHARACTER in text:
        i = text.index(REPLACEMENT_CHARACTER)
        raise SamplingParamError("prompt", f"is not valid UTF-8 (U+FFFD, the replacement for undecodable bytes, at character {i}; hint: send UTF-8 text)")


@dataclass(frozen=True)
class ClientRequest:
    """The sampling fields a client sent, as its front end parsed them; None: not sent."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    frequency_penalty: float | None = None
    presence_penalty: float | None = None


@dataclass(frozen=True)
class ServedRequest:
    """What the request is served with: the client's values, unset ones left unset, and max_tokens resolved."""

    max_tokens: int
    temperature: float | None
    top_p: float | None
    top_k: int | None
    seed: int | None
    stop: tuple[str, ...]
    frequency_penalty: float | None
    presence_penalty: float | None

    @property
    def greedy(self) -> bool:
        return implies_greedy(self.temperature, self.top_k, self.top_p)

    def sampling_kwargs(self) -> dict[str, Any]:
        """``SamplingParams`` keywords (TensorRT-LLM's names; the reference runtime's class takes the same):
        max_tokens always, the rest only when the client set them."""
        kw: dict[str, Any] = {"max_tokens": self.max_tokens}
        for name in ("temperature", "top_p", "top_k", "seed", "frequency_penalty", "presence_penalty"):
            v = getattr(self, name)
            if v is not None:
                kw[name] = v
        if self.stop:
            kw["stop"] = list(self.stop)
        return kw

    def captured(self) -> dict[str, Any]:
        """The captured record's ``sampling`` (formats/traffic.CapturedSampling): the values the sampler
        used (``effective_sampling``: temperature 0 for a greedy request), max_tokens as resolved, the seed."""
        temperature, top_p, top_k = effective_sampling(self.temperature, self.top_p, self.top_k)
        return {"temperature": temperature, "top_p": top_p, "top_k": top_k, "max_tokens": self.max_tokens, "seed": self.seed}


def resolve_request(req: ClientRequest, *, prompt_len: int, max_seq_len: int, default_max_tokens: int | None = None) -> ServedRequest:
    """The contract (module docstring); SamplingParamError names the first field it refuses."""
    validate_sampling(req.temperature, req.top_p, req.top_k, req.seed)
    check_seed(req.seed)
    for name in ("frequency_penalty", "presence_penalty"):
        v = getattr(req, name)
        if v is not None and not math.isfinite(v):
            raise SamplingParamError(name, f"{v} is not a finite number")
    if prompt_len < 1:
        raise SamplingParamError("prompt", "is empty")
    room = max_seq_len - prompt_len
    if room < 1:
        raise SamplingParamError("prompt", f"is {prompt_len} tokens; the bundle's max_seq_len is {max_seq_len}, which leaves no room to generate")
    if req.max_tokens is None:
        max_tokens = room if default_max_tokens is None else min(default_max_tokens, room)
    elif req.max_tokens < 1:
        raise SamplingParamError("max_tokens", f"{req.max_tokens}: must be at least 1")
    elif req.max_tokens > room:
        raise SamplingParamError("max_tokens", f"{req.max_tokens} exceeds the bundle's limit: max_seq_len {max_seq_len} - prompt {prompt_len} tokens = {room}")
    else:
        max_tokens = req.max_tokens
    return ServedRequest(
        max_tokens=max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        seed=req.seed,
        stop=tuple(req.stop),
        frequency_penalty=req.frequency_penalty,
        presence_penalty=req.presence_penalty,
    )
