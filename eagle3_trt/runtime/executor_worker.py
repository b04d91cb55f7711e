"""``ReferenceLLM``'s worker process: the engine and its scheduler loop, fed over one socket.

``python -m eagle3_trt.runtime.executor_worker FD CONFIG_JSON`` (started by ``executor_ipc.WorkerClient``,
the role of TensorRT-LLM's worker process under ``GenerationExecutorProxy``, tensorrt_llm/executor/executor.py
@ed53795b). The main thread runs ``scheduler.Scheduler.run``; a reader thread admits requests,
sets abort flags, answers ``speculation_state`` and, on ``shutdown`` or EOF (the parent closed the
socket or died), ends the loop, so the process never outlives its parent. SIGINT and SIGTERM are
ignored: the parent's drain decides when the work in flight ends, not a signal to its process group. Every update of one
scheduler round leaves in one JSON message (wire format: ``executor_ipc.py``).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from eagle3_trt.runtime.executor_ipc import dumps, error_to_wire, loads, sampling_from_wire
from eagle3_trt.runtime.request_output import PerfRaw, Sink
from eagle3_trt.runtime.scheduler import Scheduler


class PipeSink(Sink):
    """Collects a round's updates (text as the delta since the last one) and sends them as one message."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.lock = threading.Lock()  # the reader thread answers state requests on the same socket
        self.batch: list[list[Any]] = []
        self.sent_text: dict[int, int] = {}
        self.cancels: dict[int, threading.Event] = {}

    def deliver(
        self, key: Any, new_ids: list[int], text: str, finished: bool, reason: str | None, stop_reason: str | None, perf: PerfRaw, error: str | None
    ) -> None:
        n = self.sent_text.pop(key, 0) if finished else self.sent_text.get(key, 0)
        if not finished:
            self.sent_text[key] = len(text)
        else:
            self.cancels.pop(key, None)
        self.batch.append([key, new_ids, text[n:], finished, reason, stop_reason, perf, error])

    def round_end(self) -> None:
        if self.batch:
            data = dumps({"t": "round", "u": self.batch})
            self.batch = []
            self.send_bytes(data)

    def send_bytes(self, data: bytes) -> None:
        try:
            with self.lock:
                self.conn.send_bytes(data)
        except OSError:
            pass  # the parent is gone; the reader thread has seen EOF and ends the loop


def _read(conn: Connection, sched: Scheduler, sink: PipeSink) -> None:
    try:
        while True:
            msg = loads(conn.recv_bytes())
            t = msg["t"]
            if t == "req":
                rid = int(msg["id"])
                cancel = threading.Event()
                sink.cancels[rid] = cancel
                try:
                    sched.admit(rid, [int(i) for i in msg["ids"]], sampling_from_wire(msg["sp"]), bool(msg["stream"]), cancel, int(msg["arrival"]))
                except Exception as e:  # the request ends with the error, as a failing step ends it
                    arrival = int(msg["arrival"])
                    sink.deliver(rid, [], "", True, "error", None, (arrival, 0, 0, 0, 0, None), f"{type(e).__name__}: {e}")
            elif t == "abort":
                c = sink.cancels.get(int(msg["id"]))
                if c is not None:
                    c.set()
            elif t == "state":
                sink.send_bytes(dumps({"t": "state", "state": sched.speculation_state()}))
            elif t == "shutdown":
                break
    except (EOFError, OSError):
        pass
    sched.inbox.put(None)


def main(argv: list[str]) -> int:
    # The parent decides when this process stops: a signal sent to the parent's process group (Ctrl-C,
    # `eagle3-trt deploy --dynamo` SIGTERMing a worker it replaces) reaches this process too, and
    # dying with it would fail the requests the parent is still draining. It ends on ``shutdown``
    # or on EOF (the parent exited or was killed); SIGKILL still ends it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn = Connection(int(argv[1]))
    cfg = json.loads(argv[2])
    sink = PipeSink(conn)
    try:
        sched = Scheduler(Path(cfg["bundle"]), sink, device=cfg["device"], torch_threads=cfg["torch_threads"], speculation=cfg["speculation"])
    except Exception as e:  # refused in the parent with the same type and line
        sink.send_bytes(dumps({"t": "fail", "error": error_to_wire(e)}))
        return 2
    sink.send_bytes(dumps({"t": "ready"}))
    threading.Thread(target=_read, args=(conn, sched, sink), name="eagle3-executor-reader", daemon=True).start()
    sched.run()
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
