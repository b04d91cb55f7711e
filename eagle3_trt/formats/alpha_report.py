"""The alpha report (``report.json``): its schema and its one reader.

``eagle3-trt alpha BUNDLE --prompts FILE`` writes an :class:`AlphaReport` (measure/alpha_run.py builds
it, measure/report_files.py writes it); ``alpha BUNDLE --traffic DIR`` writes a
:class:`TrafficAlphaReport` (measure/traffic_alpha.py). ``recommend --report``, ``recommend
--gate-traffic``, the summary, the plot and the choices (K, gate, sa, dynamic tree, sampling flags)
read them back through :func:`read_report` and use attributes, never string keys. Every model forbids
unknown fields, so a report from another version, or a hand-edited one, is refused in one line
naming the file and the field.

The JSON on disk keeps the keys the dict-built report had: :func:`report_json` dumps the fields the
writer set (``exclude_unset``), so a section a run did not measure stays absent.

Adding a section: a top-level section is ONE optional field on :class:`AlphaReport` (``None``
default; its model next to the others here, or in its own module of formats/ when it is large) that
the writer sets (``report.<section> = ...``; assignment validates, so a dict is accepted and checked);
a per-pair figure is one optional field on :class:`PairMeasurement`. Bump ``SCHEMA`` only when an
existing field changes meaning.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from eagle3_trt.errors import UserError
from eagle3_trt.formats.acceptance_by_context import AcceptanceByContext
from eagle3_trt.formats.against_report import AgainstComparison
from eagle3_trt.formats.validation import field_error

SCHEMA: Final = 1
KIND: Final = "eagle3-trt alpha report"
TRAFFIC_KIND: Final = "eagle3-trt alpha --traffic report"
REPORT_FILE: Final = "report.json"
HINT: Final = "pass the report.json written by `eagle3-trt alpha` (re-run it with this version if it is older)"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# --- the measurements of one pair (measure/acceptance.py Measurement.to_dict) ---


class Figures(_Strict):
    """Aggregate acceptance over some turns (core/stats.py AggregateStats.to_dict)."""

    requests: int
    alpha: float
    acceptance_length: float
    draft_tokens: int
    accepted_tokens: int
    target_forwards: int
    generated_tokens: int
    drafted_per_position: list[int]
    reached_per_position: list[int]
    accepted_per_position: list[int]
    cumulative_acceptance: list[float]
    conditional_acceptance: list[float]
    accept_hist: list[int]
    request_acceptance_length: list[float]
    wall_time_s: float


class TurnRecord(_Strict):
    """One measured turn (measure/acceptance.py TurnResult.to_dict)."""

    id: str
    category: str
    turn: int
    prompt_tokens: int
    generated_tokens: int
    draft_tokens: int
    accepted_tokens: int
    target_forwards: int
    alpha: float
    acceptance_length: float
    accepted_per_position: list[int]
    drafted_per_position: list[int]
    # draft tokens accepted per verification, in order, at the run's K and at each swept K (keyed "K")
    accepted_seq: list[int] = Field(default_factory=list)
    accepted_seq_by_k: dict[int, list[int]] = Field(default_factory=dict)


class SweepPoint(_Strict):
    """One K of ``alpha --sweep``: measured, beside the cost model's E_K from the largest K's curve."""

    alpha: float
    acceptance_length: float
    predicted_acceptance_length: float
    cumulative_acceptance: list[float]
    # the counts behind the figures (recommend --write records them); absent in reports written before them
    turns: int | None = None
    generated_tokens: int | None = None
    target_forwards: int | None = None


class PairMeasurement(_Strict):
    label: str
    overall: Figures
    by_category: dict[str, Figures]
    requests: list[TurnRecord]
    skipped: list[str]
    seconds: float
    chat_template: bool = True  # the tokenizer has a chat template
    raw_prompts: int = 0  # turns encoded as raw completion text
    sweep: dict[int, SweepPoint] | None = None  # K -> measured at K (keyed "K" on disk)
    # turns the prompts file (--limit, --turns) asked for, and how many of them were not measured (``skipped``
    # says why); absent in reports written before they were recorded
    requests_asked: int | None = None
    requests_skipped: int | None = None


class Pairs(_Strict):
    bundle: PairMeasurement
    reference: PairMeasurement | None = None


class Delta(_Strict):
    alpha: float
    acceptance_length: float
    cumulative_acceptance: list[float]


class Deltas(_Strict):
    """bundle - reference, overall and per category present in both (empty without a reference)."""

    overall: Delta | None = None
    by_category: dict[str, Delta] = Field(default_factory=dict)


class Diagnostic(_Strict):
    """One check of measure/diagnostics.py (what went wrong when alpha is low)."""

    check: str
    ok: bool
    detail: str
    info: bool = False  # informational: never a problem
    value: float | None = None
    per_position: list[float] | None = None
    oracle: float | None = None
    null_oracle: float | None = None
    cross_entropy: float | None = None
    alternatives: dict[str, dict[str, Any]] | None = None


class SpecSamplingRecord(_Strict):
    """The speculative-sampling flags a sampled run was served with (core/spec_sampling.py)."""

    use_rejection_sampling: bool
    allow_advanced_sampling: bool
    advanced_sampling_mode: str
    served: str


class Settings(_Strict):
    prompts: str
    records: int
    limit: int | None = None
    turns: str
    max_tokens: int
    max_draft_len: int
    method: str
    device: str
    decoding: str
    batch_size: int
    sweep: list[int]
    chat_template: str
    temperature: float | None = None
    spec_sampling: SpecSamplingRecord | None = None
    tensor_parallel: int = 1  # ranks the target was split over (alpha --tp N, runtime/distributed.py)


class Timings(_Strict):
    load_s: float


class CostRecommendation(_Strict):
    """The cost model's K and max_concurrency (measure/cost_model.py Recommendation.to_dict); its
    table and evidence are the cost model's own records, kept as it writes them."""

    max_draft_len: int
    max_concurrency: int
    cumulative_acceptance: list[float]
    table: list[dict[str, Any]]
    evidence: dict[str, Any]


