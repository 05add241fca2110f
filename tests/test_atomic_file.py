"""Output files: never onto an input (however it is reached), and whole or absent under their final name."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from file_size_limit import run_with_file_size_limit
from pocketspec.atomic_file import check_output_folder, is_same_file, refuse_output_onto_inputs, replaced_on_success
from pocketspec.errors import UserError


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "hi"}\n')
    return path


def _ways_to_name(path, tmp_path):
    """The same file through its path, a relative path, a symlink, a hard link and a detour."""
    symlink = tmp_path / "via-symlink.jsonl"
    symlink.symlink_to(path)
    hardlink = tmp_path / "via-hardlink.jsonl"
    os.link(path, hardlink)
    (tmp_path / "sub").mkdir()
    return [path, tmp_path / "sub" / ".." / path.name, symlink, hardlink]


def test_every_name_of_an_input_is_refused_and_the_input_kept(prompts, tmp_path):
    for output in _ways_to_name(prompts, tmp_path):
        with pytest.raises(UserError, match="is the --prompt-file file") as raised:
            refuse_output_onto_inputs(output, [("--target", None), ("--prompt-file", prompts)], flag="--output")
        assert "\n" not in str(raised.value)
    assert prompts.read_text() == '{"prompt": "hi"}\n'


def test_other_files_and_new_files_are_not_inputs(prompts, tmp_path):
    other = tmp_path / "other.jsonl"
    other.write_text('{"prompt": "hi"}\n')  # equal bytes, another file
    refuse_output_onto_inputs(other, [("--prompt-file", prompts)], flag="--output")
    refuse_output_onto_inputs(tmp_path / "new.jsonl", [("--prompt-file", prompts)], flag="--output")
    assert not is_same_file(tmp_path / "new.jsonl", tmp_path / "new.jsonl")


def test_a_failed_write_keeps_the_old_file_and_leaves_nothing_else(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text("old\n")
    for error in (KeyboardInterrupt, ValueError):
        with pytest.raises(error):
            with replaced_on_success(path, what="--output") as file:
                file.write("half a li")
                file.flush()
                assert path.read_text() == "old\n"  # the new text goes elsewhere until the end
                raise error()
        assert sorted(tmp_path.iterdir()) == [path] and path.read_text() == "old\n"


def test_a_file_system_that_refuses_the_text_is_one_user_error_and_keeps_the_old_file(tmp_path):
    """A write past what the file system takes (a full disk; here the file size limit, EFBIG, in a child process)
    is one UserError naming the output: the failed flush on closing must not replace it with a bare OSError."""
    path = tmp_path / "out.jsonl"
    path.write_text("old\n")
    result = run_with_file_size_limit(f"""
from pocketspec.atomic_file import replaced_on_success
from pocketspec.errors import UserError
try:
    with replaced_on_success({str(path)!r}, what="--output") as file:
        for _ in range(100):
            file.write("x" * 1000)
except UserError as error:
    print(error)
""", 4096)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.startswith(f"cannot write --output {path}: File too large"), result.stdout
    assert sorted(tmp_path.iterdir()) == [path] and path.read_text() == "old\n"


def test_a_finished_write_replaces_the_file_and_keeps_its_mode(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text("old\n")
    path.chmod(0o640)
    with replaced_on_success(path, what="--output") as file:
        file.write("new\n")
    assert path.read_text() == "new\n" and (path.stat().st_mode & 0o777) == 0o640
    assert sorted(tmp_path.iterdir()) == [path]


def test_a_symbolic_link_is_followed_as_the_shells_redirection_follows_it(tmp_path):
    """Even one that names a file not there yet, or a link to a link."""
    real, later = tmp_path / "real.jsonl", tmp_path / "later.jsonl"
    real.write_text("old\n")
    (tmp_path / "link.jsonl").symlink_to(real)
    (tmp_path / "chain.jsonl").symlink_to(tmp_path / "link.jsonl")
    (tmp_path / "dangling.jsonl").symlink_to(later)
    for name, text in (("chain.jsonl", "new\n"), ("dangling.jsonl", "fresh\n")):
        with replaced_on_success(tmp_path / name, what="--output") as file:
            file.write(text)
    assert real.read_text() == "new\n" and later.read_text() == "fresh\n"
    assert all((tmp_path / name).is_symlink() for name in ("link.jsonl", "chain.jsonl", "dangling.jsonl"))
    assert len(list(tmp_path.iterdir())) == 5


def test_a_new_file_gets_the_usual_mode(tmp_path):
    path = tmp_path / "new.jsonl"
    umask = os.umask(0o022)
    try:
        with replaced_on_success(path, what="--output") as file:
            file.write("x")
    finally:
        os.umask(umask)
    assert (path.stat().st_mode & 0o777) == 0o644


def test_an_unwritable_place_is_one_user_error(tmp_path):
    with pytest.raises(UserError, match="cannot write --output .*missing") as raised:
        with replaced_on_success(tmp_path / "missing" / "out.jsonl", what="--output"):
            pass
    assert "\n" not in str(raised.value)


def _device_twin(tmp_path, name: str, minor: int) -> Path:
    """A character device like /dev/null (1, 3) or /dev/full (1, 7) in tmp_path, so a regression replaces the
    twin and not the machine's own; skipped where this user may not make one."""
    path = tmp_path / name
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
        os.close(os.open(path, os.O_WRONLY))  # a filesystem mounted nodev makes the node but refuses to open it
    except OSError as error:
        pytest.skip(f"cannot make a device node here: {error}")
    return path


