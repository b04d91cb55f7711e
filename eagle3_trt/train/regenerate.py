"""Regenerating the responses of captured prompts with the target, greedy (issue 23).

What a client received may come from another sampling setting, a stop string, a truncation or an
older model; a head is trained to predict *the target's* greedy continuation, so the responses
are produced again, as ModelOpt's speculative-decoding example does before training
(examples/speculative_decoding/scripts/server_generate.py in NVIDIA/Model-Optimizer @0831d655:
each prompt sent to an OpenAI-compatible server at temperature 0, the reply stored for training).

Two ways:
- ``regenerate_local``: the bundle's own target through the reference runtime's decoding loop
  (core.engine.SpeculativeEngine with no draft, i.e. plain greedy decoding; the quantized target
  is dequantized with its activations fake-quantized as the runtime serves it);
- ``regenerate_endpoint``: a running OpenAI-compatible endpoint (``eagle3-trt serve-dynamo``'s
  frontend, trtllm-serve, vLLM): ``/v1/completions`` at temperature 0 with the prompt as the token
  ids the model saw (OpenAI's completions take a token array; checked against serve-dynamo), the
  reply's token ids when the server returns them (Dynamo's ``nvext.completion_token_ids``), else
  its text tokenized with the bundle's tokenizer.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import requests

from eagle3_trt.errors import UserError
from eagle3_trt.train.evaluate import greedy_generate


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    text: str | None  # the prompt as the model saw it (None when redacted)
    max_tokens: int


def regenerate_local(
    target, prompts: Sequence[Prompt], stop_ids: tuple[int, ...], pad_id: int, batch_size: int = 8, on_batch: Callable[[int], None] | None = None
) -> list[list[int]]:
    """The target's greedy continuation of each prompt (ending at, and including, its first stop token)."""
    out: list[list[int]] = [[] for _ in prompts]
    by_len: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(prompts):
        by_len[p.max_tokens].append(i)
    for n, idx in sorted(by_len.items()):
        gens = greedy_generate(target, [prompts[i].ids for i in idx], n, stop_ids, pad_id, batch_size, on_batch=on_batch)
        for i, g in zip(idx, gens):
            out[i] = list(g)
    return out


def completions_url(url: str) -> str:
    u = url.strip().rstrip("/")
    if not u.startswith(("http://", "https://")):
        u = "http://" + u
    if not u.endswith("/v1"):
        u += "/v1"
    return u + "/completions"


def check_endpoint(url: str, model: str, timeout_s: float = 10.0) -> None:
    """Refuse (one line, before any model is loaded) an endpoint that does not answer or does not serve ``model``."""
    models_url = completions_url(url).rsplit("/", 1)[0] + "/models"
    try:
        r = requests.get(models_url, timeout=timeout_s)
        names = [m.get("id") for m in r.json().get("data", [])] if r.status_code == 200 else None
    except requests.RequestException as e:
        raise UserError(
            "--endpoint", f"{models_url} did not answer ({type(e).__name__})", "start the server first, or leave out --endpoint to regenerate locally"
        ) from None
    except ValueError:
        names = None
    if names is not None and model not in names:
        raise UserError(
            "--endpoint-model", f"{model!r} is not served at {url} (it serves {', '.join(map(str, names)) or 'nothing'})", "pass the served model name"
        )


def regenerate_endpoint(
    url: str, model: str, prompts: Sequence[Prompt], tokenizer, timeout_s: float = 600.0, on_batch: Callable[[int], None] | None = None
) -> list[list[int]]:
    """Greedy replies from a running OpenAI-compatible server (one request per prompt)."""
    endpoint = completions_url(url)
    out: list[list[int]] = []
    # Dynamo's extension that returns the reply's token ids; servers whose request schema forbids
    # unknown fields refuse it (trtllm-serve: tensorrt_llm/serve/openai_protocol.py @0076e939,
    # OpenAIBaseModel extra="forbid"; its choices carry ``token_ids`` instead), so it is dropped
    # after the first refusal
    nvext: dict | None = {"extra_fields": ["completion_token_ids"]}
    with requests.Session() as s:
        for p in prompts:
            body = {
                "model": model,
                "prompt": p.ids,  # the ids as the model saw them: text would be encoded again (BOS added twice, a template's tokens split)
                "max_tokens": p.max_tokens,
                "temperature": 0.0,
                "stream": False,
            }
            try:
                r = s.post(endpoint, json={**body, "nvext": nvext} if nvext else body, timeout=timeout_s)
                if nvext and r.status_code in (400, 422) and "nvext" in r.text:
                    nvext = None
                    r = s.post(endpoint, json=body, timeout=timeout_s)
            except requests.RequestException as e:
                raise UserError(
                    "--endpoint", f"{endpoint} did not answer ({type(e).__name__})", "start the server first, or leave out --endpoint to regenerate locally"
                ) from None
            if r.status_code != 200:
                raise UserError("--endpoint", f"{endpoint} answered HTTP {r.status_code}: {r.text[:160]!r}", "check --endpoint-model and the server's log")
            try:
                choice = r.json()["choices"][0]
            except (ValueError, KeyError, IndexError):
                raise UserError(
                    "--endpoint", f"{endpoint} did not return an OpenAI completion", "point --endpoint at an OpenAI-compatible /v1 base URL"
                ) from None
            ids = (
                choice.get("token_ids") or (r.json().get("nvext") or {}).get("completion_token_ids") or (choice.get("nvext") or {}).get("completion_token_ids")
            )
            if not ids:
                ids = tokenizer.encode(choice.get("text") or "", add_special_tokens=False)
            out.append([int(x) for x in ids])
            if on_batch:
                on_batch(1)
    return out
