"""What a user typed for a model (a catalog name or a GGUF path) turned into the path of a checked file,
pulling a catalog model that is missing when asked to."""

from __future__ import annotations

import os
from pathlib import Path

from pocketspec.models.catalog import folder_problem, get_model, home_error, model_path
from pocketspec.errors import UserError
from pocketspec.models.gguf_check import check_gguf
from pocketspec.models.pull import check_unchanged, pull


def _looks_like_path(name_or_path: str) -> bool:
    return os.sep in name_or_path or "/" in name_or_path or name_or_path.endswith(".gguf")


def resolve_model(name_or_path: str, *, pull_if_missing: bool = False) -> Path:
    """Turn a catalog name or a GGUF path into the path of a checked model file.

    A catalog model that is not downloaded is pulled when `pull_if_missing`, else it is a
    UserError that says how to pull it. A downloaded one whose size or mtime differ from its
    pull's stamp is re-hashed.
    """
    as_path = Path(name_or_path).expanduser()
    if as_path.is_file() or _looks_like_path(name_or_path):
        if not as_path.exists():
            raise UserError(f"model file {as_path} does not exist")
        check_gguf(as_path)
        return as_path.resolve()

    entry = get_model(name_or_path)
    path = model_path(entry.name)
    fix = f"re-download with: pocketspec models pull {entry.name}"
    if not path.exists():
        problem = folder_problem(path.parent)
        if problem is not None:  # a pull could not save it either: say what to fix instead
            raise home_error(f"model '{entry.name}', which is not downloaded", problem)
        if not pull_if_missing:
            raise UserError(f"model '{entry.name}' is not downloaded; run: pocketspec models pull {entry.name}")
        pull(entry.name)
    file_bytes = path.stat().st_size
    if file_bytes != entry.size_bytes:
        raise UserError(f"{path} has {file_bytes} bytes, expected {entry.size_bytes}; {fix}")
    check_unchanged(entry, path)
    check_gguf(path, fix=fix)
    return path