class ModeFigures(_Strict):
    """One speculation mode's figures (measure/alpha_run.py mode_figures)."""

    acceptance_length: float
    alpha: float
    tokens_verified_per_forward: float
    requests: int
    generated_tokens: int
    target_forwards: int
    draft_tokens: int
    accepted_tokens: int


class PairedDiff(_Strict):
    """A paired bootstrap difference (core/paired_ci.py PairedDiff.to_dict)."""

    a: float
    b: float
    diff: float
    ci: tuple[float, float]
    level: float
    n: int
    n_groups: int


class SAConfigRecord(_Strict):
    threshold: int
    enable_global_pool: bool


class DynamicTreeRecord(_Strict):
    """The tree a dynamic-tree mode measured, in TensorRT-LLM's names (speculative/dynamic_tree/mode.py)."""

    use_dynamic_tree: bool
    dynamic_tree_max_topK: int
    max_total_draft_tokens: int
    max_draft_len: int


class ModeEntry(_Strict):
    """``alpha --modes``: one mode measured on the same turns as the others."""

    method: str
    overall: ModeFigures
    by_category: dict[str, ModeFigures]
    sa_config: SAConfigRecord | None = None
    dynamic_tree: DynamicTreeRecord | None = None
    vs_chain: PairedDiff | None = None  # AL(mode) - AL(chain), paired over turns
    # each turn's draft tokens accepted per verification, in order (the switch-off replay when this mode
    # wins: measure/method_gate.py); absent in reports written before they were recorded
    accepted_seqs: list[list[int]] | None = None


