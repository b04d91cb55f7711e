"""One table of requests for both front ends (runtime/request_contract.py is the one contract).

Each row is one request in the contract's terms (prompt and sampling fields, Dynamo's OpenAI names) and
what both front ends answer: ``SERVED`` (the same text) or the contract field both refuse. ``differs``
lists, by client family, the outcome where one front end's own parser answers before the project's code
and cannot be made to agree; docs/dynamo.md ("One contract, two front ends") names each such row with
the upstream source that forces it. tests/test_request_table.py sends every row to Triton (raw HTTP
``/generate`` and tritonclient gRPC) and Dynamo (the ``openai`` package and raw httpx) and compares.

Client families: ``triton_http``, ``triton_grpc``, ``dynamo`` (both Dynamo clients get one answer).
An outcome is ``SERVED``, a field name (a 4xx whose message names it), ``UNNAMED`` (a 4xx naming no
field) or ``SERVER_ERROR`` (a 5xx: no row expects one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

PROMPT = "def fibonacci(n):"
SERVED = "served"
UNNAMED = "refused, no field named"
SERVER_ERROR = "5xx"


@dataclass(frozen=True)
class Row:
    name: str
    fields: dict[str, float | int] = field(default_factory=dict)  # contract names; max_tokens 8 unless given
    prompt: str | bytes = PROMPT  # bytes: sent as-is (raw HTTP and gRPC only: the openai package sends str)
    expect: str = SERVED
    differs: dict[str, str] = field(default_factory=dict)
    same_text_as: str | None = None  # a served row whose text this one must equal (greedy spellings)

    def sampling(self) -> dict[str, float | int]:
        return {"max_tokens": 8, **self.fields}


ROWS: tuple[Row, ...] = (
    Row("no_sampling_fields"),
    Row("temperature_0", {"temperature": 0.0}, same_text_as="no_sampling_fields"),
    Row("top_k_1", {"top_k": 1}, same_text_as="no_sampling_fields"),
    # TensorRT-LLM's greedy spelling; Dynamo's frontend refuses 0 (validate_top_p) before a worker sees it.
    Row("top_p_0", {"top_p": 0.0}, same_text_as="no_sampling_fields", differs={"dynamo": "top_p"}),
    Row("top_k_0_seeded", {"top_k": 0, "seed": 7}),  # top-k off: sampled at temperature 1 over the whole vocabulary
    Row("temperature_0.7_seed_11", {"temperature": 0.7, "seed": 11}),
    Row("seed_2^63-1", {"temperature": 1.0, "seed": 2**63 - 1}),
    Row("seed_2^63", {"temperature": 1.0, "seed": 2**63}, expect="seed", differs={"dynamo": UNNAMED}),
    Row("seed_-1", {"seed": -1}, expect="seed"),
    Row("seed_2^64", {"seed": 2**64}, expect="seed", differs={"dynamo": UNNAMED}),
    Row("temperature_-1", {"temperature": -1.0}, expect="temperature"),
    # TensorRT-LLM takes any temperature >= 0; Dynamo's frontend 0..2 (validate_temperature).
    Row("temperature_3_seeded", {"temperature": 3.0, "seed": 5}, differs={"dynamo": "temperature"}),
    Row("top_p_1.5", {"top_p": 1.5}, expect="top_p"),
    # Dynamo's "no top-k" is -1 and a request's 0 reaches the worker as -1, so the worker serves -1 as 0.
    Row("top_k_-1_seeded", {"top_k": -1, "seed": 3}, expect="top_k", differs={"dynamo": SERVED}),
    Row("max_tokens_0", {"max_tokens": 0}, expect="max_tokens"),
    Row("max_tokens_past_context", {"max_tokens": 100_000}, expect="max_tokens"),
    Row("empty_prompt", prompt="", expect="prompt"),
    Row("whitespace_prompt", prompt=" \n\t ", expect="prompt"),
    Row("invalid_utf8_prompt", prompt=b"ab\xff\xfe cd", expect="prompt"),
)

ROW_BY_NAME = {r.name: r for r in ROWS}


def triton_name(contract_field: str) -> str:
    """The Triton model's input for a contract field (the prompt is ``text_input``)."""
    return "text_input" if contract_field == "prompt" else f"sampling_param_{contract_field}"


CONTRACT_FIELDS = ("prompt", "max_tokens", "temperature", "top_p", "top_k", "seed")


def _words(text: str) -> str:
    return text.lower().replace("_", " ").removeprefix("validation: ")


