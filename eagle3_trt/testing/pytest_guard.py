"""Every test runs, or says why not: the suite's own pytest plugin.

Loaded explicitly (``-p eagle3_trt.testing.pytest_guard`` in pyproject's addopts) while plugin
autoloading is off (``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``, set by ``make test``). Installed
packages register global plugins: ai-dynamo 1.6.1's ``triton_tests``/``trtllm_tests`` return
True from ``pytest_ignore_collect`` for any ``test_triton_*``/``test_trtllm_*`` file, and 101 of
this suite's tests vanished with a green summary. This plugin makes such losses fail the run:

- every ``test_*.py`` under the paths pytest was given must yield collected tests;
- no module may be skipped at collection, and nothing deselected unless the user asked
  (``-k``, ``-m``, ``--deselect``);
- a test may be skipped only through a declared requirement, ``@pytest.mark.needs("name")``,
  which this plugin checks; a skip from anywhere else is a failure;
- the run ends with one line: how many ran, passed and were skipped, and why, by requirement.

Under pytest-xdist (``make test`` runs ``-n 2``) collection happens in the workers: each worker's guard
checks its collection (every worker collects every test) and sends what it found, and which tests
it skipped for which requirement, to the controller through xdist's ``workeroutput``; the controller
counts the outcomes of the reports it receives and prints the one line.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest


def _importable(name: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    return check


def _cuda() -> bool:
    # torch is heavy and optional for the check itself; the suite always has it
    import torch

    return bool(torch.cuda.is_available())


def _tritonserver() -> bool:
    return bool(shutil.which("tritonserver") or _importable("pytriton")())


def _tmpfs() -> bool:
    """Root and a kernel that lets us mount a tmpfs (full-disk tests fill one)."""
    if os.geteuid() != 0:
        return False
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", d], capture_output=True)
        if r.returncode:
            return False
        subprocess.run(["umount", d], capture_output=True)
    return True


# The checkout under test: pytest's rootdir once a run is configured, which is where the tests look
# for ../shared (Path(__file__).parents[1].parent); the package's own checkout before that. The two
# differ when a clone runs with another checkout's editable install.
_ROOT: list[Path] = [Path(__file__).resolve().parents[2]]


def shared_data_dir() -> Path:
    """The ../shared/data folder the tests marked needs("shared") read, as an absolute path."""
    return (_ROOT[0].parent / "shared" / "data").resolve()


def _shared() -> bool:
    return shared_data_dir().is_dir()


def _make_venv() -> bool:
    return bool(shutil.which("make")) and (Path(sys.executable).parent.parent / ".eagle3-trt-installed").is_file()


# name -> (check, what is missing when it fails; "{shared}" is where ../shared/data was looked for)
REQUIREMENTS: dict[str, tuple[Callable[[], bool], str]] = {
    "cuda": (_cuda, "a CUDA GPU"),
    "no_cuda": (lambda: not _cuda(), "a machine without a CUDA GPU (the test checks the CPU refusal)"),
    "tensorrt_llm": (_importable("tensorrt_llm"), "TensorRT-LLM (NVIDIA's containers or package index)"),
    "no_tensorrt_llm": (lambda: not _importable("tensorrt_llm")(), "a machine without TensorRT-LLM"),
    "tritonserver": (_tritonserver, "a tritonserver binary (nvidia-pytriton, the [triton] extra)"),
    "tritonclient": (_importable("tritonclient"), "tritonclient (the [triton] extra)"),
    "dynamo": (_importable("dynamo.frontend"), "NVIDIA Dynamo (ai-dynamo; make test installs it)"),
    "openai": (_importable("openai"), "the openai client (the [dynamo] extra)"),
    "kubernetes_validate": (_importable("kubernetes_validate"), "kubernetes-validate (the [dynamo] extra)"),
    "vllm_or_sglang": (lambda: _importable("vllm")() or _importable("sglang")(), "vLLM or SGLang"),
    "tmpfs": (_tmpfs, "root and permission to mount a tmpfs"),
    "shared": (_shared, "../shared/data next to the repository (the shared data sets and tokenizers): {shared} not found"),
    "make_venv": (_make_venv, "make and the Makefile's .venv"),
    "dev_shm": (lambda: Path("/dev/shm").is_dir(), "/dev/shm"),
    "curl": (lambda: shutil.which("curl") is not None, "curl (the README's health checks call it)"),
    # ModelOpt's reader of offline hidden states: in the package from 0.4x; 0.37 (the containers' ModelOpt)
    # keeps it in examples/speculative_decoding/eagle_utils.py, which no wheel installs
    "modelopt_offline_dataset": (
        lambda: (
            _importable("modelopt.torch.speculative.eagle.utils")()
            and hasattr(importlib.import_module("modelopt.torch.speculative.eagle.utils"), "OfflineSupervisedDataset")
        ),
        "ModelOpt's OfflineSupervisedDataset in the package (0.4x; 0.37 has it only in its examples)",
    ),
    "aiperf": (
        lambda: (_ROOT[0] / ".venv-aiperf" / "bin" / "aiperf").is_file() or shutil.which("aiperf") is not None,
        "NVIDIA AIPerf (make bench-aiperf installs it into .venv-aiperf)",
    ),
}


def _missing(name: str) -> str:
    """What a skip says is missing, with the absolute path where ../shared was looked for."""
    return REQUIREMENTS[name][1].format(shared=shared_data_dir())


# test files skipped whole by require(): path -> requirement
_MODULE_SKIPS: dict[Path, str] = {}


def require(*names: str) -> None:
    """At the top of a test module whose imports need an optional package: skip the whole module,
    counted under the requirement, when one is missing (the guard accepts no other module skip)."""
    caller = Path(inspect.stack()[1].filename).resolve()
    for name in names:
        if name not in REQUIREMENTS:
            raise ValueError(f"unknown requirement {name!r} (declared: {', '.join(REQUIREMENTS)})")
        if not _met(name):
            _MODULE_SKIPS[caller] = name
            pytest.skip(f"needs {name}: {_missing(name)}", allow_module_level=True)


_CHECKS: dict[str, bool] = {}


def _met(name: str) -> bool:
    if name not in _CHECKS:
        _CHECKS[name] = REQUIREMENTS[name][0]()
    return _CHECKS[name]


def _user_selected(config: pytest.Config) -> bool:
    return bool(config.getoption("keyword", "") or config.getoption("markexpr", "") or config.getoption("deselect", None))


def _reason(report: pytest.TestReport) -> str:
    lr = report.longrepr
    return str(lr[2]) if isinstance(lr, tuple) and len(lr) == 3 else str(lr)


@dataclass(eq=False)  # pluggy keeps plugins in sets: hash by identity
class SuiteGuard:
    """One per run: what was collected, skipped and why, and what went missing."""

    config: pytest.Config
    skipped_by_need: dict[str, str] = field(default_factory=dict)  # nodeid -> requirement
    outcomes: Counter[str] = field(default_factory=Counter)
    skipped_needs: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    skipped_files: set[Path] = field(default_factory=set)
    deselected: int = 0
    collected: int = 0
    # xdist controller: skipped nodeids waiting for the workers' requirement map (sent at their end)
    pending_skips: dict[str, str] = field(default_factory=dict)

    @property
    def is_worker(self) -> bool:
        return hasattr(self.config, "workerinput")

    @property
    def is_controller(self) -> bool:
        return not self.is_worker and self.config.pluginmanager.has_plugin("dsession")

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self.deselected += len(items)
        if items and not _user_selected(self.config):
            self.problems.append(f"{len(items)} tests deselected by a plugin, not by -k/-m/--deselect")

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if not report.skipped or self.is_controller:
            return  # under xdist each worker checks its own collection (the controller lacks require()'s record)
        need = _MODULE_SKIPS.get((self.config.rootpath / report.nodeid.split("::")[0]).resolve())
        self.skipped_files.add((self.config.rootpath / report.nodeid.split("::")[0]).resolve())
        if need is None:
            self.problems.append(f"{report.nodeid or 'a collector'} skipped at collection")
        else:
            self.skipped_needs[f"{need} (whole file)"] += 1

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            for mark in item.iter_markers("needs"):
                unknown = [n for n in mark.args if n not in REQUIREMENTS]
                if unknown:
                    raise pytest.UsageError(f"{item.nodeid}: unknown requirement {unknown} (declared: {', '.join(REQUIREMENTS)})")
                missing = [n for n in mark.args if not _met(n)]
                if missing:
                    self.skipped_by_need[item.nodeid] = missing[0]
                    item.add_marker(pytest.mark.skip(reason=f"needs {missing[0]}: {_missing(missing[0])}"))
                    break

    def _expected_files(self) -> set[Path]:
        """The test files under the paths pytest was given, less those the user --ignore'd."""
        out: set[Path] = set()
        base = Path(self.config.invocation_params.dir)
        ignored = [(base / p).resolve() for p in self.config.getoption("ignore", None) or []]
        for arg in self.config.args:
            p = base / arg.split("::")[0]
            if p.is_dir():
                out.update(q.resolve() for q in p.rglob("test_*.py") if "__pycache__" not in q.parts)
            elif p.is_file() and p.name.startswith("test_") and "::" not in arg:
                out.add(p.resolve())
        return {f for f in out if not any(f == i or i in f.parents for i in ignored)}

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.collected = len(session.items)
        if _user_selected(self.config):
            return
        seen = {Path(str(item.path)).resolve() for item in session.items}
        for f in sorted(self._expected_files() - seen - self.skipped_files):
            self.problems.append(f"{f.name} collected no tests (ignored by a plugin, or empty)")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.is_worker:
            return  # the controller counts the reports the workers forward
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.outcomes[report.outcome] += 1
        if report.skipped and hasattr(report, "wasxfail"):
            self.outcomes["xfailed"] += 1
        elif report.skipped and self.is_controller:
            self.pending_skips[report.nodeid] = _reason(report)
        elif report.skipped:
            self._count_skip(report.nodeid, _reason(report))

    def _count_skip(self, nodeid: str, reason: str) -> None:
        need = self.skipped_by_need.get(nodeid)
        if need is None:
            self.problems.append(f"{nodeid} skipped without a declared requirement ({reason})")
        else:
            self.skipped_needs[need] += 1

    @pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown when xdist is not loaded
    def pytest_testnodedown(self, node: object, error: object) -> None:
        """xdist controller: merge one worker's collection checks and requirement map."""
        out = getattr(node, "workeroutput", None) or {}
        sent = out.get(_WORKER_KEY)
        if sent is None:
            if error is None:
                self.problems.append(f"xdist worker {getattr(node, 'gateway', node)} sent no suite-guard data")
            return
        self.collected = max(self.collected, int(sent["collected"]))
        self.deselected = max(self.deselected, int(sent["deselected"]))
        self.skipped_by_need.update(sent["skipped_by_need"])
        for p in sent["problems"]:
            if p not in self.problems:
                self.problems.append(p)
        for need, n in sent["file_skips"].items():
            self.skipped_needs[need] = max(self.skipped_needs[need], int(n))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.is_worker:
            # what every worker found at collection (the same on each) and the skips it declared
            file_skips = {k: v for k, v in self.skipped_needs.items() if k.endswith("(whole file)")}
            self.config.workeroutput[_WORKER_KEY] = {  # type: ignore[attr-defined]
                "collected": self.collected,
                "deselected": self.deselected,
                "skipped_by_need": dict(self.skipped_by_need),
                "problems": list(self.problems),
                "file_skips": file_skips,
            }
            return
        for nodeid, reason in self.pending_skips.items():
            self._count_skip(nodeid, reason)
        self.pending_skips.clear()
        if self.problems and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.is_worker:
            return
        tr = terminalreporter
        for p in self.problems:
            tr.write_line(f"suite guard: {p}", red=True)
        why = ", ".join(f"{n} {need}" for need, n in sorted(self.skipped_needs.items())) or "none"
        ran = self.outcomes["passed"] + self.outcomes["failed"]
        tr.write_line(
            f"suite: {self.collected} collected, {ran} ran ({self.outcomes['passed']} passed, "
            f"{self.outcomes['failed']} failed, {self.outcomes['xfailed']} xfailed as declared), {sum(self.skipped_needs.values())} skipped by requirement "
            f"({why}), {self.deselected} deselected, {len(self.problems)} guard problems",
            bold=True,
            red=bool(self.problems or self.outcomes["failed"]),
        )


_WORKER_KEY = "eagle3_suite_guard"


def pytest_configure(config: pytest.Config) -> None:
    _ROOT[0] = Path(config.rootpath).resolve()
    config.addinivalue_line("markers", f"needs(*names): the test needs these; skipped (and counted) when one is missing. Names: {', '.join(REQUIREMENTS)}")
    config.pluginmanager.register(SuiteGuard(config), "eagle3-suite-guard")
