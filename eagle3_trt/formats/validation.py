"""A pydantic validation error as the project's one-line error: the file, the first bad field, a hint."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from eagle3_trt.errors import UserError


def field_error(where: Path | str, e: ValidationError, hint: str, *, unknown_hint: str | None = None) -> UserError:
    """``where:field: message (hint)`` for the first error of ``e``; ``unknown_hint`` replaces the hint
    when that error is a field the schema does not have (extra="forbid")."""
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "<root>"
    if err["type"] == "extra_forbidden" and unknown_hint is not None:
        hint = unknown_hint
    return UserError(f"{where}:{loc}", err["msg"], hint)
