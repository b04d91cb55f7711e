"""The documentation site builds with --strict, and its command reference is the CLI's own help.

``make docs`` runs ``mkdocs build --strict`` (mkdocs.yml); this test runs the same build, so a broken
link, an anchor that is gone, a page missing from the nav or a command the generated reference cannot
load fails the suite. The command reference is generated (docs/hooks/cli_reference.py + mkdocs-click):
the test checks that every command ``eagle3-trt --help`` lists has its section and its options there.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml

from eagle3_trt.cli import cli

ROOT = Path(__file__).resolve().parents[1]
MKDOCS = [sys.executable, "-m", "mkdocs"]
ENV = os.environ | {"NO_MKDOCS_2_WARNING": "1"}


def _text(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    p = subprocess.run(
        [*MKDOCS, "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return out


def test_every_page_in_docs_is_in_the_nav_and_built(site):
    def pages(nav) -> list[str]:
        out: list[str] = []
        for item in nav:
            v = next(iter(item.values())) if isinstance(item, dict) else item
            out += pages(v) if isinstance(v, list) else [v]
        return out

    conf = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.Loader)
    nav = pages(conf["nav"])
    on_disk = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(nav) == on_disk
    for page in nav:
        built = site / ("index.html" if page == "index.md" else page.removesuffix(".md") + "/index.html")
        assert built.is_file(), page


def test_the_command_reference_is_every_commands_help(site):
    text = _text(site / "reference" / "commands" / "index.html")
    ctx = click.Context(cli, info_name="eagle3-trt")
    names = cli.list_commands(ctx)
    assert len(names) >= 19
    for name in names:
        assert f"eagle3-trt {name}¶" in text, f"no section for {name}"
        cmd = cli.get_command(ctx, name)
        assert cmd is not None
        for param in cmd.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert param.opts[0] in text, (name, param.opts[0])


def test_help_texts_are_printed_as_written():
    """click prints help verbatim (no %-formatting, unlike argparse): a '%%' in a help string reaches the user."""
    ctx = click.Context(cli, info_name="eagle3-trt")
    doubled = []
    for name in cli.list_commands(ctx):
        cmd = cli.get_command(ctx, name)
        assert cmd is not None
        with click.Context(cmd, info_name=name, parent=ctx) as sub:
            if "%%" in cmd.get_help(sub):
                doubled.append(name)
    assert not doubled, f"'%%' in the --help of {doubled}"


def test_strict_build_fails_on_a_broken_link(tmp_path):
    """The site's validation settings turn a link to a missing page into a failed build."""
    conf = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.Loader)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# x\n\nsee [the page](gone.md)\n")
    small = {"site_name": "t", "strict": True, "validation": conf["validation"], "nav": [{"Home": "index.md"}]}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(small))
    p = subprocess.run([*MKDOCS, "build", "-d", str(tmp_path / "site")], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "gone.md" in p.stderr, p.stderr[-2000:]


def test_the_readme_links_to_pages_that_exist():
    """The README is not part of the site (mkdocs checks the pages' links): its links to the pages are checked here."""
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)\s]*)?\)", (ROOT / "README.md").read_text())
    assert len(links) >= 10, links
    assert [link for link in links if not (ROOT / link).is_file()] == []
