"""Issue 11 B: the target tokenizer against its own config, one config schema for validate and
engine, registry-only --model, and calibration input (checked early, capped, interruptible).

Everything runs on the tiny pair the project makes (conftest.tiny_pair) and through the real CLI
entry point (eagle3_trt.cli.main), in process where that is enough and in a subprocess where a
real signal must reach a real calibration."""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3_trt.cli import main
from eagle3_trt.convert.target import read_target
from eagle3_trt.convert.validate import ValidationReport, check_target_tokenizer
from eagle3_trt.errors import UserError
from eagle3_trt.pipeline.presets import PRESET_DIR, available, load_preset, load_preset_file

REPO = Path(__file__).resolve().parents[1]


def _edit(path: Path, **kv) -> None:
    cfg = json.loads(path.read_text())
    for k, v in kv.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    path.write_text(json.dumps(cfg))


def _cli(capsys, *argv: str) -> tuple[int, str]:
    """Exit code and stderr of one CLI run; the message must be one line without a traceback."""
    rc = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return rc, err


def _one_line_error(err: str, *needles: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _nothing_written(out: Path) -> None:
    assert not out.exists(), out
    left = [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
    assert left == [], left


def _check_tokenizer(target_dir: Path) -> ValidationReport:
    rep = ValidationReport()
    check_target_tokenizer(read_target(target_dir), rep)
    return rep


def _swap_token_ids(tokenizer_json: Path, a: str, b: str) -> tuple[int, int]:
    """Exchange the ids of tokens a and b everywhere in tokenizer.json: still a loadable tokenizer,
    but no longer the one the weights and config.json were made with (a swapped tokenizer)."""
    data = json.loads(tokenizer_json.read_text())
    vocab = data["model"]["vocab"]
    ia, ib = vocab[a], vocab[b]
    vocab[a], vocab[b] = ib, ia
    for t in data["added_tokens"]:
        t["id"] = {ia: ib, ib: ia}.get(t["id"], t["id"])
    tokenizer_json.write_text(json.dumps(data))
    return ib, ia


# ---------------------------------------------------------------- 1. tokenizer vs config


def test_tokenizer_ids_agree_with_transformers(tiny_pair):
    """The special ids the check reads from the files are the ones transformers resolves (the
    TensorRT-LLM LLM API loads the tokenizer with AutoTokenizer), on the good and a swapped tokenizer."""
    from transformers import AutoTokenizer  # ~4 s; only this test needs the real loader

    target = tiny_pair[0]
    rep = _check_tokenizer(target)
    tok = AutoTokenizer.from_pretrained(str(target))
    detail = rep.checks[0]["detail"]
    for role in ("bos", "eos", "pad"):
        assert f"{getattr(tok, f'{role}_token')!r}={getattr(tok, f'{role}_token_id')}" in detail, detail
    new_bos, _ = _swap_token_ids(target / "tokenizer.json", "<|begin_of_text|>", "<|eot_id|>")
    assert AutoTokenizer.from_pretrained(str(target)).bos_token_id == new_bos != 0


def test_swapped_tokenizer_refused_by_validate_and_engine(tiny_pair, tmp_path, capsys):
    t, d = tiny_pair
    new_bos, new_eos = _swap_token_ids(t / "tokenizer.json", "<|begin_of_text|>", "<|eot_id|>")
    rc, err = _cli(capsys, "validate", "--target", str(t), "--draft", str(d))
    line = _one_line_error(err, f"{t / 'config.json'}:bos_token_id", f"0, but the tokenizer's bos_token '<|begin_of_text|>' is id {new_bos}", "hint:")
    assert rc == 2
    out = tmp_path / "bundle"
    for extra in ([], ["--dry-run"]):
        rc, err = _cli(capsys, "engine", "--target", str(t), "--draft", str(d), "--target-gpu", "h100", "-o", str(out), *extra)
        assert rc == 2 and _one_line_error(err) == line
        _nothing_written(out)


@pytest.mark.parametrize(
    "edit, needles",
    [
        ({"config.json": {"eos_token_id": [1]}}, ["config.json:eos_token_id", "1, but the tokenizer's eos_token '<|eot_id|>' is id 4"]),
        ({"generation_config.json": {"eos_token_id": [1, 2]}}, ["generation_config.json:eos_token_id", "[1, 2], but the tokenizer's eos_token"]),
        ({"config.json": {"pad_token_id": 3}}, ["config.json:pad_token_id", "3, but the tokenizer's pad_token '<|finetune_right_pad_id|>' is id 5"]),
        ({"config.json": {"bos_token_id": 600}}, ["config.json:bos_token_id", "id 600 is outside the vocabulary 0..511"]),
        ({"generation_config.json": {"pad_token_id": 512}}, ["generation_config.json:pad_token_id", "id 512 is outside the vocabulary"]),
        ({"generation_config.json": {"bos_token_id": "0"}}, ["generation_config.json:bos_token_id", 'must be a valid integer, got "0"']),
        ({"config.json": {"vocab_size": 500}}, ["config.json:vocab_size", "500, but tokenizer.json has 512 tokens with ids up to 511"]),
        ({"tokenizer_config.json": {"bos_token": "<s>"}}, ["tokenizer_config.json:bos_token", "'<s>' is not a token of tokenizer.json"]),
        (
            {"special_tokens_map.json": {"eos_token": {"content": "<|end_of_text|>"}}},
            ["special_tokens_map.json:eos_token", "'<|end_of_text|>' but tokenizer_config.json says '<|eot_id|>'"],
        ),
    ],
)
def test_tokenizer_config_disagreements(tiny_pair, edit, needles):
    t = tiny_pair[0]
    for name, kv in edit.items():
        if not (t / name).exists():
            (t / name).write_text("{}")
        _edit(t / name, **kv)
    with pytest.raises(UserError) as e:
        _check_tokenizer(t)
    line = e.value.line()
    assert "\n" not in line and "hint:" in line
    for n in needles:
        assert n in line, line


def test_llama3_style_eos_lists_pass(tiny_pair):
    """config.json names one stop id and generation_config.json several (Meta's Llama-3 Instruct
    layout): the tokenizer's eos must be one of the declared ids, not all of them."""
    t = tiny_pair[0]
    _edit(t / "config.json", eos_token_id=4)
    _edit(t / "generation_config.json", eos_token_id=[1, 4])
    assert _check_tokenizer(t).checks[0]["check"] == "target_tokenizer"


# ---------------------------------------------------------------- 2. one config schema


@pytest.mark.parametrize("value", ["256", "two-fifty-six", 64.0, True])
def test_bad_hidden_size_same_line_from_validate_and_engine(tiny_pair, tmp_path, capsys, value):
    t, d = tiny_pair
    _edit(t / "config.json", hidden_size=value)
    out = tmp_path / "bundle"
    rc_v, err_v = _cli(capsys, "validate", "--target", str(t), "--draft", str(d))
    rc_e, err_e = _cli(capsys, "engine", "--target", str(t), "--draft", str(d), "--target-gpu", "h100", "-o", str(out))
    line = _one_line_error(err_v, f"{t / 'config.json'}:hidden_size", f"got {json.dumps(value)}")
    assert rc_v == rc_e == 2 and _one_line_error(err_e) == line
    _nothing_written(out)


def test_transformers_refuses_a_string_hidden_size_too(tiny_pair):
    """Why "256" is refused rather than coerced: transformers does not take it either (5.x when the
    config is read, 4.57 when the model is built), so a coerced value would not survive serving."""
    from transformers import AutoConfig, AutoModelForCausalLM  # ~4 s; only this test builds a model

    t = tiny_pair[0]
    _edit(t / "config.json", hidden_size="64")
    # 5.x: huggingface_hub's StrictDataclassFieldValidationError naming the field; 4.57: a TypeError
    # where the str meets arithmetic (`//`) or a tensor shape (torch.empty: "tuple of ints")
    with pytest.raises(Exception, match="hidden_size|unsupported operand|tuple of ints"):
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(t)))


