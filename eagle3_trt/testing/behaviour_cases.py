"""Pairs that pass every file check but not the behaviour checks (convert/behaviour.py), made from
copies of the embedded tiny pairs: tests/test_behaviour_checks.py and the bad-input corpus use them."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

from eagle3_trt.resources import data_dir

MODELS = data_dir("models")


def copy_embedded(name: str, dest: Path, target_from: str | None = None, draft_from: str | None = None) -> tuple[Path, Path]:
    """models/<name>'s target and draft copied to dest/target and dest/draft (either part may be
    taken from another embedded pair instead)."""
    dest = Path(dest)
    for part, src in (("target", target_from or name), ("draft", draft_from or name)):
        shutil.copytree(MODELS / src / part, dest / part)
    return dest / "target", dest / "draft"


def permute_vocab(target_dir: Path, seed: int = 0) -> None:
    """Shuffle the ids of tokenizer.json's ordinary vocabulary entries: same size, same special
    tokens at the same ids, same merges (BPE merges name tokens by text), so every file check
    passes while every ordinary token now reads as another one."""
    p = Path(target_dir) / "tokenizer.json"
    tok = json.loads(p.read_text(encoding="utf-8"))
    special = {a["id"] for a in tok.get("added_tokens", [])}
    vocab = tok["model"]["vocab"]
    names = [t for t, i in vocab.items() if i not in special]
    ids = [vocab[t] for t in names]
    random.Random(seed).shuffle(ids)
    vocab.update(zip(names, ids, strict=True))
    p.write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
