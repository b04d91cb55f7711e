"""Every file the project writes has one typed reader, and nothing reads one with a raw json.loads."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from eagle3_trt.errors import UserError
from eagle3_trt.formats.heldout import read_heldout
from eagle3_trt.train.hidden_states import CACHE_SCHEMA, read_cache_manifest
from eagle3_trt.train.trainer import read_trainer_state
from eagle3_trt.triton_serving.server import ServerHandle

PKG = Path(__file__).resolve().parents[1] / "eagle3_trt"

# Where json.loads may appear in production code, and what it parses. Each project-written file has
# its typed reader here; the rest parse other people's files or wire data.
JSON_PARSERS = {
    # the executor's IPC messages (JSON over a socketpair between ReferenceLLM and its worker process), not files
    "runtime/executor_ipc.py": "the worker process's messages",
    "runtime/executor_worker.py": "the parent's messages",
    "formats/bundle_manifest.py": "manifest.json: the bundle's typed reader (pydantic, extra=forbid)",
    "triton_serving/server.py": "server.json: ServerHandle.load",
    "dynamo_serving/launcher.py": "the Dynamo deployment record: Deployment.load",
    "formats/alpha_report.py": "report.json: read_report (the alpha report's schema, pydantic, extra=forbid)",
    "formats/checkpoint_io.py": "Hugging Face config files: the strict JSON reader",
    "formats/tree_choices.py": "a --tree argument",
    "convert/streaming.py": "safetensors headers",
    "convert/prompts.py": "user prompt files (JSONL)",
    "convert/export.py": "ModelOpt's exported draft config.json",
    "convert/validate_tokenizer.py": "the checkpoint's tokenizer files",
    "pipeline/model_size.py": "a preset's model config.json",
    "train/data.py": "user training data (JSONL)",
    "clients/llm_client.py": "server responses",
    "triton_serving/deploy.py": "Triton's repository API responses",
    "clients/openai_client.py": "server-sent events",
    "clients/chat.py": "the checkpoint's tokenizer_config.json",
    # captured traffic: one field of a record line read without validating the whole record (hot paths)
    "triton_serving/generate_body.py": "a client's /generate body, checked before tritonserver parses it",
    "formats/traffic.py": "a segment's first record time (retention's age order)",
    "formats/traffic_split.py": "a record's prompt ids when the split re-reads a candidate",
}


def test_raw_json_parsing_only_where_declared():
    found = {}
    for p in PKG.rglob("*.py"):
        rel = str(p.relative_to(PKG))
        if rel.startswith("testing/") or "__pycache__" in rel:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("loads", "load") and isinstance(node.value, ast.Name) and node.value.id == "json":
                found.setdefault(rel, node.lineno)
    undeclared = sorted(set(found) - set(JSON_PARSERS))
    assert not undeclared, f"raw json parsing in {undeclared}: read a project file through its typed reader"
    stale = sorted(set(JSON_PARSERS) - set(found))
    assert not stale, f"declared but gone: {stale}"


def test_heldout_reader_is_strict(tmp_path):
    assert read_heldout(tmp_path) is None
    (tmp_path / "heldout_prompts.json").write_text(json.dumps({"about": "x", "prompts": [[1, 2]]}))
    assert read_heldout(tmp_path).prompts == [[1, 2]]
    (tmp_path / "heldout_prompts.json").write_text(json.dumps({"about": "x", "prompts": [[1, 2]], "extra": 1}))
    with pytest.raises(UserError) as e:
        read_heldout(tmp_path)
    assert e.value.where == str(tmp_path / "heldout_prompts.json")


def test_derived_data_readers_reject_other_schemas(tmp_path):
    m = {"schema": CACHE_SCHEMA, "key": "k", "seq_len": 8, "aux_layer_ids": [1, 2, 3], "target_hidden_size": 4, "shards": [2]}
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    assert read_cache_manifest(tmp_path).key == "k"
    (tmp_path / "manifest.json").write_text(json.dumps({**m, "schema": CACHE_SCHEMA + 1}))
    assert read_cache_manifest(tmp_path) is None
    (tmp_path / "state.json").write_text(json.dumps({"step": 3, "run_key": "r", "settings": {}, "history": []}))
    assert read_trainer_state(tmp_path).step == 3
    (tmp_path / "state.json").write_text(json.dumps({"step": 3, "run_key": "r", "settings": {}, "history": [], "lr": 1}))
    assert read_trainer_state(tmp_path) is None


def test_damaged_server_record_is_one_line(tmp_path):
    (tmp_path / "server.json").write_text("{not json")
    with pytest.raises(UserError) as e:
        ServerHandle.load(tmp_path)
    assert "unreadable server record" in e.value.what
