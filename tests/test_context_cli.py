"""`alpha` prints and stores acceptance by context and prompt length, and `recommend` reads it back
(measure/context_buckets.py, measure/switch_off.py), through the CLI on the tiny FP8 bundle."""

from __future__ import annotations

import json

from eagle3_trt.cli import main
from eagle3_trt.formats.acceptance_by_context import AcceptanceByContext
from eagle3_trt.measure.switch_off import NO_CONTEXT_SETTING


def test_alpha_reports_acceptance_by_context_and_recommend_reads_it(fp8_bundle, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    texts = ["def f(x):\n    return x\n" * n for n in (1, 4, 16, 24)]
    prompts.write_text("".join(json.dumps({"category": "code", "text": t}) + "\n" for t in texts))
    out = tmp_path / "rep"
    assert main(["alpha", str(fp8_bundle), "--prompts", str(prompts), "--max-tokens", "12", "--no-bf16", "--sweep", "1-3", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "acceptance by tokens of context at the verification" in printed and "acceptance by prompt length" in printed
    rep = json.loads((out / "report.json").read_text())
    ctx = AcceptanceByContext.model_validate(rep["acceptance_by_context"])
    overall = rep["pairs"]["bundle"]["overall"]
    for table in (ctx.by_context, ctx.by_prompt_length):
        # every decode forward lands in exactly one bucket: the prefills are the only forwards left out
        assert sum(r.forwards for r in table.rows) == overall["target_forwards"] - overall["requests"]
        assert sum(r.draft_tokens for r in table.rows) == overall["draft_tokens"]
        assert sum(r.accepted_tokens for r in table.rows) == overall["accepted_tokens"]
        assert table.unmatched == []
    assert sum(r.requests for r in ctx.by_prompt_length.rows) == overall["requests"]  # one prompt-length bucket per request
    assert main(["recommend", str(fp8_bundle), "--report", str(out / "report.json"), "--concurrency", "4"]) == 0
    printed = capsys.readouterr().out
    lines = [ln for ln in printed.splitlines() if ln.startswith("acceptance by context at K=")]
    assert len(lines) == 1, printed[-3000:]
    # the random-weight head accepts nothing: no bucket pays, and the one line says no setting acts on context length
    assert "speculation does not pay in any measured context bucket" in lines[0]
    assert printed.count(NO_CONTEXT_SETTING) == 1
