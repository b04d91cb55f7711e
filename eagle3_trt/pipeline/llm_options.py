"""TensorRT-LLM LLM-API options for EAGLE-3 one-model, as written into a bundle's llm_api_options.yaml.

Field names follow NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py (``TorchLlmArgs``, ``Eagle3DecodingConfig``). The same YAML feeds
``LLM(**options)``, ``trtllm-serve --config`` and the Triton llmapi model.yaml. Paths are
relative to the bundle directory and resolved by whoever loads the bundle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator

from eagle3_trt.core.spec_sampling import SpecSamplingConfig
from eagle3_trt.errors import UserError
from eagle3_trt.speculative.dynamic_tree.options import check_dynamic_tree_options
from eagle3_trt.speculative.sa.options import SAEnhancerOptions


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Eagle3Options(_Strict):
    decoding_type: Literal["Eagle3"] = "Eagle3"
    max_draft_len: int = Field(ge=1, description="draft length K; tokens proposed per target forward")
    speculative_model: str = Field("draft", description="draft checkpoint dir (older releases: speculative_model_dir)")
    # One-model (drafting and verification inside the target's forward) is TensorRT-LLM's default and,
    # since PR #17366, the only mode; newer releases dropped the field, so it is written only if False.
    eagle3_one_model: bool | None = Field(None, description="None = TensorRT-LLM's default (one-model)")
    eagle3_layers_to_capture: list[int] | None = Field(None, description="target layer outputs fed to fc; None = {1, L//2-1, L-4}")
    max_concurrency: int | None = Field(None, ge=1, description="no speculation above this batch size")
    draft_len_schedule: dict[int, int] | None = Field(None, description="batch size -> draft length")
    acceptance_rate_window_size: int | None = Field(None, ge=1)
    acceptance_rate_threshold: float | None = Field(None, ge=0.0, le=1.0)
    sa_config: SAEnhancerOptions | None = Field(None, description="suffix-automaton draft enhancer (TensorRT-LLM >= 1.3)")
    # TensorRT-LLM's EAGLE-3 dynamic tree (speculative/dynamic_tree/builder.py; PyTorch backend from 1.3, pipeline/trtllm_versions.py)
    use_dynamic_tree: bool | None = Field(None, description="draft a tree built per step from the draft's probabilities (None: off)")
    dynamic_tree_max_topK: int | None = Field(None, ge=1, description="dynamic tree: nodes expanded per draft layer")
    max_total_draft_tokens: int | None = Field(None, ge=1, description="dynamic tree: nodes verified per step, in [max_draft_len, topK * max_draft_len]")
    # vLLM's SpeculativeConfig key (vllm/config/speculative.py) selecting a method that drafts all K tokens in one
    # forward: the key a registered method's head hooks write into its bundle (``head.speculative_options``;
    # the method's home, speculative/registry.py METHODS, says which). No TensorRT-LLM release has it
    # (VLLM_ONLY_FIELDS below), so compile, Triton and the launchers refuse a bundle that sets it (the
    # method's head hooks say why).
    parallel_drafting: bool | None = Field(None, description="vLLM parallel drafting (a P-EAGLE head); None: off")

    @model_validator(mode="after")
    def _dynamic_tree(self) -> Eagle3Options:
        """The dynamic tree's rules, in its home (speculative/dynamic_tree/options.py)."""
        check_dynamic_tree_options(
            self.use_dynamic_tree,
            self.dynamic_tree_max_topK,
            self.max_total_draft_tokens,
            self.max_draft_len,
            self.sa_config is not None,
            self.draft_len_schedule,
        )
        return self

    # speculative/eagle3/release.py: which releases have them, and what a release without them does
    eagle3_model_arch: Literal["llama3", "mistral_large3"] | None = Field(
        None, description="draft module TensorRT-LLM builds (>= 1.3; None: its default, llama3, which every draft built here is)"
    )
    spec_dec_variant: StrictInt | None = Field(None, gt=0, description="TensorRT-LLM 1.4 DecodingBaseConfig field, positive (None: its default, 3)")
    # DecodingBaseConfig's speculative sampling flags; what each combination serves at temperature > 0
    # is in core/spec_sampling.py. None: not written, the release's default (False, False, full).
    allow_advanced_sampling: bool | None = Field(None, description="sample temperature > 0 requests while speculating (off: served greedily)")
    use_rejection_sampling: bool | None = Field(None, description="verify by rejection sampling (TensorRT-LLM >= 1.3; needs allow_advanced_sampling)")
    advanced_sampling_mode: Literal["full", "no_topk", "no_topp", "no_topk_no_topp"] | None = Field(
        None, description="filters skipped while speculating (TensorRT-LLM >= 1.3); anything but full ignores a request's top_k/top_p"
    )

    @model_validator(mode="after")
    def _sampling_flags(self) -> Eagle3Options:
        if self.use_rejection_sampling and not self.allow_advanced_sampling:
            raise ValueError("use_rejection_sampling needs allow_advanced_sampling: true (TensorRT-LLM fills the sampling parameters only with it)")
        return self

    def sampling_flags(self) -> SpecSamplingConfig:
        """The flags as the served release reads them (an unset flag: TensorRT-LLM's default)."""
        return SpecSamplingConfig(
            use_rejection_sampling=bool(self.use_rejection_sampling),
            allow_advanced_sampling=bool(self.allow_advanced_sampling),
            advanced_sampling_mode=self.advanced_sampling_mode or "full",
        )

    @model_validator(mode="after")
    def _consistent(self) -> Eagle3Options:
        if self.max_concurrency is not None and self.draft_len_schedule is not None:
            raise ValueError("max_concurrency and draft_len_schedule cannot both be set (TensorRT-LLM translates one into the other)")
        if self.draft_len_schedule:
            smallest = min(self.draft_len_schedule)
            if self.draft_len_schedule[smallest] != self.max_draft_len:
                raise ValueError("draft_len_schedule: the smallest batch size must map to max_draft_len")
            if any(v > self.max_draft_len or v < 0 for v in self.draft_len_schedule.values()):
                raise ValueError("draft_len_schedule values must be in 0..max_draft_len")
            if min(self.draft_len_schedule) < 1:
                raise ValueError("draft_len_schedule keys are batch sizes, at least 1")
            # more sequences make a verification forward costlier, so K may only fall as batch grows;
            # a rising K is a typo or a noisy measurement, not a plan
            ks = [self.draft_len_schedule[b] for b in sorted(self.draft_len_schedule)]
            if any(later > earlier for earlier, later in zip(ks, ks[1:])):
                raise ValueError(
                    f"draft_len_schedule: K rises with batch size ({dict(sorted(self.draft_len_schedule.items()))}); K must not increase as batch grows"
                )
        if (self.acceptance_rate_window_size is None) != (self.acceptance_rate_threshold is None):
            raise ValueError("acceptance_rate_window_size and acceptance_rate_threshold go together")
        if self.eagle3_layers_to_capture is not None and len(set(self.eagle3_layers_to_capture)) != len(self.eagle3_layers_to_capture):
            raise ValueError("eagle3_layers_to_capture must be distinct")
        return self


