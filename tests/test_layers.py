"""The layer contracts in pyproject.toml hold: lint-imports over the tree as the wheel lays it out.

The top-level folders are namespace subpackages of eagle3_trt in a checkout (no __init__.py, so
that build/ never shadows PyPA's build). import-linter's graph builder only walks regular
packages, so the test copies the sources under eagle3_trt/ with empty __init__.py files, the
same modules and imports the wheel installs, and runs the real lint-imports on that copy.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("convert", "core", "build", "runtime", "train", "triton_repo", "clients")


def _layout(dest: Path) -> Path:
    pkg = dest / "eagle3_trt"
    shutil.copytree(ROOT / "eagle3_trt", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for name in FOLDERS:
        shutil.copytree(ROOT / name, pkg / name, ignore=shutil.ignore_patterns("__pycache__", "data", "presets", "model_configs"))
    for d in [pkg, *(p for p in pkg.rglob("*") if p.is_dir())]:
        (d / "__init__.py").touch()
    return dest


def test_every_folder_is_in_a_layer():
    text = (ROOT / "pyproject.toml").read_text()
    on_disk = {p.name for p in ROOT.iterdir() if p.is_dir() and any(p.glob("*.py")) and p.name not in ("tests", "benchmarks", "eagle3_trt")}
    assert on_disk == set(FOLDERS), on_disk ^ set(FOLDERS)
    for name in FOLDERS:
        assert f'"eagle3_trt.{name}' in text or f"| eagle3_trt.{name}" in text, f"{name} is in no layer"


def test_import_linter_contracts_hold(tmp_path):
    pytest.importorskip("importlinter")
    root = _layout(tmp_path)
    exe = Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(exe), "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=root,
                       env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout, r.stdout[-3000:]
