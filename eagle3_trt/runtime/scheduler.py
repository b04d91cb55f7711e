"""The reference runtime's scheduler loop: ``SpeculativeEngine`` stepped as TensorRT-LLM iterates.

One round = one TensorRT-LLM iteration over every in-flight request; detokenization and stop
strings as TensorRT-LLM applies them (see ``reference_llm.py``). Runs on ``ReferenceLLM``'s thread
(single process) or in its worker process (``executor_worker.py``); updates go to a ``Sink``.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eagle3_trt.core.engine import SamplingParams as EngineSamplingParams
from eagle3_trt.formats import generation
from eagle3_trt.runtime.detok import IncrementalDetokenizer, StopMatcher, detokenize_step
from eagle3_trt.runtime.llm_api import SamplingParams, effective_sampling
from eagle3_trt.runtime.loader import engine_from_bundle, speculation_control
from eagle3_trt.runtime.request_output import PerfRaw, Sink


def eos_token_ids(tokenizer, bundle: Path) -> tuple[int, ...]:
    """EOS ids the bundle's target declares (Llama 3 lists several) plus the tokenizer's."""
    ids = list(generation.eos_token_ids(bundle / "target"))
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.append(int(tokenizer.eos_token_id))
    return tuple(dict.fromkeys(ids))


@dataclass
class _Req:
    key: Any  # what the sink delivers to: the RequestOutput (in process) or the request id (worker)
    streaming: bool
    gen: object
    detok: IncrementalDetokenizer
    stops: StopMatcher
    arrival_ns: int
    cancel: threading.Event
    speculate: bool
    text: str = ""
    n_tokens: int = 0
    unsent: list[int] = field(default_factory=list)
    first_scheduled_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0
    stats: Any = None  # the engine's last RequestStats snapshot (None before the first step)
    accepted_trim: int = 0  # accepted drafts taken back at a stop string
    trimmed_pp: list[int] = field(default_factory=list)
    als: list[int] = field(default_factory=list)
    step_drafted: int = 0  # the last step's draft tokens and accepted drafts (the gate's sample)
    step_accepted: int = 0


class Scheduler:
    """The engine and its scheduler loop: what runs on ``ReferenceLLM``'s thread (single process)
    or in its worker process (``executor_worker.py``). Updates go to ``sink``."""

    def __init__(self, bundle: Path, sink: Sink, *, device: str = "auto", torch_threads: int | None = None, speculation: bool = True):
        if torch_threads:
            torch.set_num_threads(torch_threads)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.bundle = Path(bundle)
        self.sink = sink
        self.engine = engine_from_bundle(self.bundle, device=device)
        self.tokenizer = self.engine.tokenizer
        self.speculation = speculation
        if speculation and (warning := self.engine.sampling.warning()):
            print(f"{self.bundle}: {warning}", file=sys.stderr)  # what TensorRT-LLM would serve, once per load
        self.eos_ids = eos_token_ids(self.tokenizer, self.bundle)
        # draft_len_schedule and the acceptance-rate switch-off, run per scheduler round as TensorRT-LLM
        # runs them per iteration (core/speculation_control.py; None: speculation off for the server)
        self.control = speculation_control(self.bundle, self.engine.max_draft_len) if speculation else None
        self.tok_lock = threading.Lock()  # HF fast tokenizers must not decode from two threads at once
        self.inbox: queue.Queue[_Req | None] = queue.Queue()

    def admit(self, key: Any, ids: list[int], sp: SamplingParams, streaming: bool, cancel: threading.Event, arrival_ns: int) -> None:
        """Queue one request for the scheduler loop (any thread)."""
        temperature, top_p, top_k = effective_sampling(sp.temperature, sp.top_p, sp.top_k)  # TensorRT-LLM's resolution
        eparams = EngineSamplingParams(
            max_tokens=int(sp.max_tokens), temperature=temperature, top_p=top_p, top_k=top_k, seed=sp.seed, stop_token_ids=self.eos_ids
        )
        speculate = self.speculation and sp.eagle3_speculative
        self.inbox.put(
            _Req(
                key,
                streaming,
                self.engine.stream(ids, eparams, speculate=speculate),
                IncrementalDetokenizer(self.tokenizer, lock=self.tok_lock),
                StopMatcher(sp.stop_strings),
                arrival_ns,
                cancel,
                speculate,
            )
        )

    def speculation_state(self) -> dict[str, object] | None:
        """Iterations run, gate samples, and when the acceptance gate switched speculation off."""
        return self.control.state() if self.control is not None else None

    def run(self) -> None:
        """One round = one TensorRT-LLM iteration: every in-flight request is stepped once (its
        prefill, or one decode step), at the K ``draft_len_schedule`` gives the round's batch size
        (0 once the acceptance gate has tripped); the rows that drafted give the gate one sample.
        Returns when ``None`` arrives in the inbox (requests in flight end "cancelled")."""
        active: list[_Req] = []
        lagging = 0  # finished last round; the overlap scheduler still schedules them this round
        while True:
            block = not active
            if block:
                lagging = 0  # an idle server has processed every finished request
            while True:
                try:
                    item = self.inbox.get(block=block)
                except queue.Empty:
                    break
                if item is None:
                    for r in active:
                        self._finish(r, "", "cancelled")
                    self.sink.round_end()
                    return
                active.append(item)
                block = False
            ctl = self.control
            if ctl is not None:
                # TensorRT-LLM's overlap scheduler schedules iteration i+1 before it learns which requests
                # iteration i finished, so those are counted in i+1's batch size
                self.engine.k_cap = ctl.k_for(len(active) + (lagging if ctl.overlap_scheduler else 0))
            drafted, accepted = [], []
            done = 0
            for r in list(active):
                r.step_drafted = r.step_accepted = 0
                if self._step(r):
                    active.remove(r)
                    done += 1
                drafted.append(r.step_drafted)
                accepted.append(r.step_accepted)
            self.sink.round_end()
            lagging = done
            if ctl is not None:
                ctl.after(drafted, accepted)

    def _close(self, r: _Req) -> None:
        try:
            r.gen.close()  # type: ignore[attr-defined]  # frees the request's KV cache
        except Exception:
            pass

    def _step(self, r: _Req) -> bool:
        """Advance one request by one target forward; True when it is finished."""
        if r.cancel.is_set():
            self._close(r)
            self._finish(r, "", "cancelled")
            return True
        now = time.monotonic_ns()
        r.first_scheduled_ns = r.first_scheduled_ns or now
        try:
            step = next(r.gen)  # type: ignore[call-overload]
        except StopIteration:
            self._finish(r, self._flush(r), "stop")
            return True
        except Exception as e:
            self._close(r)
            self._finish(r, "", "error", error=f"{type(e).__name__}: {e}")
            return True
        prev = r.stats
        r.stats = step.stats
        now = time.monotonic_ns()
        if step.new_token_ids:
            r.first_token_ns = r.first_token_ns or now
            r.last_token_ns = now
        # A stop string is located at the exact token that completes it; the rest of the step is
        # not returned (detok.detokenize_step: one decode per step unless a stop string completes).
        ids = [int(t) for t in step.new_token_ids]
        n_kept, delta = detokenize_step(r.detok, r.stops, ids)
        kept = ids[:n_kept]
        self._account(r, prev, len(step.new_token_ids), len(kept))
        r.n_tokens += len(kept)
        r.unsent += kept
        r.text += delta
        if r.stops.matched is not None:
            self._close(r)
            self._finish(r, "", "stop", stop_reason=r.stops.matched)
            return True
        if step.finished:
            self._finish(r, self._flush(r), step.finish_reason or "stop")
            return True
        if r.streaming:
            self.sink.deliver(r.key, r.unsent, r.text, False, None, None, self._perf(r), None)
            r.unsent = []
        return False

    def _account(self, r: _Req, prev, produced: int, kept: int) -> None:
        """Per-step acceptance; when a stop string cut the step short, the tokens after it are
        taken back from the accepted drafts (the last kept token stands in for the bonus)."""
        st = r.stats
        drafted = st.draft_tokens - (prev.draft_tokens if prev else 0)
        accepted = st.accepted_tokens - (prev.accepted_tokens if prev else 0)
        r.step_drafted, r.step_accepted = max(0, drafted), max(0, accepted)
        if drafted > 0:
            r.als.append(min(accepted, kept - 1) + 1 if kept < produced else accepted + 1)
        if kept < produced:
            keep_acc = max(0, min(accepted, kept - 1))
            r.accepted_trim += accepted - keep_acc
            if len(r.trimmed_pp) < len(st.accepted_per_position):
                r.trimmed_pp += [0] * (len(st.accepted_per_position) - len(r.trimmed_pp))
            for pos in range(keep_acc, accepted):
                r.trimmed_pp[pos] += 1

    def _flush(self, r: _Req) -> str:
        return r.stops.feed(r.detok.flush()) + r.stops.flush()

    def _perf(self, r: _Req) -> PerfRaw:
        st = r.stats
        if st is None or not r.speculate:
            spec = None
            forwards = getattr(st, "target_forwards", 0) if st is not None else 0
        else:
            acc = st.accepted_tokens - r.accepted_trim
            acc_pp = [a - (r.trimmed_pp[i] if i < len(r.trimmed_pp) else 0) for i, a in enumerate(st.accepted_per_position)]
            spec = (acc / st.draft_tokens if st.draft_tokens else 0.0, acc, st.draft_tokens, list(st.drafted_per_position), acc_pp, list(r.als))
            forwards = st.target_forwards
        return (r.arrival_ns, r.first_scheduled_ns, r.first_token_ns, r.last_token_ns, int(forwards), spec)

    def _finish(self, r: _Req, tail: str, reason: str, stop_reason: str | None = None, error: str | None = None) -> None:
        r.text += tail
        self.sink.deliver(r.key, r.unsent, r.text, True, reason, stop_reason, self._perf(r), error)
        r.unsent = []
