"""The reference runtime over a node's GPUs: a measuring command under ``torchrun``, and ``--tp N``
launching it.

Every rank runs the whole command (the same prompts, the same decoding loop: core/tensor_parallel.py
keeps all ranks' hidden states identical, so they take the same decisions); rank 0 alone prints
and writes. The other ranks' stdout is dropped and their writes discarded (atomic.discarding_writes),
so a report is written once, through the same staged writer, or not at all. ``--tp N`` starts
``torch.distributed.run`` with the same command line and reduces its output to rank 0's lines and,
when a rank fails, the one line saying which and why.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from eagle3_trt.atomic import discarding_writes
from eagle3_trt.core.tensor_parallel import TPGroup
from eagle3_trt.errors import GateFailed, RankFailed, UserError
from eagle3_trt.procs import HOST, torchrun_env

_STATE: dict[str, TPGroup | None] = {"group": None}
# torchrun's own log lines (elastic agent warnings, the ChildFailedError summary) and Python tracebacks
_LAUNCHER_NOISE = re.compile(r"^(\[?[WEI]\d{4} |Traceback |torch\.distributed|\[[0-9]+\]:|=+$|-+$|[A-Za-z_.]+Error|  |Root Cause|Failures:|\*+)")


def current() -> TPGroup | None:
    """The tensor-parallel group this process measures in (None: one process holds the whole target)."""
    return _STATE["group"]


def under_torchrun() -> bool:
    return torchrun_env()[1] > 1


@contextlib.contextmanager
def tp_session(tp: int, device: str | None) -> Iterator[str | None]:
    """Run a measuring command as one rank of torchrun's group; yields this rank's device.

    Outside torchrun (and at ``tp`` 1) it does nothing. A worker joins the default process group
    (gloo on CPU, nccl on CUDA), rank 0 keeps its output, the other ranks compute silently and write
    nothing; a failing rank prints its one ``error:`` line."""
    rank, world, local = torchrun_env()
    if world <= 1:
        yield device
        return
    if tp not in (1, world):
        raise UserError(
            "--tp", f"{tp} does not match torchrun's {world} processes", "pass --tp N alone (it starts torchrun) or run under torchrun --nproc-per-node N"
        )
    if (device is None and torch.cuda.is_available()) or (device or "").startswith("cuda"):
        if local >= torch.cuda.device_count():
            raise UserError("--tp", f"local rank {local} has no GPU (torch sees {torch.cuda.device_count()})", "use at most one rank per GPU")
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    else:
        device = "cpu"
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    _STATE["group"] = TPGroup(rank=rank, world=world)
    real_err = sys.stderr
    quiet = rank != 0
    try:
        with contextlib.ExitStack() as stack:
            if quiet:
                devnull = stack.enter_context(open(os.devnull, "w"))
                stack.enter_context(contextlib.redirect_stdout(devnull))
                stack.enter_context(contextlib.redirect_stderr(devnull))
                stack.enter_context(discarding_writes())
            yield device
    except (UserError, RankFailed) as e:
        if quiet:  # rank 0 prints its own through the CLI
            line = e.line() if isinstance(e, UserError) else str(e)
            print(f"error: rank {rank}: {line}", file=real_err, flush=True)
        raise
    finally:
        _STATE["group"] = None
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def launch(argv: list[str], n: int) -> None:
    """Run ``eagle3-trt ARGV`` as ``n`` torchrun ranks on this node; returns when rank 0 has finished.

    rank 0's stdout and progress pass through as they come; when any rank fails, one line (the
    failing rank's own error, else the signal or exit code torchrun reports) is raised as
    ``RankFailed`` (a gate verdict stays ``GateFailed``)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n), "--master-addr", HOST, "--master-port", str(_free_port())]
    env = {**os.environ}
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.Popen([*cmd, "-m", "eagle3_trt.cli", *argv], stderr=subprocess.PIPE, text=True, env=env, start_new_session=False)
    errors: list[str] = []
    summary: list[str] = []
    noisy = False
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            text = line.rstrip("\n")
            if text.startswith("error: ") or text.startswith("gate FAILED"):
                errors.append(text)
                continue
            noisy = noisy or bool(_LAUNCHER_NOISE.match(text))
            if noisy:
                summary.append(text)
            elif text:
                print(text, file=sys.stderr, flush=True)
        rc = proc.wait()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)  # torchrun passes it to its workers
        proc.wait()
        raise
    if rc == 0:
        return
    gate = [e for e in errors if e.startswith("gate FAILED")]
    if gate:
        raise GateFailed(gate[0])
    died = _failed_rank(summary, rc, n)
    # a rank killed by a signal leaves its peers only "peer gone" errors: the summary names the cause
    if errors and " by signal " not in died:
        raise RankFailed(_without_prefix(errors[0]))
    raise RankFailed(died)


def _without_prefix(line: str) -> str:
    return line[len("error: ") :] if line.startswith("error: ") else line


def _failed_rank(summary: list[str], rc: int, n: int) -> str:
    """The one line for a rank that died without saying why (a signal, an OOM kill): torchrun's
    failure summary names its rank and exit code."""
    text = "\n".join(summary)
    rank = re.search(r"rank\s*:\s*(\d+)", text)
    code = re.search(r"exitcode\s*:\s*(-?\d+)", text)
    who = f"rank {rank.group(1)}" if rank else "a rank"
    how = ""
    if code:
        c = int(code.group(1))
        how = f" by signal {-c} ({signal.Signals(-c).name})" if c < 0 and -c in signal.valid_signals() else f" with exit code {c}"
    return f"--tp {n}: {who} of {n} ended{how} mid-run (launcher exit {rc}); nothing was written"


def relaunch_argv(ctx: Any) -> list[str]:
    """The command line this CLI process was started with (recorded by ``eagle3_trt.cli.main``)."""
    obj = ctx.find_root().obj
    if not isinstance(obj, dict) or "argv" not in obj:
        raise UserError("--tp", "starts torchrun with this command line, which this caller did not record", "run `eagle3-trt ... --tp N` from the shell")
    return list(obj["argv"])
