"""One tree: the source tree is the import tree, and the layer contracts in pyproject.toml hold on it.

lint-imports runs from the repository root on the checkout as it is (make lint runs it too);
a planted upward import in a copy of the package shows the contracts can fail.
"""

import ast
import importlib
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import eagle3_trt

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "eagle3_trt"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _subpackages() -> set[str]:
    return {p.parent.name for p in PKG.glob("*/__init__.py")}


def test_every_module_sits_where_its_dotted_name_says():
    """Every module under the package imports from the file its dotted name names; nothing edits __path__."""
    assert Path(eagle3_trt.__file__).resolve() == PKG / "__init__.py"
    seen = 0
    for info in pkgutil.walk_packages(eagle3_trt.__path__, "eagle3_trt."):
        spec = importlib.util.find_spec(info.name)
        assert spec is not None and spec.origin, info.name
        rel = info.name.split(".")[1:]
        want = PKG.joinpath(*rel, "__init__.py") if info.ispkg else PKG.joinpath(*rel[:-1], rel[-1] + ".py")
        assert Path(spec.origin).resolve() == want, (info.name, spec.origin)
        seen += 1
    on_disk = [p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts]
    assert seen + 1 == len(on_disk), (seen, len(on_disk))  # + eagle3_trt/__init__.py itself
    for p in on_disk:
        assert "__path__" not in p.read_text().replace('"__path__"', ""), p
    for d in (p.parent for p in on_disk):
        assert (d / "__init__.py").is_file(), f"{d} is a namespace folder"
        assert d.name != "build", f"{d}: a subpackage named build"


def test_top_level_data_folders_hold_no_code():
    """build/, convert/, models/, triton_repo/ are data (recipes, calibration, pairs, the Triton template)."""
    for name in ("build", "convert", "models", "triton_repo"):
        assert not list((ROOT / name).glob("__init__.py")), name
        code = [p for p in (ROOT / name).rglob("*.py") if p != ROOT / "triton_repo" / "model" / "model.py"]
        assert not code, code
    assert "build" not in {p.name for p in PKG.iterdir()}


def test_every_subpackage_is_in_a_contract():
    text = (ROOT / "pyproject.toml").read_text()
    for name in sorted(_subpackages()):
        assert f'"eagle3_trt.{name}' in text or f"| eagle3_trt.{name}" in text, f"{name} is in no contract"


def _lint(cwd: Path, pythonpath: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=cwd,
        env={"PYTHONPATH": str(pythonpath), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_import_linter_contracts_hold_on_the_checkout():
    r = _lint(ROOT, ROOT)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert " 0 broken" in r.stdout, r.stdout[-3000:]


def test_a_broken_layer_is_caught(tmp_path):
    """The contract check can fail: an upward import planted in a copy of core/ breaks it."""
    shutil.copytree(PKG, tmp_path / "eagle3_trt", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "eagle3_trt" / "core" / "planted.py").write_text("from eagle3_trt.measure import commands  # noqa\n")
    r = _lint(tmp_path, tmp_path)
    assert r.returncode != 0 and "eagle3_trt.core.planted -> eagle3_trt.measure.commands" in r.stdout, r.stdout[-3000:]


# Modules whose eagle3_trt imports are deliberately local, and why.
LOCAL_IMPORT_MODULES = {
    # The CLI loads each command's module only when that command runs, so `eagle3-trt --help`
    # and `presets` answer without importing torch, transformers and ModelOpt (seconds).
    "eagle3_trt/cli.py",
    # Runs inside Triton's Python backend stub, which ignores PYTHONPATH: the toolkit becomes
    # importable only after the model adopts the paths recorded in model.yaml.
    "triton_repo/model/model.py",
    # The bundle checks before serving (refuse_on_trtllm asks the method registry, which imports torch)
    # are imported where they run, so `stop`, `status` and the other server commands that import these
    # modules answer without torch (eagle3-trt stop: 4.2 -> 0.3 CPU-s; the suite calls it ~40 times).
    "eagle3_trt/triton_serving/model_yaml.py",
    "eagle3_trt/dynamo_serving/launcher.py",
}


def _sources():
    yield from sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)
    yield ROOT / "triton_repo" / "model" / "model.py"


def _local_imports(path: Path):
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
