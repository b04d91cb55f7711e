"""The wheel puts every top-level folder under eagle3_trt/ and nothing at top level."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("hatchling")
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    return next(out.glob("eagle3_trt-*.whl"))


def test_wheel_layout(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops <= {"eagle3_trt", next(t for t in tops if t.endswith(".dist-info"))}, tops
    for must in ("eagle3_trt/__init__.py", "eagle3_trt/cli.py", "eagle3_trt/build/bundle.py", "eagle3_trt/build/presets/tiny.yaml",
                 "eagle3_trt/convert/validate.py", "eagle3_trt/convert/data/calib_prompts.jsonl",
                 "eagle3_trt/convert/data/tiny_tokenizer/tokenizer.json", "eagle3_trt/core/draft.py"):
        assert must in names, must


def test_installed_wheel_imports_without_the_source_tree(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)], check=True, timeout=300)
    code = ("import eagle3_trt, eagle3_trt.build.presets as p; assert eagle3_trt.SOURCE_ROOT is None, eagle3_trt.SOURCE_ROOT; "
            "print(p.available()); import importlib.util as u; assert u.find_spec('build') is None or 'eagle3_trt' not in str(u.find_spec('build').origin)")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "llama3.3-70b" in r.stdout and "tiny" in r.stdout
