"""Where the embedded model pairs come from: shipped weights if present, else made from a seed."""

from __future__ import annotations

import json
import os
from pathlib import Path

from eagle3_trt.atomic import staged_dir
from eagle3_trt.convert import tiny_pair
from eagle3_trt.errors import UserError
from eagle3_trt.resources import data_dir


def cache_dir() -> Path:
    return Path(os.environ.get("EAGLE3_TRT_CACHE") or Path.home() / ".cache" / "eagle3-trt")


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
    if name != "tiny":  # only the Llama pair has a random stand-in made from a seed
        names = sorted({p.parent.parent.name for p in data_dir("models").glob("*/target/config.json")} | {"tiny"})
        raise UserError(f"embedded:{name}", "no such embedded model pair", f"embedded pairs: {', '.join(names)}")
    out = cache_dir() / "models" / "tiny-random-seed0"
    target, draft = out / "target", out / "draft"
    if not ((target / "model.safetensors").is_file() and (draft / "model.safetensors").is_file()):
        # Seconds of work: a second process making the same cache waits for the first instead of
        # failing; the pair is seeded, so whichever copy ends up in place is the same.
        with staged_dir(out, wait_s=120) as tmp:
            tiny_pair.make_pair(tmp)
    return target, draft


def heldout_prompts(pair_dir: Path) -> list[list[int]] | None:
    """Token ids of the held-out prompts an embedded pair ships beside target/ and draft/, or None."""
    f = Path(pair_dir) / "heldout_prompts.json"
    return json.loads(f.read_text())["prompts"] if f.is_file() else None
