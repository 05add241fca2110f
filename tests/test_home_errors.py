"""A POCKETSPEC_HOME that cannot hold files (its parent a file, or read-only) is one line, exit 2,
for every command that would write there, and no command asks for the pull that would fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pocketspec.models.catalog import folder_problem, writable_home_folder
from pocketspec.errors import UserError

REPO = Path(__file__).resolve().parents[1]
COMMANDS = [
    ["models", "pull", "smollm2-135m-instruct"],
    ["generate", "--target", "smollm2-135m-instruct", "--draft", "none", "--prompt", "hi"],
    ["chat", "--target", "smollm2-135m-instruct", "--draft", "none"],
    ["plan", "--target", "smollm2-135m-instruct", "--draft", "none"],
]


def _cli(args: list[str], home: Path, *, read_only: Path | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "apps.cli", *args]
    if read_only is not None:
        command = _read_only_command(read_only, command)
    env = {**os.environ, "POCKETSPEC_HOME": str(home)}
    env.pop("POCKETSPEC_CATALOG", None)
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, input="hello\n", timeout=300)


def _read_only_command(folder: Path, command: list[str]) -> list[str]:
    """`command` run where `folder` cannot be written: a read-only bind mount as root (root ignores
    permission bits), else the folder's write bits removed."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return command
    if shutil.which("unshare") is None:
        pytest.skip("running as root without unshare: no way to make a folder read-only")
    script = (f'mount --bind "{folder}" "{folder}" && mount -o remount,bind,ro "{folder}" && exec "$@"')
    probe = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a read-only mount here: {probe.stderr.decode().strip()}")
    return ["unshare", "-m", "sh", "-c", script, "sh", *command]


def _assert_one_line(result: subprocess.CompletedProcess, *fragments: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "models pull" not in lines[0], "advises the pull that cannot succeed"
    return lines[0]


@pytest.fixture
def home_under_a_file(tmp_path) -> Path:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where a folder should be\n")
    return blocker / "pocketspec"


@pytest.mark.parametrize("args", COMMANDS, ids=lambda args: " ".join(args[:2]))
def test_home_whose_parent_is_a_file(home_under_a_file, args):
    _assert_one_line(_cli(args, home_under_a_file), "POCKETSPEC_HOME", "is not a folder")
    assert (home_under_a_file.parent.read_text() == "a file where a folder should be\n")


@pytest.mark.parametrize("args", COMMANDS, ids=lambda args: " ".join(args[:2]))
def test_read_only_home(tmp_path, args):
    home = tmp_path / "home"
    home.mkdir()
    _assert_one_line(_cli(args, home, read_only=home), "POCKETSPEC_HOME", "not writable")
    assert list(home.iterdir()) == []


def test_doctor_reports_an_unusable_home_and_still_runs(home_under_a_file):
    result = _cli(["doctor"], home_under_a_file)
    assert result.returncode == 0, result.stderr
    assert "cannot hold downloads" in result.stdout and "is not a folder" in result.stdout


def test_folder_problem_changes_nothing(tmp_path):
    target = tmp_path / "a" / "b" / "c"
    assert folder_problem(target) is None and not (tmp_path / "a").exists()
    assert writable_home_folder(target, "things") == target and target.is_dir()
    (tmp_path / "file").write_text("x")
    assert folder_problem(tmp_path / "file" / "deeper") == f"{tmp_path / 'file'} is not a folder"
    with pytest.raises(UserError, match="cannot hold things"):
        writable_home_folder(tmp_path / "file" / "deeper", "things")


@pytest.mark.parametrize("blocked", ["under a file", "read-only"])
def test_doctor_calibrate_refuses_a_home_that_cannot_keep_its_tables(tmp_path, smollm2_path, blocked):
    """--calibrate measures for later runs: on such a home it measured for seconds (a minute for the 1.5B target),
    said it "could not save" the tables, and exited 0."""
    if blocked == "under a file":
        (tmp_path / "not-a-folder").write_text("")
        home, read_only = tmp_path / "not-a-folder" / "pocketspec", None
    else:
        home = read_only = tmp_path / "home"
        home.mkdir()
    result = _cli(["doctor", "--calibrate", "--target", str(smollm2_path), "--draft", "none"], home,
                  read_only=read_only)
    _assert_one_line(result, f"POCKETSPEC_HOME {home} cannot hold measured cost tables")
    assert "measuring" not in result.stderr
