"""Running one child process and reading its peak resident memory.

Linux's ru_maxrss survives execve, so a child spawned by a large parent reports the
parent's peak (see pocketspec.stats.peak_rss_bytes). The child's own VmHWM is read
from /proc while it runs instead; ru_maxrss from wait4 is the fallback elsewhere.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pocketspec.huge_pages import users_environment
from pocketspec.stats import vm_hwm_bytes

POLL_SECONDS = 0.02
INTERRUPTED_EXIT_CODE = 130  # what a program that handles Ctrl-C exits with


@dataclass
class ChildRun:
    returncode: int
    stdout: str
    stderr: str
    peak_rss_bytes: int
    seconds: float


class _LineReader:
    """Complete lines appended to a file so far, read without moving the writer's offset."""

    def __init__(self, file, on_line):
        self.file, self.on_line, self.offset, self.pending = file, on_line, 0, b""

    def read(self) -> None:
        while chunk := os.pread(self.file.fileno(), 1 << 16, self.offset):
            self.offset += len(chunk)
            *lines, self.pending = (self.pending + chunk).split(b"\n")
            for line in lines:
                self.on_line(line.decode(errors="replace"))


def run_peer(argv: list[str]) -> ChildRun:
    """A peer (one of llama.cpp's tools) run as the user would run it: with the environment the user
    gave PocketSpec, not the huge-page tunable PocketSpec added to its own (pocketspec/huge_pages.py)."""
    return run_child(argv, env=users_environment(os.environ))


def run_child(argv: list[str], *, stdin_text: str | None = None, timeout_seconds: float | None = None,
              on_line=None, env: dict[str, str] | None = None) -> ChildRun:
    """Run argv to completion with its output in temporary files (no pipe can fill up).

    env: the child's environment (None: this process's). on_line, when given, sees each line of
    stdout as it is written. A child that Ctrl-C ended raises KeyboardInterrupt here, as Ctrl-C in
    this process does.
    """
    with tempfile.TemporaryFile() as stdin_file, tempfile.TemporaryFile() as stdout_file, \
            tempfile.TemporaryFile() as stderr_file:
        if stdin_text is not None:
            stdin_file.write(stdin_text.encode())
            stdin_file.seek(0)
        started = time.perf_counter()
        process = subprocess.Popen(argv, stdin=stdin_file if stdin_text is not None else subprocess.DEVNULL,
                                   stdout=stdout_file, stderr=stderr_file, env=env)
        peak_bytes = 0
        reader = _LineReader(stdout_file, on_line) if on_line is not None else None
        try:
            while True:
                pid, status, usage = os.wait4(process.pid, os.WNOHANG)
                if pid:
                    break
                peak_bytes = max(peak_bytes, vm_hwm_bytes(process.pid) or 0)
                if reader is not None:
                    reader.read()
                if timeout_seconds is not None and time.perf_counter() - started > timeout_seconds:
                    process.kill()
                time.sleep(POLL_SECONDS)
        except BaseException:
            process.kill()
            process.wait()
            raise
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode in (-signal.SIGINT, INTERRUPTED_EXIT_CODE):
            # Ctrl-C reaches the child's process group too, and the child may end first
            raise KeyboardInterrupt
        if reader is not None:
            reader.read()
        if not peak_bytes:
            peak_bytes = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
        stdout_file.seek(0)
        stderr_file.seek(0)
        return ChildRun(process.returncode, stdout_file.read().decode(errors="replace"),
                        stderr_file.read().decode(errors="replace"), peak_bytes, time.perf_counter() - started)


def describe_failure(run: ChildRun, what: str) -> str:
    """One line on why a child failed: a signal (out of memory shows as SIGKILL) or its last stderr line."""
    if run.returncode < 0:
        signal_number = -run.returncode
        hint = " (killed: out of memory?)" if signal_number == 9 else ""
        return f"{what} ended by signal {signal_number}{hint}"
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    return f"{what} exited with code {run.returncode}" + (f": {lines[-1].strip()}" if lines else "")


def executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)
