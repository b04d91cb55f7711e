"""Render ``config.pbtxt`` from its template and check it with Triton's own ``ModelConfig`` protobuf.

Hand-edited Triton configs are where deployments break, so every config this project writes,
and every config ``serve`` is about to load, goes through :func:`validate_config_text`: it is
parsed by ``google.protobuf.text_format`` into ``tritonclient``'s ``ModelConfig`` (unknown
fields and bad enums fail there, with line and column), then checked against the llmapi
interface in :mod:`interface`.
"""

from __future__ import annotations

import re
from pathlib import Path

from eagle3_trt.errors import UserError
from eagle3_trt.resources import data_dir
from eagle3_trt.triton_serving.interface import INPUTS, OUTPUTS, TensorSpec

TEMPLATE = data_dir("triton_repo") / "model" / "config.pbtxt.tmpl"

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z0-9_]*)\s*\}\}")
_LEFTOVER = re.compile(r"\{\{|\}\}|\$\{")


def render_template(text: str, values: dict[str, str], where: str = "config.pbtxt.tmpl") -> str:
    """Fill ``{{NAME}}`` placeholders; a missing or unused value is an error, never silent."""
    wanted = set(_PLACEHOLDER.findall(text))
    missing = sorted(wanted - set(values))
    if missing:
        raise UserError(where, f"template placeholder(s) left unfilled: {', '.join(missing)}", "pass a value for each")
    unused = sorted(set(values) - wanted)
    if unused:
        raise UserError(where, f"value(s) given for placeholder(s) the template lacks: {', '.join(unused)}")
    for key, val in values.items():
        if _LEFTOVER.search(val) or '"' in val or "\n" in val:
            raise UserError(where, f"value for {key} contains characters a pbtxt string cannot hold: {val!r}")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


def render_config(model_name: str, bundle_dir: str, runtime: str, instance_count: int = 1, decoupled: bool = True, gpu_device_ids: str = "") -> str:
    text = render_template(
        TEMPLATE.read_text(),
        {
            "MODEL_NAME": model_name,
            "BUNDLE_DIR": bundle_dir,
            "RUNTIME": runtime,
            "INSTANCE_COUNT": str(int(instance_count)),
            "DECOUPLED": "true" if decoupled else "false",
            "GPU_DEVICE_IDS": gpu_device_ids,
        },
    )
    validate_config_text(text, where="config.pbtxt", expected_name=model_name)
    return text


def parse_config_text(text: str, where: str = "config.pbtxt"):
    """Parse into ``tritonclient.grpc.model_config_pb2.ModelConfig`` (raises UserError)."""
    try:
        from google.protobuf import text_format  # local: comes with tritonclient, the optional [triton] extra
        from tritonclient.grpc import model_config_pb2  # optional [triton] extra, see above
    except ImportError as e:
        raise UserError(
            where, f"cannot validate a Triton model config without tritonclient ({e})", "pip install 'eagle3-trt[triton]' (or tritonclient[grpc])"
        ) from None

    leftover = _LEFTOVER.search(text)
    if leftover:
        line = text.count("\n", 0, leftover.start()) + 1
        raise UserError(f"{where}:{line}", "unfilled template placeholder", "regenerate with `eagle3-trt package`")
    cfg = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, cfg)
    except text_format.ParseError as e:
        raise UserError(where, f"not a valid Triton ModelConfig: {e}", "regenerate with `eagle3-trt package`") from None
    return cfg


def _type_name(value: int) -> str:
    from tritonclient.grpc import model_config_pb2  # local: the optional [triton] extra (checked in parse_config_text)

    return model_config_pb2.DataType.Name(value)


