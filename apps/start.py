"""The `pocketspec` command's entry point: it first starts the process again with huge pages for
llama.cpp's buffers where that helps (pocketspec/huge_pages.py), before the CLI's imports take
their second, then runs the CLI. `python -m apps.cli` and `python -m apps.bench` call
restart_first too."""

import contextlib
import sys


@contextlib.contextmanager
def _interrupt_as_one_line():
    """A Ctrl-C met as apps/cli.py meets one once its own handling runs: one line, exit code 130."""
    try:
        yield
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted\n")
        sys.exit(130)


def restart_first() -> None:
    """restart_with_huge_pages, with a Ctrl-C meanwhile met as apps/cli.py meets one during its imports."""
    with _interrupt_as_one_line():
        from pocketspec.huge_pages import restart_with_huge_pages

        restart_with_huge_pages()


def main() -> None:
    restart_first()
    with _interrupt_as_one_line():  # importing the CLI (click) before it can meet a Ctrl-C itself
        from apps.cli import main as cli
    cli()


if __name__ == "__main__":
    main()
