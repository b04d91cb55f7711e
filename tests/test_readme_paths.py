"""The README's map stays true: every project path it names exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = {p.parent.name for p in (ROOT / "eagle3_trt").glob("*/__init__.py")}
DATA = {"build", "convert", "models", "triton_repo", "tests", "benchmarks", "eagle3_trt"}


def test_every_project_path_in_the_readme_exists():
    missing = []
    for lineno, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1):
        for path in re.findall(r"(?<![\w./-])([a-z_]+/[\w./-]*\.(?:py|yaml|json|jsonl|tmpl|md))", line):
            head = path.split("/")[0]
            if head in SUBPACKAGES and not (ROOT / "eagle3_trt" / path).exists() and not (ROOT / path).exists():
                missing.append(f"README.md:{lineno} {path}")
            elif head in DATA and head not in SUBPACKAGES and not (ROOT / path).exists() and "<" not in path:
                missing.append(f"README.md:{lineno} {path}")
    assert not missing, "\n".join(missing)
