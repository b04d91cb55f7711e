"""Speculative-decoding options whose name or meaning differs between TensorRT-LLM releases.

One table (``CHANGES``) with the source of every row; ``spec_for_release`` rewrites a bundle's
``speculative_config`` for one release, or refuses what that release cannot express. Used by
``build/trtllm_adapter.to_llm_kwargs`` (compile, the Triton trtllm runtime: the installed
release) and by ``build/other_engines`` (the trtllm-serve launcher writes one options file per
release band and picks it at launch).

Release bands. TensorRT-LLM 1.2's release branch predates every change below (its cut also
predates PR #10099 of 2025-12-18, see ``SPECULATIVE_MODEL_SINCE`` below), so the
"before" side is certain for 1.2.x. Which 1.3.0rc first carries each change is not pinned
down; 1.3.0rc0 and later are given the new form, which the 1.3.0rc27 and 1.4.0rc1 API
reference pages document. The failure mode is chosen on purpose: an early 1.3.0rc with the old
validators refuses the new form loudly at load, while the old form on a new release would load
and silently mean something else (the draft_len_schedule keys changed meaning). When
TensorRT-LLM is importable its field list decides instead (``installed_fields``). Also here: which
release is installed (package metadata, no import) and the oldest one supported.

Sources (NVIDIA/TensorRT-LLM):
- PR #10860 "Dynamic draft length on spec decode one-model path", merged 2026-03-13. Before it,
  ``tensorrt_llm/llmapi/llm_args.py`` required ``1`` in ``draft_len_schedule`` ("draft_len_schedule
  must include batch_size=1 ... Add {1: <max_draft_len>} to your schedule") and read keys as lower
  bounds ("{1: 4, 4: 2, 8: 0} means: batch_size >= 1 uses draft_len=4, batch_size >= 4 uses
  draft_len=2, batch_size >= 8 uses draft_len=0"); since it, keys are upper bounds ("{4: 4, 8: 2,
  32: 1}: batch sizes 1-4 use 4, 5-8 use 2, 9-32 use 1, 33+ use 0"), the smallest key must map to
  max_draft_len, and ``max_concurrency`` becomes ``{max_concurrency: max_draft_len}``. Before it the
  one-model path could not switch speculation off at run time (PR #8344, model_engine.py: "for one
  engine mode, we are not able to turn off spec decode at runtime"), so ``max_concurrency`` and the
  schedule load but do nothing for EAGLE-3 one-model on 1.2.x.
- PR #12905 "BREAKING: Acceptance rate based speculation off in one model path" (2026-04): renamed
  ``acceptance_window`` -> ``acceptance_rate_window_size`` and ``acceptance_length_threshold`` ->
  ``acceptance_rate_threshold``, and changed the quantity from an acceptance *length* to an
  acceptance *rate* in [0, 1]; the old gate ran on the two-model path only. A rate cannot be
  turned into a length, so a bundle that sets the rate gate is refused for 1.2.x.
- ``eagle3_one_model``: True is the default wherever the field exists; the 1.4.0rc1 API reference
  (llm-api/reference/Eagle3DecodingConfig.html) no longer lists it (two-model EAGLE-3 removed,
  PR #17366 made False fall back to True). The adapter omits it when True; False is refused from
  1.4.0rc1 on.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

from eagle3_trt.errors import UserError
from eagle3_trt.formats import rope_releases
from eagle3_trt.speculative.dynamic_tree.release import dynamic_tree_for_release
from eagle3_trt.speculative.eagle3.release import variant_for_release
from eagle3_trt.speculative.eagle3.sampling_release import sampling_for_release
from eagle3_trt.speculative.sa.release import sa_for_release


@dataclass(frozen=True)
class OptionChange:
    option: str  # speculative_config field(s) concerned
    since: str  # first release with the new form (see the module docstring for how sure)
    change: str
    source: str


NEW_SCHEDULE_SINCE = "1.3.0rc0"
ACCEPTANCE_RATE_SINCE = "1.3.0rc0"
ONE_MODEL_ONLY_SINCE = "1.4.0rc1"
# First release assumed to know `speculative_model` (see pipeline/trtllm_adapter.py's docstring).
SPECULATIVE_MODEL_SINCE = "1.3.0rc0"
# Oldest release the toolkit targets: unified ModelOpt checkpoints need >= 1.2.0
# (NVIDIA/Model-Optimizer docs/source/deployment/3_unified_hf.rst).
MIN_SUPPORTED = "1.2.0"

CHANGES: tuple[OptionChange, ...] = (
    OptionChange(
        "draft_len_schedule, max_concurrency",
        NEW_SCHEDULE_SINCE,
        "schedule keys become upper bounds (batch size 1 no longer required); one-model EAGLE-3 honours both",
        "NVIDIA/TensorRT-LLM PR #10860 (merged 2026-03-13); PR #8344",
    ),
    OptionChange(
        "acceptance_rate_window_size, acceptance_rate_threshold",
        ACCEPTANCE_RATE_SINCE,
        "were acceptance_window / acceptance_length_threshold (a length, two-model only)",
        "NVIDIA/TensorRT-LLM PR #12905 (2026-04)",
    ),
    OptionChange("eagle3_one_model", ONE_MODEL_ONLY_SINCE, "field removed; one-model is the only mode", "TensorRT-LLM 1.4.0rc1 API reference; PR #17366"),
)

# Release bands the trtllm-serve launcher writes an options file for: (band, representative
# version, shell `case` pattern of the versions it serves). The last band is the default, also
# used when the version cannot be read.
LAUNCH_BANDS: tuple[tuple[str, str, str], ...] = (
    ("1.2", "1.2", "1.2.*"),
    ("current", "", "*"),
)
UNSUPPORTED_PATTERN = "0.*|1.0|1.0.*|1.1|1.1.*"  # older than MIN_SUPPORTED (1.2.0)


def _v(version: str) -> Version:
    try:
        return Version(version)
    except InvalidVersion:
        raise UserError("TensorRT-LLM version", f"cannot parse version {version!r}", "expected something like 1.2.1 or 1.3.0rc5") from None


def _before(version: str | None, since: str) -> bool:
    return version is not None and _v(version) < _v(since)


def old_schedule(schedule: dict[int, int]) -> dict[int, int]:
    """A draft_len_schedule in the new form (key = largest batch size for that length, 0 above
    the largest key) as the pre-#10860 form (key = smallest batch size for that length, 1 first)."""
    out: dict[int, int] = {}
    lower = 1
    for bound, k in sorted(schedule.items()):
        out[lower] = k
        lower = bound + 1
    out[lower] = 0
    return out


