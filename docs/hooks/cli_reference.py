"""MkDocs hook: the command reference lists every command the CLI has.

mkdocs-click walks a group's eagerly registered commands only, and most of eagle3-trt's are loaded
lazily (eagle3_trt/cli.py LAZY_COMMANDS, so that ``--help`` does not import torch). This hook
replaces the ``<!-- eagle3-trt commands -->`` line of docs/reference/commands.md with one
mkdocs-click directive per command, in the order ``eagle3-trt --help`` lists them, each naming the
module and attribute that hold the click command: a command added to the CLI appears on the page
without an edit, and its text is its ``--help``.
"""

from __future__ import annotations

import sys

import click

PLACEHOLDER = "<!-- eagle3-trt commands -->"


def _where(cmd: click.Command) -> tuple[str, str]:
    """The module and attribute holding ``cmd`` (the module its callback is defined in)."""
    module = sys.modules[cmd.callback.__module__]  # type: ignore[union-attr]
    attr = next(k for k, v in vars(module).items() if v is cmd)
    return module.__name__, attr


def command_directives() -> str:
    from eagle3_trt.cli import cli

    ctx = click.Context(cli, info_name="eagle3-trt")
    out = []
    for name in cli.list_commands(ctx):
        cmd = cli.get_command(ctx, name)
        assert cmd is not None, name
        module, attr = _where(cmd)
        out.append(f"::: mkdocs-click\n    :module: {module}\n    :command: {attr}\n    :prog_name: eagle3-trt {name}\n    :depth: 1\n")
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if PLACEHOLDER not in markdown:
        return markdown
    return markdown.replace(PLACEHOLDER, command_directives())
