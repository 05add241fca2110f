"""Text a person hands the CLI (a prompt, a system prompt, piped stdin, a prompt file), made valid UTF-8.

One rule everywhere: bytes that are not UTF-8 become U+FFFD, and a note says so once per
source on stderr; a leading byte-order mark is dropped. Python hands such bytes over as lone
surrogates (argv and a stdin read with surrogateescape), which no tokenizer or file can encode;
after `as_text` they are gone.
"""

from __future__ import annotations

import codecs
import sys
from pathlib import Path

import click

from memplanner.sizes import format_bytes
from pocketspec.errors import UserError

REPLACEMENT = "\ufffd"
# no tokenizer here makes a token of more bytes (Qwen2.5's longest is 128 spaces, SmolLM2's 81 bytes): a text
# longer than the context times this cannot fit it, and is refused without reading the rest (`< /dev/zero`)
MAX_BYTES_PER_TOKEN = 128
_noted_sources: set[str] = set()


def _note_replaced(source: str, num_replaced: int) -> None:
    if num_replaced and source not in _noted_sources:
        _noted_sources.add(source)
        click.echo(f"note: {source} holds bytes that are not UTF-8; each was replaced with U+FFFD", err=True)


def decode_bytes(data: bytes, source: str) -> str:
    """The UTF-8 text of `data`, without the byte-order mark an editor (Windows Notepad) may have put first."""
    text = data.removeprefix(codecs.BOM_UTF8).decode("utf-8", errors="replace")
    _note_replaced(source, text.count(REPLACEMENT) - data.count(REPLACEMENT.encode()))
    return text


def as_text(text: str, source: str) -> str:
    """`text` with every stray byte (a lone surrogate) replaced by U+FFFD."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        data = text.encode("utf-8", errors="surrogateescape")  # argv and stdin: one surrogate per stray byte
    except UnicodeEncodeError:
        data = text.encode("utf-8", errors="surrogatepass")  # a JSON "\ud800" escape
    return decode_bytes(data, source)


def prompt_bytes_limit(max_context: int | None) -> int:
    """The most bytes a prompt for a context of max_context tokens (None: the default) can take."""
    # imported here: apps/cli.py imports this module before it can meet a Ctrl-C as one line
    from pocketspec.settings import ModelSettings

    return (max_context or ModelSettings().max_context) * MAX_BYTES_PER_TOKEN


PAST_THE_CONTEXT = (f"more than the context can hold (--max-context, at {MAX_BYTES_PER_TOKEN} bytes a token at "
                    "most): give less text")


def _read_at_most(file, max_bytes: int, source: str, why: str) -> bytes:
    data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UserError(f"{source} holds more than {format_bytes(max_bytes)}, {why}")
    return data


def read_text_file(path: Path, flag: str, max_bytes: int, why: str = PAST_THE_CONTEXT) -> str:
    """The text of `path`, refused past max_bytes (`why` says why); "-" reads stdin, as most tools do (a file
    named "-" is ./-)."""
    if str(path) == "-":
        return read_piped_stdin(max_bytes, why)
    try:
        with open(path, "rb") as file:
            data = _read_at_most(file, max_bytes, f"{flag} {path}", why)
    except FileNotFoundError:
        raise UserError(f"{flag} {path} does not exist") from None
    except OSError as error:
        raise UserError(f"cannot read {flag} {path}: {error.strerror or error}") from None
    return decode_bytes(data, f"{flag} {path}")


def read_piped_stdin(max_bytes: int, why: str = PAST_THE_CONTEXT) -> str:
    """stdin's text, refused past max_bytes; UserError when stdin is closed (`<&-`)."""
    if sys.stdin is None:
        raise UserError("stdin is closed: pipe the text in, or run in a terminal")
    return decode_bytes(_read_at_most(sys.stdin.buffer, max_bytes, "stdin", why), "stdin")


def make_streams_safe() -> None:
    """Whatever a message quotes (a path with stray bytes) prints, escaped, instead of raising;
    stdin hands stray bytes over as surrogates for `as_text`, instead of raising on read."""
    for stream, errors in ((sys.stdout, "backslashreplace"), (sys.stderr, "backslashreplace"),
                           (sys.stdin, "surrogateescape")):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors=errors)
