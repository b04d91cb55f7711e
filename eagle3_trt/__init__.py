"""eagle3-trt: EAGLE-3 speculative decoding bundles for TensorRT-LLM and Triton.

One regular package: every module's file sits where its dotted name says. The
repository's top-level ``build/``, ``convert/``, ``models/`` and ``triton_repo/``
folders hold data (engine recipes, calibration data, the embedded tiny pairs, the
Triton repository template), read through :mod:`eagle3_trt.resources`.
"""

from __future__ import annotations

__version__ = "0.1.0"
