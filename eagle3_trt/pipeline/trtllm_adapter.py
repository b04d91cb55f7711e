"""Turn a bundle's options (llm_api_options.yaml, read by ``build/bundle.open_bundle``) into
``LLM(...)`` keyword arguments for the installed TensorRT-LLM.

Everything here runs without TensorRT-LLM: the version comes from package metadata
(``importlib.metadata``), and option names are checked against the installed
``TorchLlmArgs.model_fields`` only when TensorRT-LLM is importable, otherwise against the
documented table (both in pipeline/trtllm_names.py). Either way an unknown name is refused here, before a load that
can take many minutes on a 70B model.

Version differences handled (TensorRT-LLM 1.2.x and later; option names from NVIDIA/TensorRT-LLM
tensorrt_llm/llmapi/llm_args.py):
- ``speculative_config.speculative_model``: renamed from ``speculative_model_dir`` by
  NVIDIA/TensorRT-LLM PR #10099 (opened 2025-12-18), which kept the old name as an accepted
  alias. Which release first shipped it is not pinned down; we ASSUME 1.3.0rc0
  (``trtllm_versions.SPECULATIVE_MODEL_SINCE``). The assumption is safe in one direction: every release, before
  and after the rename, accepts ``speculative_model_dir``, so versions below the threshold (and
  version-agnostic files such as the trtllm-serve launcher's YAML) get the old name. When
  TensorRT-LLM is importable the field list decides, not the version number.
- ``speculative_config.eagle3_one_model``: True is the default wherever the field exists and
  the only mode in newer releases (two-model EAGLE-3 is deprecated, PR #17366), whose
  signatures no longer list the field. It is therefore omitted when True.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3_trt.errors import UserError
from eagle3_trt.pipeline import trtllm_versions as versions
from eagle3_trt.pipeline.llm_options import LlmApiOptions, validate_options
from eagle3_trt.pipeline.trtllm_names import OPTIONS_FILE, check_names, documented_names, installed_names
from eagle3_trt.pipeline.trtllm_versions import SPECULATIVE_MODEL_SINCE, check_supported, installed_version, speculative_model_key

# ---------------------------------------------------------------------------------------------
# Bundle options -> kwargs


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _resolve_dir(bundle: Path, value: str, field_name: str, need: tuple[str, ...] = ("config.json",)) -> str:
    """Absolute path of a bundle-relative directory that exists and holds one of ``need``."""
    p = Path(value).expanduser()
    if not p.is_absolute():
        p = bundle / p
    if not p.is_dir() or (need and not any((p / n).is_file() for n in need)):
        what = f"{value!r} resolves to {p}, " + ("which does not exist" if not p.is_dir() else f"which has no {' or '.join(need)}")
        raise UserError(
            f"{bundle / OPTIONS_FILE}:{field_name}",
            what,
            "bundle paths are relative to the bundle directory; rebuild the bundle if files are missing",
        )
    return str(p.resolve())


@dataclass(frozen=True)
class LlmKwargs:
    kwargs: dict[str, Any]
    version: str | None  # TensorRT-LLM version the kwargs were written for (None: any)
    names_checked_against: str
    notes: tuple[str, ...] = field(default_factory=tuple)


def to_llm_kwargs(
    bundle_dir: Path,
    opts: LlmApiOptions,
    *,
    version: str | None = None,
    overrides: dict[str, Any] | None = None,
    use_installed: bool = True,
    resolve_paths: bool = True,
    check_files: bool = True,
) -> LlmKwargs:
    """``LLM(**result.kwargs)`` for the bundle at ``bundle_dir`` whose options are ``opts``
    (``open_bundle(dir).options``), checked before anything heavy is loaded.

    ``version``: the TensorRT-LLM release to write for; default the installed one (None if
    not installed: version-agnostic output). ``overrides`` are merged over the file (nested
    dicts merge key by key), and checked like the rest. ``use_installed``: read the installed
    TorchLlmArgs field list when TensorRT-LLM is importable (False: documented table only).
    ``resolve_paths``: make model/tokenizer/draft paths absolute and check they exist;
    ``check_files``: also require config.json / tokenizer files in them (False for dry-run
    bundles, which carry configs only where the sources had them).
    """
    bundle = Path(bundle_dir)
    where = str(bundle / OPTIONS_FILE) + (" + overrides" if overrides else "")
    kwargs = _with_overrides(opts.to_yaml_dict(), overrides, where)
    notes: list[str] = []
    if version is None:
        version = installed_version()
    if version is not None:
        check_supported(version)
    table = installed_names() if use_installed else None
    if table is None:
        table = documented_names()

    spec = kwargs.get("speculative_config")
    if isinstance(spec, dict):
        spec_fields = table.nested.get("speculative_config") if table.source.startswith("installed") else None
        kwargs["speculative_config"] = _spec_for_release(bundle, spec, version, spec_fields, where, notes, resolve_paths, check_files)
    if resolve_paths:
        kwargs["model"] = _resolve_dir(bundle, str(kwargs["model"]), "model", ("config.json",) if check_files else ())
        if kwargs.get("tokenizer"):
            tok_files = ("tokenizer.json", "tokenizer_config.json") if check_files else ()
            kwargs["tokenizer"] = _resolve_dir(bundle, str(kwargs["tokenizer"]), "tokenizer", tok_files)
    check_names(kwargs, table, where)
    return LlmKwargs(kwargs, version, table.source, tuple(notes))


def _with_overrides(kwargs: dict[str, Any], overrides: dict[str, Any] | None, where: str) -> dict[str, Any]:
    if overrides:
        kwargs = _normalize_spec_key(_deep_merge(kwargs, overrides))
        if _schema_only(kwargs):
            # Overrides bypass the file's validation; the schema's cross-field rules still apply.
            validate_options(kwargs, where)
    return kwargs


def _spec_for_release(
    bundle: Path,
    spec: dict[str, Any],
    version: str | None,
    spec_fields: frozenset[str] | None,
    where: str,
    notes: list[str],
    resolve_paths: bool,
    check_files: bool,
) -> dict[str, Any]:
    """speculative_config for ``version``: the draft path under the release's name (absolute when
    ``resolve_paths``), the release's option forms (trtllm_versions), eagle3_one_model left out when
    True. Notes for the user are appended to ``notes``."""
    key = speculative_model_key(version, spec_fields)
    for old in ("speculative_model", "speculative_model_dir"):
        if old in spec and old != key:
            spec[key] = spec.pop(old)
    if key == "speculative_model_dir":
        notes.append(
            f"speculative_config.speculative_model_dir (TensorRT-LLM {version or 'version unknown'}: "
            f"speculative_model assumed from {SPECULATIVE_MODEL_SINCE}; every release accepts the old name)"
        )
    spec, release_notes = versions.spec_for_release(spec, version, spec_fields, f"{where}:speculative_config")
    notes += release_notes
    if spec.get("eagle3_one_model", True) is True:
        spec.pop("eagle3_one_model", None)  # the default, and no longer a field in newer releases
    if resolve_paths and key in spec:
        spec[key] = _resolve_dir(bundle, str(spec[key]), f"speculative_config.{key}", ("config.json",) if check_files else ())
    return spec


def serving_llm_kwargs(
    bundle_dir: Path,
    opts: LlmApiOptions,
    *,
    speculation: bool = True,
    overrides: dict[str, Any] | None = None,
    portable: bool = False,
    bundle_path: str | None = None,
) -> LlmKwargs:
    """The ``LLM()`` kwargs a server loads the bundle with: the one translation behind a Triton
    repository's model.yaml and the trtllm runtime (``runtime.factory.open_llm``).

    ``speculation=False``: without the draft (a baseline model for A/B). ``portable``: for a file
    read later, perhaps by another release: checked against the documented names, not the
    installed TensorRT-LLM's field list. ``bundle_path``: the bundle's directory as the server
    will see it; paths are joined onto it instead of being resolved (and checked) here.
    """
    res = to_llm_kwargs(bundle_dir, opts, overrides=overrides or None, use_installed=not portable, resolve_paths=bundle_path is None)
    kw = res.kwargs
    if bundle_path is not None:
        root = Path(bundle_path)
        kw["model"] = str(root / str(kw["model"]))
        if kw.get("tokenizer"):
            kw["tokenizer"] = str(root / str(kw["tokenizer"]))
        spec = kw.get("speculative_config")
        if isinstance(spec, dict):
            for key in ("speculative_model", "speculative_model_dir"):
                if key in spec:
                    spec[key] = str(root / str(spec[key]))
    if not speculation:
        kw.pop("speculative_config", None)
    return res


def _normalize_spec_key(kwargs: dict[str, Any]) -> dict[str, Any]:
    """An override may use either name of the draft path; keep the schema's one until rendering."""
    spec = kwargs.get("speculative_config")
    if isinstance(spec, dict) and "speculative_model_dir" in spec:
        spec["speculative_model"] = spec.pop("speculative_model_dir")
    return kwargs


