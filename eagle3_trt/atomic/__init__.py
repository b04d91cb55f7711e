"""The one atomic writer: whole directories and single files appear complete or not at all.

Every output of the toolkit (bundles, Triton repositories, reports, trained drafts, caches) is
written through this module, so all of them share the same guarantees:

- staged next to the destination (same filesystem, so the final rename is atomic) and renamed
  into place only when complete; readers never see a half-written directory or file. Replacing an
  existing directory uses ``renameat2(RENAME_EXCHANGE)`` where the kernel and filesystem support
  it, so the destination never disappears, not even for a moment (a Triton server polling its
  repository would unload the model); elsewhere it falls back to two renames;
- fsynced before the rename (an fsync error such as a delayed ``ENOSPC`` fails the write instead
  of renaming a short file into place), and the parent directory after it;
- directories 0755 and files 0644, 0755 where the owner may execute (``mkdtemp``/``mkstemp``
  create 0700/0600 and a umask of 077 does the same to everything else; a Triton container
  running as another user could not read the output). Parent directories this module creates
  are 0755 too;
- a failure, SIGINT or SIGTERM (``docker stop``, Kubernetes) removes the staging directory: while
  a write is in progress (and only then) a signal at its default action raises
  ``KeyboardInterrupt``, and both signals are held back for the few milliseconds of a rename or
  clean-up, so neither is left half done; the previous handlers are put back when the write ends;
- staging directories left by a process that was SIGKILLed are removed by the next writer of the
  same destination (the writer's pid is in the name; a live writer's are kept);
- two writers of the same directory: the second is refused with one line naming the holder's
  pid, through an advisory ``flock`` on ``.NAME.lock`` beside the destination (a build can take
  hours, so waiting would look like a hang). The lock file is never inside the output, is removed
  on release, and a left-over one (SIGKILL) is harmless: the kernel drops the lock with the process;
- a full disk is reported as one line naming the destination.

Modules: ``writers`` (``staged_dir``, ``write_bytes``/``text``/``json``), ``paths`` (entry names,
modes, fsync, the swap), ``lock``, ``signals``, ``failures`` (full disk, unwritable parent).
"""

from eagle3_trt.atomic.failures import check_writable
from eagle3_trt.atomic.paths import DIR_MODE, EXEC_MODE, FILE_MODE, fix_modes, lock_path, make_dirs, remove_stale_staging, staging_prefix
from eagle3_trt.atomic.writers import discarding_writes, staged_dir, write_bytes, write_json, write_text

__all__ = [
    "DIR_MODE",
    "EXEC_MODE",
    "FILE_MODE",
    "check_writable",
    "discarding_writes",
    "fix_modes",
    "lock_path",
    "make_dirs",
    "remove_stale_staging",
    "staged_dir",
    "staging_prefix",
    "write_bytes",
    "write_json",
    "write_text",
]