def refused_field(message: str, names: tuple[str, ...]) -> str | None:
    """The one of ``names`` a refusal is about: the one it starts with (the project's refusals, Dynamo's
    "Validation: Top_p must be ...", "Max tokens must be ..."), else the one it mentions, else None."""
    m = _words(message)
    return next((n for n in names if m.startswith(_words(n))), None) or next((n for n in names if _words(n) in m), None)


def outcome(status: int, message: str, names: tuple[str, ...]) -> str:
    """SERVED, the field of ``names`` a 4xx names, UNNAMED, or SERVER_ERROR."""
    if status == 200:
        return SERVED
    if status >= 500:
        return SERVER_ERROR
    return refused_field(message, names) or UNNAMED


# Bad bodies for both front ends' HTTP endpoints (the bad-input corpus, tests/test_request_table.py): name ->
# the raw body. Triton's /generate gets them as they are; Dynamo's /v1/completions gets the same shapes.
BAD_BODIES: dict[str, bytes] = {
    "empty_body": b"",
    "not_json": b"hello",
    "json_array": b'["def fibonacci(n):"]',
    "json_null": b"null",
    "json_string": b'"def fibonacci(n):"',
    "truncated_json": b'{"text_input": "hi", ',
    "lone_surrogate": b'{"text_input": "ab\\ud800"}',
}

# What the project's HTTP front (triton_serving/http_front.py) refuses before tritonserver reads the body:
# body name -> the field its 400 names. tritonserver 2.51 itself answered each of these with a 500 naming
# no field (docs/bad-inputs.md gives the source lines); every other bad body reaches Triton or the model.
TRITON_BODY_FIELD: dict[str, str] = {
    "empty_body": "body",
    "not_json": "body",
    "truncated_json": "body",
    "lone_surrogate": "text_input",
    "json_array": "body",
    "json_null": "body",
    "json_string": "body",
}

# JSON objects with a value tritonserver's reader cannot convert to the declared input type (once a 500):
# name -> (the body, the field the front's 400 names; ``None``: reaches Triton's own 4xx checks or the
# model, whose 4xx names one of the body's keys). Keyed like BAD_BODIES.
TRITON_BAD_VALUES: dict[str, tuple[dict, str | None]] = {
    "text_input_number": ({"text_input": 5}, "text_input"),
    "text_input_null": ({"text_input": None}, "text_input"),
    "text_input_empty_array": ({"text_input": []}, "text_input"),
    "text_input_nested": ({"text_input": [["hi"]]}, "text_input"),
    "stop_number": ({"text_input": "hi", "sampling_param_stop": [5]}, "sampling_param_stop"),
    "max_tokens_float": ({"text_input": "hi", "sampling_param_max_tokens": 1.5}, "sampling_param_max_tokens"),
    "max_tokens_exponent": ({"text_input": "hi", "sampling_param_max_tokens": 1e3}, "sampling_param_max_tokens"),
    "max_tokens_string": ({"text_input": "hi", "sampling_param_max_tokens": "many"}, "sampling_param_max_tokens"),
    "max_tokens_bool": ({"text_input": "hi", "sampling_param_max_tokens": True}, "sampling_param_max_tokens"),
    "max_tokens_2^64": ({"text_input": "hi", "sampling_param_max_tokens": 2**64}, "sampling_param_max_tokens"),
    "temperature_string": ({"text_input": "hi", "sampling_param_temperature": "hot"}, "sampling_param_temperature"),
    "streaming_string": ({"text_input": "hi", "streaming": "yes"}, "streaming"),
    "seed_-1": ({"text_input": "hi", "sampling_param_seed": -1}, "sampling_param_seed"),
    "seed_2^64": ({"text_input": "hi", "sampling_param_seed": 2**64}, "sampling_param_seed"),
    "id_number": ({"text_input": "hi", "id": 5}, "id"),
    # what reaches Triton's own checks or the model: a 4xx
    "unknown_key_object": ({"text_input": "hi", "foo": {"a": 1}}, None),
    "temperature_two_values": ({"text_input": "hi", "sampling_param_temperature": [0.5, 0.6]}, None),
    "no_inputs": ({}, None),
    "seed_2^63": ({"text_input": "hi", "sampling_param_seed": 2**63}, None),
    "typo_max_tokens": ({"text_input": "hi", "max_tokens": 3}, None),
    "whitespace_prompt": ({"text_input": "  "}, None),
    "two_prompts": ({"text_input": ["a", "b"]}, None),
}
