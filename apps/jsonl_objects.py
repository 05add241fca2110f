"""One JSON object per line, read from a file the user named: the errors name the flag, the file and the line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from apps.text_input import read_text_file
from pocketspec.errors import UserError


def read_jsonl_objects(path: Path, flag: str, shape_hint: str) -> Iterator[tuple[int, dict, str]]:
    """(line number, object, "FLAG PATH line N") for every non-blank line; blank lines are skipped.

    `shape_hint` says what a line should look like; it ends the error for a line that is
    not JSON or not an object.
    """
    lines = read_text_file(path, flag).splitlines()
    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{flag} {path} line {line_number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise UserError(f"{where} is not JSON ({error.msg}); {shape_hint}") from None
        if not isinstance(row, dict):
            raise UserError(f"{where} is not a JSON object; {shape_hint}")
        yield line_number, row, where