@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("num_key_value_heads", 3, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
        ("max_position_embeddings", None, "missing required field"),
        ("rope_theta", "1e4", 'must be a valid number, got "1e4"'),
        ("tie_word_embeddings", "false", "must be a valid boolean"),
        ("eos_token_id", [1, "x"], 'got "x"'),
    ],
)
def test_schema_names_file_and_field(tiny_pair, field, value, needle):
    t = tiny_pair[0]
    _edit(t / "config.json", **{field: value})
    with pytest.raises(UserError) as e:
        read_target(t)
    assert e.value.where == f"{t / 'config.json'}:{field}" and needle in e.value.what


# ---------------------------------------------------------------- 3. presets from the registry only


def test_model_takes_registry_names_only(tmp_path, monkeypatch, capsys):
    # a YAML file that would load as a valid preset if --model joined its value to a path
    evil = tmp_path / "x" / "evil.yaml"
    evil.parent.mkdir()
    shutil.copy(PRESET_DIR / "tiny.yaml", evil)
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    rel = os.path.relpath(evil.with_suffix(""), PRESET_DIR)
    for name in ("../../x/evil", rel, str(evil.with_suffix("")), str(evil)):
        with pytest.raises(UserError) as e:
            load_preset(name)
        assert f"MODEL: unknown preset {name!r}" in e.value.line() and "--preset-file" in e.value.line()
        rc, err = _cli(capsys, "engine", "--model", name, "--dry-run", "-o", str(tmp_path / "out"))
        assert rc == 2
        _one_line_error(err, f"MODEL: unknown preset {name!r}", "available presets:", "tiny")
        rc, err = _cli(capsys, "plan", name)
        assert rc == 2
        _one_line_error(err, f"MODEL: unknown preset {name!r}")
    assert not (tmp_path / "out").exists()
    assert [load_preset(n).name for n in available()] == available()


