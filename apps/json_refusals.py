"""--json kept on refusal too: a command whose --json makes stdout one JSON object prints a refusal there as one,
{"error": "<the line>"}, besides that line on stderr and exit code 2. A script then reads stdout alike either way
and tells the two apart by the exit code or the `error` key; a person still reads the line."""

from __future__ import annotations

import contextlib
import json

import click

from pocketspec.errors import UserError

REFUSALS = (UserError, click.ClickException)  # what apps/cli.py says as one line with exit code 2


class JsonRefusals(click.Command):
    """A click command with a --json flag (parameter `as_json`) whose refusals are JSON under --json."""

    def refusal_json(self, error: Exception) -> dict:
        message = error.format_message() if isinstance(error, click.ClickException) else str(error)
        return {"error": message}

    def _say_refusal(self, error: Exception) -> None:
        with contextlib.suppress(OSError, ValueError):  # stdout full or closed: the line on stderr still goes
            click.echo(json.dumps(self.refusal_json(error), sort_keys=True))

    def _asks_for_json(self, ctx: click.Context, args: list[str]) -> bool:
        """Whether click's own parser reads --json as the flag (not as another option's value, not after `--`);
        where the parser itself refuses the arguments (an unknown option), whether --json stands among them."""
        try:
            options, _, _ = self.make_parser(ctx).parse_args(list(args))
        except click.ClickException:
            return "--json" in args[:args.index("--")] if "--" in args else "--json" in args
        return bool(options.get("as_json"))

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # a value refused while the flags are parsed (--max-tokens 0) comes before --json is parsed itself
        is_json = self._asks_for_json(ctx, args)
        try:
            return super().parse_args(ctx, args)
        except REFUSALS as error:
            if is_json:
                self._say_refusal(error)
            raise

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except REFUSALS as error:
            if ctx.params.get("as_json"):
                self._say_refusal(error)
            raise
