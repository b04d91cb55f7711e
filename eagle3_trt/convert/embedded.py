"""Where the embedded model pairs come from: models/<name>/{target,draft}, shipped in the checkout and the wheel."""

from __future__ import annotations

from pathlib import Path

from eagle3_trt.errors import UserError
from eagle3_trt.formats.heldout import read_heldout
from eagle3_trt.resources import data_dir


def shipped_pair(name: str) -> tuple[Path, Path] | None:
    """models/<name>/{target,draft} in the source tree or the installed package."""
    root = data_dir("models") / name
    t, d = root / "target", root / "draft"
    if (t / "config.json").is_file() and (d / "config.json").is_file():
        return t, d
    return None


def embedded_pair(name: str) -> tuple[Path, Path]:
    shipped = shipped_pair(name)
    if shipped:
        return shipped
    # models/ always ships (resources.data_dir), so an absent pair is a bad name or a damaged
    # install; there is no stand-in to make, the tiny-pair makers are test support only.
    folder = data_dir("models") / name
    names = sorted(p.parent.parent.name for p in data_dir("models").glob("*/target/config.json"))
    raise UserError(f"embedded:{name}", f"no embedded model pair in {folder}", f"embedded pairs: {', '.join(names) or 'none'}")


def heldout_prompts(pair_dir: Path) -> list[list[int]] | None:
    """Token ids of the held-out prompts an embedded pair ships beside target/ and draft/, or None."""
    held = read_heldout(pair_dir)
    return held.prompts if held else None
