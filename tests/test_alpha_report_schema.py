"""The alpha report's schema and its one reader (formats/alpha_report.py): a report ``alpha`` writes
reads back into the typed model and serialises to the same JSON; a malformed or other-version file is
refused in one line naming the file and the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from eagle3_trt.cli import main
from eagle3_trt.errors import UserError
from eagle3_trt.formats.alpha_report import AlphaReport, read_alpha_report, read_report, read_traffic_report, report_json


@pytest.fixture(scope="module")
def written(fp8_bundle, tmp_path_factory) -> Path:
    """report.json of a run that fills every section alpha writes on prompts: the BF16 reference pair
    (delta), diagnostics, a K sweep, the chain and sa modes (vs_chain) and the recommendation."""
    d = tmp_path_factory.mktemp("alpha-schema")
    prompts = d / "p.jsonl"
    prompts.write_text("".join(json.dumps({"turns": [t]}) + "\n" for t in ("Write a poem about the sea.", "Explain binary search.", "List three fruits.")))
    argv = ["alpha", str(fp8_bundle), "--prompts", str(prompts), "--max-tokens", "16", "--sweep", "1-2", "--modes", "chain,sa", "-o", str(d / "rep")]
    assert main(argv) == 0
    return d / "rep" / "report.json"


def test_round_trip_keeps_every_key_and_value(written):
    raw = json.loads(written.read_text())
    rep = read_alpha_report(written)
    assert isinstance(rep, AlphaReport)
    assert report_json(rep) == raw  # the same keys and values as written, nothing added or lost
    # every section came back typed
    assert rep.pairs.reference is not None and rep.delta.overall is not None
    assert rep.modes is not None and set(rep.modes) == {"chain", "sa"} and rep.modes["sa"].vs_chain is not None
    assert rep.recommendation is not None and rep.diagnostics
    cum, by_k = rep.curves()
    assert cum == raw["pairs"]["bundle"]["overall"]["cumulative_acceptance"]
    assert sorted(by_k) == sorted(int(k) for k in raw["pairs"]["bundle"]["sweep"]) and 1 in by_k
    assert by_k[1] == raw["pairs"]["bundle"]["sweep"]["1"]["cumulative_acceptance"]
    assert rep.pairs.bundle.requests[0].accepted_seq_by_k.keys() == {int(k) for k in raw["pairs"]["bundle"]["requests"][0]["accepted_seq_by_k"]}


def _refused(path: Path, body: object, tmp_path: Path) -> UserError:
    f = tmp_path / "report.json"
    f.write_text(json.dumps(body))
    with pytest.raises(UserError) as e:
        read_report(f)
    assert "\n" not in e.value.line()
    return e.value


def test_malformed_reports_are_refused_naming_file_and_field(written, tmp_path):
    raw = json.loads(written.read_text())
    f = str(tmp_path / "report.json")

    bad = copy.deepcopy(raw)
    bad["pairs"]["bundle"]["overall"]["alpha"] = "high"
    assert _refused(written, bad, tmp_path).where == f + ":pairs.bundle.overall.alpha"

    bad = copy.deepcopy(raw)
    del bad["settings"]["max_draft_len"]
    e = _refused(written, bad, tmp_path)
    assert e.where == f + ":settings.max_draft_len" and "required" in e.what.lower()

    bad = copy.deepcopy(raw)
    bad["modes"]["sa"]["overall"]["speedup"] = 2.0  # a field the schema does not have
    e = _refused(written, bad, tmp_path)
    assert e.where == f + ":modes.sa.overall.speedup" and "not a field of alpha report schema 1" in e.hint

    e = _refused(written, {**raw, "schema": 2}, tmp_path)
    assert e.where == f + ":schema" and "schema 2" in e.what

    e = _refused(written, {"pairs": {}}, tmp_path)
    assert e.where == f and "not an alpha report" in e.what

    (tmp_path / "report.json").write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        read_report(tmp_path / "report.json")


def test_each_reader_refuses_the_other_kind(written):
    with pytest.raises(UserError, match="is not an alpha --traffic report"):
        read_traffic_report(written)
    assert read_alpha_report(written).kind == "eagle3-trt alpha report"