def test_preset_file_option(tmp_path, capsys):
    custom = tmp_path / "mine.yaml"
    custom.write_text((PRESET_DIR / "llama3.1-8b.yaml").read_text())
    out = tmp_path / "bundle"
    rc, err = _cli(capsys, "engine", "--preset-file", str(custom), "--dry-run", "--target-gpu", "h100", "-o", str(out))
    assert rc == 0 and (out / "manifest.json").is_file(), err
    rc, err = _cli(capsys, "engine", "--preset-file", str(custom), "--model", "tiny", "--dry-run", "-o", str(tmp_path / "o2"))
    assert rc == 2
    _one_line_error(err, "--model/--preset-file", "both given")
    rc, err = _cli(capsys, "engine", "--preset-file", str(tmp_path / "none.yaml"), "--dry-run", "-o", str(tmp_path / "o3"))
    assert rc == 2
    _one_line_error(err, "none.yaml", "preset file not found")
    custom.write_text(custom.read_text() + "max_draft_lenn: 3\n")
    with pytest.raises(UserError, match="max_draft_lenn"):
        load_preset_file(custom)


# ---------------------------------------------------------------- 4. calibration input


def test_bad_calibration_file_refused_before_the_target_is_loaded(tiny_pair, tmp_path, capsys):
    t, d = tiny_pair
    # the weights are unreadable: had the target been opened first, the error would name them
    (t / "model.safetensors").write_bytes(b"not safetensors")
    calib = tmp_path / "calib.jsonl"
    calib.write_text('{"turns": ["fine"]}\n{"turn": ["typo"]}\n')
    out = tmp_path / "bundle"
    rc, err = _cli(
        capsys, "engine", "--target", str(t), "--draft", str(d), "--target-gpu", "h100", "-o", str(out), "--calib", str(calib), "--calib-samples", "2"
    )
    assert rc == 2
    _one_line_error(err, f"{calib}:2", 'no "turns"')
    rc, err = _cli(capsys, "engine", "--target", str(t), "--draft", str(d), "--target-gpu", "h100", "-o", str(out), "--calib", str(tmp_path / "missing.jsonl"))
    assert rc == 2
    _one_line_error(err, "missing.jsonl", "prompt file not found")
    _nothing_written(out)


