"""How ``eagle3-trt stop`` tells the model that the server is going down, and by when.

On SIGTERM Triton stops taking requests and waits ``--exit-timeout-secs`` for those in flight;
past that it exits on the spot (the log says "Exit timeout expired. Exiting immediately") and
every open stream is cut without a word: a bare chunked-encoding error on HTTP, "Socket closed"
on gRPC. Nothing tells the Python model that Triton is draining, so ``stop`` does: before its
SIGTERM it writes a drain marker holding the end of the drain window, and the model, which polls
it with its cancellation checks, ends each request still open at that time with an error
response saying the server is shutting down. Triton then sees nothing in flight, unloads the
models and exits normally, well inside its own timeout.

The marker sits next to the Python backend's shared-memory regions, named with the server's
unique region prefix (``--backend-config=python,shm-region-prefix-name=...``, which the model
reads from its parent's command line), so ``stop`` removes it with the regions and two servers
on one host never see each other's. A server not started by ``eagle3-trt serve`` has no such
prefix: its model never drains early, and Triton's own behaviour applies.

``eagle3-trt deploy`` retires the version it replaced the same way, one marker per backend stub
(``retire_marker_path``, named by the stub's pid: a version loaded again later has new stubs that
never see it). The marker is also what lets a model instance end its own processes when Triton
will not: tritonserver 2.51 keeps the first request of every gRPC stream (its
``TRITONSERVER_InferenceRequest``, which owns a reference to the model version) until the stream
closes (triton-inference-server/server/src/grpc/stream_infer_handler.cc@e0f0734d (v2.51.0)
``ModelStreamInferHandler::Process``: the stream's first state is its ``AsyncNotifyWhenDone`` state
and keeps ``inference_request_`` until the stream ends; triton-inference-server/core/src/infer_request.h@bfec7c61
(r24.10) ``model_shared_``; core src/model_repository_manager/model_lifecycle.cc@bfec7c61
``ModelDeleter``: a version is destroyed, and its backend finalized, only when the last reference
goes). A stream kept open
after its last response, or one whose refused request's state is never released, so holds a
version "live" with nothing in flight; the model's serving loop (``job.LlmServing``) sees the
marker, waits until it has had nothing in flight for a while, and ends its runtime and its stub.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from eagle3_trt.atomic import write_text

SHM_DIR = Path("/dev/shm")
MARKER_SUFFIX = "draining"
RETIRE_INFIX = "retire-"
PREFIX_ARG = "shm-region-prefix-name="
SHUTDOWN_MESSAGE = "server is shutting down"
RETIRED_MESSAGE = "this model version was replaced by a deploy and is unloading"

# Retiring (a stop's or a deploy's marker seen, nothing in flight): how often the marker is looked
# for, how long after it is first seen and after the last request the instance waits before it ends
# its processes. Both outlast the time Triton itself takes to finalize a version it is unloading
# (triton-inference-server/python_backend/src/python_be.cc@01d0ad82 ~ModelInstanceState: UpdateHealth
# sleeps 1 s, then the stub gets its finalize request; triton-inference-server/core/src/server.cc@bfec7c61
# InferenceServer::Stop polls for in-flight requests every second): an instance Triton is
# finalizing is never ended underneath it.
RETIRE_POLL_S = 0.5
RETIRE_SETTLE_S = 3.0
RETIRE_QUIET_S = 4.0


class DrainMarker(BaseModel):
    """The marker's content: when the drain window ends (wall clock) and how long it was."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    deadline_unix: float
    drain_s: float


def marker_path(shm_prefix: str, shm_dir: Path = SHM_DIR) -> Path:
    return Path(shm_dir) / f"{shm_prefix}{MARKER_SUFFIX}"


def retire_marker_path(shm_prefix: str, stub_pid: int, shm_dir: Path = SHM_DIR) -> Path:
    """The marker ``deploy`` writes for one backend stub of the version it replaced."""
    return Path(shm_dir) / f"{shm_prefix}{RETIRE_INFIX}{stub_pid}"


def write_marker(shm_prefix: str, drain_s: float, shm_dir: Path = SHM_DIR, stub_pid: int | None = None) -> Path:
    """The drain window ends ``drain_s`` from now (wall clock: the model is another process): the
    server's (``stop``), or with ``stub_pid`` that one stub's (``deploy`` retiring its version)."""
    path = marker_path(shm_prefix, shm_dir) if stub_pid is None else retire_marker_path(shm_prefix, stub_pid, shm_dir)
    # the atomic writer renames into place: the model never reads half a file
    return write_text(path, DrainMarker(deadline_unix=time.time() + drain_s, drain_s=drain_s).model_dump_json())


def server_shm_prefix(server_pid: int) -> str | None:
    """The shared-memory prefix ``eagle3-trt serve`` gave the Triton process ``server_pid``."""
    try:
        args = Path(f"/proc/{server_pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    for a in args:
        if a.startswith("--backend-config=python,") and PREFIX_ARG in a:
            return a.split(PREFIX_ARG, 1)[1].split(",", 1)[0] or None
    return None


class DrainWatch:
    """Polled by the model: has a stop (the server's marker) or a deploy (this stub's marker) asked
    it to go, and has the drain window of that request ended?"""

    def __init__(self, path: Path | None, retire_path: Path | None = None):
        self.path = path
        self.retire_path = retire_path
        self._deadlines: dict[Path, float] = {}

    @classmethod
    def for_parent(cls) -> DrainWatch:
        """The model's watch: its process's parent is the Triton server, and it is the stub."""
        prefix = server_shm_prefix(os.getppid())
        return cls(marker_path(prefix), retire_marker_path(prefix, os.getpid())) if prefix else cls(None)

    def _deadline(self, path: Path | None) -> float | None:
        if path is None:
            return None
        if path not in self._deadlines:
            try:
                self._deadlines[path] = DrainMarker.model_validate_json(path.read_text()).deadline_unix
            except FileNotFoundError:
                return None
            except (OSError, ValidationError):  # unreadable: drain now rather than be cut off
                self._deadlines[path] = 0.0
        return self._deadlines[path]

    def asked(self) -> str | None:
        """ "stop" or "deploy" once either wrote its marker; None before."""
        if self._deadline(self.path) is not None:
            return "stop"
        return "deploy" if self._deadline(self.retire_path) is not None else None

    def expired(self) -> bool:
        now = time.time()
        return any(d is not None and now >= d for d in (self._deadline(self.path), self._deadline(self.retire_path)))
