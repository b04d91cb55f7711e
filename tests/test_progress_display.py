"""The commands' one progress display (eagle3_trt/progress.py) off a terminal: plain, readable lines.

A CI log or ``| tee`` is not a terminal, where rich draws no live bar and printed the bars only at
the end; the display must then print ``desc: done/total info (elapsed)`` lines as it goes."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

from eagle3_trt.progress import Bars

LINE = re.compile(r"^(?P<desc>.+): (?P<done>\d+)/(?P<total>\d+)(?: (?P<info>.*))? \((?P<s>\d+) s\)$")


def test_lines_off_a_terminal_at_each_tenth_and_the_end():
    out = io.StringIO()  # not a TTY
    with Bars(stream=out) as bars:
        advance = bars.task("steps", 50)
        for i in range(50):
            advance(1, info=f"loss {i}")
    lines = out.getvalue().splitlines()
    parsed = [LINE.match(line) for line in lines]
    assert all(parsed), lines
    done = [int(m["done"]) for m in parsed if m]
    # the start, every tenth (5 steps), the end: readable without being one line per step
    assert done == [0, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50]
    assert lines[-1] == "steps: 50/50 loss 49 (0 s)"


def test_quiet_prints_nothing():
    out = io.StringIO()
    with Bars(quiet=True, stream=out) as bars:
        bars.task("steps", 3)(3)
        bars.say("hello")
    assert out.getvalue() == ""


def test_alpha_through_a_pipe_shows_prompts_tokens_and_elapsed(fp8_bundle, tmp_path):
    """`eagle3-trt alpha` run with stderr piped: the measuring prints prompts done / total with the
    tokens generated so far and the elapsed time, ending at total/total."""
    prompts = tmp_path / "p.jsonl"
    texts = ["def fibonacci(n):", "The capital of France is", "import numpy as np", "SELECT name FROM"]
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "category": "code", "turns": [t]}) + "\n" for i, t in enumerate(texts)))
    cmd = [sys.executable, "-m", "eagle3_trt.cli", "alpha", str(fp8_bundle), "--prompts", str(prompts)]
    cmd += ["--max-tokens", "48", "--batch-size", "2", "--device", "cpu", "--out", str(tmp_path / "rep")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "measuring 4 prompts" in r.stderr
    rows = [m for m in (LINE.match(line) for line in r.stderr.splitlines()) if m and m["desc"].endswith(": prompts")]
    assert rows, r.stderr[-2000:]
    by_task: dict[str, list] = {}
    for m in rows:  # the bundle, then the BF16 reference pair: one task each
        by_task.setdefault(m["desc"], []).append(m)
    assert len(by_task) == 2, list(by_task)
    for task in by_task.values():
        assert [int(m["total"]) for m in task] == [4] * len(task)
        done = [int(m["done"]) for m in task]
        assert done[0] == 0 and done[-1] == 4 and done == sorted(done) and 2 in done  # batches of 2
        tokens = [int(m["info"].split()[0]) for m in task if m["info"]]
        assert tokens == sorted(tokens) and tokens[-1] > 0
    assert "\x1b[" not in r.stderr  # no terminal control codes in a log