def test_calib_max_length_capped_at_max_position_embeddings(tiny_pair, tmp_path, capsys):
    t, d = tiny_pair
    out = tmp_path / "bundle"
    rc, err = _cli(capsys, "engine", "--target", str(t), "--draft", str(d), "--target-gpu", "h100", "-o", str(out), "--calib-max-length", "200000")
    assert rc == 2
    _one_line_error(
        err,
        "--calib-max-length",
        "200000 tokens per calibration prompt exceeds the target's max_position_embeddings (1024",
        "pass --calib-max-length 1024 or less",
    )
    for bad in ("0", "-5"):
        rc = main(["engine", "--target", str(t), "--draft", str(d), "-o", str(out), "--calib-max-length", bad])
        err = capsys.readouterr().err
        assert rc == 2 and "--calib-max-length" in err and "Traceback" not in err
    _nothing_written(out)


_CHILD = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # even when the test runner ignores SIGINT
from eagle3_trt.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _drain(fd: int, proc: subprocess.Popen, seconds: float) -> int | None:
    """Read the child's terminal for ``seconds`` or until it exits (its return code, else None). The
    pseudo-terminal holds a few KB: a child whose progress nobody reads blocks in write(), and a signal
    then only moves it to its next blocked write (one fresh-clone run timed out here that way)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return proc.returncode
        if select.select([fd], [], [], 0.05)[0]:
            try:
                os.read(fd, 65536)
            except OSError:
                pass
    return proc.poll()


def _read_until(fd: int, needle: bytes, proc: subprocess.Popen, timeout: float) -> bytes:
    buf = b""
    deadline = time.monotonic() + timeout
    while needle not in buf:
        assert proc.poll() is None, buf.decode(errors="replace")
        assert time.monotonic() < deadline, f"no {needle!r} within {timeout} s: {buf.decode(errors='replace')[-2000:]}"
        if select.select([fd], [], [], 0.2)[0]:
            try:
                buf += os.read(fd, 65536)
            except OSError:
                break
    return buf


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_during_calibration_exits_promptly_and_cleans_up(tiny_pair, tmp_path, sig, code):
    """A real signal to a real `eagle3-trt engine` while ModelOpt calibrates: exit within seconds
    with 128 + signal, no bundle, no staging directory, no lock file."""
    t, d = tiny_pair
    calib = tmp_path / "calib.txt"
    line = " ".join(f"def f{i}(x): return x * {i}" for i in range(300))  # > 1024 tokens: cut at the cap
    calib.write_text((line + "\n") * 400)
    out = tmp_path / "bundle"
    # stderr on a pseudo-terminal: rich then draws its live progress, which names the stage
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "200"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _CHILD,
            "engine",
            "--target",
            str(t),
            "--draft",
            str(d),
            "--target-gpu",
            "h100",
            "-o",
            str(out),
            "--calib",
            str(calib),
            "--calib-samples",
            "400",
            "--calib-max-length",
            "1024",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
        env=env,
        cwd=REPO,
    )
    os.close(slave)
    try:
        _read_until(master, b"calibrate + quantize target", proc, timeout=120)
        _drain(master, proc, 1.0)  # well inside the loop: 400 prompts take far longer than this
        assert proc.poll() is None
        staging = [p for p in tmp_path.iterdir() if p.name.startswith(".bundle.tmp-")]
        assert staging, "the build should be writing its staging directory"
        sent = time.monotonic()
        proc.send_signal(sig)
        rc = _drain(master, proc, 30.0)
        took = time.monotonic() - sent
        assert rc is not None, "no exit within 30 s of the signal"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    assert rc == code, (rc, proc.stdout.read())
    assert took < 10, f"{took:.1f} s from the signal to the exit"
    _nothing_written(out)