def spec_for_release(
    spec: dict[str, Any], version: str | None, spec_fields: frozenset[str] | None = None, where: str = "speculative_config"
) -> tuple[dict[str, Any], list[str]]:
    """``spec`` (a speculative_config dict in this toolkit's form, the newest release's) rewritten
    for ``version`` (None: any release; the newest form is kept). ``spec_fields``: the installed
    Eagle3DecodingConfig field names, which decide where they are known. Returns the new dict and
    notes for the user; raises UserError for what the release cannot express."""
    spec = dict(spec)
    notes: list[str] = []
    old_acceptance = (
        ("acceptance_window" in spec_fields and "acceptance_rate_threshold" not in spec_fields)
        if spec_fields is not None
        else _before(version, ACCEPTANCE_RATE_SINCE)
    )
    if old_acceptance and ("acceptance_rate_threshold" in spec or "acceptance_rate_window_size" in spec):
        # Left out, not refused: the gate is a safety net against acceptance falling in production,
        # not part of what the bundle's K was measured and predicted with, so a 1.2 server still
        # serves the measured behaviour without it. A rate cannot become 1.2's length threshold.
        spec.pop("acceptance_rate_threshold", None)
        spec.pop("acceptance_rate_window_size", None)
        notes.append(
            f"TensorRT-LLM {version or 'installed'}: acceptance_rate_window_size/acceptance_rate_threshold left out; this release "
            "has no acceptance-rate gate (its acceptance_window/acceptance_length_threshold gate a length, on the two-model path "
            "only; renamed and moved to one-model by PR #12905), so speculation stays on even if acceptance falls"
        )
    spec, sampling_notes = sampling_for_release(spec, version, spec_fields, where)  # use_rejection_sampling, advanced_sampling_mode
    notes += sampling_notes
    spec, variant_notes = variant_for_release(spec, version, spec_fields, where)  # spec_dec_variant, eagle3_model_arch
    notes += variant_notes
    spec = dynamic_tree_for_release(spec, version, where)  # use_dynamic_tree: 1.3+ (speculative/dynamic_tree/release.py)
    spec = sa_for_release(spec, version, spec_fields, where)  # sa_config: 1.3+ (speculative/sa/release.py)
    # No field changed name here, so only the version number can tell.
    if _before(version, NEW_SCHEDULE_SINCE):
        if spec.get("draft_len_schedule"):
            spec["draft_len_schedule"] = old_schedule({int(k): int(v) for k, v in spec["draft_len_schedule"].items()})
        if spec.get("draft_len_schedule") or spec.get("max_concurrency"):
            notes.append(
                f"TensorRT-LLM {version}: max_concurrency / draft_len_schedule load but do not switch speculation "
                "off for EAGLE-3 one-model (one-model support came with PR #10860); speculation stays on at every batch size"
            )
    if spec_fields is not None:
        one_model_gone = "eagle3_one_model" not in spec_fields
    else:
        one_model_gone = version is not None and not _before(version, ONE_MODEL_ONLY_SINCE)
    if spec.get("eagle3_one_model") is False and one_model_gone:
        raise UserError(
            f"{where}.eagle3_one_model", f"TensorRT-LLM {version or 'installed'} has only one-model EAGLE-3", "remove eagle3_one_model: false from the bundle"
        )
    return spec, notes


