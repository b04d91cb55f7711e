"""Traffic capture without a server (runtime/capture.py, triton_serving/capture_setup.py): the settings
and their refusals, the capturer writing real segments with the tiny pair's real tokenizer, redaction
before the first byte, the cap, and a request path that never waits. Servers: test_capture_triton.py
and test_capture_dynamo.py."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from eagle3_trt import cli
from eagle3_trt.errors import UserError
from eagle3_trt.formats.traffic import read_traffic, segments
from eagle3_trt.runtime.capture import (
    CAPTURE_ENV,
    REDACTED,
    CaptureConfig,
    Capturer,
    CaptureSource,
    capture_config,
    capture_env,
    chat_prefix,
    config_from_env,
    load_tokenizer,
    redact_joined,
)
from eagle3_trt.runtime.capture_cli import from_options
from eagle3_trt.runtime.llm_api import SpecStats
from eagle3_trt.testing.served_traffic import captured_records, newer_missing
from eagle3_trt.triton_serving.capture_setup import stub_model_dir, triton_capturer

REPO_ROOT = Path(__file__).resolve().parents[1]
TOK_DIR = REPO_ROOT / "models" / "tiny" / "target"
SECRET = "sk-live-4f9a8b7c6d5e"
HINT = "--capture takes a directory this user can write (it is created if missing)"
SOURCE = CaptureSource("f" * 64, "eagle3", "triton", "1")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(TOK_DIR)


def _stats(n: int = 5) -> SpecStats:
    return SpecStats(True, 8, 3, 4, n)


def _sampling(n: int = 5) -> dict:
    return {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": n, "seed": None}


def _capturer(tok, d: Path, warnings: list[str], **cfg) -> Capturer:
    return Capturer(CaptureConfig(dir=d, **cfg), SOURCE, tokenizer=lambda: tok, warn=warnings.append)


def _all_bytes(d: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file())


# ---- settings ------------------------------------------------------------------------------------
def test_bad_settings_are_one_line_each(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(UserError) as e:
        capture_config(tmp_path / "cap", redact=["(unclosed"])
    assert e.value.where == "--capture-redact" and "'(unclosed' is not a regular expression" in e.value.what
    with pytest.raises(UserError) as e:
        capture_config(tmp_path / "afile")
    assert e.value.where == str(tmp_path / "afile") and e.value.what == "is not a directory"
    with pytest.raises(UserError) as e:
        capture_config(tmp_path / "afile" / "cap")
    assert "is not a directory" in e.value.what
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(UserError) as e:
            capture_config(tmp_path / "cap", max_mb=bad)
        assert e.value.where == "--capture-max-mb"
    with pytest.raises(UserError) as e:
        from_options(None, None, ("secret",))
    assert e.value.where == "--capture-redact" and "without --capture" in e.value.what
    assert from_options(None, None, ()) is None
    assert not (tmp_path / "cap").exists()  # checked, not created: the serving processes create it


@pytest.mark.needs("tmpfs")
def test_read_only_directory_is_refused_before_the_server_starts(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(ro)], check=True)
    try:
        with pytest.raises(UserError) as e:
            capture_config(ro / "cap")
        assert "read-only file system" in e.value.what
        # the CLI: one line, exit 2, before anything starts (no repository needed to get there)
        rc = cli.main(["serve", str(tmp_path / "no-repo"), "--capture", str(ro / "cap")])
        err = capsys.readouterr().err
        assert rc == 2 and "Traceback" not in err, err
        assert err.strip().splitlines() == [f"error: {ro / 'cap'}: not writable: {ro} is on a read-only file system (hint: {HINT})"]
    finally:
        subprocess.run(["umount", str(ro)], check=True)


def test_settings_reach_the_serving_processes_only_when_on(tmp_path):
    cfg = capture_config(tmp_path / "cap", max_mb=2.5, redact=[r"sk-\w+"])
    env = capture_env(cfg, {"PATH": "/bin", CAPTURE_ENV: "stale"})
    assert config_from_env(env) == cfg
    assert CAPTURE_ENV not in capture_env(None, {"PATH": "/bin", CAPTURE_ENV: cfg.to_env()})  # off: nothing inherited
    assert config_from_env({}) is None
    with pytest.raises(UserError):
        config_from_env({CAPTURE_ENV: '{"dir": "/x", "bogus": 1}'})


def test_triton_stub_names_its_model_and_version(tmp_path):
    cmd = b"/s/backends/python/triton_python_backend_stub\0/r/repo/eagle3_unary/3/model.py\0eagle3_abc_x\0" + b"1048576\0"
    assert stub_model_dir(cmd) == Path("/r/repo/eagle3_unary/3")
    assert stub_model_dir(b"/usr/bin/python3\0-m\0pytest\0") is None
    # not a stub and capture off: nothing at all; not a stub with capture on: a warning, no capturer
    warned: list[str] = []
    assert triton_capturer(warned.append) is None and warned == []


def test_chat_prefix_tells_templated_prompts(tok):
    p = chat_prefix(tok)
    assert p is not None and p.startswith(tok.bos_token) and len(p) > len(tok.bos_token)
    templated = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert templated.startswith(p) and not "hi there".startswith(p)


# ---- the capturer ------------------------------------------------------------------------------------
def test_records_are_what_was_served(tok, tmp_path):
    d, warnings = tmp_path / "cap", []
    cap = _capturer(tok, d, warnings)
    templated = tok.apply_chat_template([{"role": "user", "content": "Name a prime."}], tokenize=False, add_generation_prompt=True)
    served = []
    for i, prompt in enumerate(["hello there", templated]):
        ids = tok.encode(prompt, add_special_tokens=not prompt.startswith(tok.bos_token))
        out_ids = tok.encode(f" answer {i}", add_special_tokens=False)
        served.append((prompt, ids, out_ids))
        cap.record(
            request_id=f"r{i}",
            prompt_ids=ids,
            prompt_text=prompt,
            output_ids=out_ids,
            output_text=f" answer {i}",
            finish_reason="stop",
            sampling=_sampling(),
            stats=_stats(len(out_ids)),
            category="code" if i else None,
        )
    # flushed within the flush interval, while the capturer still runs (one flush may hold r0 alone)
    assert len(captured_records(d, 2, 5)) == 2
    cap.close()
    recs = read_traffic(d)
    assert [r.request_id for r in recs] == ["r0", "r1"] and warnings == []
    for r, (prompt, ids, out_ids) in zip(recs, served):
        assert (r.prompt_text, r.prompt_ids, r.output_ids) == (prompt, ids, out_ids)
        assert (r.bundle_fingerprint, r.model, r.model_version, r.frontend) == ("f" * 64, "eagle3", "1", "triton")
        assert r.acceptance.draft_tokens == 8 and r.acceptance.accepted_draft_tokens == 3
        assert r.acceptance.acceptance_length == len(out_ids) / 4 and not r.redacted
    assert [r.chat for r in recs] == [False, True] and [r.category for r in recs] == [None, "code"]


def test_text_is_decoded_when_the_front_end_has_only_ids(tok, tmp_path):
    """Dynamo's workers see token ids: the prompt is recorded as the model saw it, special tokens included."""
    d = tmp_path / "cap"
    cap = _capturer(tok, d, [])
    templated = tok.apply_chat_template([{"role": "user", "content": "Name a prime."}], tokenize=False, add_generation_prompt=True)
    ids = tok.encode(templated, add_special_tokens=False)
    cap.record(request_id="x", prompt_ids=ids, output_ids=tok.encode(" 7", add_special_tokens=False), sampling=_sampling(), stats=_stats())
    cap.close()
    (r,) = read_traffic(d)
    assert r.prompt_text == templated and r.prompt_ids == ids and r.chat and r.output_text == " 7"


