"""The atomic writer on real files and real processes: modes, failure, SIGTERM, SIGKILL, full disk, lock."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from eagle3_trt.atomic import fix_modes, lock_path, make_dirs, remove_stale_staging, staged_dir, write_bytes, write_json, write_text
from eagle3_trt.errors import UserError

# A writer in its own process: enters staged_dir(argv[1]), writes a file, says "ready", then
# waits for a line on stdin ("wait") or sleeps ("sleep"), so the test can signal or race it.
WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from eagle3_trt.atomic import staged_dir
    with staged_dir(Path(sys.argv[1])) as tmp:
        (tmp / "part.bin").write_bytes(b"x" * 4096)
        print("ready", tmp, flush=True)
        if sys.argv[2] == "wait":
            sys.stdin.readline()
        else:
            time.sleep(120)
    print("done", flush=True)
""")


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def _leftovers(dest: Path) -> list[str]:
    """Staging entries and lock file of dest in its parent directory."""
    return sorted(p.name for p in dest.parent.iterdir() if p.name.startswith(f".{dest.name}."))


@pytest.fixture()
def umask077():
    old = os.umask(0o077)
    yield
    os.umask(old)


def _start_writer(dest: Path, how: str) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(dest), how], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("ready"):
        proc.kill()
        raise AssertionError(f"writer did not start: {line!r} {proc.stderr.read()}")
    return proc, Path(line.split(" ", 1)[1].strip())


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# ---------------------------------------------------------------- (a) modes


def test_staged_dir_and_files_are_0755_0644_under_umask_077(tmp_path, umask077):
    dest = tmp_path / "new" / "deeper" / "out"
    with staged_dir(dest) as tmp:
        assert tmp.parent == dest.parent and tmp.name.startswith(".out.tmp-")
        (tmp / "sub" / "subsub").mkdir(parents=True)
        (tmp / "sub" / "subsub" / "w.bin").write_bytes(b"1")
        (tmp / "a.json").write_text("{}")
        (tmp / "run.sh").write_text("#!/bin/sh\n")
        os.chmod(tmp / "run.sh", 0o700)  # meant to be executed: stays executable, becomes readable
        write_text(tmp / "b.txt", "written through write_text inside a staged dir")
    for p in (tmp_path / "new", tmp_path / "new" / "deeper", dest, dest / "sub", dest / "sub" / "subsub"):
        assert _mode(p) == 0o755, p
    for p in (dest / "sub" / "subsub" / "w.bin", dest / "a.json", dest / "b.txt"):
        assert _mode(p) == 0o644, p
    assert _mode(dest / "run.sh") == 0o755
    assert _leftovers(dest) == []


def test_single_file_writers_are_0644_under_umask_077(tmp_path, umask077):
    t = write_text(tmp_path / "x" / "t.txt", "hello")
    j = write_json(tmp_path / "j.json", {"k": 3})
    b = write_bytes(tmp_path / "b.bin", b"\0\1", mode=0o755)
    assert (_mode(t), _mode(j), _mode(b), _mode(tmp_path / "x")) == (0o644, 0o644, 0o755, 0o755)
    assert t.read_text() == "hello" and j.read_text() == '{\n  "k": 3\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.bin", "j.json", "x"]


def test_fix_modes_does_not_follow_symlinks(tmp_path):
    outside = tmp_path / "secret"
    outside.write_text("s")
    os.chmod(outside, 0o600)
    with staged_dir(tmp_path / "out") as tmp:
        (tmp / "link").symlink_to(outside)
    fix_modes(tmp_path / "out")
    assert _mode(outside) == 0o600
    assert (tmp_path / "out" / "link").read_text() == "s"


def test_make_dirs_leaves_existing_directories_alone(tmp_path, umask077):
    os.chmod(tmp_path, 0o711)
    make_dirs(tmp_path / "a" / "b")
    assert (_mode(tmp_path), _mode(tmp_path / "a"), _mode(tmp_path / "a" / "b")) == (0o711, 0o755, 0o755)
    (tmp_path / "f").write_text("")
    with pytest.raises(UserError, match="is not a directory"):
        make_dirs(tmp_path / "f" / "sub")


