"""How `eagle3-trt deploy --dynamo` tells a worker it is being replaced: finish what you hold, then go.

A worker's SIGTERM is handled by Dynamo (1.6.1, the Rust ``Worker`` of ``dynamo.common.backend``):
it leaves discovery, so the frontend sends it nothing new, waits its grace period (the launcher
sets none: ``stop-dynamo`` drains at the frontend instead), then calls the engine's ``cleanup``,
which ends every request still running. Before it SIGTERMs a worker it replaces, ``deploy`` writes
a drain marker beside the discovery store, named by the worker's pid and holding the end of the
drain window; ``cleanup`` then first waits for the worker's requests in flight to finish (at most
until that time) and only cuts off what is left. A worker stopped by ``stop-dynamo`` finds no marker.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from eagle3_trt.atomic import write_text

# Dynamo's cleanup budget is 30 s (dynamo/common/utils/graceful_shutdown.py _DEFAULT_CLEANUP_TIMEOUT_SECS
# in ai-dynamo 1.6.1): a drain stays inside it.
MAX_DRAIN_S = 25.0


class DrainMarker(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    deadline_unix: float


def marker_path(discovery_dir: Path, pid: int) -> Path:
    return Path(discovery_dir).parent / f"drain-{pid}.json"


def write_marker(discovery_dir: Path, pid: int, drain_s: float) -> Path:
    return write_text(marker_path(discovery_dir, pid), DrainMarker(deadline_unix=time.time() + min(drain_s, MAX_DRAIN_S)).model_dump_json())


def own_deadline() -> float | None:
    """This worker's drain deadline (wall clock), or None when no replacement asked for one."""
    kv = os.environ.get("DYN_FILE_KV")
    if not kv:
        return None
    try:
        return DrainMarker.model_validate_json(marker_path(Path(kv), os.getpid()).read_text()).deadline_unix
    except (OSError, ValidationError):
        return None
