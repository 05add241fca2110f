"""Huge pages for llama.cpp's buffers: the CLI restarts itself once with glibc.malloc.hugetlb=1 where
the kernel's THP mode is `madvise`, the model's memory then sits on 2 MiB pages, and the bench's
llama.cpp peers still run with the user's own environment."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from apps.bench.peers.process import run_peer
from pocketspec import huge_pages
from pocketspec.huge_pages import (OPT_OUT_VARIABLE, TUNABLE, TUNABLES_VARIABLE, USERS_TUNABLES_VARIABLE,
                                   environment_with_huge_pages, should_restart, state, thp_mode, users_environment)

REPO = Path(__file__).resolve().parents[1]
CAN_ADVISE = thp_mode() == "madvise" and huge_pages.glibc_has_tunable()


@pytest.mark.parametrize("text, mode", [("always [madvise] never\n", "madvise"), ("[always] madvise never", "always"),
                                        ("always madvise [never]", "never"), ("always madvise never", None),
                                        ("", None)])
def test_the_kernels_mode_is_the_bracketed_word(tmp_path, text, mode):
    setting = tmp_path / "enabled"
    setting.write_text(text)
    assert thp_mode(setting) == mode


@pytest.mark.parametrize("version, has", [("glibc 2.36", True), ("glibc 2.35", True), ("glibc 2.41.9000", True),
                                           ("glibc 3.0", True), ("glibc 2.34", False), ("glibc 2.31", False),
                                           ("glibc", False), ("", False), ("musl 1.2", False)])
def test_only_glibc_from_2_35_has_the_tunable(version, has):
    assert huge_pages.glibc_has_tunable(version) is has


def test_an_unreadable_setting_is_no_mode(tmp_path):
    assert thp_mode(tmp_path / "missing") is None
    (tmp_path / "binary").write_bytes(b"\xff\xfe")
    assert thp_mode(tmp_path / "binary") is None


def test_only_madvise_with_glibc_and_no_tunable_yet_restarts():
    assert should_restart({}, "madvise", True)
    assert should_restart({TUNABLES_VARIABLE: "glibc.malloc.arena_max=2"}, "madvise", True)
    assert not should_restart({TUNABLES_VARIABLE: f"glibc.malloc.arena_max=2:{TUNABLE}"}, "madvise", True)
    assert not should_restart({OPT_OUT_VARIABLE: "0"}, "madvise", True)
    assert not should_restart({}, "madvise", False)
    for mode in ("always", "never", None):
        assert not should_restart({}, mode, True)


def test_the_state_names_why():
    assert state({}, "madvise", True).startswith("off: GLIBC_TUNABLES lacks")
    assert state({TUNABLES_VARIABLE: TUNABLE}, "madvise", True).startswith("on: glibc.malloc.hugetlb=1")
    assert state({OPT_OUT_VARIABLE: "0"}, "madvise", True) == "off: POCKETSPEC_HUGE_PAGES=0"
    assert state({}, "always", True).startswith("on: ")
    assert state({}, "never", True).startswith("off: ")
    assert state({}, "madvise", False).startswith("off: needs")


@pytest.mark.parametrize("users", [None, "", "glibc.malloc.arena_max=2"])
def test_the_users_tunables_are_kept_and_given_back(users):
    environ = {"PATH": "/bin"} if users is None else {"PATH": "/bin", TUNABLES_VARIABLE: users}
    added = environment_with_huge_pages(environ)
    assert TUNABLE in added[TUNABLES_VARIABLE].split(":")
    if users:
        assert added[TUNABLES_VARIABLE] == f"{users}:{TUNABLE}"
    assert users_environment(added) == ({"PATH": "/bin", TUNABLES_VARIABLE: users} if users else {"PATH": "/bin"})
    assert environment_with_huge_pages(added) == added  # added once only
    assert users_environment(environ) == environ  # nothing added: nothing taken away


def _doctor_line(env: dict) -> str:
    doctor = subprocess.run([sys.executable, "-m", "apps.cli", "doctor"], capture_output=True, text=True, env=env,
                            cwd=REPO, timeout=300)
    assert doctor.returncode == 0, doctor.stderr
    return next(line for line in doctor.stdout.splitlines() if line.startswith("huge pages"))


@pytest.mark.skipif(not CAN_ADVISE, reason="needs glibc 2.35+ and the kernel's THP mode `madvise`")
def test_the_cli_restarts_itself_with_the_tunable_unless_told_not_to():
    plain = {key: value for key, value in os.environ.items() if key not in (TUNABLES_VARIABLE, OPT_OUT_VARIABLE)}
    assert "on: glibc.malloc.hugetlb=1" in _doctor_line(plain)
    assert "off: POCKETSPEC_HUGE_PAGES=0" in _doctor_line({**plain, OPT_OUT_VARIABLE: "0"})


def _most_huge_page_bytes(env: dict, target: Path) -> int:
    """The most AnonHugePages a real generate process held while it ran."""
    child = subprocess.Popen([sys.executable, "-m", "apps.cli", "generate", "--target", str(target), "--draft", "none",
                              "--prompt", "Count to ten:", "--max-tokens", "48"], cwd=REPO, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    most = 0
    while child.poll() is None:
        try:
            with open(f"/proc/{child.pid}/smaps_rollup", encoding="ascii") as rollup:
                for line in rollup:
                    if line.startswith("AnonHugePages:"):
                        most = max(most, int(line.split()[1]) * 1024)
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    assert child.returncode == 0, child.stderr.read()
    return most


@pytest.mark.skipif(not CAN_ADVISE, reason="needs glibc 2.35+ and the kernel's THP mode `madvise`")
def test_the_models_memory_sits_on_huge_pages(smollm2_path):
    plain = {key: value for key, value in os.environ.items() if key not in (TUNABLES_VARIABLE, OPT_OUT_VARIABLE)}
    with_pages = _most_huge_page_bytes(plain, smollm2_path)
    without = _most_huge_page_bytes({**plain, OPT_OUT_VARIABLE: "0"}, smollm2_path)
    assert with_pages >= 32 * 2**20 > without, (with_pages, without)


def test_a_peer_runs_with_the_users_environment(monkeypatch):
    monkeypatch.setenv(TUNABLES_VARIABLE, f"glibc.malloc.arena_max=2:{TUNABLE}")
    monkeypatch.setenv(USERS_TUNABLES_VARIABLE, "glibc.malloc.arena_max=2")
    run = run_peer([sys.executable, "-c", "import os; print(os.environ.get('GLIBC_TUNABLES'), "
                                          "os.environ.get('POCKETSPEC_USERS_GLIBC_TUNABLES'))"])
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["glibc.malloc.arena_max=2", "None"]