def _schema_only(kwargs: dict[str, Any]) -> bool:
    """True when every key is one the bundle schema models, so its validators can run on it."""
    if not set(kwargs) <= set(LlmApiOptions.model_fields):
        return False
    for key in ("speculative_config", "kv_cache_config", "cuda_graph_config"):
        value = kwargs.get(key)
        if isinstance(value, dict) and not set(value) <= _nested_schema_fields(key):
            return False
    return True


def _nested_schema_fields(key: str) -> set[str]:
    ann = LlmApiOptions.model_fields[key].annotation
    for cls in getattr(ann, "__args__", (ann,)):  # Optional[Model] -> Model
        fields = getattr(cls, "model_fields", None)
        if fields is not None:
            return set(fields)
    return set()


# ---------------------------------------------------------------------------------------------
# Writing the recommendation back into a bundle


def recommend(
    opts: LlmApiOptions,
    k: int,
    *,
    max_concurrency: int | None = None,
    draft_len_schedule: dict[int, int] | None = None,
    acceptance_rate_window_size: int | None = None,
    acceptance_rate_threshold: float | None = None,
) -> LlmApiOptions:
    """Options with the recommended draft length K and the concurrency limit for speculation.

    ``max_concurrency``: no speculation above this batch size (TensorRT-LLM turns it into
    ``draft_len_schedule={max_concurrency: K}``). ``draft_len_schedule``: batch size -> draft
    length, for a stepped schedule. At most one of the two; the schema enforces TensorRT-LLM's
    rules (smallest key maps to K, no value above K).
    """
    if max_concurrency is not None and draft_len_schedule is not None:
        raise UserError("recommendation", "give max_concurrency or draft_len_schedule, not both", "TensorRT-LLM translates one into the other")
    data = opts.model_dump()
    spec = data["speculative_config"]
    spec.update(max_draft_len=k, max_concurrency=max_concurrency, draft_len_schedule=draft_len_schedule)
    # the acceptance gate (TensorRT-LLM 1.3+): both or neither, the schema checks the pair
    spec.update(acceptance_rate_window_size=acceptance_rate_window_size, acceptance_rate_threshold=acceptance_rate_threshold)
    if draft_len_schedule is not None and data.get("cuda_graph_config") is not None:
        # TensorRT-LLM turns padding on with a schedule; say so in the file instead of silently.
        data["cuda_graph_config"]["enable_padding"] = True
    return validate_options(data, "recommendation")