# Which speculation keys each release band takes, and under which name (None: the release has no
# such key; the adapter leaves it out with a note). From the CHANGES rows above and, for 1.3/1.4,
# NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py (DecodingBaseConfig; stored version at commit
# 0004396720054fd8, whose draft_len_schedule description is the upper-bound form; earlier stored
# versions carry the batch-1/lower-bound form and acceptance_window; the 1.3.0rc27 and 1.4.0rc1
# API reference pages list acceptance_rate_* and, in 1.4 only, spec_dec_variant). 1.2's schedule key is
# accepted but keyed by lower bounds (``old_schedule``) and inert for one-model EAGLE-3.
SPEC_KEYS_BY_RELEASE: dict[str, dict[str, str | None]] = {
    "1.2": {
        "draft_len_schedule": "draft_len_schedule",
        "acceptance_rate_window_size": None,
        "acceptance_rate_threshold": None,
        "spec_dec_variant": None,
        "eagle3_model_arch": None,  # speculative/eagle3/release.py
        # speculative sampling flags (speculative/eagle3/sampling_release.py, core/spec_sampling.py)
        "allow_advanced_sampling": "allow_advanced_sampling",
        "use_rejection_sampling": None,
        "advanced_sampling_mode": None,
        # the EAGLE-3 dynamic tree (speculative/dynamic_tree/release.py): 1.3+ on the PyTorch backend
        "use_dynamic_tree": None,
        "dynamic_tree_max_topK": None,
        "max_total_draft_tokens": None,
    },
    "1.3": {
        "draft_len_schedule": "draft_len_schedule",
        "acceptance_rate_window_size": "acceptance_rate_window_size",
        "acceptance_rate_threshold": "acceptance_rate_threshold",
        "spec_dec_variant": None,
        "eagle3_model_arch": "eagle3_model_arch",  # speculative/eagle3/release.py
        "allow_advanced_sampling": "allow_advanced_sampling",
        "use_rejection_sampling": "use_rejection_sampling",
        "advanced_sampling_mode": "advanced_sampling_mode",
        "use_dynamic_tree": "use_dynamic_tree",
        "dynamic_tree_max_topK": "dynamic_tree_max_topK",
        "max_total_draft_tokens": "max_total_draft_tokens",
    },
}
SPEC_KEYS_BY_RELEASE["1.4"] = {**SPEC_KEYS_BY_RELEASE["1.3"], "spec_dec_variant": "spec_dec_variant"}  # 1.3's keys, plus spec_dec_variant


