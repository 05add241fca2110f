"""The `pocketspec` command: a click group of the subcommands that apps.COMMAND_MODULES name, with one-line errors."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys

if __name__ == "__main__":  # `python -m apps.cli`: huge pages first, before the imports below
    from apps.start import restart_first

    restart_first()

import click

from apps.text_input import make_streams_safe
from pocketspec.errors import UserError
from pocketspec.signals import Terminated, raise_terminated


class PeopleFirstGroup(click.Group):
    """Turns expected errors into one line on stderr and exit code 2, with no traceback."""

    def main(self, *args, **kwargs):
        kwargs["standalone_mode"] = False
        if sys.stderr is None:  # `2>&-`: notes and errors have nowhere to go, and the output still does
            sys.stderr = open(os.devnull, "w", encoding="utf-8")
        make_streams_safe()
        previous_sigterm = signal.signal(signal.SIGTERM, raise_terminated)
        # a closed terminal (SIGHUP) ends a command as SIGTERM does, every `finally` run (a chat's transcript
        # closed, a new one without a message removed); `nohup` keeps it ignored
        previous_sighup = signal.getsignal(signal.SIGHUP)
        if previous_sighup == signal.SIG_DFL:
            signal.signal(signal.SIGHUP, raise_terminated)
        try:
            if sys.stdout is None:  # `pocketspec ... >&-`
                raise UserError("stdout is closed: give the output somewhere to go (> FILE, or /dev/null)")
            return super().main(*args, **kwargs)
        except UserError as error:
            click.echo(f"error: {error}", err=True)
            sys.exit(UserError.exit_code)
        except click.exceptions.Exit as done:
            sys.exit(done.exit_code)
        except click.Abort:
            click.echo("interrupted", err=True)
            sys.exit(130)
        except click.exceptions.NoArgsIsHelpError as error:  # `pocketspec`, `pocketspec models`: the help, exit 2
            # as click has it for a group named without a command
            error.show()
            sys.exit(error.exit_code)
        except click.ClickException as error:
            click.echo(f"error: {error.format_message()}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            _exit_interrupted()
        except Terminated:
            _say_last("\nterminated")  # last, after what the command said while it stopped
            raise
        except OSError as error:
            if error.errno not in FULL_OUTPUT_ERRORS:
                raise
            _exit_output_failed(error)
        finally:
            signal.signal(signal.SIGTERM, previous_sigterm)
            signal.signal(signal.SIGHUP, previous_sighup)


# Writing stdout (a reply, a --json object) onto a full disk, /dev/full, or a device that failed: the machine's
# problem, not the program's. A broken pipe (`| head`) ends quietly, as click ends it.
FULL_OUTPUT_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EIO)


def _exit_output_failed(error: OSError) -> None:
    """One line, exit 2; stdout points at /dev/null first, so that Python's flush at exit has nowhere to fail."""
    _to_devnull(sys.stdout)
    _say_last(f"error: cannot write the output: {error.strerror or error}")
    sys.exit(UserError.exit_code)


def _to_devnull(stream) -> None:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


def _say_last(line: str) -> None:
    """`line` on stderr, where it can still go: a closed terminal takes stderr with it (EIO), and the exit
    code is then the signal's or the error's, not Python's for a stream it could not flush."""
    try:
        click.echo(line, err=True)
    except OSError:
        _to_devnull(sys.stderr)


def _exit_interrupted() -> None:
    click.echo("\ninterrupted", err=True)
    sys.exit(130)


@click.group(cls=PeopleFirstGroup)
@click.version_option(package_name="pocketspec")
def main() -> None:
    """PocketSpec: fast, lossless speculative decoding inside a memory budget."""


def _register_commands() -> None:
    from apps import COMMAND_MODULES

    import importlib

    for module_name in COMMAND_MODULES:
        module = importlib.import_module(f"apps.{module_name}")
        for command in module.COMMANDS:
            main.add_command(command)


try:  # the commands' imports take a second or more: a Ctrl-C then is met as one later would be
    _register_commands()
except KeyboardInterrupt:
    _exit_interrupted()

if __name__ == "__main__":
    main()
