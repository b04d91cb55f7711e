"""heldout_prompts.json: the held-out prompts an embedded pair ships beside target/ and draft/.

Written by ``eagle3_trt.testing.make_tiny_pair``; read by the build's acceptance check, by
``alpha``/``gate --prompts`` (convert/prompts.py: token-id prompts, so the build's own check can
be rerun) and tests.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from eagle3_trt.errors import UserError

HELDOUT_FILE = "heldout_prompts.json"


class HeldoutPrompts(BaseModel):
    """Token-id windows of text neither model of the pair was trained on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    about: str
    prompts: list[list[int]]


def read_heldout(pair_dir: Path) -> HeldoutPrompts | None:
    """The pair's held-out prompts, None when it ships none, a one-line UserError when unreadable."""
    f = Path(pair_dir) / HELDOUT_FILE
    if not f.is_file():
        return None
    return read_heldout_file(f)


def read_heldout_file(f: Path) -> HeldoutPrompts:
    """A held-out prompts file (any name), a one-line UserError naming the field when it is not one."""
    try:
        held = HeldoutPrompts.model_validate_json(Path(f).read_text(encoding="utf-8"))
    except (ValidationError, UnicodeDecodeError) as e:
        what = e.errors()[0]["msg"] if isinstance(e, ValidationError) else "not UTF-8 text"
        raise UserError(f, f"not a held-out prompts file ({what})", "regenerate it with eagle3_trt.testing.make_tiny_pair") from None
    for n, ids in enumerate(held.prompts):
        if not ids or min(ids) < 0:
            raise UserError(f"{f}:prompts[{n}]", "is empty or has a negative token id", "each prompt is a non-empty list of token ids")
    return held
