"""One rule for "this request is greedy", TensorRT-LLM's (sampling_params.py @a98a9061): temperature,
top_p and top_k all unset, or temperature 0, top_k 1 or top_p 0. The runtime serves such requests
greedily and ``alpha --traffic`` measures captured ones as greedy, through the same function
(runtime/llm_api.implies_greedy); the request contract (runtime/request_contract.py) turns a client's
fields into what is served and recorded, for both front ends (tests/test_request_contract.py sends the
same requests through a real Triton server and a real Dynamo deployment)."""

from __future__ import annotations

import pytest

from eagle3_trt.formats.traffic import CapturedSampling, ServedAcceptance, TrafficRecord
from eagle3_trt.measure.traffic_measure import is_greedy
from eagle3_trt.runtime.factory import open_llm
from eagle3_trt.runtime.llm_api import SamplingParamError, SamplingParams, implies_greedy
from eagle3_trt.runtime.request_contract import ClientRequest, check_prompt_text, resolve_request


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p", "greedy"),
    [
        (0.0, None, None, True),
        (0.8, 1, None, True),
        (0.8, None, 0.0, True),
        (0.8, 5, 0.9, False),
        (None, None, None, True),
        (None, 50, None, False),
        (0.7, None, None, False),
    ],
)
def test_rule_and_captured_traffic_agree(temperature, top_k, top_p, greedy):
    assert implies_greedy(temperature, top_k, top_p) is greedy
    assert SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p).greedy is greedy
    if temperature is not None:
        s = CapturedSampling(temperature=temperature, top_k=top_k or 0, top_p=1.0 if top_p is None else top_p, max_tokens=8)
        acc = ServedAcceptance(speculative=True, draft_tokens=3, accepted_draft_tokens=1, target_forwards=2, completion_tokens=3)
        rec = TrafficRecord(
            request_id="r", time_unix=0.0, bundle_fingerprint="f", model="eagle3", frontend="dynamo", chat=False, prompt_text=None,
            prompt_ids=[1], output_ids=[2], sampling=s, acceptance=acc,
        )  # fmt: skip
        assert is_greedy(rec) is greedy


def test_top_p_zero_is_served_greedily(fp8_bundle):
    """TensorRT-LLM decodes top_p=0 greedily; the reference runtime did not (it handed top_p 0 to the sampler)."""
    llm = open_llm(fp8_bundle, "reference", device="cpu", torch_threads=1)
    try:
        prompt = [1, 2, 3, 4, 5]
        greedy = llm.generate_async(prompt, SamplingParams(max_tokens=8, temperature=0.0)).result(timeout=120).outputs[0].token_ids
        top_p0 = llm.generate_async(prompt, SamplingParams(max_tokens=8, temperature=0.9, top_p=0.0, seed=1)).result(timeout=120).outputs[0].token_ids
        assert list(top_p0) == list(greedy) and len(greedy) == 8
    finally:
        llm.shutdown()


@pytest.mark.parametrize(
    ("client", "kwargs", "captured"),
    [
        # no sampling fields: greedy, nothing passed on but max_tokens (the rest of the context: 512 - 12)
        (ClientRequest(), {"max_tokens": 500}, (0.0, 1.0, 0, 500, None)),
        # top_k alone is not greedy: TensorRT-LLM samples at temperature 1 among the top 50
        (ClientRequest(top_k=50, max_tokens=8), {"max_tokens": 8, "top_k": 50}, (1.0, 1.0, 50, 8, None)),
        (ClientRequest(temperature=0.7, seed=2**40 + 1), {"max_tokens": 500, "temperature": 0.7, "seed": 2**40 + 1}, (0.7, 1.0, 0, 500, 2**40 + 1)),
        # greedy by top_k 1: recorded as greedy (temperature 0), the values TensorRT-LLM's sampler uses
        (ClientRequest(temperature=0.9, top_k=1, max_tokens=4), {"max_tokens": 4, "temperature": 0.9, "top_k": 1}, (0.0, 1.0, 0, 4, None)),
        (ClientRequest(top_p=0.0, max_tokens=4), {"max_tokens": 4, "top_p": 0.0}, (0.0, 1.0, 0, 4, None)),
        (ClientRequest(max_tokens=500, seed=2**63 - 1), {"max_tokens": 500, "seed": 2**63 - 1}, (0.0, 1.0, 0, 500, 2**63 - 1)),
    ],
)
def test_contract_passes_on_what_was_set_and_records_what_was_served(client, kwargs, captured):
    served = resolve_request(client, prompt_len=12, max_seq_len=512)
    assert served.sampling_kwargs() == kwargs
    c = served.captured()
    assert (c["temperature"], c["top_p"], c["top_k"], c["max_tokens"], c["seed"]) == captured
    assert SamplingParams(**kwargs).greedy is served.greedy is (captured[0] == 0.0)
    rec = CapturedSampling(**c)  # the record's schema takes it as is, and reads back the same verdict
    assert implies_greedy(rec.temperature, rec.top_k, rec.top_p) is served.greedy


