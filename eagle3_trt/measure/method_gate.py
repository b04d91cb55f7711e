"""The acceptance-rate switch-off for the method ``recommend`` chooses: the chain, the chain with the
suffix automaton, the dynamic tree, or a method no TensorRT-LLM release serves.

How TensorRT-LLM counts an iteration (NVIDIA/TensorRT-LLM main @0004396720054fd8,
``tensorrt_llm/_torch/speculative/speculation_gate.py`` ``SpeculationGate.record_acceptance_rate`` and
``tensorrt_llm/_torch/pyexecutor/py_executor.py``; PR #12905): the gate lives in the executor, not in a
drafter, so it runs for every one-model EAGLE-3 configuration, ``use_dynamic_tree`` and ``sa_config``
included. Each iteration whose rows drafted gives one sample, accepted / drafted tokens over those rows
(core/speculation_control.py). A tree row carries ``max_total_draft_tokens`` draft tokens, but the
executor counts a tree's drafted tokens as its path length: ``PyExecutor._accumulate_spec_dec_stats``
clamps them to ``max_draft_len`` ("the acceptance-rate denominator counts paths, not trees", mirroring
the C++ ``LlmRequest::updateNumTokensPerIteration``). So a dynamic-tree iteration counts as
accepted / K, K the tree's depth, as a chain iteration does; a suffix-automaton iteration replaces the
chain's drafts and still drafts K per row. The reference runtime feeds its gate the same way
(core/engine.py records a tree verification as K drafted).

So each method's gate is computed alike (measure/gate_replay.py ``choose_gate``): threshold = the
break-even acceptance at K and the concurrency through the method's own cost hook
(speculative/<method>/cost.py: a tree's iteration costs its verified nodes and its expansion),
break_even_alpha(K, overhead) with overhead = T_iter / T_base - 1; window = the smallest whose replays
of that method's measured requests (``alpha --modes``: each turn's accepted drafts per verification)
switch speculation off in at most 1% of them. A method served by another engine (a class with
``no_switch_off``: the reason, one line) gets no gate.
"""

from __future__ import annotations

from types import SimpleNamespace

from eagle3_trt.formats.alpha_report import AlphaReport
from eagle3_trt.measure.cost_model import Recommendation, break_even_alpha, model_costs, predict_from_tokens
from eagle3_trt.measure.gate_replay import GateChoice, choose_gate
from eagle3_trt.speculative.registry import method_class


def no_gate_reason(method: str) -> str | None:
    """Why no acceptance-rate switch-off applies to ``method`` (a registry name), None when TensorRT-LLM's does."""
    reason: str | None = getattr(method_class(method), "no_switch_off", None)
    return reason


def none_applies(method: str, k: int, concurrency: int, reason: str) -> GateChoice:
    """The one-line decision for a method no switch-off applies to (``GateChoice.line`` says it)."""
    return GateChoice(None, 0.0, None, {"reason": reason, "k": k, "concurrency": concurrency, "requests": 0, "method": method, "applies": False})


def mode_gate(mode: str, rec: Recommendation, report: AlphaReport, costs: dict, k: int) -> GateChoice:
    """The gate of ``alpha --modes`` mode ``mode`` when it wins at depth/draft length ``k``: threshold at its
    break-even acceptance (its cost hook at the concurrency ``rec`` was chosen for), window from replays of
    its measured turns (module docstring)."""
    conc = int(rec.evidence.get("chosen_at_concurrency", 1))
    entry = (report.modes or {})[mode]
    gpu, tp, tcost, dcost = model_costs(costs)
    tree = entry.dynamic_tree
    shape = (
        SimpleNamespace(dynamic_tree_max_topK=tree.dynamic_tree_max_topK, max_total_draft_tokens=tree.max_total_draft_tokens, max_draft_len=k)
        if tree is not None
        else costs.get("options")
    )
    pred = predict_from_tokens(entry.overall.acceptance_length, gpu, tcost, dcost, tp, conc, k, method=mode, options=shape)
    threshold = round(min(1.0, max(0.0, break_even_alpha(k, pred.overhead))), 4)
    seqs = [list(s) for s in entry.accepted_seqs or []]
    if not seqs:
        reason = f"the alpha report holds no per-verification acceptance of mode {mode} (measure it again with this version: alpha --modes ...,{mode})"
        return GateChoice(None, threshold, None, {"reason": reason, "k": k, "concurrency": conc, "requests": 0, "method": mode})
    choice = choose_gate(seqs, k, threshold, conc)
    choice.evidence.update(method=mode, overhead=round(pred.overhead, 4))
    return choice


__all__ = ["mode_gate", "no_gate_reason", "none_applies"]
