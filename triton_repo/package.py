"""Write a Triton model repository for an engine bundle, and check an existing one.

Layout (one decoupled Python-backend model, optionally a no-speculation twin for A/B)::

    REPO/<name>/config.pbtxt
    REPO/<name>/1/model.py      (copied from triton_repo/model/model.py)
    REPO/<name>/1/model.yaml
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import eagle3_trt
from eagle3_trt.atomic import staged_dir
from eagle3_trt.errors import UserError
from eagle3_trt.triton_repo.interface import DEFAULT_MODEL_NAME
from eagle3_trt.triton_repo.model_yaml import MODEL_YAML, ModelYaml, dump_model_yaml, load_model_yaml, read_bundle, resolve_bundle
from eagle3_trt.triton_repo.pbtxt import render_config, validate_config_text

MODEL_TEMPLATE = Path(__file__).resolve().parent / "model" / "model.py"
BASELINE_SUFFIX = "_nospec"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def package_import_root() -> str:
    """Directory that makes ``import eagle3_trt`` work (source checkout or site-packages)."""
    return str(Path(eagle3_trt.__file__).resolve().parent.parent)


@dataclass(frozen=True)
class PackagedModel:
    name: str
    dir: Path
    speculation: bool


def _write_model(root: Path, name: str, cfg: ModelYaml, instance_count: int) -> None:
    mdir = root / name
    (mdir / "1").mkdir(parents=True)
    (mdir / "config.pbtxt").write_text(render_config(name, cfg.bundle, cfg.runtime, instance_count))
    shutil.copyfile(MODEL_TEMPLATE, mdir / "1" / "model.py")
    (mdir / "1" / MODEL_YAML).write_text(dump_model_yaml(cfg))


def package_bundle(
    bundle: Path,
    out: Path,
    *,
    model_name: str = DEFAULT_MODEL_NAME,
    runtime: str = "reference",
    device: str = "auto",
    torch_threads: int | None = None,
    instance_count: int = 1,
    default_max_tokens: int = 64,
    with_baseline: bool = False,
    bundle_path: str | None = None,
    force: bool = False,
) -> list[PackagedModel]:
    """Write the repository atomically (temp dir next to ``out``, then rename).

    ``bundle_path`` overrides the path written into model.yaml, for a repository that is
    mounted elsewhere (e.g. inside a container); the bundle is then not checked here.
    """
    bundle = Path(bundle).resolve()
    out = Path(out)
    if not _NAME_RE.match(model_name):
        raise UserError("--name", f"'{model_name}' is not a valid Triton model name", "letters, digits, _ . - (max 64)")
    if instance_count < 1:
        raise UserError("--instances", "must be >= 1")
    read_bundle(bundle)
    if out.exists() and not force:
        raise UserError(out, "already exists", "pass --force to replace it")
    if out.exists() and not _looks_like_repository(out):
        raise UserError(out, "exists and is not a model repository; --force only replaces repositories", "choose another -o")

    base = ModelYaml(
        runtime=runtime,  # type: ignore[arg-type]
        bundle=bundle_path or str(bundle),
        device=device,  # type: ignore[arg-type]
        torch_threads=torch_threads,
        default_max_tokens=default_max_tokens,
        python_path=[package_import_root()],
    )
    models = [(model_name, base)]
    if with_baseline:
        models.append((model_name + BASELINE_SUFFIX, base.model_copy(update={"speculation": False})))

    with staged_dir(out) as tmp:
        for name, cfg in models:
            _write_model(tmp, name, cfg, instance_count)
        check_repository(tmp, check_bundle=bundle_path is None)
    return [PackagedModel(name, out / name, cfg.speculation) for name, cfg in models]


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
        my_path = mdir / "1" / MODEL_YAML
        if not (mdir / "1" / "model.py").is_file():
            raise UserError(mdir / "1" / "model.py", "missing")
        my = load_model_yaml(my_path)
        if cfg.parameters["eagle3_bundle"].string_value != my.bundle:
            raise UserError(cfg_path, "parameters['eagle3_bundle'] differs from model.yaml 'bundle'", "regenerate with `eagle3-trt package`")
        if cfg.parameters["eagle3_runtime"].string_value != my.runtime:
            raise UserError(cfg_path, "parameters['eagle3_runtime'] differs from model.yaml 'runtime'", "regenerate with `eagle3-trt package`")
        if check_bundle:
            read_bundle(resolve_bundle(my, my_path))
    return names
