"""The category prompt sets in examples/ (made by examples/make_prompt_sets.py, issue 29): they load
as prompt files with their declared categories, the long-context set fits the embedded pair's
context, none quotes a held-out file (the pair's own gate measures on those), and the generator is
seeded (the same records for the same seed)."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest

from eagle3_trt.convert.prompts import load_prompt_records

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SETS = {"coding": "coding", "edit_paste": "edit", "quote": "quote", "long_context": "long"}


def _generator():
    spec = importlib.util.spec_from_file_location("make_prompt_sets", EXAMPLES / "make_prompt_sets.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", sorted(SETS))
def test_each_set_loads_with_its_category(name):
    recs = load_prompt_records(EXAMPLES / f"{name}.jsonl", None)
    assert len(recs) >= 10 and {r.category for r in recs} == {SETS[name]}
    assert len({r.id for r in recs}) == len(recs)


def test_the_long_set_spans_2k_to_4k_tokens_within_the_context():
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(ROOT / "models" / "tiny" / "target")
    ctx = json.loads((ROOT / "models" / "tiny" / "target" / "config.json").read_text())["max_position_embeddings"]
    lens = [len(tok(r.turns[0], add_special_tokens=True)["input_ids"]) for r in load_prompt_records(EXAMPLES / "long_context.jsonl", None)]
    assert min(lens) >= 2000 and max(lens) <= 3840 and max(lens) - min(lens) > 1000
    if ctx >= 4096:  # the pair these sets are for: prompt + 128 generated tokens fit
        assert max(lens) + 128 < ctx


def test_no_prompt_quotes_a_held_out_file():
    from eagle3_trt.testing.tiny_recipe import read_corpus

    train, held, _ = read_corpus()
    train_lines = {ln.strip() for t in train.values() for ln in t.splitlines()}
    # lines long enough to be distinctive that only a held-out file has
    marks = {ln.strip() for t in held.values() for ln in t.splitlines() if len(ln.strip()) >= 40} - train_lines
    assert len(marks) > 100
    for name in SETS:
        for r in load_prompt_records(EXAMPLES / f"{name}.jsonl", None):
            lines = {ln.strip() for ln in r.turns[0].splitlines()}
            assert not lines & marks, f"{name} {r.id} quotes a held-out file"


def test_the_generator_is_seeded():
    gen = _generator()
    from eagle3_trt.testing.tiny_copy_data import identifier_pool, lines_of
    from eagle3_trt.testing.tiny_recipe import read_corpus

    files = lines_of(list(read_corpus()[0].values()))
    pool = identifier_pool(files)
    for make in (lambda r: gen.coding(r, files), lambda r: gen.edit_paste(r, files, pool), lambda r: gen.quote(r, files)):
        assert make(random.Random(5)) == make(random.Random(5))
        assert make(random.Random(5)) != make(random.Random(6))
