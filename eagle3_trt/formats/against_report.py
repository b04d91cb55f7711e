"""The ``against`` section of the alpha report: ``alpha BUNDLE --against OTHER`` (measure/against.py).

Two bundles of one target measured on the same prompts, turn by turn: per category both bundles'
AL, alpha and predicted speedup with the paired difference A - B and its bootstrap interval
(core/paired_ci.py), the method and K per concurrency (measure/method_choice.py), and which to deploy.
``formats/alpha_report.py`` holds it as ``AlphaReport.against``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AgainstBundle(_Strict):
    """One of the two bundles: its label in the tables, path, method (registry name), the K it was
    measured at, and its manifest fingerprint."""

    label: str
    path: str
    method: str
    k: int = Field(ge=1)
    fingerprint: str


class AgainstBundles(_Strict):
    a: AgainstBundle  # BUNDLE
    b: AgainstBundle  # OTHER


class PairedFigure(_Strict):
    """A figure of both bundles and A - B with its paired interval (core/paired_ci.PairedDiff.to_dict)."""

    a: float
    b: float
    diff: float
    ci: list[float] = Field(min_length=2, max_length=2)
    level: float
    n: int  # paired turns
    n_groups: int  # prompts resampled


class AgainstRow(_Strict):
    """One category (or "overall"): turns paired, prompts, and the three paired figures."""

    category: str
    turns: int
    prompts: int
    acceptance_length: PairedFigure
    alpha: PairedFigure
    predicted_speedup: PairedFigure  # at the section's concurrency, each bundle at its measured K


class BundleChoice(_Strict):
    k: int
    predicted_speedup: float


class ConcurrencyChoice(_Strict):
    """The (bundle, K) to deploy at one concurrency, or speculation off (``deploy`` None)."""

    concurrency: int
    deploy: str | None
    method: str | None
    k: int | None
    predicted_speedup: float
    by_bundle: dict[str, BundleChoice]  # label -> its best K here


class Verdict(_Strict):
    choice: Literal["a", "b"] | None  # None: speculation off
    label: str | None
    k: int | None
    beyond_noise: bool  # the measured speedup difference's interval excludes 0
    line: str  # as printed


class OtherFigures(_Strict):
    """The other bundle's aggregate figures (BUNDLE's are the report's own pairs.bundle)."""

    requests: int
    alpha: float
    acceptance_length: float
    generated_tokens: int
    target_forwards: int
    draft_tokens: int
    accepted_tokens: int
    cumulative_acceptance: list[float]


class OtherMeasurement(_Strict):
    label: str
    overall: OtherFigures
    by_category: dict[str, OtherFigures]
    seconds: float
    # K -> cumulative acceptance measured at K (its sweep): recommend --report rebuilds the method choice from it
    sweep: dict[int, list[float]] = Field(default_factory=dict)


class UnpairedTurns(_Strict):
    a: int
    b: int


class AgainstComparison(_Strict):
    """The whole section."""

    bundles: AgainstBundles
    concurrency: int
    gpu: str
    tp: int
    paired_by: str
    unpaired_turns: UnpairedTurns
    rows: list[AgainstRow]  # "overall" first, then each category
    per_concurrency: list[ConcurrencyChoice]
    other_measurement: OtherMeasurement
    deploy: Verdict
