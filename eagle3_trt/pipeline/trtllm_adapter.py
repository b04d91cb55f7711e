"""Turn a bundle's options (llm_api_options.yaml, read by ``build/bundle.open_bundle``) into
``LLM(...)`` keyword arguments for the installed TensorRT-LLM.

Everything here runs without TensorRT-LLM: the version comes from package metadata
(``importlib.metadata``), and option names are checked against the installed
``TorchLlmArgs.model_fields`` only when TensorRT-LLM is importable, otherwise against
``DOCUMENTED_NAMES`` below. Either way an unknown name is refused here, before a load that
can take many minutes on a 70B model.

Version differences handled (TensorRT-LLM 1.2.x and later; option names from NVIDIA/TensorRT-LLM
tensorrt_llm/llmapi/llm_args.py):
- ``speculative_config.speculative_model``: renamed from ``speculative_model_dir`` by
  NVIDIA/TensorRT-LLM PR #10099 (opened 2025-12-18), which kept the old name as an accepted
  alias. Which release first shipped it is not pinned down; we ASSUME 1.3.0rc0
  (``SPECULATIVE_MODEL_SINCE``). The assumption is safe in one direction: every release, before
  and after the rename, accepts ``speculative_model_dir``, so versions below the threshold (and
  version-agnostic files such as the trtllm-serve launcher's YAML) get the old name. When
  TensorRT-LLM is importable the field list decides, not the version number.
- ``speculative_config.eagle3_one_model``: True is the default wherever the field exists and
  the only mode in newer releases (two-model EAGLE-3 is deprecated, PR #17366), whose
  signatures no longer list the field. It is therefore omitted when True.
"""

from __future__ import annotations

import copy
import difflib
import functools
import importlib.metadata
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from eagle3_trt.errors import UserError
from eagle3_trt.pipeline import trtllm_versions as versions
from eagle3_trt.pipeline.llm_options import LlmApiOptions, validate_options

# The name the messages use for the bundle's options file (build/bundle.py owns the file).
OPTIONS_FILE = "llm_api_options.yaml"

# First release assumed to know `speculative_model` (see the module docstring).
SPECULATIVE_MODEL_SINCE = "1.3.0rc0"
# Oldest release the toolkit targets: unified ModelOpt checkpoints need >= 1.2.0
# (NVIDIA/Model-Optimizer docs/source/deployment/3_unified_hf.rst).
MIN_SUPPORTED = "1.2.0"

