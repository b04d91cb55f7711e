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
FOLDERS = ("convert", "core", "build", "runtime", "train", "triton_repo", "dynamo_serving", "clients")


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


def test_a_broken_layer_is_caught(tmp_path):
    """The contract check can fail: an upward import planted in a copy of core/ breaks it."""
    pytest.importorskip("importlinter")
    root = _layout(tmp_path)
    (root / "eagle3_trt" / "core" / "planted.py").write_text("from eagle3_trt.runtime import commands  # noqa\n")
    exe = Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(exe), "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=root,
                       env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "eagle3_trt.core.planted -> eagle3_trt.runtime.commands" in r.stdout, r.stdout[-3000:]


# Modules whose eagle3_trt imports are deliberately local, and why.
LOCAL_IMPORT_MODULES = {
    # The CLI loads each command's module only when that command runs, so `eagle3-trt --help`
    # and `presets` answer without importing torch, transformers and ModelOpt (seconds).
    "eagle3_trt/cli.py",
    # Runs inside Triton's Python backend stub, which ignores PYTHONPATH: the toolkit becomes
    # importable only after the model adopts the paths recorded in model.yaml.
    "triton_repo/model/model.py",
}


def _sources():
    for name in ("eagle3_trt", *FOLDERS):
        yield from sorted((ROOT / name).rglob("*.py"))


def _local_imports(path: Path):
    import ast

    lines = path.read_text().splitlines()
    tree = ast.parse("\n".join(lines))
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                line = lines[node.lineno - 1]
                before = lines[node.lineno - 2] if node.lineno > 1 else ""
                commented = "#" in line or before.strip().startswith("#")
                yield node.lineno, mods, commented


def test_imports_are_at_the_top():
    """eagle3_trt imports sit at the top of the module; a local import is a heavy optional
    third-party one, and says why in a comment on its line or the line above."""
    bad = []
    for path in _sources():
        rel = str(path.relative_to(ROOT))
        for lineno, mods, commented in _local_imports(path):
            ours = any(m == "eagle3_trt" or m.startswith("eagle3_trt.") for m in mods)
            if ours and rel not in LOCAL_IMPORT_MODULES:
                bad.append(f"{rel}:{lineno} local import of {mods}")
            elif not ours and not commented:
                bad.append(f"{rel}:{lineno} local import of {mods} without a comment saying why")
    assert not bad, "\n".join(bad)
