"""The suite guard (eagle3_trt.testing.pytest_guard) turns lost tests into failures.

Each case runs a real pytest on a small planted suite in a temporary directory, with the guard
loaded as make test loads it, and reads the exit status and the guard's summary line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PASSING = "def test_ok():\n    assert 1 + 1 == 2\n"


# make test's pytest-xdist options (the Makefile's PYTEST_XDIST): the guard must hold in the workers too
XDIST = ("-p", "xdist.plugin", "-n", "2", "--dist", "loadfile")


def _run(root: Path, files: dict[str, str], *, autoload: bool, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    for name, text in files.items():
        (root / name).write_text(text)
    (root / "pytest.ini").write_text("[pytest]\naddopts = -p eagle3_trt.testing.pytest_guard -p no:cacheprovider\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_DISABLE_PLUGIN_AUTOLOAD"}
    if not autoload:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", *extra, "."], cwd=root, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.needs("dynamo")
def test_a_plugin_that_drops_a_file_fails_the_run(tmp_path):
    """ai-dynamo's global triton_tests plugin ignores test_triton_*.py: with autoloading on the guard
    names the file and fails; with autoloading off (make test) the same suite passes."""
    files = {"test_triton_planted.py": PASSING, "test_other.py": PASSING}
    r = _run(tmp_path, files, autoload=True)
    assert r.returncode == 1, r.stdout
    assert "suite guard: test_triton_planted.py collected no tests" in r.stdout, r.stdout
    assert "suite: 1 collected" in r.stdout, r.stdout
    r = _run(tmp_path, files, autoload=False)
    assert r.returncode == 0, r.stdout
    assert "suite: 2 collected, 2 ran (2 passed" in r.stdout and "0 guard problems" in r.stdout, r.stdout
    # the same under xdist (workers collect; autoloading on also loads xdist itself)
    r = _run(tmp_path, files, autoload=True, extra=("-n", "2"))
    assert r.returncode == 1, r.stdout
    assert "suite guard: test_triton_planted.py collected no tests" in r.stdout and "suite: 1 collected" in r.stdout, r.stdout
    r = _run(tmp_path, files, autoload=False, extra=XDIST)
    assert r.returncode == 0 and "suite: 2 collected, 2 ran (2 passed" in r.stdout and "0 guard problems" in r.stdout, r.stdout


@pytest.mark.parametrize("extra", [(), XDIST], ids=["serial", "xdist"])
def test_an_undeclared_skip_fails_and_a_declared_one_is_counted(tmp_path, extra):
    files = {
        "test_skips.py": "import pytest\n\n"
        "def test_quiet_skip():\n    pytest.skip('not today')\n\n"
        "@pytest.mark.needs('tensorrt_llm', 'no_tensorrt_llm')\n"
        "def test_declared():\n    pass\n",
        "test_more.py": PASSING,
    }
    r = _run(tmp_path, files, autoload=False, extra=extra)
    assert r.returncode == 1, r.stdout
    assert "test_skips.py::test_quiet_skip skipped without a declared requirement" in r.stdout and "not today" in r.stdout, r.stdout
    assert "2 skipped by requirement" not in r.stdout and "1 skipped by requirement" in r.stdout, r.stdout
    assert "suite: 3 collected, 1 ran (1 passed" in r.stdout, r.stdout


def test_a_test_lost_in_a_worker_fails_the_run(tmp_path):
    """A plugin that deselects inside the xdist workers (the controller collects nothing itself)."""
    files = {
        "conftest.py": "def pytest_collection_modifyitems(config, items):\n"
        "    lost = [i for i in items if i.name == 'test_b']\n"
        "    items[:] = [i for i in items if i.name != 'test_b']\n"
        "    config.hook.pytest_deselected(items=lost)\n",
        "test_a.py": PASSING + "\ndef test_b():\n    pass\n",
        "test_c.py": PASSING,
    }
    r = _run(tmp_path, files, autoload=False, extra=XDIST)
    assert r.returncode == 1, r.stdout
    assert r.stdout.count("suite guard: 1 tests deselected by a plugin") == 1, r.stdout
    assert "suite: 2 collected, 2 ran (2 passed" in r.stdout, r.stdout


@pytest.mark.parametrize("extra", [(), XDIST], ids=["serial", "xdist"])
def test_a_module_skipped_at_collection_fails_unless_required(tmp_path, extra):
    files = {
        "test_mod.py": "import pytest\npytest.importorskip('no_such_module_anywhere')\n" + PASSING,
        "test_req.py": "from eagle3_trt.testing.pytest_guard import require\nrequire('vllm_or_sglang')\n" + PASSING,
        "test_ok.py": PASSING,
    }
    r = _run(tmp_path, files, autoload=False, extra=extra)
    assert r.returncode == 1, r.stdout
    assert "suite guard: test_mod.py skipped at collection" in r.stdout, r.stdout
    assert "test_req.py" not in r.stdout, r.stdout
    assert "1 skipped by requirement (1 vllm_or_sglang (whole file))" in r.stdout, r.stdout


def test_an_unknown_requirement_is_a_usage_error(tmp_path):
    r = _run(tmp_path, {"test_x.py": "import pytest\n\n@pytest.mark.needs('a_gpu_please')\ndef test_x():\n    pass\n"}, autoload=False)
    assert r.returncode == 4 and "unknown requirement ['a_gpu_please']" in r.stdout + r.stderr, r.stdout + r.stderr


def test_user_selection_is_not_a_loss(tmp_path):
    r = _run(tmp_path, {"test_a.py": PASSING + "\ndef test_b():\n    pass\n"}, autoload=False, extra=("-k", "ok"))
    assert r.returncode == 0 and "1 deselected" in r.stdout, r.stdout


def test_an_ignored_file_is_the_user_s_choice(tmp_path):
    r = _run(tmp_path, {"test_a.py": PASSING, "test_b.py": PASSING}, autoload=False, extra=("--ignore", "test_b.py"))
    assert r.returncode == 0 and "suite: 1 collected" in r.stdout and "0 guard problems" in r.stdout, r.stdout


def test_a_missing_shared_folder_is_named_with_the_path_looked_at(tmp_path):
    """needs("shared") looks for ../shared/data next to the checkout under test (pytest's rootdir, not
    the installed package's checkout) and its skip line gives that absolute path; once the folder is
    there, the test runs."""
    repo = tmp_path / "repo"
    repo.mkdir()
    files = {"test_data.py": "import pytest\n\n@pytest.mark.needs('shared')\ndef test_reads_shared():\n    pass\n"}
    r = _run(repo, files, autoload=False, extra=("-rs",))
    assert r.returncode == 0, r.stdout
    assert f"needs shared: ../shared/data next to the repository (the shared data sets and tokenizers): {tmp_path}/shared/data not found" in r.stdout, r.stdout
    assert "1 skipped by requirement (1 shared)" in r.stdout, r.stdout
    (tmp_path / "shared" / "data").mkdir(parents=True)
    r = _run(repo, files, autoload=False)
    assert r.returncode == 0 and "1 ran (1 passed" in r.stdout and "0 skipped by requirement" in r.stdout, r.stdout
