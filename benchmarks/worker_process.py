"""A benchmark script running one measurement in a fresh process of itself, so that the process's memory
and start-up are that measurement's own.

The script's main() calls answer_if_worker(worker) first; run_worker(__file__, config) then runs
`python SCRIPT --worker CONFIG_JSON`, whose worker(config) result comes back as the last line of its
stdout. Only the standard library is imported here: a worker that measures its own memory from the
start sees nothing this module added.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER_FLAG = "--worker"
STDERR_TAIL_CHARS = 3000


class WorkerFailed(SystemExit):
    """A worker that exited non-zero. Uncaught, it ends the script with its message (exit code 1) and no
    traceback; a script that keeps going catches it and reads returncode and stderr."""

    def __init__(self, what: str, returncode: int, stderr: str | None):
        self.returncode, self.stderr = returncode, stderr or ""
        ended = f"ended by signal {-returncode}" if returncode < 0 else f"exited with code {returncode}"
        detail = f"; the end of its stderr:\n{self.stderr[-STDERR_TAIL_CHARS:]}" if stderr else "; its stderr is above"
        super().__init__(f"{what} {ended}{detail}")


def run_worker(script: str | Path, config, *, what: str = "worker", capture_stderr: bool = True) -> dict:
    """worker(config) of `script`, run in a fresh process from the repository root. capture_stderr=False
    lets the worker's stderr (its progress) through to this one's. Raises WorkerFailed on a non-zero exit."""
    done = subprocess.run([sys.executable, str(script), WORKER_FLAG, json.dumps(config)], cwd=ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE if capture_stderr else None)
    if done.returncode != 0:
        raise WorkerFailed(what, done.returncode, done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def answer_if_worker(worker) -> None:
    """When run_worker started this process: print worker(config) as one JSON line and exit; else return."""
    if len(sys.argv) == 3 and sys.argv[1] == WORKER_FLAG:
        print(json.dumps(worker(json.loads(sys.argv[2]))))
        sys.exit(0)
