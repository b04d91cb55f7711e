"""The one table of speculation methods: name -> method class (see speculative/__init__.py).

The names are the ones ``alpha --modes`` measures and reports use."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from eagle3_trt.core.method_api import SpeculationMethod
from eagle3_trt.errors import UserError
from eagle3_trt.speculative.dynamic_tree.method import DynamicTreeMethod
from eagle3_trt.speculative.eagle3.method import Eagle3Chain
from eagle3_trt.speculative.peagle.method import PEagleMethod
from eagle3_trt.speculative.sa.method import SuffixAutomatonMethod


class RegisteredMethod(Protocol):
    """A method class as the registry holds it."""

    name: str

    @classmethod
    def from_options(cls, spec: Any, at_bundle_k: bool) -> SpeculationMethod | None:
        """The method a bundle's ``speculative_config`` serves, or None when they do not select it.
        ``at_bundle_k``: the engine runs at the bundle's own K (not an ``--max-draft-len`` override)."""
        ...

    # the cost model's hook (speculative/<method>/cost.py ``step_seconds``): seconds of one speculative
    # iteration, called as (target_forward_s, draft_forward_s, batch, expected_tokens, k, options) where
    # ``target_forward_s(tokens)`` / ``draft_forward_s(tokens)`` time one forward over that many tokens
    step_seconds: Callable[..., float]


# name -> method class. Adding a method: one line here (its home: speculative/<method>/).
METHODS: dict[str, type[RegisteredMethod]] = {
    Eagle3Chain.name: Eagle3Chain,
    SuffixAutomatonMethod.name: SuffixAutomatonMethod,
    DynamicTreeMethod.name: DynamicTreeMethod,
    PEagleMethod.name: PEagleMethod,
}

DEFAULT_METHOD = Eagle3Chain.name


def method_class(name: str) -> type[RegisteredMethod]:
    """The class registered under ``name``, or a one-line UserError listing the known ones."""
    try:
        return METHODS[name]
    except KeyError:
        raise UserError("method", f"unknown speculation method {name!r}", f"use one of {', '.join(METHODS)}") from None


def method_for_head(raw: dict[str, Any]) -> type[RegisteredMethod] | None:
    """The method whose own head format a draft's config.json is (its class's ``head`` hooks claim it),
    or None: an EAGLE-3 head, served by the chain and the methods built on it (convert/draft_format.py
    reads it). A method with its own head format sets ``head`` on its class; the loader,
    validation, bundle build and launchers then handle it through those hooks, not by name."""
    for cls in METHODS.values():
        head = getattr(cls, "head", None)
        if head is not None and head.claims(raw):
            return cls
    return None


def trainable_methods() -> dict[str, Any]:
    """``train-draft --method`` choices: the default chain (an EAGLE-3 head, train/'s TTT) and every
    method whose class has ``training`` hooks (its own objective, speculative/<method>/training.py)."""
    return {DEFAULT_METHOD: None, **{name: t for name, cls in METHODS.items() if (t := getattr(cls, "training", None)) is not None}}


def method_from_options(spec: Any, *, at_bundle_k: bool = True) -> SpeculationMethod | None:
    """The method a bundle's ``speculative_config`` selects (None: the engine's own EAGLE-3 chain or
    static tree). Every non-default method is asked; options that select two are refused (the
    options schema refuses them first, e.g. use_dynamic_tree with sa_config)."""
    chosen = [(name, m) for name, cls in METHODS.items() if name != DEFAULT_METHOD and (m := cls.from_options(spec, at_bundle_k)) is not None]
    if len(chosen) > 1:
        names = " and ".join(n for n, _ in chosen)
        raise UserError("speculative_config", f"the options select two speculation methods ({names})", "keep one")
    return chosen[0][1] if chosen else None


def step_cost(name: str) -> Callable[..., float]:
    """The cost hook of the method registered under ``name`` (``RegisteredMethod.step_seconds``): what
    measure/cost_model.py prices an iteration with, so no method's cost is hard-coded there."""
    return method_class(name).step_seconds
