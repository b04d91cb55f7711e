"""An engine bundle -> the reference runtime's SpeculativeEngine.

The model core (core/engine.py) knows checkpoint directories, not bundles; this is where a
bundle's facts (K, aux layers, directories, max_seq_len, recorded BF16 sources) are mapped onto
``convert.load.load_engine``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from eagle3_trt.convert.load import load_engine
from eagle3_trt.core.engine import SpeculativeEngine
from eagle3_trt.core.speculation_control import SpeculationControl, SpeculationGate, schedule_from_options
from eagle3_trt.errors import UserError
from eagle3_trt.formats.checkpoint_io import read_json
from eagle3_trt.pipeline.bundle import Bundle, open_bundle
from eagle3_trt.pipeline.reference_memory import device_shortfall
from eagle3_trt.runtime.distributed import current
from eagle3_trt.speculative.registry import method_from_options


def engine_from_bundle(
    bundle: Bundle | Path | str, *, device: str = "cpu", dtype=None, max_draft_len: int | None = None, reference: bool = False
) -> SpeculativeEngine:
    """The bundle as built (quantized weights dequantized, activations fake-quantized), at the
    bundle's K unless ``max_draft_len`` says otherwise.

    ``reference=True``: the BF16 target and draft the bundle was built from (paths recorded in
    its manifest), with the bundle's K and aux layers; a one-line UserError when they are gone.
    """
    b = bundle if isinstance(bundle, Bundle) else open_bundle(Path(bundle))
    k = b.k if max_draft_len is None else int(max_draft_len)
    refuse_what_does_not_fit(b, device)
    if reference:
        tdir, ddir = b.source_dirs()
        eng = load_engine(
            tdir, ddir, max_draft_len=k, aux_layer_ids=b.aux_layer_ids, quantized=False, max_seq_len=b.max_seq_len, device=device, dtype=dtype, tp=current()
        )
    else:
        eng = _load_built(b, k, device, dtype)
    # temperature > 0 while speculating is served as TensorRT-LLM serves the bundle's flags
    spec = b.options.speculative_config
    # the speculation method the options select (eagle3_trt/speculative/registry.py; None: the chain)
    eng.method = method_from_options(spec, at_bundle_k=k == b.k)
    # the served flags: e.g. sa_config turns use_rejection_sampling off (llm_args.validate_rejection_sampling_config)
    flags = spec.sampling_flags()
    eng.sampling = eng.method.served_sampling(flags) if eng.method is not None else flags
    return eng


def speculation_control(bundle: Bundle | Path | str, max_draft_len: int) -> SpeculationControl:
    """How a TensorRT-LLM server runs the bundle's options from iteration to iteration
    (core/speculation_control.py): ``draft_len_schedule`` (or ``max_concurrency``) by batch size,
    the ``acceptance_rate_window_size`` / ``acceptance_rate_threshold`` switch-off, and whether the
    overlap scheduler delays it by one iteration (``disable_overlap_scheduler``, default false)."""
    b = bundle if isinstance(bundle, Bundle) else open_bundle(Path(bundle))
    o = b.options
    spec = o.speculative_config
    gate = None
    if spec.acceptance_rate_window_size and spec.acceptance_rate_threshold is not None:
        gate = SpeculationGate(spec.acceptance_rate_window_size, spec.acceptance_rate_threshold)
    return SpeculationControl(
        max_draft_len=max_draft_len,
        schedule=schedule_from_options(spec.draft_len_schedule, spec.max_concurrency, max_draft_len),
        gate=gate,
        overlap_scheduler=not o.disable_overlap_scheduler,
        max_batch_size=o.max_batch_size,
    )


def _load_built(b: Bundle, k: int, device: str, dtype) -> SpeculativeEngine:
    return load_engine(
        b.target_dir,
        b.draft_dir,
        tokenizer_dir=b.tokenizer_dir,
        max_draft_len=k,
        aux_layer_ids=b.aux_layer_ids,
        quantized=True,
        max_seq_len=b.max_seq_len,
        device=device,
        dtype=dtype,
        tp=current(),
    )


def refuse_what_does_not_fit(b: Bundle, device: str) -> None:
    """One line, before anything loads, when this rank's slice of the target (at the run's TP size) and
    the draft do not fit the device they are measured on (pipeline/reference_memory.py)."""
    group = current()
    tp = group.world if group is not None else 1
    draft_cfg_file = b.draft_dir / "config.json"
    try:
        draft_cfg = read_json(draft_cfg_file) if draft_cfg_file.is_file() else None
    except UserError:  # an unreadable head config: the target alone is sized
        draft_cfg = None
    short = device_shortfall(b.target_config, draft_cfg, tp, device)
    if short is None:
        return
    raise UserError(
        "--tp",
        f"measuring {b.path.name} {short}",
        "use more GPUs (--tp N, at most one rank per GPU) or GPUs with more memory; `eagle3-trt plan MODEL --measure` sizes it",
    )


def default_device(device: str | None) -> str:
    """``device`` as given, else cuda when available, else cpu."""
    if device:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"
