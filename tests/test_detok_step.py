"""Step-wise detokenization (issue 32): ``detokenize_step`` decodes a decoding step's tokens at once
and must keep exactly the tokens and text that feeding them one at a time keeps, stop strings
and characters split across tokens included."""

from __future__ import annotations

import random

import pytest

TEXT = "Grüße aus Köln 🌍🚀 — naïve café, 東京タワー. END of the line\n\nnext 🌍 para END again"


@pytest.fixture(scope="module")
def tok(shared_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(shared_dir / "data" / "llama3_tokenizer"))


def _per_token(tok, stops, steps):
    """The rule before issue 32: every token fed on its own, stopping at the one that completes a stop string."""
    from eagle3_trt.runtime.detok import IncrementalDetokenizer, StopMatcher

    d, m = IncrementalDetokenizer(tok), StopMatcher(stops)
    out = []
    for step in steps:
        kept, text = 0, ""
        for t in step:
            kept += 1
            text += m.feed(d.add([t]))
            if m.matched is not None:
                break
        out.append((kept, text))
        if m.matched is not None:
            return out, m.matched, ""
    return out, None, m.feed(d.flush()) + m.flush()


def _stepwise(tok, stops, steps):
    from eagle3_trt.runtime.detok import IncrementalDetokenizer, StopMatcher, detokenize_step

    d, m = IncrementalDetokenizer(tok), StopMatcher(stops)
    out = []
    for step in steps:
        out.append(detokenize_step(d, m, list(step)))
        if m.matched is not None:
            return out, m.matched, ""
    return out, None, m.feed(d.flush()) + m.flush()


@pytest.mark.parametrize("stops", [(), ("END",), ("\n\n",), ("ö", "タ"), ("🚀",), ("line\n\nnext",), ("absent",)])
def test_stepwise_equals_token_by_token(tok, stops):
    ids = tok.encode(TEXT, add_special_tokens=False)
    rng = random.Random(32)
    for _ in range(12):
        steps, i = [], 0
        while i < len(ids):
            n = rng.randint(1, 5)  # up to max_draft_len + 1 tokens per step
            steps.append(ids[i : i + n])
            i += n
        got, want = _stepwise(tok, stops, steps), _per_token(tok, stops, steps)
        # the same tokens kept at every step and the same text in the end (a step may send its text a
        # step later than token-by-token feeding would, when it ends inside a character)
        assert [k for k, _ in got[0]] == [k for k, _ in want[0]]
        assert "".join(t for _, t in got[0]) + got[2] == "".join(t for _, t in want[0]) + want[2]
        assert got[1] == want[1]
        assert all("\ufffd" not in t for _, t in got[0])


def test_stop_string_cuts_at_the_completing_token(tok):
    from eagle3_trt.runtime.detok import IncrementalDetokenizer, StopMatcher, detokenize_step

    ids = tok.encode("alpha beta END gamma delta", add_special_tokens=False)
    d, m = IncrementalDetokenizer(tok), StopMatcher(("END",))
    kept, text = detokenize_step(d, m, ids)  # the whole answer as one step
    assert m.matched == "END" and text == "alpha beta "
    assert tok.decode(ids[:kept]).endswith("END")  # nothing after the completing token is kept
    assert not tok.decode(ids[: kept - 1]).endswith("END")
