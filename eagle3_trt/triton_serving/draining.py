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
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from eagle3_trt.atomic import write_text

SHM_DIR = Path("/dev/shm")
MARKER_SUFFIX = "draining"
PREFIX_ARG = "shm-region-prefix-name="
SHUTDOWN_MESSAGE = "server is shutting down"


class DrainMarker(BaseModel):
    """The marker's content: when the drain window ends (wall clock) and how long it was."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    deadline_unix: float
    drain_s: float


def marker_path(shm_prefix: str, shm_dir: Path = SHM_DIR) -> Path:
    return Path(shm_dir) / f"{shm_prefix}{MARKER_SUFFIX}"


def write_marker(shm_prefix: str, drain_s: float, shm_dir: Path = SHM_DIR) -> Path:
    """The drain window ends ``drain_s`` from now (wall clock: the model is another process)."""
    path = marker_path(shm_prefix, shm_dir)
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
    """Polled by the model: has the drain window of a stop ended?"""

    def __init__(self, path: Path | None):
        self.path = path
        self.deadline: float | None = None

    @classmethod
    def for_parent(cls) -> DrainWatch:
        """The model's watch: its process's parent is the Triton server."""
        prefix = server_shm_prefix(os.getppid())
        return cls(marker_path(prefix) if prefix else None)

    def expired(self) -> bool:
        if self.path is None:
            return False
        if self.deadline is None:
            try:
                self.deadline = DrainMarker.model_validate_json(self.path.read_text()).deadline_unix
            except FileNotFoundError:
                return False
            except (OSError, ValidationError):  # unreadable: drain now rather than be cut off
                self.deadline = 0.0
        return time.time() >= self.deadline