# The transformers each release pins (``Requires-Dist`` of its sdist on PyPI, read 2026-11-26): 1.2.1 and
# 1.3.0rc4..rc14 transformers==4.57.1/4.57.3; 1.3.0rc15 5.5.3; 1.3.0rc22..rc29 and 1.4.0rc0/rc1 5.5.4 (rc22.post1
# >=5.11). 1.3.0rc0..rc3 list none (dynamic metadata): taken as 4.57, their neighbours' pin.
TRANSFORMERS_5_SINCE = "1.3.0rc15"
# RopeParams.from_config merges rope_parameters over the config since NVIDIA/TensorRT-LLM PR #10636 (merged
# 2026-01-14, after 1.2's branch cut); which 1.3.0rc first carries it is not pinned down, so 1.3.0rc0..rc14
# are read both ways (formats/rope_releases.py).
ROPE_PARAMETERS_MERGE_SINCE = "1.3.0rc0"


def rope_reader(version: str | None) -> list[rope_releases.Reader]:
    """How ``version`` (None: unknown, so every release the toolkit supports) loads a config's rope."""
    if version is None:
        return [rope_releases.Reader("4.57", False, "TensorRT-LLM 1.2.x"), rope_releases.Reader("5", True, f"TensorRT-LLM {TRANSFORMERS_5_SINCE} or newer")]
    if _v(version) < _v(ROPE_PARAMETERS_MERGE_SINCE):
        return [rope_releases.Reader("4.57", False, f"TensorRT-LLM {version}")]
    if _v(version) < _v(TRANSFORMERS_5_SINCE):
        return [rope_releases.Reader("4.57", None, f"TensorRT-LLM {version}")]
    return [rope_releases.Reader("5", True, f"TensorRT-LLM {version}")]


def installed_version() -> str | None:
    """TensorRT-LLM's version from package metadata, without importing it (None if absent)."""
    for dist in ("tensorrt_llm", "tensorrt-llm"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def parse_version(v: str, where: str = "TensorRT-LLM version"):
    try:
        return Version(v)
    except InvalidVersion:
        raise UserError(where, f"cannot parse version {v!r}", "expected something like 1.2.1 or 1.3.0rc5") from None


def speculative_model_key(version: str | None, spec_fields: frozenset[str] | None = None) -> str:
    """``speculative_model`` or ``speculative_model_dir`` for a release.

    An installed field list decides; else the version number; with neither, the old name,
    which every release accepts.
    """
    if spec_fields is not None:
        return "speculative_model" if "speculative_model" in spec_fields else "speculative_model_dir"
    if version is None:
        return "speculative_model_dir"
    return "speculative_model" if parse_version(version) >= parse_version(SPECULATIVE_MODEL_SINCE) else "speculative_model_dir"


def check_supported(version: str) -> None:
    if parse_version(version) < parse_version(MIN_SUPPORTED):
        raise UserError(
            f"tensorrt_llm {version}",
            f"TensorRT-LLM {version} is older than {MIN_SUPPORTED}, the first release that loads unified ModelOpt checkpoints",
            "use a TensorRT-LLM 1.2.x or newer container (nvcr.io/nvidia/tensorrt-llm/release)",
        )


__all__ = [
    "CHANGES",
    "LAUNCH_BANDS",
    "MIN_SUPPORTED",
    "SPECULATIVE_MODEL_SINCE",
    "SPEC_KEYS_BY_RELEASE",
    "OptionChange",
    "check_supported",
    "installed_version",
    "old_schedule",
    "parse_version",
    "rope_reader",
    "spec_for_release",
    "speculative_model_key",
]
