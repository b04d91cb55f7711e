"""The reference runtime behind the Triton model: the toolkit's ``SpeculativeEngine``.

One scheduler thread steps every in-flight request in turn (one decoding step each per round),
so concurrent streams all make progress, cancellation is checked between steps, and the engine
is only ever called from one thread.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from pathlib import Path

import torch

from eagle3_trt.core.engine import SamplingParams
from eagle3_trt.runtime.loader import engine_from_bundle
from eagle3_trt.triton_repo.job import Job, Serving, Sink
from eagle3_trt.triton_repo.request_params import GenRequest, RequestError, resolve_max_tokens


def eos_token_ids(tokenizer, bundle: Path) -> tuple[int, ...]:
    """EOS ids from generation_config.json (Llama 3 lists several) plus the tokenizer's."""
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


class ReferenceServing(Serving):
    def __init__(self, bundle: Path, device: str, torch_threads: int | None = None, **kw):
        super().__init__(bundle, **kw)
        if torch_threads:
            torch.set_num_threads(torch_threads)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.engine = engine_from_bundle(self.bundle, device=device)
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
        params = SamplingParams(
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
        now = time.monotonic_ns()
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
