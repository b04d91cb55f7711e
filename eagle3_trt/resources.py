"""Where the run-time data lives: one locator for the checkout and the wheel.

The repository's top-level data folders (``build/`` presets and model configs,
``convert/data/``, ``models/``, ``triton_repo/``) are what users look for there, so
they stay at top level with no ``__init__.py``. A wheel ships them as package data
under ``eagle3_trt/_data/<folder>`` (pyproject ``force-include``); a checkout (an
editable install or ``python -m`` from the root) reads them where they are.
Everything that reads those files goes through :func:`data_dir`.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

DataFolder = Literal["build", "convert", "models", "triton_repo"]
DATA_FOLDERS: tuple[DataFolder, ...] = ("build", "convert", "models", "triton_repo")


def checkout_root() -> Path | None:
    """The repository root when this package is imported from a source checkout, else None."""
    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / "eagle3_trt").is_dir() and (root / "build" / "presets").is_dir():
        return root
    return None


def data_dir(folder: DataFolder) -> Path:
    """The directory holding one top-level data folder: packaged in a wheel, else the checkout's."""
    packaged = Path(str(resources.files("eagle3_trt"))) / "_data" / folder
    if packaged.is_dir():
        return packaged
    root = checkout_root()
    if root is None:
        raise FileNotFoundError(f"eagle3_trt data folder {folder!r} is neither packaged nor in a checkout")
    return root / folder
