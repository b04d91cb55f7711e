"""Write a Triton model repository for an engine bundle, and check an existing one.

Layout (one Python-backend model; optionally a no-speculation twin for A/B and a unary twin)::

    REPO/<name>/config.pbtxt
    REPO/<name>/1/model.py      (copied from triton_repo/model/model.py)
    REPO/<name>/1/model.yaml    (upstream's format: triton_config + the LLM() options)
    REPO/<name>/1/eagle3.yaml   (this toolkit's settings: runtime, bundle, device, ...)

Every model instance gets its own GPUs (``gpu_device_ids``, upstream's semantics): the models x
instances x tensor_parallel_size GPUs must fit in ``--gpus`` or packaging is refused.

``package`` only ever adds or replaces its own model directories: other models in REPO stay as
they are. Each model directory it writes records the sha256 of every file it wrote
(``eagle3-package.json``); a later ``package`` refuses, naming the file, when one was edited (the
README invites editing model.yaml) or a same-named model is not its own, unless ``--force``
(which still replaces only those model directories). A repository a running tritonserver has
loaded is refused before anything is read or written.
"""

from __future__ import annotations

import re
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

import eagle3_trt
from eagle3_trt.atomic import staged_dir, write_text
from eagle3_trt.errors import UserError
from eagle3_trt.formats.checkpoint_io import sha256_file
from eagle3_trt.pipeline.trtllm_adapter import serving_llm_kwargs
from eagle3_trt.procs import serving_repository
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
RECORD_FILE = "eagle3-package.json"
FORCE_HINT = "--force overwrites only the models package writes; other models in the repository stay"


class PackageRecord(BaseModel):
    """What ``package`` wrote into one model directory: path (relative to it) -> sha256."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    files: dict[str, str]


def read_record(mdir: Path) -> PackageRecord | None:
    """The model directory's package record, or None where ``package`` wrote none."""
    path = Path(mdir) / RECORD_FILE
    if not path.is_file():
        return None
    try:
        return PackageRecord.model_validate_json(path.read_bytes())
    except ValidationError as e:
        raise UserError(path, f"unreadable package record ({e.errors()[0]['msg']}); nothing written", FORCE_HINT) from None


def _record(mdir: Path) -> PackageRecord:
    files = sorted(p for p in mdir.rglob("*") if p.is_file())
    return PackageRecord(files={p.relative_to(mdir).as_posix(): sha256_file(p) for p in files})


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


def write_version_files(vdir: Path, serving: ServingConfig, my: ModelYaml) -> None:
    """One model version directory's files (model.py, model.yaml, eagle3.yaml); also used by deploy.py."""
    write_text(vdir / "model.py", MODEL_TEMPLATE.read_text())
    write_text(vdir / MODEL_YAML, dump_model_yaml(my))
    write_text(vdir / SERVING_YAML, dump_serving_yaml(serving))


def _write_model(mdir: Path, name: str, serving: ServingConfig, my: ModelYaml, instance_count: int, gpu_ids: str) -> None:
    write_text(mdir / "config.pbtxt", render_config(name, serving.bundle, serving.runtime, instance_count, my.triton_config.decoupled, gpu_ids))
    write_version_files(mdir / "1", serving, my)
    write_text(mdir / RECORD_FILE, _record(mdir).model_dump_json(indent=1) + "\n")


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
    default_max_tokens: int | None = None,
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
    _check_not_served(out)
    info = read_bundle(bundle)
    variants = _variants(model_name, decoupled, with_baseline, with_unary)
    _check_out(out, [name for name, _, _ in variants], force)

    serving = ServingConfig(
        runtime=runtime,
        bundle=bundle_path or str(bundle),
        device=device,
        torch_threads=torch_threads,
        default_max_tokens=default_max_tokens,
        python_path=[package_import_root()],
    )
    gpu_ids = _gpu_ids(len(variants), instance_count, runtime, device, gpus, info.tensor_parallel_size)

    # model.yaml is read later, maybe by another TensorRT-LLM release: portable names and paths
    b = info.bundle
    llm_kw = {spec: serving_llm_kwargs(b.path, b.options, speculation=spec, portable=True, bundle_path=bundle_path).kwargs for spec in (True, False)}
    # A new repository is staged whole; in an existing one each of our model directories is staged
    # beside its place, all written and checked before the first is swapped in (other entries untouched).
    with ExitStack() as stack:
        new_repo = not out.exists()
        root = stack.enter_context(staged_dir(out)) if new_repo else out
        for (name, spec, dec), ids in zip(variants, gpu_ids):
            mdir = root / name if new_repo else stack.enter_context(staged_dir(out / name))
            my = ModelYaml(TritonConfig(decoupled=dec), llm_kw[spec])
            _write_model(mdir, name, serving.model_copy(update={"speculation": spec}), my, instance_count, ids)
            check_model(mdir, name, check_bundle=bundle_path is None)
    return [PackagedModel(name, out / name, spec, dec, ids) for (name, spec, dec), ids in zip(variants, gpu_ids)]


