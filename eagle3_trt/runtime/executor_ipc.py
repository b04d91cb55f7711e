"""``ReferenceLLM``'s worker process, seen from the user's process: start it, talk to it, dispatch its results.

TensorRT-LLM serves one GPU through ``GenerationExecutorProxy`` (tensorrt_llm/executor/executor.py
@ed53795b, ``GenerationExecutor.create``: "Partition the workload to multiple process for streaming
performance"): the model runs in a worker process, and a dispatcher thread in the user's process
(``dispatch_result_task``, tensorrt_llm/executor/proxy.py) takes each batch of results off the IPC
queue and hands them to the requests' queues, waking each event loop once per batch. ``WorkerClient``
is that proxy for the reference runtime; the worker is ``executor_worker.py``.

Wire: one ``socket.socketpair`` framed by ``multiprocessing.connection.Connection``
(``send_bytes``/``recv_bytes``), each message one compact JSON object (never pickle):

* parent -> worker: ``{"t": "req", "id", "ids", "sp", "stream", "arrival"}``, ``{"t": "abort", "id"}``,
  ``{"t": "state"}``, ``{"t": "shutdown"}``;
* worker -> parent: ``{"t": "ready"}`` or ``{"t": "fail", "error": {...}}`` once at start-up, then
  ``{"t": "round", "u": [[id, new_ids, text_delta, finished, reason, stop_reason, perf, error], ...]}``
  (every update of one scheduler round in one message) and ``{"t": "state", "state": ...}`` replies.

The worker is a fresh interpreter (``python -m eagle3_trt.runtime.executor_worker``: what
multiprocessing's ``spawn`` starts, without its pickled bootstrap) that loads the bundle itself; it
exits when its socket reaches EOF, so it never outlives this process.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import os
import queue
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from eagle3_trt.convert.load import _load_tokenizer
from eagle3_trt.errors import UserError
from eagle3_trt.pipeline.bundle import open_bundle
from eagle3_trt.runtime.llm_api import SamplingParams
from eagle3_trt.runtime.request_output import RequestOutput, Waker

WORKER_MODULE = "eagle3_trt.runtime.executor_worker"


def dumps(msg: dict[str, Any]) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode()


def loads(data: bytes) -> dict[str, Any]:
    msg = json.loads(data)
    if not isinstance(msg, dict) or "t" not in msg:
        raise ValueError(f"not an executor message: {data[:80]!r}")
    return msg


def error_to_wire(e: BaseException) -> dict[str, Any]:
    """An exception the worker hit at start-up, as the parent re-raises it (same type, same line)."""
    if isinstance(e, UserError):
        return {"kind": "UserError", "where": e.where, "what": e.what, "hint": e.hint}
    return {"kind": type(e).__name__, "message": str(e)}


def error_from_wire(err: dict[str, Any]) -> Exception:
    if err.get("kind") == "UserError":
        return UserError(err["where"], err["what"], err.get("hint"))
    cls = getattr(builtins, str(err.get("kind")), None)
    message = str(err.get("message", ""))
    if isinstance(cls, type) and issubclass(cls, Exception):
        return cls(message)
    return RuntimeError(f"{err.get('kind')}: {message}")


def sampling_to_wire(sp: SamplingParams) -> dict[str, Any]:
    return dataclasses.asdict(sp)


def sampling_from_wire(d: dict[str, Any]) -> SamplingParams:
    return SamplingParams(**d)  # validated again, as the parent validated it


def python_executable() -> str:
    """The interpreter to start the worker with. Inside Triton's Python-backend stub (an embedded
    interpreter) ``sys.executable`` may name the stub; then the same Python's binary under its prefix."""
    exe = sys.executable
    if exe and os.path.basename(exe).startswith("python") and os.access(exe, os.X_OK):
        return exe
    for name in (f"python{sys.version_info.major}.{sys.version_info.minor}", f"python{sys.version_info.major}", "python"):
        cand = os.path.join(sys.exec_prefix, "bin", name)
        if os.access(cand, os.X_OK):
            return cand
    raise RuntimeError(f"no Python interpreter to start the reference runtime's worker process (sys.executable={exe!r})")