def test_redaction_happens_before_the_first_byte(tok, tmp_path):
    d = tmp_path / "cap"
    cap = _capturer(tok, d, [], redact=(r"sk-live-[0-9a-f]+", r"\d{3}-\d{2}-\d{4}"))
    prompt = f"my key is {SECRET} and my SSN is 123-45-6789, please keep them"
    out = f"Sure: {SECRET}"
    cap.record(
        request_id="a",
        prompt_ids=tok.encode(prompt),
        prompt_text=prompt,
        output_ids=tok.encode(out, add_special_tokens=False),
        output_text=out,
        sampling=_sampling(),
        stats=_stats(),
    )
    # the secret only in the ids (a Dynamo worker: no text given): found by decoding, ids re-encoded
    cap.record(
        request_id="b", prompt_ids=tok.encode(f"use {SECRET}"), output_ids=tok.encode(" ok", add_special_tokens=False), sampling=_sampling(), stats=_stats()
    )
    cap.record(
        request_id="c",
        prompt_ids=tok.encode("nothing to hide"),
        prompt_text="nothing to hide",
        output_ids=[5],
        output_text="x",
        sampling=_sampling(),
        stats=_stats(),
    )
    cap.close()
    blob = _all_bytes(d)
    assert blob and SECRET.encode() not in blob and b"123-45-6789" not in blob
    for piece in ("4f9a8b7c6d5e", "sk-live"):
        assert piece.encode() not in blob
    a, b, c = read_traffic(d)
    assert a.prompt_text == f"my key is {REDACTED} and my SSN is {REDACTED}, please keep them" and a.output_text == f"Sure: {REDACTED}"
    assert a.prompt_ids == tok.encode(a.prompt_text) and a.output_ids == tok.encode(a.output_text, add_special_tokens=False)
    assert b.prompt_text is not None and SECRET not in b.prompt_text and REDACTED in b.prompt_text
    for r in (a, b):
        assert r.redacted
        for ids in (r.prompt_ids, r.output_ids):
            assert SECRET not in tok.decode(ids)  # the ids do not carry what the text hid
    assert not c.redacted and c.output_ids == [5]


