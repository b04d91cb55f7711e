"""Draft-tree choices written as JSON text (a CLI flag, a request field, a benchmark option):
``"[[0], [1], [0, 0]]"`` -> the list of paths ``core.tree.DraftTree.from_choices`` checks and builds."""

from __future__ import annotations

import json
from typing import Any

from eagle3_trt.errors import UserError


def choices_from_json(text: str) -> Any:
    """The JSON value of ``text`` (shape-checked by ``DraftTree.from_choices``); a UserError if it is not JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError("tree", f"not a JSON list of paths ({e})", "write choices like [[0], [1], [0, 0]]") from None
