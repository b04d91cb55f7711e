"""The capture options ``serve`` and ``serve-dynamo`` share (issue 23 A): ``--capture DIR``,
``--capture-max-mb N``, ``--capture-redact REGEX`` (repeatable), and retention: ``--capture-keep-mb N``,
``--capture-keep-hours H``, ``--capture-segment-s S``. See runtime/capture.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from eagle3_trt.errors import UserError
from eagle3_trt.runtime.capture import DEFAULT_MAX_MB, DEFAULT_SEGMENT_S, CaptureConfig, capture_config


def capture_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option(
        "--capture-segment-s",
        "capture_segment_s",
        type=float,
        default=None,
        metavar="S",
        help=f"with --capture: close each segment after S seconds (default {DEFAULT_SEGMENT_S:g}): retention never touches an open segment",
    )(f)
    f = click.option(
        "--capture-keep-hours",
        "capture_keep_hours",
        type=float,
        default=None,
        metavar="H",
        help="with --capture: retention; delete segments last written more than H hours ago (checked at each flush; capture goes on)",
    )(f)
    f = click.option(
        "--capture-keep-mb",
        "capture_keep_mb",
        type=float,
        default=None,
        metavar="MB",
        help="with --capture: retention; delete the oldest segments while the directory holds more than MB (below --capture-max-mb; capture goes on)",
    )(f)
    f = click.option(
        "--capture-redact",
        "capture_redact",
        multiple=True,
        metavar="REGEX",
        help="with --capture: replace every match in prompts and outputs by [REDACTED] before anything is written (repeatable)",
    )(f)
    f = click.option(
        "--capture-max-mb",
        "capture_max_mb",
        type=float,
        default=None,
        metavar="MB",
        help=f"with --capture: cap on the capture directory's segments (default {DEFAULT_MAX_MB:g}); at the cap capture stops with one warning and serving goes on",
    )(f)
    f = click.option(
        "--capture",
        "capture_dir",
        type=click.Path(path_type=Path),
        default=None,
        metavar="DIR",
        help="record every finished request (prompt and output tokens and text, sampling, acceptance, bundle id, time) to DIR; off by default",
    )(f)
    return f


def capture_summary(cfg: CaptureConfig) -> str:
    redact = f", redacting {len(cfg.redact)} pattern(s)" if cfg.redact else ""
    keep = "".join(
        [f", keeping the newest {cfg.keep_mb:g} MB" if cfg.keep_mb else "", f", deleting segments older than {cfg.keep_hours:g} h" if cfg.keep_hours else ""]
    )
    return f"{cfg.dir} (cap {cfg.max_mb:g} MB{redact}{keep})"


def from_options(
    capture_dir: Path | None,
    capture_max_mb: float | None,
    capture_redact: tuple[str, ...],
    capture_keep_mb: float | None = None,
    capture_keep_hours: float | None = None,
    capture_segment_s: float | None = None,
) -> CaptureConfig | None:
    """The checked capture settings (one UserError per bad value, before any server starts); None when off."""
    if capture_dir is None:
        for name, given in (
            ("--capture-max-mb", capture_max_mb is not None),
            ("--capture-redact", bool(capture_redact)),
            ("--capture-keep-mb", capture_keep_mb is not None),
            ("--capture-keep-hours", capture_keep_hours is not None),
            ("--capture-segment-s", capture_segment_s is not None),
        ):
            if given:
                raise UserError(name, "given without --capture", "add --capture DIR to record traffic (capture is off by default)")
        return None
    return capture_config(
        capture_dir,
        DEFAULT_MAX_MB if capture_max_mb is None else capture_max_mb,
        capture_redact,
        capture_keep_mb,
        capture_keep_hours,
        DEFAULT_SEGMENT_S if capture_segment_s is None else capture_segment_s,
    )