def test_at_the_cap_capture_stops_once_and_requests_go_on(tok, tmp_path):
    d, warnings = tmp_path / "cap", []
    (d).mkdir()
    (d / "traffic-0000000000001-1-000000.jsonl").write_text("")  # an earlier run's (empty) segment counts too
    cap = _capturer(tok, d, warnings, max_mb=0.003)  # 3000 bytes: a few records
    ids = tok.encode("hello there")
    spent = 0.0  # the record calls alone: the sleeps' overshoot on a busy machine is not the request path's
    for i in range(40):
        t0 = time.perf_counter()
        cap.record(
            request_id=f"r{i}", prompt_ids=ids, prompt_text="hello there", output_ids=[7] * 20, output_text="x" * 40, sampling=_sampling(20), stats=_stats(20)
        )
        spent += time.perf_counter() - t0
        time.sleep(0.01)
    cap.close()
    recs = read_traffic(d)
    assert 0 < len(recs) < 40 and cap.stopped
    assert sum(p.stat().st_size for p in segments(d)) <= 3000
    assert [r.request_id for r in recs] == [f"r{i}" for i in range(len(recs))]  # the first ones, whole
    assert len(warnings) == 1 and "reached --capture-max-mb 0.003" in warnings[0] and "serving continues" in warnings[0]
    assert spent < 0.5  # 40 calls on the request path: no waiting for the disk


def test_the_request_path_never_waits(tok, tmp_path):
    """A writer that is stuck (tokenizer still loading) must not slow requests: the queue drops."""
    warnings: list[str] = []

    def slow():
        time.sleep(1.0)
        return tok

    cap = Capturer(CaptureConfig(dir=tmp_path / "cap"), SOURCE, tokenizer=slow, warn=warnings.append, queue_size=4)
    t0 = time.perf_counter()
    for i in range(50):
        cap.record(request_id=str(i), prompt_ids=[1, 2], prompt_text="ab", output_ids=[3], output_text="c", sampling=_sampling(), stats=_stats())
    assert time.perf_counter() - t0 < 0.2
    cap.close()
    assert cap.dropped == 46 and len(read_traffic(tmp_path / "cap")) == 4
    assert len(warnings) == 1 and "dropped" in warnings[0]


def test_an_unwritable_directory_turns_capture_off_not_serving(tok, tmp_path):
    (tmp_path / "afile").write_text("x")
    warnings: list[str] = []
    cap = _capturer(tok, tmp_path / "afile", warnings)
    cap.record(request_id="a", prompt_ids=[1], prompt_text="a", output_ids=[2], output_text="b", sampling=_sampling(), stats=_stats())
    cap.close()
    assert cap.stopped and len(warnings) == 1 and warnings[0].startswith("capture off: cannot start writing")
    assert (tmp_path / "afile").read_text() == "x"


