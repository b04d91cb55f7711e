"""heldout_prompts.json: the held-out prompts an embedded pair ships beside target/ and draft/.

Written by ``eagle3_trt.testing.make_tiny_pair``; read by the build's acceptance check and tests.
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
    try:
        return HeldoutPrompts.model_validate_json(f.read_text())
    except ValidationError as e:
        raise UserError(f, f"not a held-out prompts file ({e.errors()[0]['msg']})", "regenerate it with eagle3_trt.testing.make_tiny_pair") from None
