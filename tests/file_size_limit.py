"""A full disk, as a test can make one: a child Python process whose files may not grow past a limit
(RLIMIT_FSIZE; a write past it fails with EFBIG, "File too large", as one onto a full disk fails with ENOSPC)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]


def run_with_file_size_limit(body: str, limit_bytes: int) -> subprocess.CompletedProcess:
    """Run the Python source `body` in a child whose files stop at limit_bytes; its output, as text."""
    preamble = ("import resource, signal\n"
                "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
                f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit_bytes}, {limit_bytes}))\n")
    return subprocess.run([sys.executable, "-c", preamble + body], capture_output=True, text=True, timeout=60,
                          cwd=REPOSITORY)
