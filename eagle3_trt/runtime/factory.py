"""``open_llm``: the one way a server or client gets an LLM-API object for a bundle.

Both runtimes return an object of ``tensorrt_llm.LLM``'s serving shape (``llm_api.ServingLlm``):
``generate_async`` / ``shutdown``, plus the runtime's ``SamplingParams`` class, a tokenizer and
whether speculation can be switched off per request. The Triton model, the Dynamo worker and
the clients call only this; which class implements a runtime (and when TensorRT-LLM is
imported) is decided here alone.

* ``reference``: ``reference_llm.ReferenceLLM``, the toolkit's PyTorch engine (CPU or one GPU), in a
  worker process as TensorRT-LLM's executor runs one GPU's model (every caller gets the same split).
* ``trtllm``: ``tensorrt_llm.LLM`` built from the bundle's ``LLM()`` kwargs (or the ones a Triton
  repository's model.yaml holds). TensorRT-LLM is imported on the call, not before: the caller sets
  ``CUDA_VISIBLE_DEVICES`` and the MPI environment first (``triton_serving/instances.py``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, get_args

from eagle3_trt.errors import UserError
from eagle3_trt.pipeline.bundle import Bundle, open_bundle
from eagle3_trt.pipeline.trtllm_adapter import LlmKwargs, build_llm, check_names, documented_names, installed_names, serving_llm_kwargs
from eagle3_trt.runtime.llm_api import RuntimeName, ServingLlm
from eagle3_trt.runtime.reference_llm import ReferenceLLM

RUNTIMES: tuple[str, ...] = get_args(RuntimeName)

# The options each runtime takes; anything else is refused by name rather than ignored.
_OPTIONS = {
    "reference": frozenset({"device", "torch_threads", "speculation", "single_process"}),
    "trtllm": frozenset({"speculation", "llm_kwargs", "llm_extra"}),
}


class TrtllmLLM:  # pragma: no cover - needs TensorRT-LLM and a GPU
    """``tensorrt_llm.LLM`` with what ``ServingLlm`` adds: its SamplingParams and the bundle's tokenizer."""

    per_request_speculation = False  # one-model EAGLE-3 has no per-request switch

    def __init__(self, llm_kwargs: dict[str, Any], tokenizer_dir: Path):
        # local: optional and heavy, and imported only after the caller set CUDA_VISIBLE_DEVICES
        from tensorrt_llm import SamplingParams
        from transformers import AutoTokenizer  # local: the reference runtime brings its own tokenizer

        table = installed_names() or documented_names()
        check_names(llm_kwargs, table, where="LLM() options")
        self.llm = build_llm(LlmKwargs(llm_kwargs, None, table.source))
        self.sampling_params_cls = SamplingParams
        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))

    def generate_async(self, inputs: Any, sampling_params: Any = None, streaming: bool = False) -> Any:
        return self.llm.generate_async(inputs, sampling_params, streaming=streaming)

    def shutdown(self) -> None:
        self.llm.shutdown()


def open_llm(bundle: Bundle | Path | str, runtime: RuntimeName | str = "reference", **opts: Any) -> ServingLlm:
    """An LLM-API object serving ``bundle`` on ``runtime``.

    reference: ``device`` ("auto" | "cpu" | "cuda"), ``torch_threads``, ``speculation`` (False: the
    target alone), ``single_process`` (None: TensorRT-LLM's rule, the engine in a worker process unless
    ``TLLM_WORKER_USE_SINGLE_PROCESS=1``; see ``ReferenceLLM``). trtllm: ``speculation``, ``llm_kwargs`` (``LLM()`` kwargs to use instead of the
    bundle's, e.g. a model.yaml's), ``llm_extra`` (merged over them, e.g. ``gpus_per_node``).
    An unknown runtime or option is a UserError.
    """
    if runtime not in _OPTIONS:
        raise UserError("runtime", f"unknown runtime {runtime!r}", f"one of: {', '.join(RUNTIMES)}")
    unknown = sorted(set(opts) - _OPTIONS[runtime])
    if unknown:
        raise UserError("runtime", f"{runtime} takes no option {', '.join(unknown)}", f"its options: {', '.join(sorted(_OPTIONS[runtime]))}")
    b = bundle if isinstance(bundle, Bundle) else open_bundle(Path(bundle))
    speculation = bool(opts.get("speculation", True))
    if runtime == "reference":
        return ReferenceLLM(
            b.path,
            device=opts.get("device", "auto"),
            torch_threads=opts.get("torch_threads"),
            speculation=speculation,
            single_process=opts.get("single_process"),
        )
    given = opts.get("llm_kwargs")  # pragma: no cover - below needs TensorRT-LLM and a GPU
    kwargs = copy.deepcopy(given) if given is not None else serving_llm_kwargs(b.path, b.options).kwargs
    kwargs.update(opts.get("llm_extra") or {})
    if not speculation:
        kwargs.pop("speculative_config", None)
    return TrtllmLLM(kwargs, b.tokenizer_dir)
