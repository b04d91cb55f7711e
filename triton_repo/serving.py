"""What the Triton model runs: per-request state and the two runtimes behind one interface.

Triton-free on purpose (the model in ``model/model.py`` supplies a ``Sink`` built on
``triton_python_backend_utils``), so the request life cycle is written once:

* ``ReferenceServing`` drives ``eagle3_trt.core.engine.SpeculativeEngine``. One scheduler
  thread steps every in-flight request in turn (one decoding step each per round), so
  concurrent streams all make progress, cancellation is checked between steps, and the
  engine is only ever called from one thread.
* ``TrtllmServing`` builds TensorRT-LLM's ``LLM(**options)`` from the bundle's
  ``llm_api_options.yaml`` and runs ``generate_async(..., streaming=True)`` on an asyncio loop
  thread. TensorRT-LLM is imported only here.

Both produce the same ``Emission`` objects and the same ``RequestSummary`` for metrics.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from eagle3_trt.triton_repo.detok import IncrementalDetokenizer, StopMatcher
from eagle3_trt.triton_repo.request_params import GenRequest, RequestError, resolve_max_tokens


@dataclass(frozen=True)
class PerfSnapshot:
    arrival_ns: int
    first_scheduled_ns: int
    first_token_ns: int
    last_token_ns: int
    draft_tokens: int
    accepted_tokens: int
    acceptance_rate: float
    acceptance_length: float
    speculation: bool


@dataclass(frozen=True)
class Emission:
    text: str
    n_tokens: int
    final: bool
    finish_reason: str | None = None
    stop_reason: str | None = None
    perf: PerfSnapshot | None = None


@dataclass
class RequestSummary:
    status: str  # ok | cancelled | error
    speculation: bool
    generated_tokens: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    step_acceptance_lengths: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)


class Sink(Protocol):
    def emit(self, e: Emission) -> None: ...
    def fail(self, message: str, cancelled: bool = False) -> None: ...
    def is_cancelled(self) -> bool: ...


def _now() -> int:
    return time.monotonic_ns()


def prompt_has_bos(tokenizer, prompt: str) -> bool:
    """A chat-templated prompt already starts with BOS: encoding must not add a second one."""
    bos = getattr(tokenizer, "bos_token", None)
    return bool(bos) and prompt.startswith(bos)


def eos_token_ids(tokenizer, bundle: Path) -> tuple[int, ...]:
    """EOS ids from generation_config.json (Llama 3 lists several) plus the tokenizer's."""
    import json

    ids: list[int] = []
    for p in (bundle / "target" / "generation_config.json",):
        try:
            eos = json.loads(p.read_text()).get("eos_token_id")
        except (OSError, ValueError):
            continue
        ids += eos if isinstance(eos, list) else ([eos] if isinstance(eos, int) else [])
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.append(int(tokenizer.eos_token_id))
    return tuple(dict.fromkeys(ids))


class Job:
    """One request from arrival to its final response."""

    def __init__(self, req: GenRequest, sink: Sink, tokenizer, request_id: str, arrival_ns: int, speculation: bool,
                 tok_lock=None):
        self.req = req
        self.sink = sink
        self.request_id = request_id
        self.speculation = speculation
        self.arrival_ns = arrival_ns
        self.first_scheduled_ns = 0
        self.first_token_ns = 0
        self.last_token_ns = 0
        self.detok = IncrementalDetokenizer(tokenizer, lock=tok_lock)
        self.stops = StopMatcher(req.stop)
        self.n_tokens = 0
        self.unsent_tokens = 0
        self.buffer: list[str] = []  # non-streaming: the whole text
        self.sent_any = False
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.target_steps = 0
        self.step_als: list[int] = []
        self.drafted_pp: list[int] = []
        self.accepted_pp: list[int] = []
        self.cancel_requested = False
        self.done = False
        self.next_cancel_check = 0
        self.max_tokens = 0
        self.gen: Any = None

    # -- output -------------------------------------------------------------
    def _prefix(self) -> str:
        if self.req.exclude_input_from_output or self.sent_any:
            return ""
        return self.req.prompt

    def perf(self) -> PerfSnapshot:
        rate = self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0
        al = self.n_tokens / self.target_steps if self.target_steps else 0.0
        return PerfSnapshot(
            self.arrival_ns,
            self.first_scheduled_ns,
            self.first_token_ns,
            self.last_token_ns,
            self.draft_tokens,
            self.accepted_tokens,
            rate,
            al,
            self.speculation,
        )

    def push(self, new_ids, finished: bool, finish_reason: str | None) -> None:
        """New tokens from the runtime: detokenize, apply stop strings, send what is ready."""
        now = _now()
        if new_ids:
            if not self.first_token_ns:
                self.first_token_ns = now
            self.last_token_ns = now
            self.n_tokens += len(new_ids)
            self.unsent_tokens += len(new_ids)
        text = self.stops.feed(self.detok.add(new_ids)) if new_ids else ""
        if self.stops.matched is not None:
            finished, finish_reason = True, "stop"
        if finished:
            if self.stops.matched is None:
                text += self.stops.feed(self.detok.flush())
                text += self.stops.flush()
            self.finish(text, finish_reason or "stop")
        elif self.req.streaming:
            if text or self.unsent_tokens:
                self._send(Emission(self._prefix() + text, self.unsent_tokens, False))
        else:
            self.buffer.append(text)

    def _send(self, e: Emission) -> None:
        self.sent_any = True
        self.unsent_tokens = 0
        self.sink.emit(e)

    def finish(self, text: str, finish_reason: str) -> None:
        if self.done:
            return
        self.done = True
        if not self.req.streaming:
            text = "".join(self.buffer) + text
            n = self.n_tokens
        else:
            n = self.unsent_tokens
        perf = self.perf() if self.req.return_perf_metrics else None
        stop_reason = self.stops.matched if self.req.return_stop_reason else None
        self._send(Emission(self._prefix() + text, n, True, finish_reason, stop_reason, perf))

    def fail(self, message: str, cancelled: bool = False) -> None:
        if self.done:
            return
        self.done = True
        self.sink.fail(message, cancelled)

    def summary(self, status: str) -> RequestSummary:
        return RequestSummary(
            status,
            self.speculation,
            self.n_tokens,
            self.draft_tokens,
            self.accepted_tokens,
            list(self.step_als),
            list(self.drafted_pp),
            list(self.accepted_pp),
        )