def test_contract_default_max_tokens_caps_the_rest_of_the_context():
    assert resolve_request(ClientRequest(), prompt_len=10, max_seq_len=512, default_max_tokens=64).max_tokens == 64
    assert resolve_request(ClientRequest(), prompt_len=500, max_seq_len=512, default_max_tokens=64).max_tokens == 12
    assert resolve_request(ClientRequest(), prompt_len=500, max_seq_len=512).max_tokens == 12


@pytest.mark.parametrize(
    ("client", "prompt_len", "field", "says"),
    [
        (ClientRequest(temperature=-0.1), 5, "temperature", "negative"),
        (ClientRequest(temperature=float("nan")), 5, "temperature", "not a finite number"),
        (ClientRequest(top_p=1.5), 5, "top_p", "outside [0, 1]"),
        (ClientRequest(top_k=-1), 5, "top_k", "negative"),
        (ClientRequest(seed=-1), 5, "seed", "64-bit unsigned integer"),
        (ClientRequest(seed=2**64), 5, "seed", "64-bit unsigned integer"),
        # both front ends serve 0 .. 2**63 - 1 (Dynamo's frontend reads seed as an i64); the runtime takes any uint64
        (ClientRequest(seed=2**63), 5, "seed", "the largest seed both front ends serve"),
        (ClientRequest(max_tokens=0), 5, "max_tokens", "at least 1"),
        (ClientRequest(max_tokens=508), 5, "max_tokens", "max_seq_len 512 - prompt 5 tokens = 507"),
        (ClientRequest(), 512, "prompt", "leaves no room"),
        (ClientRequest(frequency_penalty=float("inf")), 5, "frequency_penalty", "not a finite number"),
    ],
)
def test_contract_refuses_in_one_line_naming_the_field(client, prompt_len, field, says):
    with pytest.raises(SamplingParamError) as e:
        resolve_request(client, prompt_len=prompt_len, max_seq_len=512)
    assert e.value.field == field and str(e.value).startswith(f"{field}: ") and says in str(e.value) and "\n" not in str(e.value)
    if field in ("temperature", "top_p", "top_k", "seed") and "both front ends" not in str(e.value):  # the runtime refuses the same values
        with pytest.raises(SamplingParamError):
            SamplingParams(**{field: getattr(client, field)})


def test_no_sampling_fields_is_served_greedily_and_top_k_alone_is_sampled(fp8_bundle):
    """The reference runtime (both front ends' runtime) with the contract's SamplingParams."""
    llm = open_llm(fp8_bundle, "reference", device="cpu", torch_threads=1)
    try:
        prompt = [1, 2, 3, 4, 5]

        def run(**kw):
            served = resolve_request(ClientRequest(max_tokens=16, **kw), prompt_len=len(prompt), max_seq_len=512)
            return list(llm.generate_async(prompt, SamplingParams(**served.sampling_kwargs())).result(timeout=120).outputs[0].token_ids)

        greedy = run(temperature=0.0)
        assert run() == run() == greedy and len(greedy) == 16
        sampled = {tuple(run(top_k=50, seed=s)) for s in (1, 2, 3)}
        assert len(sampled) == 3 and tuple(greedy) not in sampled  # random tiny weights: three seeds, three answers
        assert run(top_k=50, seed=2) == run(top_k=50, seed=2)
    finally:
        llm.shutdown()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty or only whitespace"),
        (" \n\t ", "empty or only whitespace"),
        ("ab\ufffdcd", "not valid UTF-8 (U+FFFD, the replacement for undecodable bytes, at character 2"),
    ],
)
def test_prompt_text_checks_name_the_prompt(text, says):
    """The prompt checks both front ends apply (Triton to text_input, Dynamo's worker to the decoded ids)."""
    with pytest.raises(SamplingParamError) as e:
        check_prompt_text(text)
    assert e.value.field == "prompt" and says in str(e.value) and "hint:" in str(e.value)
    check_prompt_text(" def f(): pass ")  # surrounding whitespace is text
