"""eagle3-trt: EAGLE-3 speculative decoding bundles for TensorRT-LLM and Triton.

The project keeps its parts in top-level folders (convert/, build/, triton_repo/,
runtime/, clients/) but exposes them under one import namespace, ``eagle3_trt``.
A wheel copies them under ``eagle3_trt/``; in a source checkout the repository
root is appended to this package's ``__path__`` so the same imports resolve to
the working tree. The folders have no ``__init__.py`` at top level on purpose:
``build`` must never be importable as a top-level regular package, where it
would shadow PyPA's ``build``.
"""

from __future__ import annotations

import os as _os

__version__ = "0.1.0"

_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "pyproject.toml")) and _os.path.isdir(_os.path.join(_root, "convert")):
    __path__.append(_root)  # type: ignore[name-defined]  # noqa: F821

SOURCE_ROOT = _root if _root in __path__ else None  # type: ignore[name-defined]  # noqa: F821
