"""Write a Triton model repository for an engine bundle, and check an existing one.

Layout (one Python-backend model; optionally a no-speculation twin for A/B and a unary twin)::

    REPO/<name>/config.pbtxt
    REPO/<name>/1/model.py      (copied from triton_repo/model/model.py)
    REPO/<name>/1/model.yaml    (upstream's format: triton_config + the LLM() options)
    REPO/<name>/1/eagle3.yaml   (this toolkit's settings: runtime, bundle, device, ...)

Every model instance gets its own GPUs (``gpu_device_ids``, upstream's semantics): the models x
instances x tensor_parallel_size GPUs must fit in ``--gpus`` or packaging is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import eagle3_trt
from eagle3_trt.atomic import staged_dir, write_text
from eagle3_trt.errors import UserError
from eagle3_trt.pipeline.trtllm_adapter import serving_llm_kwargs
from eagle3_trt.resources import data_dir
from eagle3_trt.runtime.llm_api import SERVED_MODEL_NAME, DeviceName, RuntimeName
from eagle3_trt.triton_serving.instances import assign_gpus
from eagle3_trt.triton_serving.model_yaml import (
    MODEL_YAML,
    SERVING_YAML,
    ModelYaml,
    ServingConfig,
    TritonConfig,
    dump_model_yaml,
    dump_serving_yaml,
    load_model_yaml,
    load_serving_yaml,
    read_bundle,
    resolve_bundle,
)
from eagle3_trt.triton_serving.pbtxt import render_config, validate_config_text

MODEL_TEMPLATE = data_dir("triton_repo") / "model" / "model.py"
BASELINE_SUFFIX = "_nospec"
UNARY_SUFFIX = "_unary"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def package_import_root() -> str:
    """Directory that makes ``import eagle3_trt`` work (source checkout or site-packages)."""
    return str(Path(eagle3_trt.__file__).resolve().parent.parent)


@dataclass(frozen=True)
class PackagedModel:
    name: str
    dir: Path
    speculation: bool
    decoupled: bool
    gpu_device_ids: str


def _write_model(root: Path, name: str, serving: ServingConfig, my: ModelYaml, instance_count: int, gpu_ids: str) -> None:
    mdir = root / name
    write_text(mdir / "config.pbtxt", render_config(name, serving.bundle, serving.runtime, instance_count, my.triton_config.decoupled, gpu_ids))
    write_text(mdir / "1" / "model.py", MODEL_TEMPLATE.read_text())
    write_text(mdir / "1" / MODEL_YAML, dump_model_yaml(my))
    write_text(mdir / "1" / SERVING_YAML, dump_serving_yaml(serving))


def package_bundle(
    bundle: Path,
    out: Path,
    *,
    model_name: str = SERVED_MODEL_NAME,
    runtime: RuntimeName = "reference",
    device: DeviceName = "auto",
    torch_threads: int | None = None,
    instance_count: int = 1,
    gpus: int | None = None,
    default_max_tokens: int = 64,
    decoupled: bool = True,
    with_unary: bool = False,
    with_baseline: bool = False,
    bundle_path: str | None = None,
    force: bool = False,
) -> list[PackagedModel]:
    """Write the repository atomically (temp dir next to ``out``, then rename).

    ``bundle_path`` overrides the path written into the YAML files, for a repository that is
    mounted elsewhere (e.g. inside a container); the bundle is then not checked here.
    ``decoupled``: the main model streams (True) or answers unary calls (False);
    ``with_unary``: also write ``<name>_unary``, a non-decoupled twin (one more copy of the model
    in memory) so one server answers both kinds of client.
    """
    bundle = Path(bundle).resolve()
    out = Path(out)
    _check_package_args(model_name, instance_count, decoupled, with_unary)
    info = read_bundle(bundle)
    _check_out(out, force)

    serving = ServingConfig(
        runtime=runtime,
        bundle=bundle_path or str(bundle),
        device=device,
        torch_threads=torch_threads,
        default_max_tokens=default_max_tokens,
        python_path=[package_import_root()],
    )
    variants = _variants(model_name, decoupled, with_baseline, with_unary)
    gpu_ids = _gpu_ids(len(variants), instance_count, runtime, device, gpus, info.tensor_parallel_size)

    # model.yaml is read later, maybe by another TensorRT-LLM release: portable names and paths
    b = info.bundle
    llm_kw = {spec: serving_llm_kwargs(b.path, b.options, speculation=spec, portable=True, bundle_path=bundle_path).kwargs for spec in (True, False)}
    with staged_dir(out) as tmp:
        for (name, spec, dec), ids in zip(variants, gpu_ids):
            my = ModelYaml(TritonConfig(decoupled=dec), llm_kw[spec])
            _write_model(tmp, name, serving.model_copy(update={"speculation": spec}), my, instance_count, ids)
        check_repository(tmp, check_bundle=bundle_path is None)
    return [PackagedModel(name, out / name, spec, dec, ids) for (name, spec, dec), ids in zip(variants, gpu_ids)]


def _check_package_args(model_name: str, instance_count: int, decoupled: bool, with_unary: bool) -> None:
    if not _NAME_RE.match(model_name):
        raise UserError("--name", f"'{model_name}' is not a valid Triton model name", "letters, digits, _ . - (max 64)")
    if instance_count < 1:
        raise UserError("--instances", "must be >= 1")
    if with_unary and not decoupled:
        raise UserError("--with-unary", "the main model is already unary (--no-decoupled)", "drop one of the two")


def _check_out(out: Path, force: bool) -> None:
    if out.exists() and not force:
        raise UserError(out, "already exists", "pass --force to replace it")
    if out.exists() and not _looks_like_repository(out):
        raise UserError(out, "exists and is not a model repository; --force only replaces repositories", "choose another -o")


def _variants(model_name: str, decoupled: bool, with_baseline: bool, with_unary: bool) -> list[tuple[str, bool, bool]]:
    """(model name, speculation, decoupled) of every model the repository holds."""
    variants = [(model_name, True, decoupled)]
    if with_baseline:
        variants.append((model_name + BASELINE_SUFFIX, False, decoupled))
    if with_unary:
        variants.append((model_name + UNARY_SUFFIX, True, False))
    return variants


def _gpu_ids(n_models: int, instance_count: int, runtime: RuntimeName, device: DeviceName, gpus: int | None, tensor_parallel_size: int) -> list[str]:
    """Per model, the GPU ids of its instances (';'-separated), or "" for none assigned."""
    # Each instance of each model gets its own GPUs; the reference runtime on CPU needs none.
    tp = tensor_parallel_size if runtime == "trtllm" else 1
    on_gpus = runtime == "trtllm" or device != "cpu"
    gpu_ids = [""] * n_models
    if gpus is not None and on_gpus:
        all_ids = assign_gpus(n_models * instance_count, tp, gpus).split(";")
        gpu_ids = [";".join(all_ids[i * instance_count : (i + 1) * instance_count]) for i in range(n_models)]
    elif runtime == "trtllm" and n_models * instance_count > 1:
        raise UserError(
            "--gpus",
            f"{n_models} model(s) x {instance_count} instance(s) of TensorRT-LLM would share the same GPUs",
            f"pass --gpus N (N >= {n_models * instance_count * tp}) so each instance gets its own",
        )
    return gpu_ids


def _looks_like_repository(path: Path) -> bool:
    """Empty, or only model directories (each with a config.pbtxt): safe to replace."""
    if not path.is_dir():
        return False
    entries = [p for p in path.iterdir() if not p.name.startswith(".")]
    return all(p.is_dir() and (p / "config.pbtxt").is_file() for p in entries)


def check_repository(repo: Path, check_bundle: bool = True) -> list[str]:
    """Validate every model in a repository; returns the model names. Raises UserError."""
    repo = Path(repo)
    if not repo.is_dir():
        raise UserError(repo, "model repository not found", "write one with `eagle3-trt package BUNDLE -o REPO`")
    names = sorted(p.name for p in repo.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not names:
        raise UserError(repo, "contains no model directories")
    for name in names:
        mdir = repo / name
        cfg_path = mdir / "config.pbtxt"
        if not cfg_path.is_file():
            raise UserError(cfg_path, "missing")
        cfg = validate_config_text(cfg_path.read_text(), where=str(cfg_path), expected_name=name)
        if not (mdir / "1" / "model.py").is_file():
            raise UserError(mdir / "1" / "model.py", "missing")
        my = load_model_yaml(mdir / "1" / MODEL_YAML)
        sv_path = mdir / "1" / SERVING_YAML
        sv = load_serving_yaml(sv_path)
        if cfg.parameters["eagle3_bundle"].string_value != sv.bundle:
            raise UserError(cfg_path, f"parameters['eagle3_bundle'] differs from {SERVING_YAML} 'bundle'", "regenerate with `eagle3-trt package`")
        if cfg.parameters["eagle3_runtime"].string_value != sv.runtime:
            raise UserError(cfg_path, f"parameters['eagle3_runtime'] differs from {SERVING_YAML} 'runtime'", "regenerate with `eagle3-trt package`")
        dec = bool(cfg.model_transaction_policy.decoupled)
        if dec != my.triton_config.decoupled:
            raise UserError(
                cfg_path,
                f"config.pbtxt says decoupled: {str(dec).lower()}, model.yaml triton_config says decoupled: {str(my.triton_config.decoupled).lower()}",
                "they must agree (upstream's model.py reads model.yaml); regenerate with `eagle3-trt package`",
            )
        if sv.speculation != ("speculative_config" in my.llm_kwargs):
            raise UserError(
                mdir / "1" / MODEL_YAML,
                f"speculative_config {'missing' if sv.speculation else 'present'} but {SERVING_YAML} says speculation: {str(sv.speculation).lower()}",
                "regenerate with `eagle3-trt package`",
            )
        if check_bundle:
            read_bundle(resolve_bundle(sv, sv_path))
    return names
