"""The CLI run in a new process per call, forked from one process that has imported it once.

Importing torch, transformers and ModelOpt costs seconds per process; tests that run the command
line many times (tests/test_bad_inputs.py, tests/test_triton_package_ownership.py) fork each run
from a process that has imported the CLI and every command module. A fork is a fresh process as far
as the run can tell (own exit code, stdout, stderr, cwd, signal handlers), running
``eagle3_trt.cli.main`` exactly as the ``eagle3-trt`` console script does; a run that hangs is
killed by its own alarm (exit -14), not the whole test session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

_ZYGOTE = """
import json, os, signal, sys, traceback
from eagle3_trt import cli
for name in cli.LAZY_COMMANDS:
    cli.load_command(name)
import eagle3_trt.pipeline.builder, eagle3_trt.convert.validate  # what `engine` and `validate` import when they run
print(json.dumps({"ready": os.getpid()}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        rc = 1
        try:
            signal.alarm(req["timeout"])
            os.chdir(req["cwd"])
            fd_in = os.open(os.devnull, os.O_RDONLY)
            fd_out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            fd_err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd_in, 0); os.dup2(fd_out, 1); os.dup2(fd_err, 2)
            sys.argv = ["eagle3-trt", *req["argv"]]
            try:
                rc = cli.main(req["argv"])  # what the console script does: sys.exit(main())
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:
                traceback.print_exc()  # as the interpreter prints an uncaught exception
                rc = 1
            sys.stdout.flush(); sys.stderr.flush()
        finally:
            os._exit(rc)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)
"""


class ForkedCli:
    """``run(argv, cwd)`` -> CompletedProcess (returncode, stdout, stderr), one forked process per call."""

    def __init__(self, timeout_s: int = 120):
        self.timeout_s = timeout_s
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_ZYGOTE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT, env=env
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith('{"ready"'):
            self.proc.kill()
            raise RuntimeError(f"CLI process did not start: {line!r}")

    def run(self, argv: list[str], cwd: Path | str = REPO_ROOT) -> subprocess.CompletedProcess:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with tempfile.TemporaryDirectory(prefix="forked-cli-") as d:
            out, err = Path(d) / "stdout", Path(d) / "stderr"
            req = {"argv": [str(a) for a in argv], "cwd": str(cwd), "stdout": str(out), "stderr": str(err), "timeout": self.timeout_s}
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            rc = json.loads(self.proc.stdout.readline())["rc"]
            return subprocess.CompletedProcess(argv, rc, out.read_text(), err.read_text())

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)