def test_triton_requests_may_carry_a_category_and_nothing_else():
    from eagle3_trt.triton_serving.request_params import RequestError, check_parameters

    check_parameters({"eagle3_category": "code", "triton_enable_empty_final_response": True})
    for bad in ("", 5, "x" * 65):
        with pytest.raises(RequestError) as e:
            check_parameters({"eagle3_category": bad})
        assert e.value.field == "eagle3_category"
    with pytest.raises(RequestError) as e:
        check_parameters({"category": "code"})
    assert e.value.field == "category" and "unknown fields are refused" in e.value.message


def test_segments_rotate_by_size_so_a_flush_rewrites_little(tok, tmp_path):
    from eagle3_trt.formats.traffic import SegmentWriter

    d = tmp_path / "cap"
    cap = _capturer(tok, d, [])
    for i in range(3):
        cap.record(request_id=str(i), prompt_ids=[1, 2], prompt_text="ab", output_ids=[3], output_text="c", sampling=_sampling(), stats=_stats())
    cap.close()
    recs = read_traffic(d)
    w = SegmentWriter(tmp_path / "by-size", segment_bytes=2 * len(recs[0].to_line()))
    for r in recs:
        assert w.write(r)
    w.flush()
    assert [len(p.read_text().splitlines()) for p in segments(tmp_path / "by-size")] == [2, 1]
    assert [r.request_id for r in read_traffic(tmp_path / "by-size")] == ["0", "1", "2"]


def _rec(cap: Capturer, i: int, **kw) -> None:
    fields = {"prompt_ids": [1, 2], "prompt_text": "ab", "output_ids": [3], "output_text": "c", "sampling": _sampling(), "stats": _stats()}
    cap.record(request_id=f"r{i}", **{**fields, **kw})