# Option names documented for TorchLlmArgs (BaseLlmArgs + TorchLlmArgs) from 1.2.x to the 2026
# main branch [NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py]. Names that exist only in some
# releases are included: this table catches typos when TensorRT-LLM is not importable; the
# installed field list is exact and wins whenever it can be read.
DOCUMENTED_TOP_LEVEL: frozenset[str] = frozenset(
    [
        "model",
        "tokenizer",
        "tokenizer_mode",
        "custom_tokenizer",
        "skip_tokenizer_init",
        "trust_remote_code",
        "tensor_parallel_size",
        "dtype",
        "revision",
        "tokenizer_revision",
        "model_kwargs",
        "pipeline_parallel_size",
        "context_parallel_size",
        "gpus_per_node",
        "moe_cluster_parallel_size",
        "moe_tensor_parallel_size",
        "moe_expert_parallel_size",
        "enable_attention_dp",
        "enable_lm_head_tp_in_adp",
        "pp_partition",
        "cp_config",
        "load_format",
        "enable_lora",
        "lora_config",
        "kv_cache_config",
        "enable_chunked_prefill",
        "guided_decoding_backend",
        "batched_logits_processor",
        "iter_stats_max_iterations",
        "request_stats_max_iterations",
        "peft_cache_config",
        "scheduler_config",
        "cache_transceiver_config",
        "sparse_attention_config",
        "speculative_config",
        "max_batch_size",
        "max_input_len",
        "max_seq_len",
        "max_beam_width",
        "max_num_tokens",
        "gather_generation_logits",
        "num_postprocess_workers",
        "postprocess_tokenizer_dir",
        "reasoning_parser",
        "decoding_config",
        "otlp_traces_endpoint",
        "backend",
        "return_perf_metrics",
        "prometheus_metrics_config",
        "orchestrator_type",
        "env_overrides",
        "garbage_collection_gen0_threshold",
        "cuda_graph_config",
        "attention_dp_config",
        "disable_overlap_scheduler",
        "moe_config",
        "attn_backend",
        "sampler_type",
        "enable_iter_perf_stats",
        "enable_iter_req_stats",
        "print_iter_log",
        "batch_wait_timeout_ms",
        "batch_wait_timeout_iters",
        "batch_wait_max_tokens_ratio",
        "torch_compile_config",
        "enable_autotuner",
        "enable_layerwise_nvtx_marker",
        "enable_min_latency",
        "stream_interval",
        "force_dynamic_quantization",
        "allreduce_strategy",
        "checkpoint_loader",
        "checkpoint_format",
        "kv_connector_config",
        "mm_encoder_only",
        "max_stats_len",
    ]
)
# Nested configs the bundle writes. Eagle3DecodingConfig = DecodingBaseConfig + EagleDecodingConfig
# fields (1.2.x .. 1.4.0rc1 reference pages); KvCacheConfig and CudaGraphConfig likewise.
DOCUMENTED_NESTED: dict[str, frozenset[str]] = {
    "speculative_config": frozenset(
        [
            "decoding_type",
            "max_draft_len",
            "max_total_draft_tokens",
            "speculative_model",
            "speculative_model_dir",
            "eagle3_one_model",
            "eagle3_layers_to_capture",
            "eagle3_model_arch",
            "num_eagle_layers",
            "max_non_leaves_per_layer",
            "eagle_choices",
            "greedy_sampling",
            "posterior_threshold",
            "use_dynamic_tree",
            "dynamic_tree_max_topK",
            "max_concurrency",
            "draft_len_schedule",
            "load_format",
            "acceptance_rate_window_size",
            "acceptance_rate_threshold",
            "use_rejection_sampling",
            "enable_penalty",
        ]
    ),
    "kv_cache_config": frozenset(
        [
            "enable_block_reuse",
            "max_tokens",
            "max_attention_window",
            "sink_token_length",
            "free_gpu_memory_fraction",
            "host_cache_size",
            "onboard_blocks",
            "cross_kv_cache_fraction",
            "secondary_offload_min_priority",
            "event_buffer_max_size",
            "attention_dp_events_gather_period_ms",
            "enable_partial_reuse",
            "copy_on_partial_reuse",
            "use_uvm",
            "max_gpu_total_bytes",
            "dtype",
            "mamba_ssm_cache_dtype",
            "tokens_per_block",
        ]
    ),
    "cuda_graph_config": frozenset(["batch_sizes", "max_batch_size", "enable_padding"]),
}
# Where the installed classes live (tensorrt_llm.llmapi exports all four).
_INSTALLED_CLASSES = {
    None: "TorchLlmArgs",
    "speculative_config": "Eagle3DecodingConfig",
    "kv_cache_config": "KvCacheConfig",
    "cuda_graph_config": "CudaGraphConfig",
}


# ---------------------------------------------------------------------------------------------
# Versions


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


# ---------------------------------------------------------------------------------------------
# Name tables


@dataclass(frozen=True)
class NameTable:
    top: frozenset[str]
    nested: dict[str, frozenset[str]]
    source: str  # "installed TensorRT-LLM X" or "documented table"


def documented_names() -> NameTable:
    return NameTable(DOCUMENTED_TOP_LEVEL, dict(DOCUMENTED_NESTED), "documented table (TensorRT-LLM 1.2.x to 1.4)")


