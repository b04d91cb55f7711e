"""The README's map and the documentation pages stay true: every project path they name exists."""

import re
from pathlib import Path

from eagle3_trt.testing.readme_blocks import doc_pages

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = {p.parent.name for p in (ROOT / "eagle3_trt").glob("*/__init__.py")}
DATA = {"build", "convert", "models", "triton_repo", "tests", "benchmarks", "eagle3_trt", "examples"}


def missing_paths(page: Path) -> list[str]:
    missing = []
    name = page.relative_to(ROOT).as_posix()
    for lineno, line in enumerate(page.read_text().splitlines(), 1):
        for path in re.findall(r"(?<![\w./-])([a-z_]+/[\w./-]*\.(?:py|yaml|jsonl|json|tmpl|md)\b)", line):
            head = path.split("/")[0]
            # a module path is relative to eagle3_trt/ (core/rope.py) or the root; a data path to the root
            candidates = [ROOT / "eagle3_trt" / path, ROOT / path] if head in SUBPACKAGES else [ROOT / path] if head in DATA else []
            if candidates and "<" not in path and not any(c.exists() for c in candidates):
                missing.append(f"{name}:{lineno} {path}")
    return missing


def test_every_project_path_in_the_readme_and_the_docs_exists():
    pages = doc_pages(ROOT)
    assert len(pages) > 1  # README.md and docs/
    missing = [m for page in pages for m in missing_paths(page)]
    assert not missing, "\n".join(missing)
