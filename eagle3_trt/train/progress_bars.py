"""Progress bars of `train-draft`: the commands' one progress facility (eagle3_trt/progress.py)."""

from __future__ import annotations

from eagle3_trt.progress import Advance, Bars, no_progress

__all__ = ["Advance", "Bars", "no_progress"]
