"""The bundle facts the cost model needs (formats, parallelism, shapes, weight sizes), read from a bundle."""

from __future__ import annotations

from pathlib import Path

from eagle3_trt.errors import UserError
from eagle3_trt.formats.checkpoint_io import read_json
from eagle3_trt.formats.draft_config import layer_config
from eagle3_trt.measure.cost_model import DEFAULT_BATCHES
from eagle3_trt.pipeline.bundle import Bundle, open_bundle
from eagle3_trt.pipeline.gpus import get_gpu
from eagle3_trt.pipeline.memory import kv_bytes_per_token
from eagle3_trt.pipeline.model_size import count_target, moe_cost_inputs, parse_shape
from eagle3_trt.speculative.registry import DEFAULT_METHOD, method_from_options


def method_of(b: Bundle) -> str:
    """The registry name of the method ``b`` serves (the chain when its options select none): its
    cost hook prices the bundle's iterations (``cost_model.predict_from_tokens``)."""
    m = method_from_options(b.options.speculative_config)
    return m.name if m is not None else DEFAULT_METHOD


def _weight_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in Path(d).glob("*.safetensors"))


def recommendation_batches(b: Bundle) -> tuple[int, ...]:
    """The batch sizes a recommendation is predicted at: the cost model's grid up to the bundle's
    max_batch_size (a server never batches more, so a larger max_concurrency promises nothing),
    and the bundle's CUDA-graph batch sizes, the sizes TensorRT-LLM actually runs (draft_len_schedule
    keys fall on them)."""
    mbs = b.options.max_batch_size
    cg = b.options.cuda_graph_config
    graphs = {x for x in (cg.batch_sizes or []) if x <= mbs} if cg is not None else set()
    return tuple(sorted({x for x in DEFAULT_BATCHES if x <= mbs} | graphs | {mbs}))


def bundle_cost_inputs(bundle: Bundle | Path, gpu: str | None = None, tp: int | None = None) -> dict:
    """Keyword arguments for ``cost_model.recommend`` read from a bundle (formats, options, configs, file sizes)."""
    b = bundle if isinstance(bundle, Bundle) else open_bundle(bundle)
    gpu_name = gpu or b.target_gpu.name
    tp = b.tensor_parallel_size if tp is None else tp
    tcfg = read_json(b.target_dir / "config.json")
    dcfg = layer_config(read_json(b.draft_dir / "config.json"))  # a method's own head may nest it (speculators' layout)
    kv_dtype = "fp8" if b.kv_cache == "fp8" else "bf16"
    # whole-model bytes (tp=1): the cost model splits them over TP itself
    ts = parse_shape(tcfg, str(b.target_dir / "config.json"))
    ds = parse_shape(dcfg, str(b.draft_dir / "config.json"))
    tb, db = _weight_bytes(b.target_dir), _weight_bytes(b.draft_dir)
    if not tb or not db:
        raise UserError(b.path, "no weight files in target/ or draft/", "this looks like a --dry-run bundle; build it fully")
    # a target kept as shipped is costed in its shipped format (gpt-oss: MXFP4 experts, the rest BF16)
    target_format = b.quant.target_native if b.quant.target == "native" else b.quant.target
    moe = moe_cost_inputs(ts, target_format if target_format in ("mxfp4", "fp8", "nvfp4") else "bf16")
    return dict(
        gpu=get_gpu(gpu_name),
        target_bytes=tb,
        draft_bytes=db,
        tp=tp,
        target_format=target_format,
        draft_format=b.quant.draft,
        target_params=float(count_target(ts).total) if moe else None,
        target_moe=moe,
        target_kv_bytes_per_token=kv_bytes_per_token(ts.layers, ts.kv_heads, ts.head_dim, kv_dtype, tp=1),
        draft_kv_bytes_per_token=kv_bytes_per_token(ds.layers, ds.kv_heads, ds.head_dim, kv_dtype, tp=1),
        target_layers=int(tcfg["num_hidden_layers"]),
        hidden=int(tcfg["hidden_size"]),
        method=method_of(b),  # the method the bundle serves: its cost hook prices each iteration
        options=b.options.speculative_config,
    )
