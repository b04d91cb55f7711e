"""Check a ``/generate`` body against the model's declared inputs before tritonserver reads it.

tritonserver 2.51's HTTP front end converts the JSON body to input tensors itself, and its JSON
reader's errors are ``TRITONSERVER_ERROR_INTERNAL``, answered as HTTP 500 with no field named
(triton-inference-server/server src/http_server.cc@v2.51.0: ``HandleGenerate`` ->
``EVRequestToJson``, ``ParseJsonTritonRequestID``, ``ConvertGenerateRequest`` ->
``ExactMappingInput`` -> ``ReadDataFromJson``; ``HttpCodeFromError``). ``check_generate_body``
refuses exactly what that reader cannot convert, naming the field (or ``body``) with a hint, as a
``RequestError`` (HTTP 400 in the front, ``http_front.py``). Values that convert are left to the
model (``request_params``), which refuses bad ones by name: one rule, in one place.

What the reader accepts, per declared type (``ReadDataFromJsonHelper``): a JSON string for
TYPE_STRING, ``true``/``false`` for TYPE_BOOL, an integer in int64 range (no fraction, no
exponent) for TYPE_INT64, in 0 .. 2**64-1 for TYPE_UINT64, any number for TYPE_FP32; each as one
value or a flat array of them (a nested array overruns its element count: another 500).
"""

from __future__ import annotations

import json
import math
from typing import Any

from eagle3_trt.triton_serving.interface import TensorSpec
from eagle3_trt.triton_serving.request_params import RequestError

BODY = "body"  # the field named when the body as a whole is refused
EXAMPLE = '{"text_input": "def fibonacci(n):", "sampling_param_max_tokens": 64}'

_INT_RANGE = {"TYPE_INT64": (-(2**63), 2**63 - 1), "TYPE_UINT64": (0, 2**64 - 1)}
_WANT = {
    "TYPE_STRING": "a JSON string",
    "TYPE_BOOL": "true or false",
    "TYPE_INT64": "a JSON integer (no fraction or exponent) from -2**63 to 2**63-1",
    "TYPE_UINT64": "a JSON integer (no fraction or exponent) from 0 to 2**64-1",
    "TYPE_FP32": "a JSON number",
}


def _kind(v: Any) -> str:
    """The JSON type of a parsed value, as a client would name it."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return f"the integer {v}"
    if isinstance(v, float):
        return f"the number {v!r}"
    if isinstance(v, str):
        return "a string"
    return "an array" if isinstance(v, list) else "an object"


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # tritonserver's reader keeps both members and adds the input twice; Python's would keep the last
    seen: dict[str, Any] = {}
    for k, v in pairs:
        if k in seen:
            raise RequestError(k, "appears twice in one JSON object; send each key once")
        seen[k] = v
    return seen


def _no_constant(name: str) -> Any:
    raise RequestError(BODY, f"{name} is not JSON (tritonserver's parser refuses it); send a finite number")


def _lone_surrogate(v: Any) -> bool:
    if isinstance(v, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in v)
    if isinstance(v, list):
        return any(_lone_surrogate(x) for x in v)
    if isinstance(v, dict):
        return any(_lone_surrogate(k) or _lone_surrogate(x) for k, x in v.items())
    return False


def parse_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or RequestError naming ``body`` (or the key a parse error is in)."""
    if not raw.strip():
        raise RequestError(BODY, f"is empty; send a JSON object such as {EXAMPLE}")
    # Invalid UTF-8 inside a string reaches the model as tritonserver passes it on (the model refuses a
    # prompt that is not UTF-8, naming text_input), so it is only replaced here, not refused.
    text = raw.decode("utf-8", errors="replace")
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise RequestError(BODY, f"is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); send a JSON object such as {EXAMPLE}") from None
    except RecursionError:
        raise RequestError(BODY, "is nested too deeply; send a flat JSON object of inputs") from None
    if not isinstance(obj, dict):
        raise RequestError(BODY, f"is {_kind(obj)}, not a JSON object; send an object of inputs such as {EXAMPLE}")
    for k, v in obj.items():
        if _lone_surrogate(k) or _lone_surrogate(v):  # an escaped lone surrogate (\ud800): not Unicode text
            raise RequestError(k, "holds a lone UTF-16 surrogate escape (\\ud800-\\udfff without its pair); send valid Unicode text")
        if isinstance(v, float) and not math.isfinite(v):
            raise RequestError(k, f"{v} overflows a double (tritonserver's parser refuses it); send a finite number")
    return obj


def _check_value(spec: TensorSpec, v: Any) -> None:
    dtype = spec.data_type
    want = _WANT.get(dtype)
    if want is None:  # a type the interface never declares: tritonserver's own checks answer
        return
    ok: bool
    if dtype == "TYPE_STRING":
        ok = isinstance(v, str)
    elif dtype == "TYPE_BOOL":
        ok = isinstance(v, bool)
    elif dtype == "TYPE_FP32":
        ok = isinstance(v, int | float) and not isinstance(v, bool)  # its range is the model's check
    else:
        ok = isinstance(v, int) and not isinstance(v, bool)
        lo, hi = _INT_RANGE[dtype]
        if ok and not lo <= v <= hi:
            raise RequestError(spec.name, f"{v} is out of the range of {dtype} ({lo} .. {hi}); send {want}")
    if not ok:
        raise RequestError(spec.name, f"is {_kind(v)}, but the input is {dtype}; send {want}")


def check_generate_body(raw: bytes, inputs: dict[str, TensorSpec]) -> dict[str, Any]:
    """The parsed body when tritonserver can convert it to ``inputs`` (the model's declared inputs);
    else RequestError naming the field or ``body``. Keys that are not inputs are left to tritonserver
    and the model (request parameters, refused by name there)."""
    obj = parse_body(raw)
    if "id" in obj and not isinstance(obj["id"], str):
        raise RequestError("id", f"is {_kind(obj['id'])}; the request id must be a JSON string; send one (or leave 'id' out)")
    for key, v in obj.items():
        spec = inputs.get(key)
        if spec is None:
            continue
        values = v if isinstance(v, list) else [v]
        if not values:
            raise RequestError(key, f"is an empty array; send {_WANT.get(spec.data_type, 'a value')} (or leave the key out)")
        if spec.dims == (1,) and len(values) != 1:
            raise RequestError(key, f"takes one value, got an array of {len(values)}; send one value")
        for x in values:
            if isinstance(x, list | dict):
                raise RequestError(key, f"holds {_kind(x)}; send {_WANT.get(spec.data_type, 'a value')} or a flat array of them")
            _check_value(spec, x)
    return obj
