"""`pocketspec bench`: the command (command.py), its prompt suites, rounds, worker processes, report,
plots and the peer adapters that drive other tools (peers/)."""
