"""`pocketspec serve`: an OpenAI-compatible HTTP server for one model (docs/serve.md); flags and what it
prints. The server itself lives in pocketspec/serve/."""

from __future__ import annotations

import contextlib
import functools

import click

from apps.flags import (backend_options, model_choice_options, runtime_options, sampling_options, session_settings,
                        setting_option)
from apps.terminal import note, progress_line
from pocketspec.serve.listen import bind_socket, check_exposure, require_serve_packages
from pocketspec.serve.open import open_slots
from pocketspec.serve.serve_settings import API_KEY_VARIABLE, ServeSettings
from pocketspec.settings import GenerationSettings

SERVE = ServeSettings()


def server_options(function):
    options = [
        click.option("--host", default=SERVE.host, show_default=True,
                     help="Address to listen on; other than loopback only with an API key."),
        setting_option("--port", ServeSettings, "port", show_default=True, help="0: any free port (printed)."),
        click.option("--api-key", envvar=API_KEY_VARIABLE, default=None, show_envvar=True,
                     help="Require `Authorization: Bearer KEY` on /v1 and /metrics. Prefer the environment "
                          "variable: other users of this machine can read command lines."),
        setting_option("--max-concurrency", ServeSettings, "max_concurrency", show_default=True,
                       help="Requests generating at once: rows of the torch pool, or sequences of one llama.cpp context."),
        setting_option("--max-queue", ServeSettings, "max_queue", show_default=True,
                       help="Requests waiting for a slot; one more gets 503 with Retry-After."),
        click.option("--max-body", default=SERVE.max_body, show_default=True,
                     help="Largest request body, e.g. 4MiB; a larger one gets 413."),
        setting_option("--shutdown-seconds", ServeSettings, "shutdown_seconds", show_default=True,
                       help="On SIGTERM or Ctrl-C: how long to wait for the cancelled responses to end."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def _announce(url: str, model_id: str, serve: ServeSettings, has_key: bool) -> None:
    """Notes on stderr, then the one line on stdout that says where to connect."""
    if not has_key:
        note(f"no API key: listening on loopback only; set --api-key or {API_KEY_VARIABLE} to serve other hosts")
    note(f"{serve.max_concurrency} at a time, {serve.max_queue} more may wait; SIGTERM or Ctrl-C stops")
    click.echo(f"pocketspec serve: {model_id} listening on {url} (OpenAI API at {url}/v1)")


@click.command()
@model_choice_options
@setting_option("--max-tokens", GenerationSettings, "max_reply_tokens", show_default=True,
                help="max_tokens of a request that gives none.")
@functools.partial(sampling_options, is_per_request=True)
@runtime_options
@backend_options
@server_options
def serve(target, draft, pair, max_tokens, temperature, top_p, top_k, seed, gamma, memory_budget, max_context,
          kv_type, threads, repack, exact_verify, host, port, api_key, max_concurrency, max_queue, max_body,
          shutdown_seconds, **backend_args):
    """Serve the model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions).

    The sampling flags are the defaults of requests that leave them out; a request without a seed gets one
    drawn for it unless --seed names one.
    """
    serve_settings = ServeSettings(host=host, port=port, max_concurrency=max_concurrency, max_queue=max_queue,
                                   max_body=max_body, shutdown_seconds=shutdown_seconds)
    check_exposure(host, api_key)
    require_serve_packages()
    from pocketspec.serve.server import run_server  # the serve extra's packages: imported by this command only
    from pocketspec.serve.server_state import new_server_state

    settings = session_settings(
        target=target, draft=draft, pair=pair, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
        gamma=gamma, memory_budget=memory_budget, max_context=max_context, kv_type=kv_type, threads=threads,
        repack=repack, exact_verify=exact_verify, max_new_tokens=max_tokens, **backend_args)
    with contextlib.closing(bind_socket(host, port)) as sock:  # before loading, so a taken port fails at once
        slots = open_slots(settings, max_concurrency=max_concurrency, on_note=note, on_progress=progress_line(),
                           server=serve_settings)
        try:
            state = new_server_state(slots, settings, serve_settings, max_tokens=max_tokens, api_key=api_key)

            def announce(url: str) -> None:
                _announce(url, state.model_id, serve_settings, has_key=state.api_key is not None)

            run_server(state, sock, shutdown_seconds=shutdown_seconds, on_listening=announce)
        finally:
            slots.close()
    note("pocketspec serve: stopped")


COMMANDS = [serve]
