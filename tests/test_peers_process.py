"""A child's own peak memory and its stdout lines as they come."""

from __future__ import annotations

import sys

import pytest

from apps.bench.peers.process import describe_failure, run_child

MIB = 2**20


def test_peak_of_a_child_that_allocates():
    code = "b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096]); print('done')"
    run = run_child([sys.executable, "-c", code])
    assert run.returncode == 0 and run.stdout == "done\n"
    assert 300 * MIB < run.peak_rss_bytes < 450 * MIB


def test_peak_of_a_small_child_is_its_own_not_the_parents():
    ballast = bytearray(400 * MIB)
    ballast[::4096] = b"x" * len(ballast[::4096])
    run = run_child([sys.executable, "-c", "import time; time.sleep(0.3)"])
    assert run.peak_rss_bytes < 100 * MIB
    del ballast


def test_lines_stdin_and_failures():
    lines = []
    code = "import sys; [print(line.strip(), flush=True) for line in sys.stdin]; sys.exit('bad input')"
    run = run_child([sys.executable, "-c", code], stdin_text="a\nb\n", on_line=lines.append)
    assert lines == ["a", "b"]
    assert describe_failure(run, "worker") == "worker exited with code 1: bad input"
    killed = run_child([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert describe_failure(killed, "worker") == "worker ended by signal 9 (killed: out of memory?)"


@pytest.mark.parametrize("code", ["import os, signal; os.kill(os.getpid(), signal.SIGINT)",
                                  "raise KeyboardInterrupt", "raise SystemExit(130)"])
def test_a_child_ended_by_ctrl_c_interrupts_the_parent_too(code):
    with pytest.raises(KeyboardInterrupt):
        run_child([sys.executable, "-c", code])
