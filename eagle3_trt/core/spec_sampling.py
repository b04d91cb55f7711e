"""What TensorRT-LLM's one-model EAGLE-3 serves for a temperature > 0 request, per sampling flag.

``SpecSamplingConfig`` mirrors three ``Eagle3DecodingConfig`` (``DecodingBaseConfig``) fields with
TensorRT-LLM's defaults; the engine (core/engine.py) reads ``engine.sampling`` and serves:

- ``allow_advanced_sampling`` off (the default): the one-model worker never fills the per-request
  temperature / top-k / top-p tensors (``SpecMetadata.populate_sampling_params_for_one_model``
  returns early) and ``SpecWorkerBase._sample_tokens_for_batch`` takes ``torch.argmax``: the
  request is decoded greedily, whatever its temperature. NOT the target's sampling distribution.
- ``allow_advanced_sampling`` on, ``use_rejection_sampling`` off: draft tokens stay greedy
  (``_draft_sampler_greedy``); the target samples one token per verified position with the
  request's temperature / top-k / top-p and a draft token is accepted while it equals the target's
  sample (``_sample_and_accept_draft_tokens_base``: cumprod of equality). Each emitted token is a
  target sample given the emitted prefix, so the output follows the target's distribution.
- both on: the draft samples from its filtered distribution q, kept per position, and the target
  accepts with min(1, p/q), resampling norm(max(0, p - q)) on rejection
  (``_sample_and_accept_draft_tokens_rejection`` / ``rejection_sampling_one_model``,
  ``_draft_sampler_advanced_for_rejection``): the target's distribution again.
- ``advanced_sampling_mode`` (``full`` | ``no_topk`` | ``no_topp`` | ``no_topk_no_topp``) drops the
  named filters from every speculative sample (``resolve_advanced_sampling_filters``: a skipped
  filter becomes None): a request that sets a skipped filter gets temperature-only sampling, not
  its own distribution.

Sources (NVIDIA/TensorRT-LLM, read through the search index; stored versions, commits not given
by the index): tensorrt_llm/_torch/speculative/interface.py, search-index id 52097831500 (the
1.3 form: ``runtime_draft_len``, "use_rejection_sampling (requires allow_advanced_sampling=True)")
and id 55097849426 (the later form with ``skip_top_k``/``skip_top_p`` and draft sampling for
rejection); tensorrt_llm/_torch/pyexecutor/sampler/ops/flashinfer.py
``resolve_advanced_sampling_filters`` (id 57350603787); the 1.3.0rc27 and 1.4.0rc1 API reference
pages of ``Eagle3DecodingConfig`` (all three fields, defaults False / False / FULL). Newer main
(llm_args.py id 55143598664) deprecates ``allow_advanced_sampling`` as a no-op (sampling then
auto-detected per request): not the 1.3 / 1.4 behaviour modelled here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from eagle3_trt.errors import UserError

if TYPE_CHECKING:  # no torch import here: the options schema (pipeline/llm_options.py) reads these flags
    from eagle3_trt.core.sampling import SamplingParams

AdvancedSamplingMode = Literal["full", "no_topk", "no_topp", "no_topk_no_topp"]
ADVANCED_SAMPLING_MODES: tuple[str, ...] = ("full", "no_topk", "no_topp", "no_topk_no_topp")
Served = Literal["greedy", "match", "rejection"]


@dataclass(frozen=True)
class SpecSamplingConfig:
    """TensorRT-LLM's speculative sampling flags, with its defaults."""

    use_rejection_sampling: bool = False
    allow_advanced_sampling: bool = False
    advanced_sampling_mode: AdvancedSamplingMode = "full"

    def __post_init__(self) -> None:
        if self.advanced_sampling_mode not in ADVANCED_SAMPLING_MODES:
            raise UserError("advanced_sampling_mode", f"unknown value {self.advanced_sampling_mode!r}", f"one of: {', '.join(ADVANCED_SAMPLING_MODES)}")
        if self.use_rejection_sampling and not self.allow_advanced_sampling:
            raise UserError(
                "use_rejection_sampling",
                "needs allow_advanced_sampling (TensorRT-LLM 1.3/1.4 fill the sampling parameters only with it)",
                "set allow_advanced_sampling: true as well, or drop use_rejection_sampling",
            )

    @property
    def served(self) -> Served:
        """How a temperature > 0 request is verified while speculating."""
        if not self.allow_advanced_sampling:
            return "greedy"
        return "rejection" if self.use_rejection_sampling else "match"

    @property
    def skips_top_k(self) -> bool:
        return self.advanced_sampling_mode in ("no_topk", "no_topk_no_topp")

    @property
    def skips_top_p(self) -> bool:
        return self.advanced_sampling_mode in ("no_topp", "no_topk_no_topp")

    def served_params(self, params: SamplingParams) -> SamplingParams:
        """The sampling parameters a speculative run of ``params`` is actually served with."""
        if params.greedy:
            return params
        if self.served == "greedy":
            return replace(params, temperature=0.0, top_k=0, top_p=1.0)
        top_k = 0 if self.skips_top_k else params.top_k
        top_p = 1.0 if self.skips_top_p else params.top_p
        return params if (top_k, top_p) == (params.top_k, params.top_p) else replace(params, top_k=top_k, top_p=top_p)

    def inexact_reason(self, params: SamplingParams | None = None) -> str | None:
        """Why speculative output with these flags does not follow the target's own sampling
        (for ``params``, or for some temperature > 0 request when None); None when it does."""
        if params is not None and params.greedy:
            return None
        if self.served == "greedy":
            return "allow_advanced_sampling is off, so TensorRT-LLM one-model EAGLE-3 decodes temperature > 0 requests greedily (argmax)"
        skipped = [n for n, s in (("top_k", self.skips_top_k), ("top_p", self.skips_top_p)) if s]
        if not skipped:
            return None
        if params is not None and not ((self.skips_top_k and params.top_k > 0) or (self.skips_top_p and params.top_p < 1.0)):
            return None
        return f"advanced_sampling_mode {self.advanced_sampling_mode} ignores the request's {' and '.join(skipped)} while speculating"

    def warning(self) -> str | None:
        """One line for the user when temperature > 0 requests are not served as the target samples."""
        why = self.inexact_reason()
        if why is None:
            return None
        return (
            f"warning: speculative_config: {why}; such output is not distributed as the target's own sampling "
            "(set allow_advanced_sampling: true and advanced_sampling_mode: full for exact sampling)"
        )


# The reference runtime's own default: TensorRT-LLM with both flags on (exact rejection sampling).
REJECTION_SAMPLING = SpecSamplingConfig(use_rejection_sampling=True, allow_advanced_sampling=True)

__all__ = ["ADVANCED_SAMPLING_MODES", "REJECTION_SAMPLING", "AdvancedSamplingMode", "SpecSamplingConfig"]
