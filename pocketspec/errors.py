"""Errors meant for people: the CLI prints the message as one line and exits with code 2."""


class UserError(Exception):
    """A problem with the user's input (a path, a flag, a model file, a budget).

    The message names the value at fault and what to do about it.
    """

    exit_code = 2
