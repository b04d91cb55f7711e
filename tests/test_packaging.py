"""The wheel is the package as it sits in the checkout, plus its data; installed, it builds the tiny bundle."""

import json
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return next(out.glob("eagle3_trt-*.whl"))


def test_wheel_modules_are_the_checkout_s_modules(wheel):
    """No code is remapped: every .py in the wheel is the file at the same path in the checkout."""
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops <= {"eagle3_trt", next(t for t in tops if t.endswith(".dist-info"))}, tops
    code = {n for n in names if n.endswith(".py") and not n.startswith("eagle3_trt/_data/")}
    in_tree = {str(p.relative_to(ROOT)) for p in (ROOT / "eagle3_trt").rglob("*.py") if "__pycache__" not in p.parts}
    assert code == in_tree, code ^ in_tree
    for must in (
        "eagle3_trt/_data/build/presets/tiny.yaml",
        "eagle3_trt/_data/build/model_configs/llama3.3-70b/draft/config.json",
        "eagle3_trt/_data/convert/data/calib_prompts.jsonl",
        "eagle3_trt/_data/convert/data/tiny_tokenizer/tokenizer.json",
        "eagle3_trt/_data/models/tiny/draft/model.safetensors",
        "eagle3_trt/_data/triton_repo/model/config.pbtxt.tmpl",
        "eagle3_trt/_data/triton_repo/model/model.py",
    ):
        assert must in names, must
    assert not any("/build/" in n for n in code), "a module under a folder named build"


def test_installed_wheel_builds_the_tiny_bundle_outside_the_checkout(wheel, tmp_path):
    """A new virtual environment outside the checkout gets the wheel from pip (its console script
    included); `eagle3-trt engine --model tiny` run from elsewhere builds the bundle from the wheel's own
    data. The dependencies (torch, transformers, ModelOpt: gigabytes) are lent read-only through a path
    file naming this environment's site-packages, which is not a site dir, so its editable-install
    hook for the checkout is never processed."""
    venv = tmp_path / "venv"
    # no pip of its own (ensurepip costs seconds): this environment's pip installs into it (--python)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "borrowed_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    subprocess.run([*pip, "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True, timeout=300)
    # one torch thread, as conftest gives the suite's other processes (this environment is built from scratch)
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    code = (
        "import eagle3_trt, eagle3_trt.resources as r, importlib.util as u; print(eagle3_trt.__file__); print(r.data_dir('models')); "
        "print(r.checkout_root()); assert u.find_spec('build') is None or 'eagle3_trt' not in str(u.find_spec('build').origin)"
    )
    r = subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    pkg, models, checkout = r.stdout.split()
    assert pkg.startswith(str(site)) and models.startswith(str(site)) and checkout == "None", r.stdout
    r = subprocess.run(
        [str(venv / "bin" / "eagle3-trt"), "engine", "--model", "tiny", "-o", str(tmp_path / "bundle")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest["preset"] == "tiny" and "git_sha" not in manifest  # built from a wheel, not a checkout