def test_a_device_is_written_through_and_never_replaced(tmp_path):
    """--output /dev/null (or /dev/stdout, a FIFO): renaming a finished file over it would replace the device."""
    null = _device_twin(tmp_path, "null", 3)
    with replaced_on_success(null, what="--output") as file:
        file.write("text\n")
    assert stat.S_ISCHR(os.stat(null).st_mode) and sorted(tmp_path.iterdir()) == [null]


@pytest.mark.parametrize("name", ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"])
@pytest.mark.parametrize("redirect", [">", ">>"])
def test_stdout_redirected_to_a_file_is_written_at_its_place_not_emptied_nor_replaced(tmp_path, name, redirect):
    """`{ echo before; generate --output /dev/stdout; echo after; } > out.txt`: the file was replaced, so the shell's
    own lines went to the unlinked old one and out.txt held the reply alone."""
    out = tmp_path / "out.txt"
    out.write_text("earlier\n")
    script = ("import sys; from pathlib import Path; from pocketspec.atomic_file import replaced_on_success\n"
              "print('before')\n"
              f"with replaced_on_success(Path({name!r}), what='--output') as file:\n"
              "    file.write('reply\\n')\n"
              "print('after')\n")
    inode = out.stat().st_ino
    subprocess.run(f"{shlex.quote(sys.executable)} -c {shlex.quote(script)} {redirect} {shlex.quote(str(out))}; "
                   f"echo shell >> {shlex.quote(str(out))}", shell=True, check=True, cwd=Path(__file__).parent.parent)
    kept = "earlier\n" if redirect == ">>" else ""
    assert out.read_text() == kept + "before\nreply\nafter\nshell\n"
    assert out.stat().st_ino == inode and sorted(tmp_path.iterdir()) == [out]


@pytest.mark.parametrize("folder", ["/dev/fd", "/proc/self/fd"])
def test_a_descriptor_that_is_not_open_is_refused_before_anything_opens_it(tmp_path, folder):
    """`--output /dev/fd/N` with N not open: by the time the reply is written, the model's file or a log may hold N,
    and the text went into it."""
    opened = os.open(tmp_path / "held", os.O_WRONLY | os.O_CREAT)
    os.close(opened)  # the lowest free number: the next file this process opens gets it
    with pytest.raises(UserError, match=f"descriptor {opened} is not open") as raised:
        check_output_folder(Path(f"{folder}/{opened}"), what="--output")
    assert "\n" not in str(raised.value)
    with open(tmp_path / "open", "w") as file:  # the same number, open: the shell's redirection, written through
        assert file.fileno() == opened
        check_output_folder(Path(f"{folder}/{opened}"), what="--output")


def test_a_fifo_receives_the_text_as_it_is_written(tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    reader.start()
    with replaced_on_success(fifo, what="--output") as file:
        file.write("line one\n")
    reader.join(timeout=30)
    assert received == ["line one\n"] and stat.S_ISFIFO(os.stat(fifo).st_mode)


@pytest.mark.parametrize("streams", [False, True])
def test_a_device_that_refuses_the_text_is_one_user_error(tmp_path, streams):
    """Refused at the last write, or at a flush while the text streams (generate flushes every token)."""
    full = _device_twin(tmp_path, "full", 7)
    with pytest.raises(UserError, match="cannot write --output .*full: No space left") as raised:
        with replaced_on_success(full, what="--output") as file:
            file.write("text\n")
            if streams:
                file.flush()
    assert "\n" not in str(raised.value) and stat.S_ISCHR(os.stat(full).st_mode)


@pytest.mark.parametrize("name, taken, kept", [
    ("out.jsonl", [], "out.interrupted.jsonl"),
    ("out.jsonl", ["out.interrupted.jsonl"], "out.interrupted-2.jsonl"),
    ("out", ["out.interrupted", "out.interrupted-2"], "out.interrupted-3"),
])
def test_a_file_kept_beside_leaves_the_named_one_and_every_taken_name_as_they_were(tmp_path, name, taken, kept):
    """A name taken while the block ran (here: inside it) is skipped too, never replaced."""
    path = tmp_path / name
    path.write_text("earlier\n")
    with replaced_on_success(path, what="--output") as file:
        file.write("this run's\n")
        for other in taken:
            (tmp_path / other).write_text(f"{other}\n")
        file.keep_beside("interrupted")
    assert file.kept_as == tmp_path / kept and (tmp_path / kept).read_text() == "this run's\n"
    assert path.read_text() == "earlier\n" and all((tmp_path / other).read_text() == f"{other}\n" for other in taken)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, kept, *taken])


def test_a_link_keeps_beside_the_file_it_names(tmp_path):
    (tmp_path / "sub").mkdir()
    target = tmp_path / "sub" / "real.jsonl"
    target.write_text("earlier\n")
    link = tmp_path / "out.jsonl"
    link.symlink_to(target)
    with replaced_on_success(link, what="--output") as file:
        file.write("this run's\n")
        file.keep_beside("interrupted")
    assert file.kept_as == tmp_path / "sub" / "real.interrupted.jsonl" and link.read_text() == "earlier\n"
