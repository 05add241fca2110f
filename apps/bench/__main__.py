"""`python -m apps.bench` (make bench): the bench command through the CLI, for its one-line errors."""

import sys

from pocketspec.huge_pages import restart_with_huge_pages

restart_with_huge_pages()

from apps.cli import main  # noqa: E402  (after the restart: its imports take a second)

main(["bench", *sys.argv[1:]])
