"""The TensorRT-LLM side of serving: constructing ``tensorrt_llm.LLM`` from model.yaml. Nothing else.

Everything after construction (requests, streaming, cancellation, metrics) is ``job.LlmServing``,
the code the tests run against ``reference_llm.ReferenceLLM`` through a real Triton server. What
that code relies on in TensorRT-LLM's API is listed in ``llm_api.py``.

Construction follows upstream's llmapi model.py (NVIDIA/TensorRT-LLM
triton_backend/all_models/llmapi/tensorrt_llm/1/model.py @ 044a90d2): ``LLM(**
update_llm_args_with_extra_dict({}, model.yaml without triton_config))`` plus ``gpus_per_node``
for an instance pinned to its GPUs; ``CUDA_VISIBLE_DEVICES`` and the MPI clean-up are applied to
``os.environ`` by the model before this module imports TensorRT-LLM (``instances.py``).
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

from eagle3_trt.pipeline.bundle import open_bundle
from eagle3_trt.pipeline.trtllm_adapter import LlmKwargs, build_llm, check_names, documented_names, installed_names, to_llm_kwargs


def trtllm_kwargs(bundle: Path, overrides: dict, speculation: bool) -> LlmKwargs:
    """``LLM(**kwargs)`` for the bundle via the build stage's adapter (checked names, version
    differences, absolute paths); without the draft for a baseline model."""
    b = open_bundle(Path(bundle))
    res = to_llm_kwargs(b.path, b.options, overrides=overrides or None)
    if not speculation:
        kwargs = dict(res.kwargs)
        kwargs.pop("speculative_config", None)
        res = dataclasses.replace(res, kwargs=kwargs)
    return res


def build_trtllm(llm_kwargs: dict[str, Any], extra: dict[str, Any]):  # pragma: no cover - needs TensorRT-LLM and a GPU
    """(``tensorrt_llm.LLM``, ``tensorrt_llm.SamplingParams``) from model.yaml's ``LLM()`` keys."""
    from tensorrt_llm import SamplingParams  # local: optional and heavy; imported after CUDA_VISIBLE_DEVICES is set

    kwargs = {**copy.deepcopy(llm_kwargs), **extra}
    table = installed_names() or documented_names()
    check_names(kwargs, table, where="model.yaml")
    llm = build_llm(LlmKwargs(kwargs, None, table.source))
    return llm, SamplingParams
