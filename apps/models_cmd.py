"""`pocketspec models list|pull|path`: see, download and locate the catalog's models."""

from __future__ import annotations

import click

from pocketspec.errors import UserError
from pocketspec.models.catalog import download_state, load_catalog, model_path
from pocketspec.models.model_files import resolve_model
from pocketspec.models.pull import pull


def _human_bytes(num_bytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{num_bytes} B"


@click.group(name="models")
def models() -> None:
    """List, download and locate the models in the catalog."""


@models.command(name="list")
def list_models() -> None:
    """Show each catalog model (size, whether downloaded, path) and each pair."""
    catalog = load_catalog()
    rows = [("NAME", "SIZE", "DOWNLOADED", "PATH")]
    for entry in catalog.models.values():
        path = model_path(entry.name)
        rows.append((entry.name, _human_bytes(entry.size_bytes), download_state(entry), str(path)))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3])
    if catalog.pairs:
        click.echo("\nPAIRS")
        for pair in catalog.pairs.values():
            default = "  (default)" if pair.name == catalog.default_pair else ""
            click.echo(f"{pair.name}: target {pair.target}, draft {pair.draft}{default}")


@models.command(name="pull")
@click.argument("name")
@click.option("--verify", is_flag=True, help="Re-hash a file that is already present.")
def pull_model(name: str, verify: bool) -> None:
    """Download model NAME (or both models of pair NAME) and print the path(s)."""
    catalog = load_catalog()
    if name in catalog.pairs:
        names = [catalog.pairs[name].target, catalog.pairs[name].draft]
    elif name in catalog.models:
        names = [name]
    else:  # not get_model's error: a pull takes a pair's name too, and never a path
        raise UserError(f"unknown model or pair '{name}'; known models: {', '.join(sorted(catalog.models))}; "
                        f"pairs: {', '.join(sorted(catalog.pairs)) or 'none'}")
    for model_name in names:
        click.echo(pull(model_name, verify=verify))


@models.command(name="path")
@click.argument("name")
def path_of_model(name: str) -> None:
    """Print the path of downloaded model NAME, after checking the file (exit 2 if absent)."""
    click.echo(resolve_model(name))


COMMANDS = [models]
