"""`python -m apps.bench` (make bench): the bench command through the CLI, for its one-line errors."""

import sys

from apps.cli import main

main(["bench", *sys.argv[1:]])
