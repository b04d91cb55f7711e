"""``ReferenceLLM``: the toolkit's ``SpeculativeEngine`` behind TensorRT-LLM's LLM-API shape.

``generate_async(prompt_token_ids, SamplingParams(...), streaming=True)`` returns a
``RequestOutput`` to ``async for`` over, as ``tensorrt_llm.LLM`` does (see ``llm_api.py`` for the
exact surface and the upstream commits). One scheduler thread steps every in-flight request in
turn (one target forward each per round), so concurrent streams all progress, ``abort()`` takes
effect between steps, and the engine is only ever called from one thread. That thread runs in a
worker process by default, as TensorRT-LLM's executor runs the model for one GPU (``ReferenceLLM``'s
docstring; ``executor_worker.py``), or in this process with ``TLLM_WORKER_USE_SINGLE_PROCESS=1``.

The pieces: ``request_output.py`` (what ``generate_async`` returns, and the ``Waker`` that hands
updates to it), ``scheduler.py`` (the engine and its loop), ``executor_ipc.py`` / ``executor_worker.py``
(the worker process and its dispatcher). Like TensorRT-LLM, this object detokenizes and applies stop strings (the text stops before the
stop string). Unlike a naive loop it also trims the token ids at the token that completed the
stop string: tokens the target accepted past it are not returned, not counted in
``len(token_ids)``, and are taken out of the acceptance statistics, so speculation on and off
report the same token count for the same text.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from pathlib import Path

from eagle3_trt.runtime.executor_ipc import WorkerClient
from eagle3_trt.runtime.llm_api import SamplingParams
from eagle3_trt.runtime.request_output import RequestOutput, Waker
from eagle3_trt.runtime.scheduler import Scheduler, eos_token_ids

__all__ = ["ReferenceLLM", "RequestOutput", "eos_token_ids", "single_process_requested"]


SINGLE_PROCESS_ENV = "TLLM_WORKER_USE_SINGLE_PROCESS"


def single_process_requested() -> bool:
    """TensorRT-LLM's switch, read as it reads it (``enable_worker_single_process_for_tp1``,
    tensorrt_llm/llmapi/utils.py @cc4777e9: ``os.environ.get("TLLM_WORKER_USE_SINGLE_PROCESS", "0") == "1"``)."""
    return os.environ.get(SINGLE_PROCESS_ENV, "0") == "1"


class ReferenceLLM:
    """``tensorrt_llm.LLM``'s serving surface over ``SpeculativeEngine`` (see the module docstring).
    Servers open it through ``runtime.factory.open_llm``, never by name.

    Where the engine runs follows TensorRT-LLM's executor for one GPU (``GenerationExecutor.create``,
    tensorrt_llm/executor/executor.py @ed53795b): "Partition the workload to multiple process for
    streaming performance": a ``GenerationExecutorProxy`` in the user's process, the model in a worker
    process, results back over IPC to a dispatcher thread that hands them to each request's queue.
    Here too, by default, the scheduler loop (engine, steps, detokenization, stop strings, perf
    metrics) runs in a worker process (``executor_worker.py``; messages: ``executor_ipc.py``) and this
    process keeps ``RequestOutput``, ``generate_async``, ``abort``, ``shutdown`` and a dispatcher
    thread, so the serving loop's per-step work (responses, IPC, asyncio) does not hold the GIL the
    model's Python needs. TensorRT-LLM runs the worker in-process only for ``return_logits`` or when
    ``TLLM_WORKER_USE_SINGLE_PROCESS=1`` (``enable_worker_single_process_for_tp1``, llmapi/utils.py
    @cc4777e9), warning that it "may hurt streaming generation performance"; the same variable (or
    ``single_process=True``) keeps the scheduler on a thread of this process here.
    """

    sampling_params_cls = SamplingParams
    per_request_speculation = True  # SamplingParams(eagle3_speculative=False) is honoured

    def __init__(
        self,
        bundle: Path,
        *,
        device: str = "auto",
        torch_threads: int | None = None,
        speculation: bool = True,
        single_process: bool | None = None,
    ):
        self.bundle = Path(bundle)
        self.speculation = speculation
        self.single_process = single_process_requested() if single_process is None else bool(single_process)
        self._ids = itertools.count(1)
        self._sched: Scheduler | None = None
        self._worker: WorkerClient | None = None
        if self.single_process:
            self._sched = Scheduler(self.bundle, Waker(), device=device, torch_threads=torch_threads, speculation=speculation)
            self.tokenizer = self._sched.tokenizer
            self._tok_lock = self._sched.tok_lock
            self._thread = threading.Thread(target=self._sched.run, name="eagle3-reference-llm", daemon=True)
            self._thread.start()
        else:
            self._worker = WorkerClient(self.bundle, device=device, torch_threads=torch_threads, speculation=speculation)
            self.tokenizer = self._worker.tokenizer
            self._tok_lock = threading.Lock()

    @property
    def worker_pid(self) -> int | None:
        """The worker process's id (None: the scheduler runs on a thread of this process)."""
        return self._worker.pid if self._worker is not None else None

    # -- the LLM API ----------------------------------------------------------------------------
    def generate_async(self, inputs, sampling_params: SamplingParams | None = None, streaming: bool = False) -> RequestOutput:
        sp = sampling_params or SamplingParams()
        if isinstance(inputs, dict):
            ids = list(inputs["prompt_token_ids"])
        elif isinstance(inputs, str):
            with self._tok_lock:
                ids = list(self.tokenizer.encode(inputs))
        else:
            ids = [int(i) for i in inputs]
        arrival = time.monotonic_ns()  # CLOCK_MONOTONIC: one clock for every process of the machine
        cancel = threading.Event()
        out = RequestOutput(next(self._ids), ids, streaming, cancel)
        if self._worker is not None:
            self._worker.submit(out, sp, arrival)
        else:
            assert self._sched is not None
            self._sched.admit(out, ids, sp, streaming, cancel, arrival)
        return out

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()
        elif self._sched is not None:
            self._sched.inbox.put(None)
            self._thread.join(timeout=30)

    def speculation_state(self) -> dict[str, object] | None:
        """Iterations run, gate samples, and when the acceptance gate switched speculation off."""
        if self._worker is not None:
            return self._worker.speculation_state() if self.speculation else None
        assert self._sched is not None
        return self._sched.speculation_state()