class Serving:
    """Common front: checks limits, tracks in-flight jobs by request id for ``stop``."""

    tokenizer: Any
    max_seq_len: int
    max_draft_len: int

    def __init__(self, bundle: Path, speculation: bool, default_max_tokens: int, cancel_period_ms: int,
                 on_done: Callable[[RequestSummary], None], log: Callable[[str], None]):
        self.bundle = Path(bundle)
        self.speculation = speculation
        self.default_max_tokens = default_max_tokens
        self.cancel_period_ns = cancel_period_ms * 1_000_000
        self.on_done = on_done
        self.log = log
        self._by_id: dict[str, set[Job]] = {}
        self._lock = threading.Lock()
        # HF fast tokenizers are not safe to use from two threads at once ("Already borrowed"):
        # requests are encoded on Triton's execute thread while the scheduler decodes.
        self.tok_lock = threading.Lock()

    def encode(self, prompt: str) -> list[int]:
        with self.tok_lock:
            return list(self.tokenizer.encode(prompt, add_special_tokens=not prompt_has_bos(self.tokenizer, prompt)))

    def stop_request(self, request_id: str) -> int:
        """Cancel in-flight requests carrying ``request_id``; returns how many."""
        with self._lock:
            jobs = list(self._by_id.get(request_id, ()))
        for j in jobs:
            j.cancel_requested = True
        return len(jobs)

    def _track(self, job: Job) -> None:
        if job.request_id:
            with self._lock:
                self._by_id.setdefault(job.request_id, set()).add(job)

    def _untrack(self, job: Job) -> None:
        if job.request_id:
            with self._lock:
                s = self._by_id.get(job.request_id)
                if s is not None:
                    s.discard(job)
                    if not s:
                        del self._by_id[job.request_id]

    def _check_cancel(self, job: Job, now: int) -> bool:
        if job.cancel_requested:
            return True
        if now >= job.next_cancel_check:
            job.next_cancel_check = now + self.cancel_period_ns
            try:
                return bool(job.sink.is_cancelled())
            except Exception:  # a sender that can no longer answer is gone
                return True
        return False

    def _report(self, job: Job, status: str) -> None:
        self._untrack(job)
        try:
            self.on_done(job.summary(status))
        except Exception as e:  # metrics must never break serving
            self.log(f"metrics update failed: {e}")


