"""`python -m apps.bench` (make bench): the bench command through the CLI, for its one-line errors."""

import sys

from apps.start import restart_first

restart_first()

from apps.cli import main  # noqa: E402  (after the restart: its imports take a second)

main(["bench", *sys.argv[1:]])
