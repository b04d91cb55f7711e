"""The suffix-automaton enhancer's cost-model hook: the chain's iteration (speculative/eagle3/cost.py).

TensorRT-LLM's enhancer (``sa_config``) keeps the EAGLE-3 chain's forwards and only replaces draft
tokens with a suffix match found by the automaton it updates per request (speculative/sa/automaton.py
cites the source); that lookup is not a model forward, and the cost model prices forwards only, so
an SA iteration is priced as the chain's (measure/dynamic_tree_choice.py ``mode_speedups`` does the same).
"""

from __future__ import annotations

from eagle3_trt.speculative.eagle3.cost import step_seconds

__all__ = ["step_seconds"]
