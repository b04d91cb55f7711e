"""The TensorRT-LLM runtime behind the Triton model: ``LLM(**options)`` from the bundle.

``TrtllmServing`` builds TensorRT-LLM's ``LLM`` from the bundle's ``llm_api_options.yaml``
(through the build stage's adapter) and runs ``generate_async(..., streaming=True)`` on an
asyncio loop thread. TensorRT-LLM detokenizes and applies stop strings itself; its text is
passed through, and per-position acceptance is counted from the streamed iterations.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from eagle3_trt.build.bundle import open_bundle
from eagle3_trt.build.trtllm_adapter import build_llm, to_llm_kwargs
from eagle3_trt.triton_repo.job import Emission, Job, Serving, Sink, prompt_has_bos
from eagle3_trt.triton_repo.model_yaml import read_bundle
from eagle3_trt.triton_repo.request_params import GenRequest, RequestError, resolve_max_tokens


def _to_ns(v) -> int:
    """TensorRT-LLM timing metrics are timedeltas (steady clock) or plain numbers of seconds."""
    if v is None:
        return 0
    if hasattr(v, "total_seconds"):
        return int(v.total_seconds() * 1e9)
    return int(float(v) * 1e9)


def trtllm_kwargs(bundle: Path, overrides: dict, speculation: bool):
    """``LLM(**kwargs)`` for the bundle via the build stage's adapter (checked names, version
    differences, absolute paths); without the draft for a baseline model."""
    b = open_bundle(Path(bundle))
    res = to_llm_kwargs(b.path, b.options, overrides=overrides or None)
    if not speculation:
        kwargs = dict(res.kwargs)
        kwargs.pop("speculative_config", None)
        res = dataclasses.replace(res, kwargs=kwargs)
    return res


class TrtllmServing(Serving):
    def __init__(self, bundle: Path, overrides: dict, **kw):
        super().__init__(bundle, **kw)
        info = read_bundle(self.bundle)
        self.max_seq_len = info.max_seq_len
        self.max_draft_len = info.max_draft_len if self.speculation else 0
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.bundle / "tokenizer"))
        self.llm_kwargs = trtllm_kwargs(self.bundle, overrides, self.speculation)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="eagle3-trtllm", daemon=True)
        self._thread.start()
        self.llm = asyncio.run_coroutine_threadsafe(self._build(), self._loop).result()

    async def _build(self):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, lambda: build_llm(self.llm_kwargs))

    def submit(self, req: GenRequest, sink: Sink, request_id: str, arrival_ns: int) -> None:
        if not req.speculative and self.speculation:
            raise RequestError(
                "speculative_decoding",
                "the trtllm runtime cannot switch speculation off per request; "
                "package with --with-baseline and send to the <name>_nospec model",
            )
        from tensorrt_llm import SamplingParams  # local: optional and heavy, only present where TensorRT-LLM serves

        ids = self.encode(req.prompt)
        max_tokens = resolve_max_tokens(req, len(ids), self.max_seq_len, self.default_max_tokens)
        kw: dict[str, Any] = {"max_tokens": max_tokens, "return_perf_metrics": True}
        for name in ("temperature", "top_p", "top_k", "seed", "frequency_penalty", "presence_penalty"):
            v = getattr(req, name)
            if v is not None:
                kw[name] = v
        if req.temperature == 0.0:
            # temperature 0 means greedy here; TensorRT-LLM expresses greedy as top_k=1.
            kw.pop("temperature")
            kw.pop("top_p", None)
            kw["top_k"] = 1
        if req.stop:
            kw["stop"] = list(req.stop)
        kw["add_special_tokens"] = not prompt_has_bos(self.tokenizer, req.prompt)
        job = Job(req, sink, self.tokenizer, request_id, arrival_ns, self.speculation, self.tok_lock)
        job.max_tokens = max_tokens
        self._track(job)
        asyncio.run_coroutine_threadsafe(self._run(job, SamplingParams(**kw)), self._loop)

    async def _run(self, job: Job, sp) -> None:
        text_so_far = ""
        status = "ok"
        it = None
        try:
            it = self.llm.generate_async(job.req.prompt, sp, streaming=True)
            first = True
            async for out in it:
                now = time.monotonic_ns()
                if self._check_cancel(job, now):
                    it.abort()
                    job.fail("Request cancelled by client", cancelled=True)
                    status = "cancelled"
                    return
                if not job.first_scheduled_ns:
                    job.first_scheduled_ns = now
                o = out.outputs[0]
                n_new = len(o.token_ids) - job.n_tokens
                if not first and n_new > 0 and self.max_draft_len:
                    # Each streamed output is one iteration: its token count is the
                    # acceptance length; positions 1..n_new-1 of the chain were accepted.
                    job.step_als.append(n_new)
                    job.target_steps += 1
                    if len(job.drafted_pp) < self.max_draft_len:
                        job.drafted_pp += [0] * (self.max_draft_len - len(job.drafted_pp))
                        job.accepted_pp += [0] * (self.max_draft_len - len(job.accepted_pp))
                    for k in range(self.max_draft_len):
                        job.drafted_pp[k] += 1
                        if k < n_new - 1:
                            job.accepted_pp[k] += 1
                elif first:
                    job.target_steps += 1
                first = False
                pm = getattr(o, "request_perf_metrics", None)
                if pm is not None and getattr(pm, "speculative_decoding", None) is not None:
                    job.draft_tokens = int(pm.speculative_decoding.total_draft_tokens)
                    job.accepted_tokens = int(pm.speculative_decoding.total_accepted_draft_tokens)
                if out.finished and pm is not None:
                    tm = pm.timing_metrics
                    job.arrival_ns = _to_ns(tm.arrival_time) or job.arrival_ns
                    job.first_scheduled_ns = _to_ns(tm.first_scheduled_time) or job.first_scheduled_ns
                # TensorRT-LLM detokenizes (and applies stop strings) itself: pass its text through.
                delta = o.text[len(text_so_far):]
                text_so_far = o.text
                self._push_text(job, delta, n_new, bool(out.finished), o.finish_reason)
                if job.done:
                    return
            if not job.done:
                self._push_text(job, "", 0, True, "stop")
        except Exception as e:
            status = "error"
            self.log(f"request failed in TensorRT-LLM: {type(e).__name__}: {e}")
            job.fail(f"generation failed: {type(e).__name__}: {e}")
        finally:
            self._report(job, status)

    @staticmethod
    def _push_text(job: Job, delta: str, n_new: int, finished: bool, finish_reason) -> None:
        now = time.monotonic_ns()
        if n_new > 0:
            job.first_token_ns = job.first_token_ns or now
            job.last_token_ns = now
            job.n_tokens += n_new
            job.unsent_tokens += n_new
        if finished:
            job.finish(delta, str(finish_reason or "stop"))
        elif job.req.streaming:
            if delta or job.unsent_tokens:
                job._send(Emission(job._prefix() + delta, job.unsent_tokens, False))
        else:
            job.buffer.append(delta)

    def shutdown(self) -> None:
        try:
            self.llm.shutdown()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