class AlphaReport(_Strict):
    """``report.json`` of ``eagle3-trt alpha BUNDLE --prompts FILE``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, validate_assignment=True)

    schema_: Literal[1] = Field(SCHEMA, alias="schema")
    kind: Literal["eagle3-trt alpha report"] = KIND
    bundle: str
    # pipeline/bundle.Bundle.weights_id of the bundle measured (None in reports written before it was
    # recorded): recommend refuses to apply the report to a bundle with other weights
    bundle_weights: str | None = None
    settings: Settings
    pairs: Pairs
    delta: Deltas
    diagnostics: list[Diagnostic]
    timings: Timings
    reference_note: str | None = None
    numerics_note: str | None = None
    sampling_warning: str | None = None
    recommendation: CostRecommendation | None = None
    recommendation_error: str | None = None
    modes: dict[str, ModeEntry] | None = None
    # sections being added (issue 28): typed by their authors (replace dict[str, Any] with the section's model)
    acceptance_by_context: AcceptanceByContext | None = None  # measure/context_buckets.py: AL and alpha per context-length bucket
    against: AgainstComparison | None = None  # measure/against.py: alpha BUNDLE --against OTHER, side by side
    # new sections: one optional field here (module docstring)

    def curves(self) -> tuple[list[float], dict[int, list[float]]]:
        """(the run's cumulative acceptance, {K: cumulative acceptance measured at K} for every K of its sweep)."""
        prim = self.pairs.bundle
        return prim.overall.cumulative_acceptance, {k: v.cumulative_acceptance for k, v in (prim.sweep or {}).items()}


# --- alpha --traffic (measure/traffic_alpha.py) ---


class PromptKinds(_Strict):
    chat: int
    raw: int


class TrafficSkipped(_Strict):
    other_bundles: dict[str, int]  # fingerprint[:12] -> records
    unmeasurable: list[str]
    # the lines of ``unmeasurable`` whose prompt the bundle's max_seq_len cannot hold (requests it could have
    # measured); absent in reports written before it was recorded
    beyond_max_seq_len: list[str] = Field(default_factory=list)


class KFigures(_Strict):
    alpha: float
    acceptance_length: float
    requests: int


class OfflineFigures(_Strict):
    requests: int
    alpha: float
    acceptance_length: float
    generated_tokens: int
    target_forwards: int


class ServedFigures(_Strict):
    """The server's own acceptance over some records (measure/traffic_alpha.py served_figures)."""

    requests: int
    acceptance_length: float
    alpha: float
    completion_tokens: int
    target_forwards: int


class DriftWindow(ServedFigures):
    start_unix: float
    end_unix: float
    bundles: list[str]


class Drift(_Strict):
    window: int
    windows: list[DriftWindow]
    by_category: dict[str, ServedFigures]


class GreedyAgreement(_Strict):
    requests: int
    identical: int
    differ: list[str]


class OfflineVsServed(_Strict):
    offline_acceptance_length: float
    served_acceptance_length: float
    diff: float
    ci: tuple[float, float]
    level: float
    n: int
    prompts: int
    tolerance: float
    beyond_sampling_noise: bool
    greedy: GreedyAgreement
    sampled: int


class TrafficRequest(_Strict):
    request_id: str
    accepted_seq_by_k: dict[int, list[int]]


class TrafficAlphaReport(_Strict):
    """``report.json`` of ``eagle3-trt alpha BUNDLE --traffic DIR``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, validate_assignment=True)

    schema_: Literal[1] = Field(SCHEMA, alias="schema")
    kind: Literal["eagle3-trt alpha --traffic report"] = TRAFFIC_KIND
    bundle: str
    bundle_fingerprint: str
    traffic: str
    max_draft_len: int
    records: int
    compared: int
    prompts: PromptKinds
    skipped: TrafficSkipped
    per_k: dict[int, KFigures]
    offline: OfflineFigures
    served: ServedFigures
    comparison: OfflineVsServed
    drift: Drift
    # each greedy request's accepted drafts per verification at every K (recommend --gate-traffic
    # replays them); absent in reports written before them
    requests: list[TrafficRequest] = Field(default_factory=list)
    seconds: float
    # new sections: one optional field here (module docstring)


def report_json(report: AlphaReport | TrafficAlphaReport) -> dict[str, Any]:
    """The JSON object written to report.json: the fields the writer set, under their on-disk names."""
    return report.model_dump(mode="json", by_alias=True, exclude_unset=True)


def parse_report(raw: object, where: Path | str, want: Literal["alpha", "traffic"] | None = None) -> AlphaReport | TrafficAlphaReport:
    """A report already parsed from JSON, validated (its ``kind`` picks the model; ``want`` refuses the
    other kind); a one-line UserError naming ``where`` and the first bad field."""
    if not isinstance(raw, dict) or raw.get("kind") not in (KIND, TRAFFIC_KIND):
        raise UserError(where, "not an alpha report (no 'kind' of an eagle3-trt alpha report)", HINT)
    if want == "traffic" and raw["kind"] != TRAFFIC_KIND:
        raise UserError(where, "is not an alpha --traffic report", "pass the report.json written by `eagle3-trt alpha BUNDLE --traffic DIR`")
    if want == "alpha" and raw["kind"] != KIND:
        raise UserError(where, "is an alpha --traffic report", "pass the report.json written by `eagle3-trt alpha BUNDLE --prompts FILE`")
    if raw.get("schema") != SCHEMA:
        raise UserError(f"{where}:schema", f"schema {raw.get('schema')!r}; this eagle3-trt reads schema {SCHEMA} alpha reports", HINT)
    model: type[AlphaReport] | type[TrafficAlphaReport] = AlphaReport if raw["kind"] == KIND else TrafficAlphaReport
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise field_error(where, e, HINT, unknown_hint=f"not a field of alpha report schema {SCHEMA}; {HINT}") from None


def read_report(path: Path, want: Literal["alpha", "traffic"] | None = None) -> AlphaReport | TrafficAlphaReport:
    """The one reader of report.json (either kind ``alpha`` writes; ``want`` names the one needed), or
    a one-line UserError."""
    path = Path(path)
    if not path.is_file():
        raise UserError(path, "report not found", HINT)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(path, f"not valid JSON ({e})", HINT) from None
    return parse_report(raw, path, want)


def read_alpha_report(path: Path) -> AlphaReport:
    """An ``alpha --prompts`` report (``recommend --report``)."""
    rep = read_report(path, "alpha")
    assert isinstance(rep, AlphaReport)  # parse_report refused the other kind
    return rep


def read_traffic_report(path: Path) -> TrafficAlphaReport:
    """An ``alpha --traffic`` report (``recommend --gate-traffic``)."""
    rep = read_report(path, "traffic")
    assert isinstance(rep, TrafficAlphaReport)  # parse_report refused the other kind
    return rep
