"""Copy windows and edits for the embedded Llama target's training text (issue 29).

Trained on plain source alone, the tiny target never learned to repeat what is in its prompt: no
greedy continuation of a pasted block repeated it, so copy-based drafting (the suffix automaton)
could not be shown. These documents are synthesised from the training files, seeded, so that about
half of the target's training text asks it to copy:

- pasted: a block of lines repeated 2-4 times, as a user pastes it (examples/repeat_code.jsonl);
- again: a block, then the line ``# again:``, then the same block verbatim;
- changed: a block, then ``# changed:``, then the block with one or two identifiers renamed
  throughout, a number changed, or a line dropped (paste and edit);
- long documents (up to the 4,096-token context): segments of several files, later ones
  repeating (``# again:``/``# changed:``) a block from far earlier, so copying must reach back
  thousands of tokens.

Each copy document continues with the lines that followed the block in its file, so the target also
learns where a copy ends. The held-out paste prompts (``paste_prompts``) are made the same way from
the held-out files, ending right where the copy starts.
"""

from __future__ import annotations

import builtins
import keyword
import random
import re

MARK_AGAIN = "# again:\n"
MARK_CHANGED = "# changed:\n"
IDENT = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")
INT = re.compile(r"\b\d+\b")
# renaming these would make a block that no longer means anything; keep them
_KEEP = frozenset(keyword.kwlist) | frozenset(dir(builtins)) | {"self", "cls"}


def lines_of(texts: list[str]) -> list[list[str]]:
    """Each file's lines (newline kept), files with fewer than 8 lines left out."""
    out = [t.splitlines(keepends=True) for t in texts]
    return [[ln if ln.endswith("\n") else ln + "\n" for ln in f] for f in out if len(f) >= 8]


def identifier_pool(files: list[list[str]], limit: int = 4000) -> list[str]:
    """Identifiers the renames draw from: the corpus's own names (>= 3 characters), sorted."""
    seen: dict[str, None] = {}
    for f in files:
        for ln in f:
            for n in IDENT.findall(ln):
                if len(n) >= 3 and n not in _KEEP and not n[0].isdigit():
                    seen[n] = None
    return sorted(seen)[:limit] if len(seen) <= limit else sorted(random.Random(0).sample(sorted(seen), limit))


def edit_block(rng: random.Random, block: str, pool: list[str]) -> str:
    """The block with one or two identifiers renamed throughout, and maybe a number changed or a line dropped."""
    names = [n for n in dict.fromkeys(IDENT.findall(block)) if len(n) >= 3 and n not in _KEEP]
    out = block
    for n in rng.sample(names, min(len(names), rng.randint(1, 2))):
        out = re.sub(rf"\b{re.escape(n)}\b", rng.choice(pool), out)
    nums = INT.findall(out)
    if nums and rng.random() < 0.3:
        old = rng.choice(nums)
        out = re.sub(rf"\b{old}\b", str(rng.randint(0, 99)), out, count=1)
    lines = out.splitlines(keepends=True)
    if len(lines) >= 4 and rng.random() < 0.25:
        del lines[rng.randrange(1, len(lines))]
        out = "".join(lines)
    return out


def _block(rng: random.Random, f: list[str], max_lines: int, max_chars: int) -> tuple[int, int]:
    """(start, end) line indices of a non-blank block of 2..max_lines lines under max_chars characters."""
    for _ in range(20):
        i = rng.randrange(len(f) - 2)
        n = rng.randint(2, max_lines)
        j = min(len(f), i + n)
        while j > i + 1 and sum(map(len, f[i:j])) > max_chars:
            j -= 1
        if any(ln.strip() for ln in f[i:j]):
            return i, j
    return 0, 2


def _copy(rng: random.Random, block: str, pool: list[str]) -> tuple[str, str]:
    """(what comes between the two occurrences, the second occurrence) for one of the three kinds."""
    u = rng.random()
    if u < 0.3:
        return "", block * rng.randint(1, 3)  # pasted: 2-4 occurrences in all
    if u < 0.65:
        return MARK_AGAIN, block
    return MARK_CHANGED, edit_block(rng, block, pool)


def copy_document(rng: random.Random, files: list[list[str]], pool: list[str]) -> str:
    """A short copy document: a few lines of context, a block, its copy, the lines that followed."""
    f = rng.choice(files)
    i, j = _block(rng, f, 16, 1200)
    block = "".join(f[i:j])
    mark, second = _copy(rng, block, pool)
    ctx = "".join(f[max(0, i - rng.randint(0, 8)) : i])
    after = "".join(f[j : j + rng.randint(1, 6)])
    return ctx + block + mark + second + after


def long_document(rng: random.Random, files: list[list[str]], pool: list[str], chars: int) -> str:
    """Segments of several files (about `chars` characters); after the first quarter, some segments
    are copies of a block from an earlier segment, so the copy reaches back up to the whole document."""
    parts: list[str] = []
    size = 0
    while size < chars:
        if parts and size > chars // 4 and rng.random() < 0.35:
            src = rng.choice(parts).splitlines(keepends=True)
            if len(src) >= 3:
                i, j = _block(rng, src, 12, 900)
                mark, second = _copy(rng, "".join(src[i:j]), pool)
                piece = (mark or MARK_AGAIN) + second
                parts.append(piece)
                size += len(piece)
                continue
        f = rng.choice(files)
        i = rng.randrange(max(1, len(f) - 20))
        piece = "".join(f[i : i + rng.randint(20, 80)])
        parts.append(piece)
        size += len(piece)
    return "".join(parts)


def copy_corpus(texts: list[str], seed: int, copy_chars: int, long_docs: int, long_chars: int) -> tuple[list[str], list[str]]:
    """(short copy documents totalling about copy_chars characters, long_docs long documents)."""
    rng = random.Random(seed)
    files = lines_of(texts)
    pool = identifier_pool(files)
    short: list[str] = []
    size = 0
    while size < copy_chars:
        short.append(copy_document(rng, files, pool))
        size += len(short[-1])
    return short, [long_document(rng, files, pool, long_chars) for _ in range(long_docs)]


def paste_prompts(texts: list[str], n: int, seed: int, max_chars: int = 320) -> list[tuple[str, str, str]]:
    """n held-out paste prompts (kind, prompt text, the block it should copy when the kind is not
    'changed'): context + block + marker (or the block once for 'pasted'), ending where the copy starts."""
    rng = random.Random(seed)
    files = lines_of(texts)
    pool = identifier_pool(files)
    kinds = ("pasted", "again", "changed")
    out: list[tuple[str, str, str]] = []
    for k in range(n):
        kind = kinds[k % 3]
        f = rng.choice(files)
        i, j = _block(rng, f, 8, max_chars)
        block = "".join(f[i:j])
        ctx = "".join(f[max(0, i - rng.randint(0, 3)) : i])[-200:]
        if kind == "pasted":
            prompt = ctx + block * 2
        elif kind == "again":
            prompt = ctx + block + MARK_AGAIN
        else:
            prompt = ctx + block + MARK_CHANGED + edit_block(rng, block, pool).splitlines(keepends=True)[0]
        out.append((kind, prompt, block))
    return out