# ---------------------------------------------------------------- (b) failure and replacement


def test_exception_keeps_the_old_destination_and_leaves_nothing(tmp_path):
    dest = tmp_path / "bundle"
    with staged_dir(dest) as tmp:
        (tmp / "v").write_text("1")
    with pytest.raises(RuntimeError, match="boom"), staged_dir(dest) as tmp:
        (tmp / "v").write_text("2")
        (tmp / "half.bin").write_bytes(b"x" * 1000)
        raise RuntimeError("boom")
    assert sorted(p.name for p in dest.iterdir()) == ["v"] and (dest / "v").read_text() == "1"
    assert _leftovers(dest) == []


def test_replacing_swaps_contents_and_leaves_no_old_copy(tmp_path):
    dest = tmp_path / "bundle"
    for v in ("1", "2", "3"):
        with staged_dir(dest) as tmp:
            (tmp / f"only-{v}").write_text(v)
    assert [p.name for p in dest.iterdir()] == ["only-3"]
    assert _leftovers(dest) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]


def test_lock_file_is_beside_the_destination_never_inside(tmp_path):
    dest = tmp_path / "bundle"
    with staged_dir(dest) as tmp:
        assert lock_path(dest) == tmp_path / ".bundle.lock" and lock_path(dest).is_file()
        assert lock_path(dest).read_text().strip() == str(os.getpid())
        (tmp / "f").write_text("")
    assert [p.name for p in dest.iterdir()] == ["f"]
    assert not lock_path(dest).exists()


# ---------------------------------------------------------------- (c) SIGTERM


def test_sigterm_removes_the_staging_dir(tmp_path):
    dest = tmp_path / "out"
    proc, staging = _start_writer(dest, "sleep")
    assert staging.is_dir() and (staging / "part.bin").is_file()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert "done" not in out and "KeyboardInterrupt" in err  # the signal became an exception, so clean-up ran
    assert not staging.exists() and not dest.exists()
    assert _leftovers(dest) == []