# ---------------------------------------------------------------------------------------------
# Version-agnostic YAML for trtllm-serve / Triton (paths stay relative to the bundle)


def serve_yaml(opts: LlmApiOptions) -> dict[str, Any]:
    """The options as a ``trtllm-serve --extra_llm_api_options`` file for any supported release.

    The model is trtllm-serve's positional argument, so ``model`` and ``backend`` are left out;
    ``speculative_model_dir`` is used because every release accepts it; paths stay relative to
    the bundle (the launcher runs from the bundle directory).
    """
    res = to_llm_kwargs(Path("."), opts, version=None, use_installed=False, resolve_paths=False)
    out = dict(res.kwargs)
    out.pop("model", None)
    out.pop("backend", None)
    return out


def build_llm(res: LlmKwargs):  # pragma: no cover - needs TensorRT-LLM and a GPU
    """Construct ``tensorrt_llm.LLM`` from checked kwargs (imports TensorRT-LLM here, not before)."""
    from tensorrt_llm import LLM  # local: optional and heavy (GPU machines only)

    kwargs = copy.deepcopy(res.kwargs)
    try:  # the same conversion trtllm-serve and the Triton llmapi model apply to YAML options
        from tensorrt_llm.llmapi.llm_args import update_llm_args_with_extra_dict  # local: as above; absent in some releases

        model = kwargs.pop("model")
        kwargs = update_llm_args_with_extra_dict({"model": model}, kwargs)
    except ImportError:
        pass
    return LLM(**kwargs)
