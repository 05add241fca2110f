"""The runtime's own errors: UserError is meant for people (the CLI prints it as one line and exits
with code 2), BudgetError is the one that says --memory-budget cannot hold what was asked for; ContextFullError
is a backend refusing tokens its KV cache has no room for."""


class UserError(Exception):
    """A problem with the user's input (a path, a flag, a model file, a budget).

    The message names the value at fault and what to do about it.
    """

    exit_code = 2


class BudgetError(UserError):
    """--memory-budget cannot hold what the flags ask for (a caller may add what it keeps of the budget)."""


class ContextFullError(RuntimeError):
    """The KV cache has no room for the tokens asked for."""