def _check_tensors(where: str, kind: str, actual, expected: tuple[TensorSpec, ...], check_optional: bool) -> list[str]:
    problems: list[str] = []
    by_name = {}
    for t in actual:
        if t.name in by_name:
            problems.append(f"{kind} '{t.name}' declared twice")
        by_name[t.name] = t
    for spec in expected:
        t = by_name.pop(spec.name, None)
        if t is None:
            if not spec.extra:
                problems.append(f"{kind} '{spec.name}' missing (the llmapi interface declares it)")
            continue
        if _type_name(t.data_type) != spec.data_type:
            problems.append(f"{kind} '{spec.name}' has data_type {_type_name(t.data_type)}, expected {spec.data_type}")
        if tuple(t.dims) != spec.dims:
            problems.append(f"{kind} '{spec.name}' has dims {list(t.dims)}, expected {list(spec.dims)}")
        if check_optional and bool(t.optional) != spec.optional:
            want = "optional" if spec.optional else "required"
            problems.append(f"{kind} '{spec.name}' must be {want}")
    for name in by_name:
        problems.append(f"{kind} '{name}' is not part of the interface (the model never reads or writes it)")
    return problems


def validate_config(cfg, where: str = "config.pbtxt", expected_name: str | None = None) -> None:
    """Check a parsed ModelConfig against what the model needs; one UserError listing every problem."""
    from tritonclient.grpc import model_config_pb2  # local: the optional [triton] extra (checked in parse_config_text)

    problems: list[str] = []
    if expected_name is not None and cfg.name != expected_name:
        problems.append(f"name is '{cfg.name}' but the model directory is '{expected_name}'")
    if cfg.backend != "python":
        problems.append(f"backend is '{cfg.backend}', expected 'python'")
    if cfg.max_batch_size != 0:
        problems.append(f"max_batch_size is {cfg.max_batch_size}; it must be 0 (one prompt per request)")
    if not cfg.HasField("model_transaction_policy"):
        problems.append(
            "model_transaction_policy { decoupled: ... } is missing (set it here, equal to model.yaml's "
            "triton_config.decoupled: launchers disable auto-complete)"
        )
    if not cfg.instance_group:
        problems.append("instance_group is missing")
    for i, g in enumerate(cfg.instance_group):
        if g.kind != model_config_pb2.ModelInstanceGroup.KIND_CPU:
            kind = model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind)
            problems.append(f"instance_group[{i}].kind is {kind}; Python-backend LLM models use KIND_CPU (the runtime picks the GPU)")
        if g.count < 1:
            problems.append(f"instance_group[{i}].count is {g.count}; it must be >= 1")
    total = sum(g.count for g in cfg.instance_group)
    gpu_ids = cfg.parameters["gpu_device_ids"].string_value if "gpu_device_ids" in cfg.parameters else ""
    runtime = cfg.parameters["eagle3_runtime"].string_value if "eagle3_runtime" in cfg.parameters else ""
    if total > 1 and not gpu_ids and runtime == "trtllm":
        problems.append(f"{total} instances but parameters['gpu_device_ids'] is empty (each instance needs its own GPUs: package with --gpus)")
    if gpu_ids and len(gpu_ids.split(";")) < total:
        problems.append(f"parameters['gpu_device_ids'] '{gpu_ids}' lists fewer GPU sets than the {total} instances")
    for key in ("eagle3_bundle", "eagle3_runtime"):
        if key not in cfg.parameters or not cfg.parameters[key].string_value:
            problems.append(f"parameters['{key}'] is missing")
    problems += _check_tensors(where, "input", cfg.input, INPUTS, check_optional=True)
    problems += _check_tensors(where, "output", cfg.output, OUTPUTS, check_optional=False)
    if problems:
        raise UserError(where, "; ".join(problems), "regenerate with `eagle3-trt package`")


def validate_config_text(text: str, where: str = "config.pbtxt", expected_name: str | None = None):
    cfg = parse_config_text(text, where)
    validate_config(cfg, where, expected_name)
    return cfg


def declared_inputs(config_path: Path) -> dict[str, TensorSpec]:
    """The inputs a written ``config.pbtxt`` declares (name -> type and dims), as Triton serves them."""
    cfg = parse_config_text(Path(config_path).read_text(), where=str(config_path))
    return {t.name: TensorSpec(t.name, _type_name(t.data_type), tuple(t.dims), bool(t.optional)) for t in cfg.input}
