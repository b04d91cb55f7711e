"""Predicting what speculation buys: speedup per draft length K and batch size, and a recommendation.

Model (a roofline per forward pass, per GPU of a TP group):

    t(model, n tokens, kv bytes) = max(weight bytes + kv bytes) / (BW * bw_eff),
                                       2 * params * n / (peak FLOPS * flops_eff))
                                   + fixed step overhead + TP all-reduces

- Without speculation every sequence of a batch of b gets one token per target forward:
  T_base(b) = t(target, b tokens, b * ctx KV).
- With a chain of K draft tokens an iteration costs one target forward over b*(K+1) tokens
  (same weights and KV read, K+1 times the FLOPs) plus K draft forwards, and yields
  E_K = 1 + sum_{k<K} c_k tokens per sequence, c_k = P(first k+1 drafts accepted) (cumulative
  per-position acceptance). With every iteration drafting K, alpha = accepted / drafted gives
  E_K = 1 + K * alpha_K, alpha_K = mean(c_0 .. c_{K-1}); measured runs deviate slightly because
  drafts near max_tokens are shorter (``alpha --sweep`` prints measured and predicted E_K).
- Speedup S(K, b) = E_K * T_base(b) / T_spec(K, b).

Special case (tested): memory-bound and no fixed costs, T_spec / T_base = 1 + overhead with
overhead = K * draft bytes / target bytes, so S = (1 + K * alpha) / (1 + overhead) and the
break-even alpha (S = 1) is overhead / K. At larger batches the target's verification becomes
compute-bound, T_spec grows ~(K+1)x, and speculation stops paying: the model finds that batch
size, which becomes TensorRT-LLM's ``max_concurrency``.

Mixture-of-experts targets (gpt-oss): a forward reads the dense part and only the experts its tokens
route to. With E experts of which each token picks a, n tokens touch on average
E * (1 - (1 - a/E)^n) experts (uniform routing), so the expert bytes read grow with the tokens of a
verification forward while its FLOPs grow with a/E of the expert parameters: speculation's extra
tokens cost more memory traffic on a MoE target than on a dense one, at small batches most of all.

It is an estimate from data-sheet peaks and assumed efficiencies (``CostParams``), good for
choosing K and an order of magnitude for the concurrency cut-off, not for absolute latency.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from eagle3_trt.errors import UserError
from eagle3_trt.pipeline.gpus import get_gpu
from eagle3_trt.speculative.registry import DEFAULT_METHOD, step_cost

# NVFP4: 4 bits + E4M3 scale per 16; MXFP4 (gpt-oss experts as shipped, --quant native): 4 bits + E8M0 scale per 32
BYTES_PER_PARAM = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "nvfp4": 4.5 / 8, "mxfp4": 4.25 / 8}
DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class CostParams:
    bw_efficiency: float = 0.8  # achieved / peak HBM bandwidth in decode GEMMs
    flops_efficiency: float = 0.6  # achieved / peak dense tensor throughput
    target_step_overhead_us: float = 30.0  # per target forward: launch (CUDA graph), sampling, scheduling
    draft_step_overhead_us: float = 10.0  # per draft forward
    allreduce_latency_us: float = 6.0  # per all-reduce when TP > 1 (two per decoder layer)
    context_len: int = 1024  # tokens of KV read per sequence per step

    def __post_init__(self) -> None:
        if not (0 < self.bw_efficiency <= 1 and 0 < self.flops_efficiency <= 1):
            raise UserError("cost model", "efficiencies must be in (0, 1]", "use the defaults unless you measured them")


@dataclass(frozen=True)
class ModelCost:
    """What one forward of a model costs to run: bytes read and FLOPs per token, per GPU."""

    weight_bytes: float  # per GPU
    params: float  # per GPU (for FLOPs)
    peak_tflops: float  # dense, at the model's format
    kv_bytes_per_token: float = 0.0  # per GPU, read for every context token of every sequence
    layers: int = 0  # for TP all-reduces
    hidden: int = 0
    # MoE: the experts' share of weight_bytes and params (per GPU), E experts, a per token (0: dense)
    expert_bytes: float = 0.0
    expert_params: float = 0.0
    experts: int = 0
    active_experts: int = 0

    def touched(self, tokens: float) -> float:
        """Expected fraction of the experts that ``tokens`` tokens route to (uniform routing; 1 for a dense model)."""
        if not self.experts:
            return 1.0
        return 1.0 - (1.0 - self.active_experts / self.experts) ** max(tokens, 0.0)


def peak_tflops(gpu, fmt: str) -> float:
    """Dense peak at a weight format, falling back to the next wider format the GPU has. MXFP4 experts
    run with BF16 activations on Hopper (W4A16) and MXFP8 activations on Blackwell (TensorRT-LLM's gpt-oss
    deployment guide's table), i.e. at the BF16 or the FP8 rate."""
    if fmt == "mxfp4":
        return float(gpu.fp8_tflops if gpu.fp4_tflops and gpu.fp8_tflops else gpu.bf16_tflops)
    if fmt == "nvfp4" and gpu.fp4_tflops:
        return float(gpu.fp4_tflops)
    if fmt in ("nvfp4", "fp8") and gpu.fp8_tflops:
        return float(gpu.fp8_tflops)
    return float(gpu.bf16_tflops)


def forward_time_s(m: ModelCost, gpu, tokens: float, kv_tokens: float, tp: int, p: CostParams, overhead_us: float) -> tuple[float, str]:
    """(seconds, 'memory' | 'compute') of one forward over ``tokens`` tokens reading ``kv_tokens`` KV entries."""
    weights = m.weight_bytes - m.expert_bytes * (1.0 - m.touched(tokens))  # MoE: only the experts routed to
    flop_params = m.params - m.expert_params * (1.0 - (m.active_experts / m.experts if m.experts else 1.0))
    t_mem = (weights + m.kv_bytes_per_token * kv_tokens) / (gpu.bandwidth_tbs * 1e12 * p.bw_efficiency)
    t_flop = 2.0 * flop_params * tokens / (m.peak_tflops * 1e12 * p.flops_efficiency)
    t = max(t_mem, t_flop) + overhead_us * 1e-6
    if tp > 1 and m.layers:
        act = 2 * m.hidden * tokens * 2 * (tp - 1) / tp  # bf16 activations, ring all-reduce volume
        t += 2 * m.layers * (p.allreduce_latency_us * 1e-6 + act / (gpu.nvlink_gbs * 1e9))
    return t, ("compute" if t_flop > t_mem else "memory")


def expected_tokens(cumulative: list[float], k: int) -> float:
    """E_K = 1 + sum of the first K cumulative acceptances (tokens per target forward)."""
    if k > len(cumulative):
        raise UserError("cost model", f"K={k} but acceptance was measured for {len(cumulative)} positions", "measure with a larger --max-draft-len")
    return 1.0 + float(sum(cumulative[:k]))


def alpha_at(cumulative: list[float], k: int) -> float:
    return (expected_tokens(cumulative, k) - 1.0) / k if k else 0.0


def simple_speedup(alpha: float, k: int, overhead: float) -> float:
    """S = (1 + K * alpha) / (1 + overhead): the memory-bound, no-fixed-cost form."""
    return (1.0 + k * alpha) / (1.0 + overhead)


def break_even_alpha(k: int, overhead: float) -> float:
    """alpha at which speculation neither helps nor hurts in the simple form."""
    return overhead / k


@dataclass(frozen=True)
class Prediction:
    k: int
    batch: int
    speedup: float
    tokens_per_iteration: float
    alpha: float
    t_base_us: float
    t_spec_us: float
    overhead: float  # T_spec / T_base - 1
    bound: str  # whether the verification forward is memory- or compute-bound

    def to_dict(self) -> dict:
        return asdict(self)


def predict(
    cumulative: list[float],
    gpu,
    target: ModelCost,
    draft: ModelCost,
    tp: int,
    batch: int,
    k: int,
    params: CostParams = CostParams(),
    *,
    method: str = DEFAULT_METHOD,
    options=None,
) -> Prediction:
    """The prediction at (batch, K) from a measured cumulative acceptance, for ``method`` (a registry
    name: its iteration is priced by the method's own hook, ``predict_from_tokens``)."""
    if k == 0:
        return predict_from_tokens(1.0, gpu, target, draft, tp, batch, 0, params)
    return predict_from_tokens(expected_tokens(cumulative, k), gpu, target, draft, tp, batch, k, params, method=method, options=options)


def predict_from_tokens(
    e: float,
    gpu,
    target: ModelCost,
    draft: ModelCost,
    tp: int,
    batch: int,
    k: int,
    params: CostParams = CostParams(),
    *,
    method: str = DEFAULT_METHOD,
    options=None,
) -> Prediction:
    """The prediction at (batch, K) when each iteration yields ``e`` tokens per sequence (E_K, or a
    measured AL). One iteration's time is the method's hook (``registry.step_cost(method)``,
    speculative/<method>/cost.py: the chain's K sequential draft forwards, a parallel drafter's one, the
    dynamic tree's expansion; ``options``: the bundle's speculative_config, read by hooks that need
    it) over this roofline's forward times."""
    ctx = params.context_len
    t_base, _ = forward_time_s(target, gpu, batch, batch * ctx, tp, params, params.target_step_overhead_us)
    if k == 0:
        return Prediction(0, batch, 1.0, 1.0, 0.0, t_base * 1e6, t_base * 1e6, 0.0, "memory")
    bounds: list[str] = []

    def target_s(tokens: float) -> float:
        t, bound = forward_time_s(target, gpu, tokens, batch * ctx, tp, params, params.target_step_overhead_us)
        bounds.append(bound)  # the verification forward's: memory- or compute-bound
        return t

    def draft_s(tokens: float) -> float:
        return forward_time_s(draft, gpu, tokens, batch * ctx, tp, params, params.draft_step_overhead_us)[0]

    t_spec = step_cost(method)(target_s, draft_s, batch, e, k, options)
    return Prediction(k, batch, e * t_base / t_spec, e, (e - 1.0) / k, t_base * 1e6, t_spec * 1e6, t_spec / t_base - 1.0, bounds[0] if bounds else "memory")


@dataclass
class Recommendation:
    max_draft_len: int
    max_concurrency: int  # speculation off above this batch size; 0 = it never pays
    table: list[dict]
    evidence: dict = field(default_factory=dict)
    cumulative_acceptance: list[float] = field(default_factory=list)  # the measurement the chosen K was predicted from

    @property
    def speculation_pays(self) -> bool:
        return self.max_concurrency > 0

    def to_dict(self) -> dict:
        return {
            "max_draft_len": self.max_draft_len,
            "max_concurrency": self.max_concurrency,
            "cumulative_acceptance": self.cumulative_acceptance,
            "table": self.table,
            "evidence": self.evidence,
        }


def model_cost(
    weight_bytes: float,
    fmt: str,
    gpu,
    tp: int,
    *,
    params: float | None = None,
    kv_bytes_per_token: float = 0.0,
    layers: int = 0,
    hidden: int = 0,
    moe: dict | None = None,
) -> ModelCost:
    """Whole-model figures split over ``tp``. ``moe``: {"expert_bytes", "expert_params", "experts",
    "active_experts"} of a MoE target (whole model; the expert bytes and params are inside the totals)."""
    if fmt not in BYTES_PER_PARAM:
        raise UserError("cost model", f"unknown weight format {fmt!r}", f"use one of {', '.join(BYTES_PER_PARAM)}")
    n = params if params is not None else weight_bytes / BYTES_PER_PARAM[fmt]
    m = moe or {}
    return ModelCost(
        weight_bytes / tp,
        n / tp,
        peak_tflops(gpu, fmt),
        kv_bytes_per_token / tp,
        layers,
        hidden,
        m.get("expert_bytes", 0.0) / tp,
        m.get("expert_params", 0.0) / tp,
        int(m.get("experts", 0)),
        int(m.get("active_experts", 0)),
    )


def model_costs(c: dict) -> tuple:
    """(gpu, tp, target ModelCost, draft ModelCost) from ``recommend``'s keyword inputs
    (measure/bundle_costs.py ``bundle_cost_inputs``: whole-model figures, split over TP here)."""
    gpu = get_gpu(c["gpu"]) if isinstance(c["gpu"], str) else c["gpu"]
    tp = int(c.get("tp", 1))
    tcost = model_cost(
        c["target_bytes"],
        c.get("target_format", "fp8"),
        gpu,
        tp,
        kv_bytes_per_token=c.get("target_kv_bytes_per_token", 0.0),
        layers=c.get("target_layers", 0),
        hidden=c.get("hidden", 0),
        params=c.get("target_params"),
        moe=c.get("target_moe"),
    )
    dcost = model_cost(c["draft_bytes"], c.get("draft_format", "bf16"), gpu, tp, kv_bytes_per_token=c.get("draft_kv_bytes_per_token", 0.0))
    return gpu, tp, tcost, dcost


def _curve(c, where: str) -> list[float]:
    c = [float(x) for x in c]
    if not c:
        raise UserError(where, "no per-position acceptance measured", "run `eagle3-trt alpha` with K >= 1 first")
    if any(not 0 <= x <= 1 for x in c) or any(b > a + 1e-12 for a, b in zip(c, c[1:])):
        raise UserError(
            where,
            f"per-position acceptance {c} is not a non-increasing list of probabilities",
            "pass AggregateStats.cumulative_acceptance (products of the conditional acceptances)",
        )
    return c


def curves_by_k(per_position_acceptance, measured_by_k=None, max_k: int | None = None) -> dict[int, list[float]]:
    """For every candidate K (1..the largest measured, at most ``max_k``): the cumulative acceptance
    K is predicted from. A K that was measured (``measured_by_k``: K -> the curve measured at that
    K, as ``alpha --sweep`` records it) uses its own measurement; any other K the measurement of
    the next larger measured K (the first K positions of a chain do not depend on the drafts after them)."""
    curves = {len(c): c for c in [_curve(per_position_acceptance, "cost model")]}
    for k, c in sorted((measured_by_k or {}).items()):
        c = _curve(c, f"cost model (K={k})")
        if len(c) >= int(k):
            curves[int(k)] = c
        else:  # runs too short to ever draft K tokens: only the positions that were drafted are measured
            curves.setdefault(len(c), c)
    top = max(curves)
    if max_k is not None:
        if max_k > top:
            raise UserError("--max-draft-len", f"K={max_k} was not measured (largest measured K: {top})", f"measure it: eagle3-trt alpha --sweep 1-{max_k}")
        top = max_k
    return {k: curves[min(m for m in curves if m >= k)] for k in range(1, top + 1)}


def recommend(
    per_position_acceptance: list[float],
    gpu,
    target_bytes: float,
    draft_bytes: float,
    tp: int = 1,
    *,
    target_format: str = "fp8",
    draft_format: str = "bf16",
    target_kv_bytes_per_token: float = 0.0,
    draft_kv_bytes_per_token: float = 0.0,
    target_layers: int = 0,
    hidden: int = 0,
    concurrency: int = 1,
    batches=DEFAULT_BATCHES,
    min_speedup: float = 1.0,
    params: CostParams = CostParams(),
    measured_by_k: dict[int, list[float]] | None = None,
    max_k: int | None = None,
    target_params: float | None = None,
    target_moe: dict | None = None,
    method: str = DEFAULT_METHOD,
    options=None,
) -> Recommendation:
    """Best K at ``concurrency`` and the largest batch size up to which that K still pays.

    ``per_position_acceptance``: cumulative acceptance c_k = P(first k+1 drafts accepted), as
    measured (``AggregateStats.cumulative_acceptance``); K is chosen among 1..len(c), or, with
    ``measured_by_k`` (the curve measured at each K of an ``alpha --sweep``), among 1..the largest
    measured K, each K predicted from its own measurement (``curves_by_k``); ``max_k`` caps K.
    ``gpu``: a ``build.gpus.GpuSpec`` or its name. Byte counts are whole-model (split over TP here);
    KV bytes per token are whole-model too. ``target_params`` (else bytes / bytes per parameter) and
    ``target_moe`` (``model_cost``'s ``moe``) describe a MoE target. ``method``: the registry name of
    the method the bundle serves (its cost hook prices each K: ``predict_from_tokens``), ``options``
    its speculative_config.
    """
    if isinstance(gpu, str):
        gpu = get_gpu(gpu)
    curves = curves_by_k(per_position_acceptance, measured_by_k, max_k)
    if tp < 1:
        raise UserError("cost model", f"tp={tp}", "tensor parallelism is at least 1")
    tcost = model_cost(
        target_bytes,
        target_format,
        gpu,
        tp,
        kv_bytes_per_token=target_kv_bytes_per_token,
        layers=target_layers,
        hidden=hidden,
        params=target_params,
        moe=target_moe,
    )
    dcost = model_cost(draft_bytes, draft_format, gpu, tp, kv_bytes_per_token=draft_kv_bytes_per_token)
    batches = sorted(set(int(b) for b in batches) | {int(concurrency)})
    ch = _Choice.make(
        curves, batches, concurrency, min_speedup, lambda b, k: predict(curves[k], gpu, tcost, dcost, tp, b, k, params, method=method, options=options)
    )
    target = {
        "bytes": target_bytes,
        "format": target_format,
        "kv_bytes_per_token": target_kv_bytes_per_token,
        **({"moe": dict(target_moe)} if target_moe else {}),
    }
    draft = {"bytes": draft_bytes, "format": draft_format, "kv_bytes_per_token": draft_kv_bytes_per_token}
    evidence = _cost_evidence(gpu, tcost, dcost, tp, target, draft, params) | ch.evidence(curves, concurrency, min_speedup) | {"method": method}
    return Recommendation(ch.best_k, ch.max_concurrency, [p.to_dict() for p in ch.grid.values()], evidence, curves[ch.best_k])


@dataclass
class _Choice:
    """The prediction grid over (batch, K) and what ``recommend`` chooses from it."""

    batches: list[int]
    grid: dict[tuple[int, int], Prediction]
    best_k: int
    max_concurrency: int
    first_bad: int | None  # the first grid batch size at which best_k stops paying
    schedule: dict[int, int]  # batch size -> its best K, where speculation pays

    @classmethod
    def make(cls, curves: dict[int, list[float]], batches: list[int], concurrency: int, min_speedup: float, at) -> _Choice:
        """``at(batch, k)``: the Prediction for one grid point."""
        ks = range(1, max(curves) + 1)
        grid = {(b, k): at(b, k) for b in batches for k in ks}
        best_k = max(ks, key=lambda k: (grid[(concurrency, k)].speedup, -k))
        mc, first_bad = 0, None
        for b in batches:
            if grid[(b, best_k)].speedup >= min_speedup:
                mc = b
            else:
                first_bad = b
                break
        if mc and first_bad is not None:  # refine the crossover between two grid points (S falls with b)
            lo, hi = mc, first_bad
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if at(mid, best_k).speedup >= min_speedup:
                    lo = mid
                else:
                    hi = mid
            mc = lo
        schedule = {}
        for b in batches:
            kb = max(ks, key=lambda k: (grid[(b, k)].speedup, -k))
            if grid[(b, kb)].speedup >= min_speedup:
                schedule[b] = kb
        return cls(batches, grid, best_k, mc, first_bad, schedule)

    def evidence(self, curves: dict[int, list[float]], concurrency: int, min_speedup: float) -> dict:
        grid, b1, ks = self.grid, self.batches[0], range(1, max(curves) + 1)
        return {
            "cumulative_acceptance": curves[max(curves)],
            "measured_k": sorted({len(v) for v in curves.values()}),
            "alpha_by_k": {k: alpha_at(curves[k], k) for k in ks},
            "expected_tokens_by_k": {k: expected_tokens(curves[k], k) for k in ks},
            "break_even_alpha_by_k_at_batch_1": {k: break_even_alpha(k, grid[(b1, k)].overhead) for k in ks},
            "chosen_at_concurrency": concurrency,
            "speedup_at_concurrency": grid[(concurrency, self.best_k)].speedup,
            "speedup_at_batch_1": grid[(b1, self.best_k)].speedup,
            "min_speedup": min_speedup,
            "draft_len_schedule": self.schedule,
            "max_concurrency_is_lower_bound": self.first_bad is None and self.max_concurrency > 0,
        }


def _cost_evidence(gpu, tcost: ModelCost, dcost: ModelCost, tp: int, target: dict, draft: dict, params: CostParams) -> dict:
    """What the prediction assumed: the cost model, the GPU, the parallelism, the two models."""
    return {
        "model": "roofline per forward (see eagle3_trt.measure.cost_model)",
        "gpu": {
            "name": gpu.name,
            "bandwidth_tbs": gpu.bandwidth_tbs,
            "peak_tflops_target": tcost.peak_tflops,
            "peak_tflops_draft": dcost.peak_tflops,
            "nvlink_gbs": gpu.nvlink_gbs,
        },
        "tp": tp,
        "target": target,
        "draft": draft,
        "params": asdict(params),
    }


# ---------------------------------------------------------------------------------------------
# TensorRT-LLM's per-batch draft length and acceptance gate, from a Recommendation


def draft_len_schedule(rec: Recommendation) -> dict[int, int]:
    """``draft_len_schedule`` for TensorRT-LLM (1.3+ form: key = largest batch size using that K,
    no speculation above the largest key; NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py after
    PR #10860) from the prediction grid: at each grid batch size up to ``rec.max_concurrency``, the
    K with the best predicted speedup, capped at the chosen max_draft_len (TensorRT-LLM requires the
    smallest key to map to it and no value above it), then made non-increasing with batch size (a
    running minimum: a K that rose with batch would mean the grid is noisy, not that drafting
    more got cheaper), and ``max_concurrency`` itself as the last key so the schedule stops where
    ``recommend`` found speculation stops paying. Every grid batch size is a key, batch 1 included,
    which releases before #10860 require.
    """
    if not rec.speculation_pays:
        return {}
    best: dict[int, tuple[float, int]] = {}
    for row in rec.table:
        b, k, s = int(row["batch"]), int(row["k"]), float(row["speedup"])
        if b <= rec.max_concurrency and k <= rec.max_draft_len and (b not in best or (s, -k) > (best[b][0], -best[b][1])):
            best[b] = (s, k)
    out: dict[int, int] = {}
    k_prev = rec.max_draft_len
    for b in sorted(best):
        # the smallest batch size maps to max_draft_len whatever its own best K (TensorRT-LLM's rule)
        k_prev = rec.max_draft_len if not out else min(k_prev, best[b][1])
        out[b] = k_prev
    out[rec.max_concurrency] = min(k_prev, out.get(rec.max_concurrency, k_prev))
    return out


def acceptance_gate(rec: Recommendation) -> tuple[float, dict]:
    """``acceptance_rate_threshold`` for TensorRT-LLM's speculation gate, and how it was derived.

    TensorRT-LLM (1.3+, PR #12905) switches speculation off for good once the rolling acceptance
    rate (accepted / drafted tokens) over ``acceptance_rate_window_size`` falls below the threshold.
    The right threshold is the break-even acceptance at the chosen K and the expected concurrency b
    (``recommend --concurrency``): with every iteration drafting K tokens at acceptance rate alpha,
    E_K = 1 + K * alpha tokens come out per iteration at cost T_spec, against one token per T_base
    without speculation, so S = (1 + K * alpha) * T_base / T_spec >= 1 exactly when
    alpha >= (T_spec / T_base - 1) / K = overhead / K = ``break_even_alpha(K, overhead)``, with
    overhead the cost model's prediction at (b, K). Below it speculation is slower than none, so
    turning it off is right; above it, it still pays. (T_spec's first draft step grows a little
    with E_K; at the break-even point that term is the one predicted, so the error is second order.)
    """
    conc = int(rec.evidence.get("chosen_at_concurrency", 1))
    rows = [r for r in rec.table if int(r["k"]) == rec.max_draft_len]
    row = min(rows, key=lambda r: (abs(int(r["batch"]) - conc), int(r["batch"])))
    thr = min(1.0, max(0.0, break_even_alpha(rec.max_draft_len, float(row["overhead"]))))
    return round(thr, 4), {
        "threshold": "break_even_alpha(K, overhead) = overhead / K at the chosen K and the expected concurrency",
        "k": rec.max_draft_len,
        "batch": int(row["batch"]),
        "overhead": float(row["overhead"]),
        "measured_alpha": float(row["alpha"]),
    }
