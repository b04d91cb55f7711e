"""The interface between the decoding loop (core/engine.py) and a speculation method.

The loop owns what every method shares: the prefill, ONE verification forward per step over
[root, draft nodes], acceptance (core/verify.py) and the KV rollback. A method decides what is
drafted and what happens around verification. It is handed to the engine (``SpeculativeEngine(...,
method=...)`` or ``engine.using(method)``) — dependency injection: core never imports the methods,
which live one per home under ``eagle3_trt/speculative/`` and are named in its registry.

This mirrors TensorRT-LLM's ``_torch/speculative/`` (interface.py ``SpeculativeDecodingMode`` and
``SpecMetadata``, utils.py ``get_spec_worker`` / ``get_spec_drafter``: the model engine calls one
worker interface; the mode picks the worker) @ the revision cited in speculative/__init__.py.

``None`` as the engine's method is TensorRT-LLM's one-model EAGLE-3 drafting (core/drafting.py):
the chain, or a static tree when ``tree`` is given. It is the base every EAGLE-family method
drafts with, so it stays in core.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from eagle3_trt.core.draft import Eagle3Draft
from eagle3_trt.core.drafting import Drafter
from eagle3_trt.core.requests import BatchState, Row
from eagle3_trt.core.sampling import SamplingParams
from eagle3_trt.core.spec_sampling import SpecSamplingConfig
from eagle3_trt.core.target import TargetModel
from eagle3_trt.core.tree import DraftTree


class DraftingEngine(Protocol):
    """What a method reads of the engine (core/engine.py ``SpeculativeEngine``)."""

    target: TargetModel
    draft: Eagle3Draft | None
    max_draft_len: int

    def drafter(self, greedy_draft: bool = False) -> Drafter:
        """The EAGLE-3 drafter over the engine's draft (core/drafting.py)."""
        ...

    def spec_sampling(self) -> SpecSamplingConfig:
        """The speculative sampling flags served now."""
        ...


@dataclass
class Drafted:
    """One step's drafts: node target ids [B, T] on CPU; per row per node the draft distribution
    over target ids (rejection sampling) or None; per row its tree (None: the engine's tree)."""

    node_tok: torch.Tensor
    q_full: list[list[torch.Tensor | None]]
    row_trees: list[DraftTree | None] | None = None


class MethodRun(Protocol):
    """A method's state over one decoding run (one batch, prefill to the last token)."""

    # verification matches the target's samples instead of rejection sampling (the dynamic tree's
    # target-only rejection kernel: core/verify.py)
    match_samples: bool

    def draft(self, engine: DraftingEngine, rows: list[Row], st: BatchState, tree: DraftTree, k_eff: list[int], active: list[bool]) -> Drafted:
        """This step's drafts; ``tree`` is the run's shape (chain / static tree / depth bound)."""
        ...

    def tree_valid(self, first: bool) -> bool:
        """Whether verification may accept drafts; ``first``: the rows' first decode after prefill."""
        ...

    def after_verify(self, gen: Sequence[int], accepted: Mapping[int, Sequence[int]]) -> None:
        """After verification: ``gen`` the rows that decoded (batch order), ``accepted[b]`` their tokens."""
        ...


@runtime_checkable
class SpeculationMethod(Protocol):
    """What the decoding loop calls. Implementations: eagle3_trt/speculative/<method>/, one
    registry line each (speculative/registry.py)."""

    name: str  # the registry key

    def served_sampling(self, flags: SpecSamplingConfig) -> SpecSamplingConfig:
        """The speculative sampling flags as served with this method (e.g. sa_config turns
        use_rejection_sampling off)."""
        ...

    def start(self, engine: DraftingEngine, rows: list[Row], tree: DraftTree, tree_spec: Any, params: SamplingParams) -> MethodRun:
        """Begin a run (before the prefill); a one-line UserError when the method refuses it."""
        ...
