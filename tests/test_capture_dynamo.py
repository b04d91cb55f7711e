"""`eagle3-trt serve-dynamo --capture` with NVIDIA Dynamo's real frontend and one reference-runtime
worker (started and stopped with the CLI), queried with the openai client: the records are what the
client received, the chat prompt is recorded as the model saw it (templated, the secret redacted),
and the category annotation is kept."""

from __future__ import annotations

import json

import pytest

from eagle3_trt.testing.pytest_guard import require

require("dynamo", "openai")

from openai import OpenAI

from eagle3_trt.runtime.capture import REDACTED
from eagle3_trt.testing.served_traffic import captured_records as _records
from eagle3_trt.testing.servers import dynamo_served, until

SECRET = "sk-live-4f9a8b7c6d5e"


@pytest.fixture(scope="module")
def dep(fp8_bundle, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("capture-dynamo")
    state, cap = tmp / "state", tmp / "cap"
    with dynamo_served(fp8_bundle, state, "--capture", str(cap), "--capture-redact", r"sk-live-[0-9a-f]+", workers=1) as (d, out):
        assert f"capture {cap}" in out
        yield d, cap


def test_records_are_what_the_openai_client_received(dep, fp8_bundle):
    from eagle3_trt.pipeline.bundle import open_bundle
    from eagle3_trt.runtime.capture import load_tokenizer

    d, cap = dep
    client = OpenAI(base_url=d.url, api_key="none", timeout=120)
    nvext = {"nvext": {"annotations": ["eagle3_category=poetry"], "extra_fields": ["engine_data"]}}
    chat = client.chat.completions.create(
        model=d.model, messages=[{"role": "user", "content": f"My key is {SECRET}. Write a haiku."}], max_tokens=12, temperature=0, extra_body=nvext
    )
    comp = client.completions.create(model=d.model, prompt="List three prime numbers.", max_tokens=8, temperature=0, seed=3)
    recs = _records(cap, 2)
    assert len(recs) == 2
    a, b = recs
    fp = json.loads((fp8_bundle / "manifest.json").read_text())["fingerprint"]
    for r in recs:
        assert (r.model, r.frontend, r.bundle_fingerprint, r.model_version) == (d.model, "dynamo", fp, None)
    # the chat answer: text, token count, finish reason and the engine's own acceptance figures
    assert a.output_text == chat.choices[0].message.content and a.finish_reason == chat.choices[0].finish_reason
    assert len(a.output_ids) == chat.usage.completion_tokens == a.acceptance.completion_tokens
    eng = chat.model_extra["nvext"]["engine_data"]["eagle3"]
    assert (a.acceptance.draft_tokens, a.acceptance.accepted_draft_tokens, a.acceptance.target_forwards) == (
        eng["draft_tokens"],
        eng["accepted_draft_tokens"],
        eng["target_forwards"],
    )
    assert round(a.acceptance.acceptance_length, 4) == eng["acceptance_length"] and a.category == "poetry"
    # as the model saw it: the chat template applied by the frontend, the secret gone from text, ids and disk
    tok = load_tokenizer(open_bundle(fp8_bundle).tokenizer_dir)
    assert a.chat and a.redacted and a.prompt_text is not None and a.prompt_text.startswith(tok.bos_token)
    assert f"My key is {REDACTED}. Write a haiku." in a.prompt_text and SECRET not in tok.decode(a.prompt_ids)
    assert a.prompt_ids == tok.encode(a.prompt_text, add_special_tokens=False)
    blob = b"".join(p.read_bytes() for p in cap.rglob("*") if p.is_file())
    assert SECRET.encode() not in blob and b"4f9a8b7c6d5e" not in blob
    # the completion: not templated, nothing redacted, the ids the frontend sent
    assert not b.chat and not b.redacted and b.prompt_text == "List three prime numbers." and b.category is None
    assert b.output_text == comp.choices[0].text and len(b.output_ids) == comp.usage.completion_tokens
    assert len(b.prompt_ids) == comp.usage.prompt_tokens and b.sampling.seed == 3 and b.sampling.max_tokens == 8


def test_adjacent_keys_and_the_category_are_redacted_and_a_deleted_directory_stays_deleted(fp8_bundle, tmp_path):
    """The README's patterns, two keys written together and a key in the category annotation: no
    piece of either key reaches the disk. Then `rm -rf` of the capture directory: the next request
    does not recreate it (with the deleted records or any), and the worker warns once."""
    import shutil
    import time

    k1, k2 = "sk-" + "a1" * 16, "sk-" + "B2" * 16
    state, cap = tmp_path / "state", tmp_path / "cap"
    readme = ("--capture-redact", r"sk-[A-Za-z0-9]{20,}", "--capture-redact", r"\b\d{3}-\d{2}-\d{4}\b")
    with dynamo_served(fp8_bundle, state, "--capture", str(cap), *readme, workers=1) as (d, _):
        client = OpenAI(base_url=d.url, api_key="none", timeout=120)
        nvext = {"nvext": {"annotations": [f"eagle3_category=team-{k2}"]}}
        client.completions.create(model=d.model, prompt=f"keys {k1}{k2} and 123-45-6789", max_tokens=6, temperature=0, extra_body=nvext)
        (r,) = _records(cap, 1)
        blob = b"".join(p.read_bytes() for p in cap.rglob("*") if p.is_file()).decode()
        for k in (k1, k2):
            assert not [k[i : i + 8] for i in range(len(k) - 8) if k[i : i + 8] in blob], "a piece of a key was stored"
        assert r.prompt_text == f"keys {REDACTED} and {REDACTED}" and r.category == f"team-{REDACTED}" and r.redacted

        shutil.rmtree(cap)
        gone = "was deleted (or replaced); it stays deleted"
        worker_log = state / "worker-0.log"
        client.completions.create(model=d.model, prompt="List three prime numbers.", max_tokens=4, temperature=0)
        until(lambda: gone in worker_log.read_text(errors="replace"), 30, "the worker never logged that the capture directory was deleted")
        client.completions.create(model=d.model, prompt="List three prime numbers.", max_tokens=4, temperature=0)
        time.sleep(1.0)  # past the capture thread's 0.5 s flush: a second request must not recreate it or warn again
        assert not cap.exists(), sorted(p.name for p in cap.rglob("*"))
        log = worker_log.read_text(errors="replace")
        assert log.count(gone) == 1, log[-2000:]


def test_two_workers_with_retention_keep_the_newest_records(fp8_bundle, tmp_path):
    """Dynamo's two workers capture into one directory with retention on, segments closing every
    0.5 s (``--capture-segment-s``): requests from four clients at once, and afterwards no record
    newer than the oldest surviving one is missing (retention ordered the writers' segments by when
    each writer started, and one worker deleted the other's newest records, its open segment too)."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from eagle3_trt.formats.traffic import read_traffic
    from eagle3_trt.testing.served_traffic import newer_missing

    state, cap = tmp_path / "state", tmp_path / "cap"
    opts = ("--capture", str(cap), "--capture-keep-mb", "0.008", "--capture-segment-s", "0.5")
    sent: dict[str, float] = {}
    with dynamo_served(fp8_bundle, state, *opts, workers=2) as (d, out):
        assert "keeping the newest 0.008 MB" in out
        client = OpenAI(base_url=d.url, api_key="none", timeout=120)

        def ask(i: int) -> None:
            sent[f"request {i:03d}"] = time.time()
            client.completions.create(model=d.model, prompt=f"request {i:03d}: name a colour.", max_tokens=3, temperature=0)

        writers: set[str] = set()
        with ThreadPoolExecutor(4) as pool:
            for fut in [pool.submit(ask, i) for i in range(48)]:
                fut.result()
                writers |= {p.name.split("-")[1] for p in cap.glob(".writer-*.lease")}
        assert len(writers) == 2, writers  # both workers capture (each holds a writer lease while serving)
        time.sleep(1.0)  # past a flush
    recs = read_traffic(cap)
    kept = {r.prompt_text.split(":")[0]: r.time_unix for r in recs if r.prompt_text}
    assert 4 < len(recs) < 40 and len(kept) == len(recs)  # retention ran (about 10 records fit in 8 kB)
    late = newer_missing(kept, sent)
    assert not late, f"{len(late)} records newer than the oldest kept are missing: {late[:5]}"
    assert not list(cap.glob(".*.lease")), "a stopped worker left a lease"
