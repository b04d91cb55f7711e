"""Which speculation keys a TensorRT-LLM release lacks: the shared first step of
speculative/eagle3/sampling_release.py and speculative/eagle3/release.py (each then notes or refuses
what was left out)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packaging.version import InvalidVersion, Version

from eagle3_trt.errors import UserError


def release_lacks(since: str, key: str, version: str | None, spec_fields: frozenset[str] | None) -> bool:
    """Whether ``key`` (in releases from ``since`` on) is missing: the installed field list decides
    when there is one, else the version number; no version and no fields: not missing."""
    if spec_fields is not None:
        return key not in spec_fields
    if version is None:
        return False
    try:
        return Version(version) < Version(since)
    except InvalidVersion:
        raise UserError("TensorRT-LLM version", f"cannot parse version {version!r}", "expected something like 1.2.1 or 1.3.0rc5") from None


def drop_lacking(
    spec: dict[str, Any], since: Mapping[str, str], version: str | None, spec_fields: frozenset[str] | None
) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """A copy of ``spec`` without the keys of ``since`` (key -> first release with it) that the
    release lacks, and each left-out (key, value) in ``since``'s order."""
    spec = dict(spec)
    dropped = [(key, spec.pop(key)) for key, first in since.items() if key in spec and release_lacks(first, key, version, spec_fields)]
    return spec, dropped


__all__ = ["drop_lacking", "release_lacks"]
