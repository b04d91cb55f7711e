"""The README's map stays true: every project path it names exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = {p.parent.name for p in (ROOT / "eagle3_trt").glob("*/__init__.py")}
DATA = {"build", "convert", "models", "triton_repo", "tests", "benchmarks", "eagle3_trt"}


def test_every_project_path_in_the_readme_exists():
    missing = []
    for lineno, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1):
        for path in re.findall(r"(?<![\w./-])([a-z_]+/[\w./-]*\.(?:py|yaml|jsonl|json|tmpl|md)\b)", line):
            head = path.split("/")[0]
            # a module path is relative to eagle3_trt/ (core/rope.py) or the root; a data path to the root
            candidates = [ROOT / "eagle3_trt" / path, ROOT / path] if head in SUBPACKAGES else [ROOT / path] if head in DATA else []
            if candidates and "<" not in path and not any(c.exists() for c in candidates):
                missing.append(f"README.md:{lineno} {path}")
    assert not missing, "\n".join(missing)
