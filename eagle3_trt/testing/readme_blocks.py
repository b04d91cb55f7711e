"""The command blocks of the README and of every documentation page, as tests/test_readme_commands.py
runs them.

A fenced ```bash (or ```python) block in README.md or in a page under docs/ (``doc_pages``) is either
run by the test or says why it cannot run here, with an HTML comment (invisible on GitHub and on the
site) on the line before it::

    <!-- docs-check: run tiny-alpha -->        the test named by this id runs the block
    <!-- docs-check: skip (needs a GPU) -->    not run; the reason is required
    <!-- docs-check: same tiny-alpha -->       the text of the block the id names (run elsewhere), repeated
                                              on another page: it must stay equal to it

``problems`` lists every block with neither, a skip without a reason, a run id no test knows, or an
id used twice (ids are unique across all pages, so a block keeps its id and its test when it moves
from the README to a page), so a new block must be classified before the suite passes.

``commands`` splits a block the way a reader pastes it into a shell: one command per line, joined
over trailing backslashes and over quotes left open (a multi-line ``curl -d '{...}'``), comment
lines dropped. ``run_block`` runs each command in ``bash`` in a working directory and fails with
the command, its exit status and its output when the status is not the expected one (0 unless the
test says otherwise), so a README command that no longer works fails the test.

``localize`` moves the servers a block starts or calls off the README's fixed ports (8000/8001/8002
for Triton, 8080 for Dynamo) to free ones, so the test never meets another server on this machine.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

MARKER = re.compile(r"^<!--\s*docs-check:\s*(?P<kind>run|skip|same)\b\s*(?P<arg>.*?)\s*-->\s*$")
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\s*$")
LANGS = ("bash", "python")
# the README's default ports -> the name of the free port that replaces them
README_PORTS = {8000: "http", 8001: "grpc", 8002: "metrics", 8080: "dynamo"}


@dataclass(frozen=True)
class Block:
    """One fenced block: where it starts (1-based line of the opening fence), its language, its
    text, and its marker: ``kind`` "run" (``arg`` = the id), "skip" (``arg`` = "(reason)"), "same" (``arg`` = the
    id of the run block it repeats) or "";
    ``path``: the page it is on, relative to the repository root."""

    line: int
    lang: str
    text: str
    kind: str = ""
    arg: str = ""
    path: str = "README.md"

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def reason(self) -> str:
        m = re.fullmatch(r"\((.*\S.*)\)", self.arg)
        return m.group(1).strip() if m else ""


def doc_pages(root: Path) -> list[Path]:
    """The pages whose blocks are checked: README.md, then every Markdown page under docs/."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def parse_pages(root: Path) -> list[Block]:
    """The blocks of every page of ``doc_pages``, each carrying its page's path."""
    return [b for page in doc_pages(root) for b in parse_blocks(page.read_text(), str(page.relative_to(root)))]


def parse_blocks(markdown: str, path: str = "README.md") -> list[Block]:
    """Every fenced block in LANGS with the docs-check marker on the closest non-blank line above
    it (blank lines between are allowed; any other line means the block has no marker)."""
    lines = markdown.splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group("lang")
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        if lang in LANGS:
            kind = arg = ""
            k = start - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            mm = MARKER.match(lines[k].strip()) if k >= 0 else None
            if mm:
                kind, arg = mm.group("kind"), mm.group("arg")
            out.append(Block(start + 1, lang, "\n".join(lines[start + 1 : j]), kind, arg, path))
        i = j + 1
    return out


def problems(blocks: Iterable[Block], known_ids: Iterable[str]) -> list[str]:
    """What keeps the pages from being checked: unclassified blocks, skips without a reason,
    run ids no test runs (and tests whose id no block carries), ids used twice."""
    known = set(known_ids)
    out: list[str] = []
    seen: dict[str, str] = {}
    blocks = list(blocks)
    run_text = {b.arg: b.text for b in blocks if b.kind == "run"}
    for b in blocks:
        first = next((ln for ln in b.text.splitlines() if ln.strip()), "")
        where = f"{b.where} ({first.strip()[:60]!r})"
        if b.kind == "":
            out.append(f"{where}: neither run nor marked; add <!-- docs-check: run ID --> with a test, or <!-- docs-check: skip (why) -->")
        elif b.kind == "skip" and not b.reason:
            out.append(f"{where}: skip without a reason in parentheses")
        elif b.kind == "run":
            if not re.fullmatch(r"[\w.-]+", b.arg):
                out.append(f"{where}: run marker without an id")
            elif b.arg in seen:
                out.append(f"{where}: run id {b.arg!r} also used at {seen[b.arg]}")
            elif b.arg not in known:
                out.append(f"{where}: run id {b.arg!r} has no test")
            seen.setdefault(b.arg, b.where)
        elif b.kind == "same":
            if b.arg not in run_text:
                out.append(f"{where}: 'same' names {b.arg!r}, which no run block carries")
            elif b.text.strip() != run_text[b.arg].strip():
                out.append(f"{where}: differs from the run block {b.arg!r} it repeats; copy it again")
    out += [f"a test runs {i!r}, which no block of the README or docs/ carries" for i in sorted(known - set(seen))]
    return out