def _check_not_served(out: Path) -> None:
    """A running tritonserver has this repository loaded: rewriting it under the server is refused
    before anything is read or written (a second `make serve` lands here)."""
    pids = serving_repository(out) if out.exists() else []
    if pids:
        raise UserError(
            out,
            f"a running tritonserver (pid {', '.join(map(str, pids))}) serves this repository; nothing written",
            "stop it first (eagle3-trt stop, or make stop), or package into another -o",
        )


def _check_package_args(model_name: str, instance_count: int, decoupled: bool, with_unary: bool) -> None:
    if not _NAME_RE.match(model_name):
        raise UserError("--name", f"'{model_name}' is not a valid Triton model name", "letters, digits, _ . - (max 64)")
    if instance_count < 1:
        raise UserError("--instances", "must be >= 1")
    if with_unary and not decoupled:
        raise UserError("--with-unary", "the main model is already unary (--no-decoupled)", "drop one of the two")


def _check_out(out: Path, names: list[str], force: bool) -> None:
    """Refuse, before anything is written: a directory that is no model repository, and (without
    --force) a model directory of ours that is not ours or that holds a file changed since we wrote it."""
    if not out.exists():
        return
    if not _looks_like_repository(out):
        raise UserError(out, "exists and is not a model repository; package writes only into model repositories", "choose another -o")
    for name in names if not force else []:
        mdir = out / name
        if not mdir.exists():
            continue
        rec = read_record(mdir)
        if rec is None:
            raise UserError(mdir, f"a model `eagle3-trt package` did not write (no {RECORD_FILE}); nothing written", f"pass another --name; {FORCE_HINT}")
        changed = _changed_file(mdir, rec)
        if changed is not None:
            raise UserError(
                changed, "differs from what `eagle3-trt package` wrote; nothing written", f"keep the edit by packaging into another -o; {FORCE_HINT}"
            )


def _changed_file(mdir: Path, rec: PackageRecord) -> Path | None:
    """The first file of ``mdir`` that is not as ``package`` wrote it: changed, gone, or added
    (Triton's own __pycache__ aside)."""
    for rel, sha in sorted(rec.files.items()):
        if not (mdir / rel).is_file() or sha256_file(mdir / rel) != sha:
            return mdir / rel
    for p in sorted(mdir.rglob("*")):
        rel = p.relative_to(mdir).as_posix()
        if p.is_file() and rel != RECORD_FILE and rel not in rec.files and "__pycache__" not in p.parts:
            return p
    return None


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
    """Empty, or only model directories (each with a config.pbtxt, or our record): safe to add ours to."""
    if not path.is_dir():
        return False
    entries = [p for p in path.iterdir() if not p.name.startswith(".")]
    return all(p.is_dir() and ((p / "config.pbtxt").is_file() or (p / RECORD_FILE).is_file()) for p in entries)


def check_repository(repo: Path, check_bundle: bool = True) -> list[str]:
    """Validate every model in a repository; returns the model names. Raises UserError."""
    repo = Path(repo)
    if not repo.is_dir():
        raise UserError(repo, "model repository not found", "write one with `eagle3-trt package BUNDLE -o REPO`")
    names = sorted(p.name for p in repo.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not names:
        raise UserError(repo, "contains no model directories")
    for name in names:
        check_model(repo / name, name, check_bundle)
    return names


def check_model(mdir: Path, name: str, check_bundle: bool = True) -> None:
    """Validate one model directory (``name`` as Triton will call it). Raises UserError."""
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