class WorkerClient:
    """The user's-process half of the executor split (``GenerationExecutorProxy``'s role)."""

    def __init__(self, bundle: Path, *, device: str = "auto", torch_threads: int | None = None, speculation: bool = True):
        b = open_bundle(Path(bundle))  # a bad manifest is refused here, before any process starts
        parent, child = socket.socketpair()
        cfg = {"bundle": str(b.path), "device": device, "torch_threads": torch_threads, "speculation": bool(speculation)}
        env = dict(os.environ)
        # the worker imports what this process imports (as spawn passes sys.path to its child)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        try:
            self._proc = subprocess.Popen(
                [python_executable(), "-m", WORKER_MODULE, str(child.fileno()), json.dumps(cfg)],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=2,  # the opener's stdout may be a protocol (the benchmark's direct side): logs go to stderr
                env=env,
            )
        finally:
            child.close()  # only the worker holds its end: EOF there when this process goes away
        self.pid = self._proc.pid
        self._conn = Connection(parent.detach())
        self._send_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._states: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._outs: dict[int, RequestOutput] = {}
        self._texts: dict[int, str] = {}
        self._dead: str | None = None
        self._closing = False
        try:
            # the tokenizer the engine loads (convert/load.py: the bundle's tokenizer dir, else the target's),
            # read here while the worker loads the model
            tok_dir = b.tokenizer_dir if b.tokenizer_dir.is_dir() else b.target_dir
            self.tokenizer = _load_tokenizer(tok_dir)
            self._wait_ready()
        except BaseException:
            self._kill()
            raise
        self._dispatcher = threading.Thread(target=self._dispatch, name="eagle3-executor-dispatch", daemon=True)
        self._dispatcher.start()

    # -- start-up ---------------------------------------------------------------------------------
    def _wait_ready(self) -> None:
        while not self._conn.poll(0.2):
            if self._proc.poll() is not None:
                raise RuntimeError(f"the reference runtime's worker process exited with code {self._proc.returncode} while loading the bundle")
        try:
            msg = loads(self._conn.recv_bytes())
        except (EOFError, OSError):
            raise RuntimeError(f"the reference runtime's worker process exited with code {self._proc.wait(30)} while loading the bundle") from None
        if msg["t"] == "fail":
            raise error_from_wire(msg["error"])
        if msg["t"] != "ready":
            raise RuntimeError(f"unexpected first message from the worker process: {msg['t']!r}")

    def _kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait(30)
        self._conn.close()

    # -- requests -----------------------------------------------------------------------------------
    def _send(self, msg: dict[str, Any]) -> None:
        data = dumps(msg)
        with self._send_lock:
            self._conn.send_bytes(data)

    def submit(self, out: RequestOutput, sp: SamplingParams, arrival_ns: int) -> None:
        if self._dead is not None:
            raise RuntimeError(self._dead)
        rid = out.request_id
        self._outs[rid] = out  # before the request leaves: its first update may come back at once
        out._on_abort = lambda: self._abort(rid)
        try:
            self._send({"t": "req", "id": rid, "ids": out.prompt_token_ids, "sp": sampling_to_wire(sp), "stream": out._streaming, "arrival": arrival_ns})
        except OSError:
            self._outs.pop(rid, None)
            raise RuntimeError(self._dead or "the reference runtime's worker process is gone") from None
        if self._dead is not None and self._outs.pop(rid, None) is not None:  # the worker died meanwhile
            raise RuntimeError(self._dead)

    def _abort(self, rid: int) -> None:
        if self._dead is None and rid in self._outs:
            try:
                self._send({"t": "abort", "id": rid})
            except OSError:
                pass  # the dispatcher ends the request with the worker's exit

    def speculation_state(self, timeout: float = 30.0) -> dict[str, object] | None:
        if self._dead is not None:
            raise RuntimeError(self._dead)
        with self._state_lock:
            self._send({"t": "state"})
            state = self._states.get(timeout=timeout)
        if state is None:
            raise RuntimeError(self._dead or "the reference runtime's worker process is gone")
        if isinstance(state.get("schedule"), dict):  # JSON object keys are strings; the schedule's are batch sizes
            state["schedule"] = {int(k): v for k, v in state["schedule"].items()}
        return state

    def shutdown(self) -> None:
        """Stop the worker (requests in flight end "cancelled", as the in-process scheduler ends them)."""
        if self._closing:
            return
        self._closing = True
        try:
            self._send({"t": "shutdown"})
        except OSError:
            pass
        self._dispatcher.join(timeout=30)
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(30)
        self._conn.close()

    # -- dispatcher thread ---------------------------------------------------------------------------
    def _dispatch(self) -> None:
        """Each round's updates to their requests, one wake-up per event loop per message (``Waker``)."""
        waker = Waker()
        outs, texts = self._outs, self._texts
        try:
            while True:
                msg = loads(self._conn.recv_bytes())
                t = msg["t"]
                if t == "round":
                    for rid, new_ids, delta, finished, reason, stop_reason, perf, error in msg["u"]:
                        out = outs.pop(rid) if finished else outs[rid]
                        text = texts.pop(rid, "") + delta if finished else texts.get(rid, "") + delta
                        if not finished:
                            texts[rid] = text
                        waker.deliver(out, new_ids, text, finished, reason, stop_reason, perf, error)
                    waker.round_end()
                elif t == "state":
                    self._states.put(msg["state"])
        except (EOFError, OSError):
            pass
        code = self._proc.poll()
        if code is None:
            try:
                code = self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                code = None
        self._dead = (
            "the reference runtime has shut down" if self._closing else f"the reference runtime's worker process (pid {self.pid}) exited with code {code}"
        )
        self._states.put(None)
        for rid, out in list(outs.items()):
            waker.deliver(out, [], texts.pop(rid, ""), True, "error", None, (0, 0, 0, 0, 0, None), self._dead)
        outs.clear()
        waker.round_end()
