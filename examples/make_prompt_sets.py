"""The category prompt sets of examples/ for the embedded pair, made from the standard-library source it
is trained on (issue 29): ``python examples/make_prompt_sets.py`` rewrites them, the same bytes for the
same seed and Python standard library.

Raw completion records (``{"id", "category", "text"}``): the embedded target is a code completion
model, so every prompt is source text ending where the answer starts, in the layout its training
text uses for copies (``eagle3_trt/testing/tiny_copy_data.py``: a block, then ``# changed:`` and the
edited block, or ``# again:`` and the block verbatim).

- ``coding.jsonl`` (category ``coding``): a function's opening lines, to be continued;
- ``edit_paste.jsonl`` (``edit``): a block pasted, ``# changed:``, and the first line of the block with
  an identifier renamed: the answer repeats most of the block with the edit carried through;
- ``quote.jsonl`` (``quote``): summarization-style copying: a long excerpt (several functions), then
  ``# again:`` and the first line of a block from its middle: the answer quotes the passage;
- ``long_context.jsonl`` (``long``): 2,048 to 3,840 tokens of consecutive source from several files
  (the embedded pair's 4,096-token context, 128 tokens left to generate), to be continued.

Only training files are used: the held-out files (``tiny_recipe.HELDOUT_FILES``) are what the pair's
own gate and model card measure on. Token counts are the committed tokenizer's (models/tiny).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from eagle3_trt.testing.tiny_copy_data import MARK_AGAIN, MARK_CHANGED, edit_block, identifier_pool, lines_of
from eagle3_trt.testing.tiny_recipe import read_corpus

HERE = Path(__file__).resolve().parent
SETS = ("coding", "edit_paste", "quote", "long_context")
N_SHORT = 24  # prompts per short set
QUOTE_CHARS = 2000  # excerpt length cap (about 600 tokens)
LONG_TOKENS = tuple(range(2048, 3841, 192))  # 10 long prompts, evenly over 2k..3.84k tokens


def _functions(f: list[str]) -> list[int]:
    """Line indices of top-level or method ``def`` lines followed by at least 8 lines."""
    return [i for i, ln in enumerate(f[:-8]) if ln.lstrip().startswith("def ") and ln.rstrip().endswith(":")]


def coding(rng: random.Random, files: list[list[str]]) -> list[dict]:
    out = []
    while len(out) < N_SHORT:
        f = rng.choice(files)
        defs = _functions(f)
        if not defs:
            continue
        i = rng.choice(defs)
        n = rng.randint(1, 6)  # the def line and a few more (docstring, first statements)
        out.append({"id": f"coding-{len(out)}", "category": "coding", "text": "".join(f[max(0, i - 2) : i + n])})
    return out


def edit_paste(rng: random.Random, files: list[list[str]], pool: list[str]) -> list[dict]:
    out = []
    while len(out) < N_SHORT:
        f = rng.choice(files)
        defs = _functions(f)
        if not defs:
            continue
        i = rng.choice(defs)
        j = min(len(f), i + rng.randint(6, 16))
        block = "".join(f[i:j])
        if len(block) > 900 or not block.strip():
            continue
        edited = edit_block(rng, block, pool)
        if edited == block:
            continue
        first = edited.splitlines(keepends=True)[0]
        out.append({"id": f"edit-{len(out)}", "category": "edit", "text": block + MARK_CHANGED + first})
    return out


def quote(rng: random.Random, files: list[list[str]]) -> list[dict]:
    out = []
    while len(out) < N_SHORT:
        f = rng.choice(files)
        if len(f) < 120:
            continue
        i = rng.randrange(len(f) - 100)
        doc = f[i : i + rng.randint(40, 80)]
        while len(doc) > 20 and sum(map(len, doc)) > QUOTE_CHARS:
            doc.pop()
        # a block of 4..10 non-blank-led lines from the middle of the excerpt, quoted after it
        a = rng.randrange(len(doc) // 4, len(doc) // 2)
        if not doc[a].strip():
            continue
        out.append({"id": f"quote-{len(out)}", "category": "quote", "text": "".join(doc) + "\n" + MARK_AGAIN + doc[a]})
    return out


def long_context(rng: random.Random, files: list[list[str]], count_tokens) -> list[dict]:
    out = []
    for n_tok in LONG_TOKENS:
        lines: list[str] = []
        while count_tokens("".join(lines)) < n_tok:
            f = rng.choice(files)
            i = rng.randrange(max(1, len(f) - 120))
            lines += f[i : i + rng.randint(60, 120)]
        while len(lines) > 1 and count_tokens("".join(lines)) > n_tok:
            lines.pop()  # end at a line start, at most n_tok tokens
        out.append({"id": f"long-{n_tok}", "category": "long", "text": "".join(lines)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--tokenizer", type=Path, default=HERE.parent / "models" / "tiny" / "target", help="sizes the long prompts in its tokens")
    args = ap.parse_args(argv)
    import transformers  # only for sizing the long prompts

    tok = transformers.AutoTokenizer.from_pretrained(args.tokenizer)
    tok.model_max_length = 1 << 30  # counting only: no "longer than the model" warning

    def count_tokens(text: str) -> int:
        return len(tok(text, add_special_tokens=True)["input_ids"])

    train, _held, _missing = read_corpus()  # training files only, sorted by name
    files = lines_of(list(train.values()))
    pool = identifier_pool(files)
    made = {
        "coding": coding(random.Random(args.seed), files),
        "edit_paste": edit_paste(random.Random(args.seed + 1), files, pool),
        "quote": quote(random.Random(args.seed + 2), files),
        "long_context": long_context(random.Random(args.seed + 3), files, count_tokens),
    }
    for name, records in made.items():
        path = args.out / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        lens = [count_tokens(r["text"]) for r in records]
        print(f"{path}: {len(records)} prompts, {min(lens)}-{max(lens)} tokens, {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
