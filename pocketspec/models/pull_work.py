"""What a pull leaves behind when it dies: its pip child, and its work folder beside the model cache.

A pull holds an exclusive flock on `.owner.lock` inside its work folder for as long as it
runs. The kernel drops the lock when the process dies, however it dies, so a folder whose
lock can be taken belongs to a dead pull and is removed; a live pull's folder is left alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

OWNER_LOCK = ".owner.lock"
WORK_PREFIX = ".pull-"
# A folder with no lock yet is a pull between mkdtemp and taking its lock, or one from a
# version of pocketspec that took none: only the latter can be this old.
UNLOCKED_STALE_SECONDS = 60
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@contextlib.contextmanager
def owned_work_folder(parent: Path, name: str) -> Iterator[Path]:
    """A fresh `.pull-NAME-*` folder in `parent`, locked while the block runs and removed after it."""
    folder = Path(tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{name}-", dir=parent))
    try:
        with open(folder / OWNER_LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def _remove_if_dead(folder: Path) -> bool:
    try:
        with open(folder / OWNER_LOCK) as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # its pull is still running
            shutil.rmtree(folder, ignore_errors=True)
            return True
    except (FileNotFoundError, IsADirectoryError):  # no lock a pull holds (a folder in its place is none either)
        if time.time() - folder.stat().st_mtime < UNLOCKED_STALE_SECONDS:
            return False
        shutil.rmtree(folder, ignore_errors=True)
        return True


def remove_stale_work_folders(parent: Path, *, say: Callable[[str], None]) -> int:
    """Remove the work folders of pulls that died; returns how many, and says so in one line."""
    num_removed = num_bytes = 0
    for folder in parent.glob(f"{WORK_PREFIX}*"):
        if not folder.is_dir():
            continue
        with contextlib.suppress(FileNotFoundError):  # another pull removed it first
            size = _folder_bytes(folder)
            if _remove_if_dead(folder):
                num_removed += 1
                num_bytes += size
    if num_removed:
        say(f"removed {num_removed} work folder(s) of pulls that did not finish ({num_bytes / 2**20:.1f} MiB) "
            f"from {parent}")
    return num_removed


def die_with_parent(parent_pid: int) -> Callable[[], None] | None:
    """A preexec_fn after which the kernel kills the child when `parent_pid` dies (Linux; None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # this process's own libc: find_library("c") would run ldconfig

    def set_death_signal() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return set_death_signal
