"""Transparent huge pages for what llama.cpp allocates: the repacked weights, the KV cache, the
compute buffers.

Decoding reads every weight once a token, and on 4 KiB pages that walk keeps missing the
TLB. Most distributions set THP to `madvise`: a process gets 2 MiB pages only where it asks for
them, and llama.cpp asks for none. glibc's tunable glibc.malloc.hugetlb=1 makes malloc ask for
its big chunks, where llama.cpp's CPU buffers come from. Measured on a 2-core AMD EPYC Zen 3
(qwen2.5-coder-1.5b q4_k_m, 2 threads, 160 tokens, benchmarks/huge_pages_bench.py, 6 alternating
pairs of fresh processes): plain decoding 2.0 % faster (1.00-1.04x a pair, faster in 5 of 6), for
19 MiB more peak RSS; llama.cpp's own llama-bench gained 1.5 % from the same tunable.

glibc reads its tunables only when a process starts, so the CLI starts itself again, once, with
the tunable added (`restart_with_huge_pages`), before it imports anything heavy; its children
inherit it. POCKETSPEC_HUGE_PAGES=0 turns this off. Where THP is `always` the kernel already
gives huge pages unasked, and where it is `never` (or outside Linux and glibc 2.35+) nothing can.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Mapping

TUNABLE = "glibc.malloc.hugetlb=1"
TUNABLES_VARIABLE = "GLIBC_TUNABLES"
OPT_OUT_VARIABLE = "POCKETSPEC_HUGE_PAGES"  # 0: leave malloc as it is
# Set on the restarted process: GLIBC_TUNABLES as the user had it, so that children the user would
# compare with (llama.cpp's own tools in the bench) run as the user runs them.
USERS_TUNABLES_VARIABLE = "POCKETSPEC_USERS_GLIBC_TUNABLES"
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode(setting: Path = THP_SETTING) -> str | None:
    """The kernel's THP mode, the bracketed word of `always [madvise] never`; None where unreadable."""
    try:
        text = setting.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def glibc_has_tunable(version: str | None = None) -> bool:
    """Whether this process runs on glibc 2.35 or later, the first with glibc.malloc.hugetlb.
    version: as os.confstr("CS_GNU_LIBC_VERSION") reads, e.g. "glibc 2.36" (None: this process's)."""
    try:
        if version is None:
            version = os.confstr("CS_GNU_LIBC_VERSION") or ""
        name, _, number = version.partition(" ")
        return name == "glibc" and tuple(int(part) for part in number.split(".")[:2]) >= (2, 35)
    except (AttributeError, ValueError, OSError):
        return False


def has_tunable(environ: Mapping[str, str]) -> bool:
    return TUNABLE in environ.get(TUNABLES_VARIABLE, "").split(":")


def state(environ: Mapping[str, str], mode: str | None, glibc: bool) -> str:
    """Whether this process's malloc asks for huge pages, and why (for doctor and the bench's notes)."""
    if mode is None or not glibc:
        return "off: needs Linux's transparent huge pages and glibc 2.35 or later"
    if mode == "never":
        return "off: the kernel's transparent huge pages are `never`"
    if mode == "always":
        return "on: the kernel's transparent huge pages are `always`"
    if has_tunable(environ):
        return f"on: {TUNABLE} (transparent huge pages `madvise`)"
    if environ.get(OPT_OUT_VARIABLE) == "0":
        return f"off: {OPT_OUT_VARIABLE}=0"
    return f"off: {TUNABLES_VARIABLE} lacks {TUNABLE}"


def current_state() -> str:
    return state(os.environ, thp_mode(), glibc_has_tunable())


def should_restart(environ: Mapping[str, str], mode: str | None, glibc: bool) -> bool:
    return glibc and mode == "madvise" and environ.get(OPT_OUT_VARIABLE) != "0" and not has_tunable(environ)


def environment_with_huge_pages(environ: Mapping[str, str]) -> dict[str, str]:
    """environ with the tunable added to any the user set; the user's own kept aside for peers."""
    environment = dict(environ)
    if has_tunable(environ):
        return environment
    users = environ.get(TUNABLES_VARIABLE, "")
    environment[USERS_TUNABLES_VARIABLE] = users
    environment[TUNABLES_VARIABLE] = f"{users}:{TUNABLE}" if users else TUNABLE
    return environment


def users_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """environ as the user gave it to the CLI, before restart_with_huge_pages added the tunable."""
    environment = dict(environ)
    if USERS_TUNABLES_VARIABLE not in environment:
        return environment
    users = environment.pop(USERS_TUNABLES_VARIABLE)
    if users:
        environment[TUNABLES_VARIABLE] = users
    else:
        environment.pop(TUNABLES_VARIABLE, None)
    return environment


def restart_with_huge_pages() -> None:
    """Starts this process again with the tunable, where it helps and is not already there.

    Call it first thing in an entry point, before any input is read: exec keeps the arguments,
    the environment (plus the tunable) and the open stdin, stdout and stderr."""
    if not sys.executable or not should_restart(os.environ, thp_mode(), glibc_has_tunable()):
        return
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:  # None: closed (`>&-`); the CLI says so after the restart
            stream.flush()
    try:
        os.execve(sys.executable, sys.orig_argv, environment_with_huge_pages(os.environ))
    except OSError:
        return  # the interpreter cannot be started again: run on without huge pages