class ReferenceServing(Serving):
    def __init__(self, bundle: Path, device: str, torch_threads: int | None = None, **kw):
        super().__init__(bundle, **kw)
        import torch

        if torch_threads:
            torch.set_num_threads(torch_threads)

        from eagle3_trt.core.engine import SamplingParams, SpeculativeEngine

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self._SamplingParams = SamplingParams
        self.engine = SpeculativeEngine.from_bundle(self.bundle, device=device)
        self.tokenizer = self.engine.tokenizer
        self.max_seq_len = int(self.engine.max_seq_len)
        self.max_draft_len = int(self.engine.max_draft_len)
        self.eos_ids = eos_token_ids(self.tokenizer, self.bundle)
        self._inbox: queue.Queue[Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="eagle3-scheduler", daemon=True)
        self._thread.start()

    def submit(self, req: GenRequest, sink: Sink, request_id: str, arrival_ns: int) -> None:
        """Check and queue a request; RequestError for bad values (nothing was queued)."""
        if req.frequency_penalty or req.presence_penalty:
            field_ = "sampling_param_frequency_penalty" if req.frequency_penalty else "sampling_param_presence_penalty"
            raise RequestError(field_, "not supported by the reference runtime (use runtime: trtllm)")
        ids = self.encode(req.prompt)
        max_tokens = resolve_max_tokens(req, len(ids), self.max_seq_len, self.default_max_tokens)
        speculate = self.speculation and req.speculative
        job = Job(req, sink, self.tokenizer, request_id, arrival_ns, speculate, self.tok_lock)
        job.max_tokens = max_tokens
        params = self._SamplingParams(
            max_tokens=max_tokens,
            temperature=req.temperature if req.temperature is not None else 0.0,
            top_p=req.top_p if req.top_p is not None else 1.0,
            top_k=req.top_k if req.top_k is not None else 0,
            seed=req.seed,
            stop_token_ids=self.eos_ids,
        )
        job.gen = self.engine.stream(ids, params, speculate=speculate)
        self._track(job)
        self._inbox.put(job)

    def shutdown(self) -> None:
        self._inbox.put(None)
        self._thread.join(timeout=30)

    # -- scheduler thread ---------------------------------------------------
    def _loop(self) -> None:
        active: list[Job] = []
        while True:
            try:
                item = self._inbox.get() if not active else self._inbox.get_nowait()
            except queue.Empty:
                item = "none"
            while item != "none":
                if item is None:
                    for j in active:
                        j.fail("server is shutting down")
                        self._close(j, "error")
                    return
                active.append(item)  # type: ignore[arg-type]
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    item = "none"
            for job in list(active):
                if self._step(job):
                    active.remove(job)

    def _close(self, job: Job, status: str) -> None:
        try:
            job.gen.close()  # frees the request's KV cache in the engine
        except Exception as e:
            self.log(f"closing request generator: {e}")
        self._report(job, status)

    def _step(self, job: Job) -> bool:
        """Advance one request by one decoding step; True when it is finished."""
        now = _now()
        if self._check_cancel(job, now):
            job.fail("Request cancelled by client", cancelled=True)
            self._close(job, "cancelled")
            return True
        if not job.first_scheduled_ns:
            job.first_scheduled_ns = now
        try:
            step = next(job.gen)
        except StopIteration:
            job.push([], True, "stop")
            self._close(job, "ok")
            return True
        except Exception as e:  # the engine failed this request; keep serving the rest
            self.log(f"request failed in the engine: {type(e).__name__}: {e}")
            job.fail(f"generation failed: {type(e).__name__}: {e}")
            self._close(job, "error")
            return True
        self._account(job, step.stats)
        try:
            job.push(list(step.new_token_ids), bool(step.finished), step.finish_reason)
        except Exception as e:  # e.g. the client went away while we were sending
            self.log(f"sending a response failed: {e}")
            job.done = True
            self._close(job, "cancelled")
            return True
        if job.done:
            self._close(job, "ok")
            return True
        return False

    @staticmethod
    def _account(job: Job, stats) -> None:
        if stats is None:
            return
        draft = int(getattr(stats, "draft_tokens", 0) or 0)
        acc = int(getattr(stats, "accepted_tokens", 0) or 0)
        if draft > job.draft_tokens:  # this step verified drafted tokens: one acceptance length sample
            job.step_als.append(acc - job.accepted_tokens + 1)
        job.draft_tokens, job.accepted_tokens = draft, acc
        job.target_steps = int(getattr(stats, "target_forwards", 0) or 0)
        job.drafted_pp = list(getattr(stats, "drafted_per_position", None) or [])
        job.accepted_pp = list(getattr(stats, "accepted_per_position", None) or [])


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
    import dataclasses

    from eagle3_trt.build.trtllm_adapter import to_llm_kwargs

    res = to_llm_kwargs(bundle, overrides=overrides or None)
    if not speculation:
        kwargs = dict(res.kwargs)
        kwargs.pop("speculative_config", None)
        res = dataclasses.replace(res, kwargs=kwargs)
    return res


class TrtllmServing(Serving):
    def __init__(self, bundle: Path, overrides: dict, **kw):
        super().__init__(bundle, **kw)
        from transformers import AutoTokenizer

        from eagle3_trt.triton_repo.model_yaml import read_bundle

        info = read_bundle(self.bundle, need_trtllm_options=True)
        self.max_seq_len = info.max_seq_len
        self.max_draft_len = info.max_draft_len if self.speculation else 0
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.bundle / "tokenizer"))
        self.llm_kwargs = trtllm_kwargs(self.bundle, overrides, self.speculation)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="eagle3-trtllm", daemon=True)
        self._thread.start()
        self.llm = asyncio.run_coroutine_threadsafe(self._build(), self._loop).result()

    async def _build(self):
        from eagle3_trt.build.trtllm_adapter import build_llm

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, lambda: build_llm(self.llm_kwargs))

    def submit(self, req: GenRequest, sink: Sink, request_id: str, arrival_ns: int) -> None:
        if not req.speculative and self.speculation:
            raise RequestError(
                "speculative_decoding",
                "the trtllm runtime cannot switch speculation off per request; "
                "package with --with-baseline and send to the <name>_nospec model",
            )
        from tensorrt_llm import SamplingParams

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
                now = _now()
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
        now = _now()
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
