"""pocketspec.measured_cache: measurements written whole, and measured by one process at a time."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from pocketspec.measured_cache import measuring_alone, read_json, write_json


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("POCKETSPEC_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_measurement_is_written_whole_and_read_back(tmp_path):
    path = tmp_path / "measured" / "table.json"
    assert write_json(path, {"widths": [1, 2]}) and read_json(path) == {"widths": [1, 2]}
    assert os.listdir(path.parent) == ["table.json"]  # no temporary file left beside it
    assert read_json(tmp_path / "missing.json") is None
    (tmp_path / "torn.json").write_text('{"widths": [1,')
    assert read_json(tmp_path / "torn.json") is None


def test_a_home_that_cannot_be_written_loses_only_the_cache(tmp_path):
    (tmp_path / "a_file").write_text("")
    assert write_json(tmp_path / "a_file" / "table.json", 1) is False


def test_a_second_process_waits_for_the_one_measuring(home):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom pocketspec.measured_cache import measuring_alone\n"
         "with measuring_alone():\n    print('held', flush=True)\n    sys.stdin.readline()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "POCKETSPEC_HOME": str(home)})
    try:
        assert holder.stdout.readline().strip() == "held"
        entered = threading.Event()

        def measure():
            with measuring_alone():
                entered.set()

        waiter = threading.Thread(target=measure)
        waiter.start()
        assert not entered.wait(0.5)  # the other process holds the lock
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert entered.wait(30)
        waiter.join()
    finally:
        holder.kill()
        holder.wait()


def test_a_watcher_is_told_why_a_waiting_process_shows_nothing(home):
    """On a terminal, a run that waits for another process's measurement (or ONNX export) says so, rather
    than showing nothing for as long as that one takes."""
    pexpect = pytest.importorskip("pexpect")
    environment = {**os.environ, "POCKETSPEC_HOME": str(home)}
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom pocketspec.measured_cache import measuring_alone\n"
         "with measuring_alone():\n    print('held', flush=True)\n    sys.stdin.readline()\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=environment)
    try:
        assert holder.stdout.readline().strip() == "held"
        waiter = pexpect.spawn(sys.executable, ["-c", "from pocketspec.measured_cache import measuring_alone\n"
                                                "with measuring_alone():\n    print('entered')\n"],
                               env=environment, encoding="utf-8", timeout=30)
        waiter.expect("waiting for another measurement or ONNX export in")
        holder.stdin.write("\n")
        holder.stdin.flush()
        waiter.expect("entered")
        waiter.expect(pexpect.EOF)
    finally:
        holder.kill()
        holder.wait()


def test_a_process_measuring_several_tables_in_a_row_takes_the_lock_once(home):
    import signal

    def waited_for_itself(signum, frame):
        raise AssertionError("the nested block waited for the lock its own process holds")

    previous = signal.signal(signal.SIGALRM, waited_for_itself)
    signal.alarm(10)
    try:
        with measuring_alone():
            with measuring_alone():
                pass
            assert (home / "costs" / "measuring.lock").exists()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