def _until_flushed(d: Path, n: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if d.is_dir() and sum(len(p.read_text().splitlines()) for p in segments(d)) >= n:
                return
        except FileNotFoundError:
            pass
        time.sleep(0.02)
    raise AssertionError(f"{n} records not flushed to {d}")


def test_adjacent_secrets_are_redacted_whole_in_every_stored_field(tok, tmp_path):
    """The README's pattern on two keys written together: re.sub's first match swallows the `sk` of
    the second key and the rest (32 of its 35 characters) leaked; two patterns overlapping leaked the
    part the first had rewritten; the category and the request id were stored unredacted."""
    import re as _re

    from eagle3_trt.runtime.capture import redact, redaction_spans

    readme = [_re.compile(r"sk-[A-Za-z0-9]{20,}"), _re.compile(r"\b\d{3}-\d{2}-\d{4}\b")]
    k1, k2 = "sk-" + "a1" * 16, "sk-" + "B2" * 16
    assert len(k2) == 35 and k2[3:] in _re.sub(readme[0], REDACTED, f"{k1}{k2}")  # what re.sub left
    assert redact(f"keys {k1}{k2} done", readme) == f"keys {REDACTED} done"
    assert redaction_spans("x" + "1" * 200_000, [_re.compile(r"\d+")]) == [(1, 200_001)]  # bounded work, nothing left
    # two patterns whose matches overlap: neither may leave a piece of the other
    assert redact("tok=abcdefXYZ", [_re.compile("abcdef"), _re.compile("defXYZ")]) == f"tok={REDACTED}"

    d = tmp_path / "cap"
    cap = _capturer(tok, d, [], redact=(r"sk-[A-Za-z0-9]{20,}", r"\b\d{3}-\d{2}-\d{4}\b"))
    prompt = f"two keys: {k1}{k2} and 123-45-6789"
    cap.record(
        request_id=f"req-{k1}",
        prompt_ids=tok.encode(prompt),
        prompt_text=prompt,
        output_ids=tok.encode(f" {k2}{k1}", add_special_tokens=False),
        output_text=f" {k2}{k1}",
        sampling=_sampling(),
        stats=_stats(),
        category=f"team-{k2}",
    )
    cap.close()
    blob = _all_bytes(d).decode()
    for k in (k1, k2):
        for i in range(0, len(k) - 8):
            assert k[i : i + 8] not in blob, f"{k[i : i + 8]!r} of a key was stored"
    (r,) = read_traffic(d)
    assert r.prompt_text == f"two keys: {REDACTED} and {REDACTED}" and r.output_text == f" {REDACTED}"
    assert r.category == f"team-{REDACTED}" and r.request_id == f"req-{REDACTED}" and r.redacted


@pytest.mark.parametrize("stopped_first", [False, True], ids=["capturing", "after-capture-stopped"])
def test_a_deleted_capture_directory_stays_deleted(tok, tmp_path, stopped_first):
    """rm -rf of the capture directory: the next flush must not recreate it with the deleted records
    (the open segment is rewritten whole at each flush); capture stops with one warning. The same once
    capture had stopped itself at the cap: closing must not write the records it still holds."""
    import shutil

    d, warnings = tmp_path / "cap", []
    cap = _capturer(tok, d, warnings, flush_s=0.05, max_mb=0.002 if stopped_first else 1.0)  # 2000 bytes: a few records
    for i in range(12 if stopped_first else 3):
        _rec(cap, i)
    if stopped_first:
        deadline = time.monotonic() + 10
        while not cap.stopped and time.monotonic() < deadline:
            time.sleep(0.02)
        assert cap.stopped and len(warnings) == 1 and "reached --capture-max-mb" in warnings[0]
    _until_flushed(d, 1 if stopped_first else 3)
    shutil.rmtree(d)
    for i in range(20, 25):
        _rec(cap, i)
        time.sleep(0.06)
    cap.close()
    assert not d.exists(), sorted(p.name for p in d.rglob("*"))
    assert cap.stopped and len(warnings) == 1
    if not stopped_first:
        assert "was deleted" in warnings[0] and "stays deleted" in warnings[0]


def test_a_deleted_open_segment_is_not_rewritten(tmp_path):
    """A segment deleted under its writer (by hand or by another writer's retention): its records stay
    deleted; the writer goes on in a new segment with the new records only."""
    from eagle3_trt.formats.traffic import SegmentWriter

    d = tmp_path / "cap"
    _write_records(d, 2)
    w = SegmentWriter(tmp_path / "w")
    recs = read_traffic(d)
    assert w.write(recs[0])
    w.flush()
    (only,) = segments(tmp_path / "w")
    only.unlink()
    assert w.write(recs[1])
    w.flush()
    assert [r.request_id for r in read_traffic(tmp_path / "w")] == [recs[1].request_id] and w.bytes_written == len(recs[1].to_line()) + 1


def _write_records(d: Path, n: int, t0: float = 1000.0) -> None:
    from eagle3_trt.formats.traffic import CapturedSampling, SegmentWriter, ServedAcceptance, TrafficRecord

    w = SegmentWriter(d, segment_records=1)
    for i in range(n):
        rec = TrafficRecord(
            request_id=f"q{i}",
            time_unix=t0 + i,
            bundle_fingerprint="f" * 64,
            model="eagle3",
            frontend="triton",
            chat=False,
            prompt_text="ab",
            prompt_ids=[1, 2],
            output_ids=[3] * 50,
            sampling=CapturedSampling(max_tokens=50),
            acceptance=ServedAcceptance(speculative=True, draft_tokens=8, accepted_draft_tokens=3, target_forwards=4, completion_tokens=50),
        )
        assert w.write(rec)
    w.close()


def test_retention_by_size_and_by_age(tok, tmp_path):
    """--capture-keep-mb deletes the oldest records past the size, --capture-keep-hours those older
    (by their own time); the newest stay, capture goes on."""
    from eagle3_trt.formats.traffic import SegmentWriter

    d = tmp_path / "cap"
    now = time.time()
    _write_records(d, 6, t0=now - 2 * 86400 - 1.5)  # six one-record segments, the first two two days old
    segs = segments(d)
    size = segs[0].stat().st_size
    w = SegmentWriter(d)
    assert [p.name for p in w.retain(keep_age_s=2 * 86400.0, now=now)] == [p.name for p in segs[:2]]
    assert [p.name for p in w.retain(keep_bytes=int(2.5 * size))] == [p.name for p in segs[2:4]]
    assert [r.request_id for r in read_traffic(d)] == ["q4", "q5"]

    # the capturer applies it after each flush, from the typed options
    cap_dir, warnings = tmp_path / "cap2", []
    _write_records(cap_dir, 4)
    cap = _capturer(tok, cap_dir, warnings, flush_s=0.05, keep_mb=2.5 * size / 1e6)
    _rec(cap, 0)
    cap.close()
    left = read_traffic(cap_dir)
    assert [r.request_id for r in left][-1] == "r0" and len(left) <= 3 and warnings == [] and not cap.stopped


_WRITER = """
import sys, time
from pathlib import Path
from eagle3_trt.runtime.capture import CaptureConfig, Capturer, CaptureSource, load_tokenizer
from eagle3_trt.runtime.llm_api import SpecStats
d, name, n, keep = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
tok = load_tokenizer(sys.argv[5])
cfg = CaptureConfig(dir=d, flush_s=0.05, segment_records=int(sys.argv[6]), segment_s=0.5, keep_mb=keep)
cap = Capturer(cfg, CaptureSource("f" * 64, "eagle3", "dynamo"), tokenizer=lambda: tok, warn=lambda m: print("WARN", m, flush=True))
print("ready", flush=True)
sys.stdin.readline()
sampling = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 4, "seed": None}
for i in range(n):
    t = time.time()
    cap.record(request_id=f"{name}-{i}", prompt_ids=[1, 5, 7], output_ids=[9] * 40, sampling=sampling, stats=SpecStats(True, 8, 3, 4, 40))
    print(f"{name}-{i} {t!r}", flush=True)
    time.sleep(0.004)
cap.close()
print("done", cap.stopped, flush=True)
"""


def _writer(d: Path, name: str, n: int, keep_mb: float, segment_records: int) -> subprocess.Popen:
    import os
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-c", _WRITER, str(d), name, str(n), str(keep_mb), str(TOK_DIR), str(segment_records)]
    p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def assert_retention_kept_the_newest(recs, sent: dict[str, float]) -> None:
    """No record newer than the oldest surviving one is missing: every request that was sent and is
    not on disk started before the oldest record kept (``sent``: request id -> the time just before
    its record call, at most its record's time)."""
    oldest = min(r.time_unix for r in recs)
    late = newer_missing({r.request_id: r.time_unix for r in recs}, sent)
    assert not late, f"{len(late)} records newer than the oldest kept ({oldest}) are missing: {late[:5]}"


def test_two_writer_processes_keep_the_newest_records(tmp_path):
    """Two capturing processes with different start times write one directory, each running retention:
    segments were ordered by the writer's start, so the later writer's retention deleted the earlier
    one's newest segments, its open one included. Now every missing record is older than every kept one."""
    d = tmp_path / "cap"
    a = _writer(d, "a", 240, 0.012, 6)
    time.sleep(0.3)  # started later: its segment names sort after all of a's under the old ordering
    b = _writer(d, "b", 60, 0.012, 6)  # and stops first: a's retention went on deleting a's own newest segments
    for p in (a, b):
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    sent: dict[str, float] = {}
    for p in (a, b):
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0 and "WARN" not in out and out.strip().endswith("done False"), out[-500:]
        sent.update(ln.split() for ln in out.splitlines() if ln.startswith(("a-", "b-")))  # type: ignore[arg-type]
    sent = {k: float(v) for k, v in sent.items()}
    recs = read_traffic(d)
    assert len(sent) == 300 and 8 < len(recs) < 100  # retention ran (about 16 records fit in 12 kB)
    assert_retention_kept_the_newest(recs, sent)
    names = {r.request_id.split("-")[0] for r in recs}
    assert names == {"a", "b"} or max(recs, key=lambda r: r.time_unix).request_id in ("a-239", "b-59")
    assert not list(d.glob(".*.lease")), "a closed writer left its lease"


def test_a_segment_being_written_by_another_process_is_never_deleted(tmp_path):
    """Another process's open segment (leased) survives retention down to 0 bytes (the older closed
    segments go); once that process is gone (SIGKILL: the kernel drops its lock), it is closed and goes."""
    import os
    import signal
    import sys

    from eagle3_trt.formats.traffic import SegmentWriter

    d = tmp_path / "cap"
    _write_records(d, 3, t0=time.time() - 10)
    holder = """
import sys, time
from pathlib import Path
from eagle3_trt.formats.traffic import CapturedSampling, SegmentWriter, ServedAcceptance, TrafficRecord
w = SegmentWriter(Path(sys.argv[1]), segment_records=100)
acc = ServedAcceptance(speculative=True, draft_tokens=8, accepted_draft_tokens=3, target_forwards=4, completion_tokens=5)
w.write(TrafficRecord(request_id="open-0", time_unix=time.time(), bundle_fingerprint="f" * 64, model="m", frontend="dynamo",
    chat=False, prompt_text="x", prompt_ids=[1], output_ids=[2], sampling=CapturedSampling(max_tokens=5), acceptance=acc))
w.flush()
print("open", flush=True)
time.sleep(600)
"""
    p = subprocess.Popen([sys.executable, "-c", holder, str(d)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "open"
        w = SegmentWriter(d)
        w.retain(keep_bytes=0, keep_age_s=1.0)
        assert [r.request_id for r in read_traffic(d)] == ["open-0"]  # the closed (older) ones went
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    w.retain(keep_bytes=0)
    assert segments(d) == [] and not list(d.glob(".*.lease"))


def test_two_writers_in_one_process_interleave_and_retention_cuts_by_time(tmp_path):
    """The cut is a time: whole segments before it go, a closed segment straddling it is rewritten
    without its older records, and nothing after it is lost."""
    from eagle3_trt.formats.traffic import SegmentWriter

    src = tmp_path / "src"
    _write_records(src, 40, t0=5000.0)
    recs = read_traffic(src)
    d = tmp_path / "cap"
    a, b = SegmentWriter(d, segment_records=7), SegmentWriter(d, segment_records=5)
    for r in recs:
        assert (a if int(r.request_id[1:]) % 3 else b).write(r)
    a.close()
    b.close()
    a.retain(keep_bytes=sum(len(r.to_line()) + 1 for r in recs[23:]))
    left = read_traffic(d)
    assert [r.request_id for r in left] == [f"q{i}" for i in range(23, 40)]


def test_retention_options_are_typed_and_refused_in_one_line(tmp_path):
    cfg = from_options(tmp_path / "cap", 10.0, (), 5.0, 24.0)
    assert cfg is not None and (cfg.keep_mb, cfg.keep_hours) == (5.0, 24.0)
    for args, field in (
        ((tmp_path / "c", 10.0, (), 10.0, None), "--capture-keep-mb"),
        ((tmp_path / "c", None, (), None, -1.0), "--capture-keep-hours"),
        ((tmp_path / "c", None, (), float("nan"), None), "--capture-keep-mb"),
        ((None, None, (), None, 3.0), "--capture-keep-hours"),
    ):
        with pytest.raises(UserError) as e:
            from_options(*args)
        assert str(e.value.where) == field
    with pytest.raises(ValueError):
        CaptureConfig(dir=tmp_path, max_mb=1.0, keep_mb=2.0)
    with pytest.raises(ValueError):
        CaptureConfig(dir=tmp_path, keep_hours=1.0, unknown=1)


def test_iter_traffic_streams_segment_by_segment(tmp_path):
    from eagle3_trt.formats.traffic import iter_traffic

    d = tmp_path / "cap"
    _write_records(d, 3)
    it = iter_traffic(d)
    assert next(it).request_id == "q0" and [r.request_id for r in it] == ["q1", "q2"]
    with pytest.raises(UserError):
        iter_traffic(tmp_path / "missing")  # refused at once, not at the first record


def test_a_key_split_across_prompt_and_output_is_redacted_in_every_stored_field(tok, tmp_path):
    """The prompt ends with the start of a key (`sk-Q7`) and the model writes its other 30 characters:
    neither side alone matches the README's pattern, so each side's own search stored `sk-Q7` in the
    prompt and the rest in output_text and output_ids. Searched as one stream, both sides are cut at
    the boundary, as texts (Triton) and as ids decoded back to text (Dynamo: no text given)."""
    head, rest = "sk-Q7", "Xb9Lm2Pq8Rs4Tu6Vw1Yz3Ab5Cd7Ef0"
    assert len(rest) == 30
    key = head + rest
    prompt, out = f"Here is my key: {head}", f"{rest}. Done"
    d = tmp_path / "cap"
    cap = _capturer(tok, d, [], redact=(r"sk-[A-Za-z0-9]{20,}",))
    p_ids, o_ids = tok.encode(prompt), tok.encode(out, add_special_tokens=False)
    cap.record(request_id="text", prompt_ids=p_ids, prompt_text=prompt, output_ids=o_ids, output_text=out, sampling=_sampling(), stats=_stats())
    cap.record(request_id="ids", prompt_ids=p_ids, output_ids=o_ids, sampling=_sampling(), stats=_stats())  # a Dynamo worker: ids only
    # the texts clean but the ids carry the key across the boundary: found by decoding, both sides re-encoded
    cap.record(
        request_id="ids-only-key",
        prompt_ids=p_ids,
        prompt_text="Here is my key: ",
        output_ids=o_ids,
        output_text=". Done",
        sampling=_sampling(),
        stats=_stats(),
    )
    cap.close()
    blob = _all_bytes(d).decode()
    pieces = [key[i : i + 5] for i in range(len(key) - 4)]
    assert not [p for p in pieces if p in blob], "a piece of the key was stored"
    a, b, c = read_traffic(d)
    for r in (a, b):
        assert r.prompt_text is not None and r.prompt_text.endswith(f"key: {REDACTED}") and r.output_text == f"{REDACTED}. Done" and r.redacted
    assert c.prompt_text == "Here is my key: " and c.output_text == ". Done" and c.redacted
    for r in (a, b, c):
        assert r.output_ids == tok.encode(r.output_text, add_special_tokens=False)
        stream = tok.decode(r.prompt_ids + r.output_ids)
        assert not [p for p in pieces if p in stream], stream  # nothing the ids decode to either


def test_records_still_queued_in_a_writer_hold_other_writers_retention_back(tok, tmp_path):
    """A record waits in a serving process's queue (its writer is behind) while another writer's
    retention runs: the cut-off stays below it (the queue's hold), so when it lands no record newer
    than it has been deleted. Without the hold the other writer deleted its 5 records newer than the
    queued ones, which then landed as the oldest survivors."""
    import threading

    from eagle3_trt.formats.traffic import SegmentWriter

    d = tmp_path / "cap"
    go = threading.Event()
    warnings: list[str] = []
    cap = Capturer(CaptureConfig(dir=d, flush_s=0.05), SOURCE, tokenizer=lambda: (go.wait(30), tok)[1], warn=warnings.append)
    try:
        for i in range(5):
            _rec(cap, i)  # queued: the capture thread is still loading its tokenizer
        src = tmp_path / "src"
        _write_records(src, 10, t0=time.time() + 5)  # newer than the queued ones
        other = SegmentWriter(d, segment_records=1)
        for r in read_traffic(src):
            assert other.write(r)
        other.close()
        size = sum(len(r.to_line()) + 1 for r in read_traffic(src)[:5])
        other.retain(keep_bytes=size)
        assert len(read_traffic(d)) == 10  # the cut stayed below the queued records: nothing newer went
        go.set()
    finally:
        go.set()
        cap.close()
    left = read_traffic(d)
    assert [r.request_id for r in left] == [f"r{i}" for i in range(5)] + [f"q{i}" for i in range(10)] and not warnings
    assert not list(d.glob(".*.lease")), "a closed capturer left its hold"
    other.retain(keep_bytes=size)  # with nothing held, the oldest go first: the queued ones, then the oldest others
    assert [r.request_id for r in read_traffic(d)] == [f"q{i}" for i in range(5, 10)]


def test_a_pattern_ending_at_a_word_boundary_is_redacted_at_the_prompts_end():
    """Searched only as prompt + output, ``\\b\\d{3}-\\d{2}-\\d{4}\\b`` missed a number ending the prompt
    when the completion went on with a word character; each side is searched on its own too."""
    import re

    ssn, key = re.compile(r"\b\d{3}-\d{2}-\d{4}\b"), re.compile(r"sk-[A-Za-z0-9]{20,}")
    assert redact_joined(("keys and 123-45-6789", "abc"), [ssn, key]) == ([f"keys and {REDACTED}", "abc"], [True, False])
    assert redact_joined(("key sk-Q7", "a" * 30 + " done"), [ssn, key]) == ([f"key {REDACTED}", f"{REDACTED} done"], [True, True])