def _field_names(model_cls: Any) -> frozenset[str]:
    """Field names plus every accepted alias of a pydantic model class."""
    names: set[str] = set()
    for name, info in model_cls.model_fields.items():
        names.add(name)
        for alias in (getattr(info, "alias", None), getattr(info, "validation_alias", None)):
            if isinstance(alias, str):
                names.add(alias)
            elif alias is not None and hasattr(alias, "choices"):  # AliasChoices
                names.update(c for c in alias.choices if isinstance(c, str))
    return frozenset(names)


@functools.lru_cache(maxsize=1)
def installed_names() -> NameTable | None:
    """Names from the importable TensorRT-LLM, or None when it is absent or cannot import.

    Importing tensorrt_llm needs a GPU driver (libcuda) and takes seconds, so this runs only
    when its package is installed; an import failure falls back to the documented table.
    """
    if importlib.util.find_spec("tensorrt_llm") is None:
        return None
    try:
        import tensorrt_llm.llmapi as llmapi  # local: optional and heavy (GPU machines only)
    except Exception:
        return None
    try:
        from tensorrt_llm.llmapi.llm_args import TorchLlmArgs  # local: where the field list lives in newer releases
    except ImportError:
        TorchLlmArgs = getattr(llmapi, "TorchLlmArgs", None)
    if TorchLlmArgs is None:
        return None
    nested = {}
    for key, cls_name in _INSTALLED_CLASSES.items():
        if key is None:
            continue
        cls = getattr(llmapi, cls_name, None)
        if cls is not None and hasattr(cls, "model_fields"):
            nested[key] = _field_names(cls)
    return NameTable(_field_names(TorchLlmArgs), nested, f"installed TensorRT-LLM {installed_version() or '?'}")


def check_names(kwargs: dict[str, Any], table: NameTable, where: str = OPTIONS_FILE) -> None:
    """Refuse option names the table does not know, naming each with its closest known name."""
    unknown: list[str] = []
    for key, value in kwargs.items():
        if key not in table.top:
            unknown.append(_with_suggestion(key, table.top))
            continue
        sub = table.nested.get(key)
        if sub is not None and isinstance(value, dict):
            unknown.extend(_with_suggestion(f"{key}.{k}", sub, prefix=f"{key}.") for k in value if k not in sub)
    if unknown:
        raise UserError(
            where,
            f"unknown TensorRT-LLM option(s): {', '.join(unknown)} (checked against the {table.source})",
            "fix the name, or remove it; options differ between TensorRT-LLM releases (tensorrt_llm/llmapi/llm_args.py)",
        )


def _with_suggestion(name: str, known: frozenset[str], prefix: str = "") -> str:
    leaf = name[len(prefix) :] if prefix else name
    close = difflib.get_close_matches(leaf, sorted(known), n=1, cutoff=0.75)
    return f"{name} (did you mean {prefix}{close[0]}?)" if close else name


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
    kwargs = opts.to_yaml_dict()
    where = str(bundle / OPTIONS_FILE) + (" + overrides" if overrides else "")
    if overrides:
        kwargs = _normalize_spec_key(_deep_merge(kwargs, overrides))
        if _schema_only(kwargs):
            # Overrides bypass the file's validation; the schema's cross-field rules still apply.
            validate_options(kwargs, where)
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
        kwargs["speculative_config"] = spec
        notes += release_notes
        if spec.get("eagle3_one_model", True) is True:
            spec.pop("eagle3_one_model", None)  # the default, and no longer a field in newer releases
        if resolve_paths and key in spec:
            spec[key] = _resolve_dir(bundle, str(spec[key]), f"speculative_config.{key}", ("config.json",) if check_files else ())
    if resolve_paths:
        kwargs["model"] = _resolve_dir(bundle, str(kwargs["model"]), "model", ("config.json",) if check_files else ())
        if kwargs.get("tokenizer"):
            tok_files = ("tokenizer.json", "tokenizer_config.json") if check_files else ()
            kwargs["tokenizer"] = _resolve_dir(bundle, str(kwargs["tokenizer"]), "tokenizer", tok_files)
    check_names(kwargs, table, where)
    return LlmKwargs(kwargs, version, table.source, tuple(notes))


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