# speculative_config fields that are vLLM's, not TensorRT-LLM's: written only into bundles of a method no
# TensorRT-LLM release serves (pipeline/trtllm_names.NOT_TRTLLM_NESTED, other_engines.VLLM_SPECULATIVE_KEYS)
VLLM_ONLY_FIELDS = frozenset({"parallel_drafting"})


class KvCacheOptions(_Strict):
    free_gpu_memory_fraction: float = Field(0.9, gt=0.0, le=1.0)
    enable_block_reuse: bool = True
    dtype: Literal["auto", "fp8", "nvfp4"] = "auto"
    tokens_per_block: int = Field(32, ge=1)


class CudaGraphOptions(_Strict):
    batch_sizes: list[int] | None = None
    max_batch_size: int | None = None
    enable_padding: bool = False

    @model_validator(mode="after")
    def _max_matches(self) -> CudaGraphOptions:
        if self.batch_sizes and self.max_batch_size is not None and self.max_batch_size != max(self.batch_sizes):
            raise ValueError("cuda_graph_config.max_batch_size must equal max(batch_sizes)")
        return self


class MoeOptions(_Strict):
    # MoeConfig.backend's values (tensorrt_llm/llmapi/llm_args.py @ 0004396720054fd8, default AUTO; older releases
    # default CUTLASS and also accept WIDEEP; TRITON arrived with gpt-oss support, which those releases need anyway)
    backend: Literal[
        "AUTO", "CUTLASS", "CUTEDSL", "WIDEEP", "TRTLLM", "DEEPGEMM", "DENSEGEMM", "VANILLA", "TRITON", "MARLIN", "MEGAMOE_DEEPGEMM", "MEGAMOE_CUTEDSL"
    ] = Field("AUTO", description="MoE kernels")