def test_sigint_at_its_default_action_removes_the_staging_dir_too(tmp_path):
    # SIGINT reset to the default action (kill, no exception): the writer takes it over for the write.
    dest = tmp_path / "out"
    code = "import signal; signal.signal(signal.SIGINT, signal.SIG_DFL)\n" + WRITER
    proc = subprocess.Popen([sys.executable, "-c", code, str(dest), "sleep"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("ready"), proc.stderr.read()
    staging = Path(line.split(" ", 1)[1].strip())
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and "done" not in out and "KeyboardInterrupt" in err
    assert not staging.exists() and not dest.exists() and _leftovers(dest) == []


# SIGTERM lands while a __del__ runs: Python swallows the handler's exception ("Exception ignored
# in ...") and carries on. Seen for real: a build stopped during transformers' imports (regex's
# Group.__del__) completed and exited 0. argv[2]: how long the body goes on afterwards.
SWALLOWED = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from eagle3_trt.atomic import staged_dir
    class Slow:
        def __del__(self):
            print("in-del", flush=True)
            time.sleep(3)
    with staged_dir(Path(sys.argv[1])) as tmp:
        (tmp / "part.bin").write_bytes(b"x")
        s = Slow()
        del s
        print("after-del", flush=True)
        time.sleep(float(sys.argv[2]))
    print("done", flush=True)
""")


@pytest.mark.parametrize("body_s", [0.0, 120.0], ids=["body-ends", "body-goes-on"])
def test_sigterm_swallowed_in_a_destructor_still_stops_the_writer(tmp_path, body_s):
    dest = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", SWALLOWED, str(dest), str(body_s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "in-del"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert "after-del" in out  # the destructor's exception was swallowed: the body went on
    assert "done" not in out and proc.returncode != 0, out + err
    assert time.monotonic() - t0 < 10  # re-raised within about a second, not after the 120 s body
    assert "Exception ignored" not in err
    assert not dest.exists() and _leftovers(dest) == []


def test_sigterm_handler_is_only_installed_while_writing(tmp_path):
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    with staged_dir(tmp_path / "o"):
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def _handlers() -> tuple:
    return signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)


@pytest.mark.parametrize("how", ["success", "error"])
def test_signal_handlers_are_restored_after_a_staged_dir(tmp_path, how):
    before = _handlers()
    with pytest.raises(RuntimeError) if how == "error" else contextlib.nullcontext(), staged_dir(tmp_path / "o") as tmp:
        (tmp / "f").write_text("x")
        if how == "error":
            raise RuntimeError("body failed")
    assert _handlers() == before
    write_text(tmp_path / "f.txt", "x")
    assert _handlers() == before


def test_default_sigint_and_sigterm_are_taken_over_only_during_the_write_and_put_back(tmp_path):
    # Both at their default action (kill without clean-up): the writer takes both over for the
    # write, and afterwards the very same dispositions are back, not the writer's handler.
    old_int, old_term = _handlers()
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with staged_dir(tmp_path / "o"):
            inside = _handlers()
        assert signal.SIG_DFL not in inside
        assert _handlers() == (signal.SIG_DFL, signal.SIG_DFL)
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


def test_a_handler_the_process_installed_is_left_alone_and_kept(tmp_path):
    def mine(signum, frame):
        raise AssertionError("not sent")

    old_term = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, mine)
        with staged_dir(tmp_path / "o"):
            assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, old_term)


def test_process_handlers_are_untouched_by_importing_the_writer():
    # Importing eagle3_trt (and its atomic writer) must not change any signal disposition.
    code = "import signal; b = (signal.getsignal(2), signal.getsignal(15)); import eagle3_trt.atomic, eagle3_trt.cli; print(b == (signal.getsignal(2), signal.getsignal(15)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr


# ---------------------------------------------------------------- (d) SIGKILL leftovers


def test_sigkilled_writers_staging_is_removed_by_the_next_writer(tmp_path):
    dest = tmp_path / "out"
    proc, staging = _start_writer(dest, "sleep")
    proc.kill()
    proc.wait()
    assert staging.is_dir() and lock_path(dest).exists()  # what a SIGKILL leaves behind
    with staged_dir(dest) as tmp:
        assert not staging.exists()
        (tmp / "new").write_text("n")
    assert [p.name for p in dest.iterdir()] == ["new"]
    assert _leftovers(dest) == []


def test_a_live_writers_staging_is_kept(tmp_path):
    dest = tmp_path / "out"
    live = tmp_path / f".out.tmp-{os.getppid()}-abcd"  # pytest's parent process is alive
    dead = tmp_path / f".out.tmp-{_dead_pid()}-efgh"
    dead_old = tmp_path / f".out.old-{_dead_pid()}-ijkl"
    other = tmp_path / f".outer.tmp-{_dead_pid()}-mnop"  # another destination's staging
    for d in (live, dead, dead_old, other):
        d.mkdir()
    with staged_dir(dest) as tmp:
        (tmp / "f").write_text("")
    assert live.is_dir() and other.is_dir()
    assert not dead.exists() and not dead_old.exists()


def test_a_running_writer_keeps_its_staging_and_its_lock(tmp_path):
    dest = tmp_path / "out"
    proc, staging = _start_writer(dest, "wait")
    try:
        assert remove_stale_staging(dest) == []
        with pytest.raises(UserError), staged_dir(dest):
            pass
        assert staging.is_dir() and (staging / "part.bin").is_file()
        out, err = proc.communicate("\n", timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert (dest / "part.bin").is_file() and _leftovers(dest) == []


# ---------------------------------------------------------------- (e) full disk


def _mount_tmpfs(mnt: Path, options: str) -> None:
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr  # tests that mount carry @pytest.mark.needs("tmpfs")


@pytest.fixture()
def tiny_fs(tmp_path):
    """A 2 MiB tmpfs; needs root and a mount namespace that allows it."""
    mnt = tmp_path / "small"
    _mount_tmpfs(mnt, "size=2m")
    yield mnt
    gc.collect()  # a failed torch.save keeps its deleted file open until collected: the mount would be busy
    if subprocess.run(["umount", str(mnt)]).returncode != 0:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def _fill_raw(d: Path) -> None:
    (d / "big.bin").write_bytes(b"x" * (3 << 20))


def _fill_safetensors(d: Path) -> None:
    save_file({"w": torch.zeros(1 << 20)}, str(d / "model.safetensors"))  # 4 MiB, SafetensorError


def _fill_torch(d: Path) -> None:
    torch.save({"w": torch.zeros(1 << 20)}, d / "model.pt")  # 4 MiB, "PytorchStreamWriter failed"


@pytest.mark.parametrize("fill", [_fill_raw, _fill_safetensors, _fill_torch], ids=["write", "safetensors", "torch.save"])
@pytest.mark.needs("tmpfs")
def test_full_disk_is_one_line_naming_the_destination(tiny_fs, fill):
    dest = tiny_fs / "bundle"
    with staged_dir(dest) as tmp:
        (tmp / "old").write_text("previous build")
    with pytest.raises(UserError) as ei, staged_dir(dest) as tmp:
        fill(tmp)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith(f"{dest}: no space left on the device")
    assert sorted(p.name for p in tiny_fs.iterdir()) == ["bundle"]  # no staging dir, no lock
    assert (dest / "old").read_text() == "previous build"


@pytest.mark.needs("tmpfs")
def test_full_disk_single_file(tiny_fs):
    path = tiny_fs / "big.json"
    with pytest.raises(UserError, match=r"big\.json: no space left on the device") as ei:
        write_bytes(path, b"x" * (3 << 20))
    assert "\n" not in str(ei.value)
    assert list(tiny_fs.iterdir()) == []


def test_read_only_file_system_is_one_line(tmp_path):
    mnt = tmp_path / "ro"
    _mount_tmpfs(mnt, "ro,size=1m")
    try:
        for write in (lambda: staged_dir(mnt / "bundle").__enter__(), lambda: write_text(mnt / "f.json", "{}")):
            with pytest.raises(UserError, match=r"cannot write in .*/ro \(read-only file system\)") as ei:
                write()
            assert "\n" not in str(ei.value)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


# ---------------------------------------------------------------- (f) lock


def test_second_writer_is_refused_while_the_first_holds_the_lock(tmp_path):
    dest = tmp_path / "out"
    with staged_dir(dest) as tmp:
        (tmp / "v").write_text("old")
    proc, staging = _start_writer(dest, "wait")
    try:
        t0 = time.monotonic()
        with pytest.raises(UserError) as ei, staged_dir(dest) as tmp:
            (tmp / "v").write_text("mine")
        assert time.monotonic() - t0 < 5  # refused at once, not after waiting
        msg = str(ei.value)
        assert msg.startswith(f"{dest}: another process (pid {proc.pid}) is writing it") and "\n" not in msg
        assert (dest / "v").read_text() == "old" and staging.is_dir()
        proc.communicate("\n", timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0
    # the first writer finished: the lock is gone and the next writer goes ahead
    assert not lock_path(dest).exists()
    with staged_dir(dest) as tmp:
        (tmp / "v").write_text("mine")
    assert [p.name for p in dest.iterdir()] == ["v"]
    assert (dest / "v").read_text() == "mine" and _leftovers(dest) == []


def test_a_left_behind_lock_file_is_harmless(tmp_path):
    dest = tmp_path / "out"
    lock_path(dest).write_text("999999999\n")  # what a SIGKILLed writer leaves
    with staged_dir(dest) as tmp:
        (tmp / "f").write_text("")
    assert (dest / "f").is_file() and not lock_path(dest).exists()