def commands(text: str) -> list[str]:
    """The block's commands, one per shell command line (continuations and open quotes joined,
    whole-line comments dropped; a trailing comment stays, bash ignores it)."""
    out: list[str] = []
    buf = ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        buf = f"{buf}\n{line}" if buf else line
        if buf.endswith("\\"):
            continue
        try:
            shlex.split(buf, comments=True)
        except ValueError:  # a quote still open: the command goes on on the next line
            continue
        out.append(buf)
        buf = ""
    if buf:
        raise ValueError(f"unterminated command at the end of the block: {buf!r}")
    return out


def free_ports(names: Iterable[str]) -> dict[str, int]:
    """A free 127.0.0.1 port per name, all distinct (the sockets stay open until all are chosen)."""
    socks, ports = [], {}
    try:
        for name in names:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports[name] = s.getsockname()[1]
    finally:
        for s in socks:
            s.close()
    return ports


def localize(cmd: str, ports: Mapping[str, int]) -> str:
    """``cmd`` with the README's fixed ports replaced by ``ports`` (keys: README_PORTS' names):
    ``127.0.0.1:8000``-style addresses, and ``eagle3-trt serve REPO`` given its three port flags
    (make targets get theirs from the environment, see ``port_env``)."""
    cmd = re.sub(r"127\.0\.0\.1:(\d+)\b", lambda m: f"127.0.0.1:{ports[README_PORTS[int(m.group(1))]]}" if int(m.group(1)) in README_PORTS else m.group(0), cmd)
    if re.search(r"\beagle3-trt serve\b(?!-)", cmd) and "--http-port" not in cmd:
        cmd = re.sub(
            r"(\beagle3-trt serve [^\s#]+)", rf"\1 --http-port {ports['http']} --grpc-port {ports['grpc']} --metrics-port {ports['metrics']}", cmd, count=1
        )
    return cmd


def port_env(ports: Mapping[str, int]) -> dict[str, str]:
    """The Makefile's port variables (``?=``, so the environment sets them)."""
    return {"HTTP_PORT": str(ports["http"]), "GRPC_PORT": str(ports["grpc"]), "METRICS_PORT": str(ports["metrics"]), "DYNAMO_PORT": str(ports["dynamo"])}


@dataclass(frozen=True)
class Result:
    cmd: str
    rc: int
    stdout: str
    stderr: str

    @property
    def out(self) -> str:
        return self.stdout + self.stderr


class BlockFailed(AssertionError):
    """A README command exited with another status than the README says."""


@dataclass
class Runner:
    """Runs commands in ``cwd`` with ``env`` (the caller's environment plus these, less ``unset``),
    ports moved."""

    cwd: str
    env: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    timeout: float = 300
    unset: tuple[str, ...] = ()

    def run(self, cmd: str, expect: int = 0, lang: str = "bash") -> Result:
        local = localize(cmd, self.ports) if self.ports else cmd
        argv = ["bash", "-c", local] if lang == "bash" else [self.env.get("PYTHON", "python"), "-c", local]
        env = {k: v for k, v in os.environ.items() if k not in self.unset} | self.env
        p = subprocess.run(argv, cwd=self.cwd, env=env, capture_output=True, text=True, timeout=self.timeout)
        r = Result(local, p.returncode, p.stdout, p.stderr)
        if r.rc != expect:
            raise BlockFailed(f"README command exited {r.rc} (expected {expect}):\n$ {local}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}")
        return r

    def run_block(self, block: Block, expect: Mapping[int, int] | None = None) -> list[Result]:
        """Every command of ``block`` in order (a python block is one program); ``expect``: command
        index -> exit status where the README says it is not 0."""
        if block.lang == "python":
            return [self.run(block.text, (expect or {}).get(0, 0), lang="python")]
        return [self.run(c, (expect or {}).get(i, 0)) for i, c in enumerate(commands(block.text))]
