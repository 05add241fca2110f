"""The runtime's own errors: UserError is meant for people (the CLI prints it as one line and exits
with code 2), BudgetError is the one that says --memory-budget cannot hold what was asked for; ModelLost says the model
cannot run any more (a split's rank stopped); ContextFullError
is a backend refusing tokens its KV cache has no room for."""


class UserError(Exception):
    """A problem with the user's input (a path, a flag, a model file, a budget).

    The message names the value at fault and what to do about it.
    """

    exit_code = 2


class BudgetError(UserError):
    """--memory-budget cannot hold what the flags ask for (a caller may add what it keeps of the budget)."""


class ModelLost(UserError):
    """The model can no longer run in this process (a split's rank stopped): said in one line, as a UserError, by
    the CLI; a server answers 500 and reports itself down on /health, for its supervisor to restart it."""


class ContextFullError(RuntimeError):
    """The KV cache has no room for the tokens asked for."""
