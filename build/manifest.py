"""Provenance for a bundle: small pure functions plus one atomic writer."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path

from eagle3_trt import SOURCE_ROOT, __version__
from eagle3_trt.convert.checkpoint_io import sha256_file

SCHEMA = 1
VERSIONED_PACKAGES = ("torch", "transformers", "nvidia-modelopt", "safetensors", "tokenizers", "tensorrt_llm", "tensorrt-llm")


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"eagle3-trt": __version__, "python": platform.python_version()}
    for name in VERSIONED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            if name.replace("_", "-") not in out:
                out[name] = None
    out.pop("tensorrt_llm", None)
    return out


def git_sha() -> str | None:
    if not SOURCE_ROOT:
        return None
    try:
        sha = subprocess.run(["git", "-C", SOURCE_ROOT, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", SOURCE_ROOT, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if sha.returncode:
        return None
    return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def file_digests(root: Path, skip: tuple[str, ...] = ()) -> dict[str, dict]:
    """relative path -> {sha256, bytes} for every file under root, sorted."""
    root = Path(root)
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name not in skip:
            out[str(p.relative_to(root))] = {"sha256": sha256_file(p), "bytes": p.stat().st_size}
    return out


def fingerprint(parts: dict) -> str:
    """Stable hash of everything that determines a bundle's content."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def write_json_atomic(path: Path, data: dict) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=False, default=str)
        f.write("\n")
    os.replace(tmp, path)


def read_manifest(bundle: Path) -> dict | None:
    p = Path(bundle) / "manifest.json"
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError:
        return None