class LlmApiOptions(_Strict):
    model: str = Field("target", description="quantized target checkpoint dir")
    tokenizer: str | None = Field("target", description="tokenizer dir")
    backend: Literal["pytorch"] = "pytorch"
    trust_remote_code: bool = False
    dtype: str = "auto"
    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    # MoE targets: experts split over this many of the tensor_parallel_size GPUs (the rest is moe_tp)
    moe_expert_parallel_size: int | None = Field(None, ge=1)
    max_batch_size: int = Field(64, ge=1)
    max_num_tokens: int = Field(8192, ge=1)
    max_seq_len: int | None = Field(None, ge=1)
    enable_chunked_prefill: bool = False
    disable_overlap_scheduler: bool = False
    kv_cache_config: KvCacheOptions = KvCacheOptions()
    cuda_graph_config: CudaGraphOptions | None = CudaGraphOptions()
    moe_config: MoeOptions | None = Field(None, description="MoE targets: the kernels (None: TensorRT-LLM's default)")
    speculative_config: Eagle3Options
    return_perf_metrics: bool = True
    # structured output (TorchLlmArgs.guided_decoding_backend); None = off
    guided_decoding_backend: Literal["xgrammar", "llguidance"] | None = None

    @model_validator(mode="after")
    def _guided_keeps_drafting(self) -> LlmApiOptions:
        # TensorRT-LLM #15022: a draft length that reaches 0 crashes xgrammar guided decoding. Above
        # the largest draft_len_schedule key (and above max_concurrency) K is 0 too (llm_args.py after
        # PR #10860), so with guided decoding the schedule must cover every batch size the server runs.
        spec, mbs = self.speculative_config, self.max_batch_size
        if self.guided_decoding_backend is None:
            return self
        sched = spec.draft_len_schedule or {}
        if any(k == 0 for k in sched.values()) or (sched and max(sched) < mbs) or (spec.max_concurrency is not None and spec.max_concurrency < mbs):
            raise ValueError(
                f"with guided_decoding_backend {self.guided_decoding_backend!r} the draft length must not reach 0 "
                f"(TensorRT-LLM #15022): no K=0 in draft_len_schedule, largest key / max_concurrency at least max_batch_size {mbs}"
            )
        return self

    @model_validator(mode="after")
    def _no_pp_with_spec(self) -> LlmApiOptions:
        if self.pipeline_parallel_size > 1:
            raise ValueError("pipeline parallelism is not supported with speculative decoding in TensorRT-LLM")
        return self

    @model_validator(mode="after")
    def _ep_divides_tp(self) -> LlmApiOptions:
        if self.moe_expert_parallel_size is not None and self.tensor_parallel_size % self.moe_expert_parallel_size:
            raise ValueError("moe_expert_parallel_size must divide tensor_parallel_size (TensorRT-LLM: moe_tp x moe_ep = tp)")
        return self

    def to_yaml_dict(self) -> dict:
        d = self.model_dump(mode="json", exclude_none=True)
        # JSON mode turns int dict keys into strings; draft_len_schedule is dict[int, int].
        sched = d.get("speculative_config", {}).get("draft_len_schedule")
        if sched is not None:
            d["speculative_config"]["draft_len_schedule"] = {int(k): v for k, v in sched.items()}
        return d


def validate_options(raw: dict[str, Any], where: Path | str) -> LlmApiOptions:
    """``raw`` as LlmApiOptions, or a one-line UserError naming ``where`` and the first bad field."""
    try:
        return LlmApiOptions.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        hint = "see build/llm_options.py for the fields the bundle may set"
        if err["type"] == "extra_forbidden":
            hint = "the bundle schema allows only the options it knows; put experiments in overrides"
        raise UserError(f"{where}:{loc}", err["msg"], hint) from None
