"""What an HTTP server (`pocketspec serve`) adds to the process a --memory-budget bounds: its libraries, and
the requests it holds, running or queued. The server keeps these off the budget before the models plan in
what is left (pocketspec/serve/open.py)."""

from __future__ import annotations

MIB = 1024 * 1024
# fastapi, uvicorn, pydantic, prometheus_client and the app imported: 21.5 MiB of RSS beside the CLI's own
# modules (2-core AMD EPYC Zen 4, 2026-12-06), with the event loop's and the pool's threads
SERVER_LIBRARIES_BYTES = 24 * MIB
# A held request's body at once as the bytes read, the parsed JSON and the validated request
REQUEST_BODY_COPIES = 3
# ... and its other Python objects: the chat template's text, token lists, the streamed response's chunks
# (the server grew 6.5 MiB over five requests, three of them 1000-token replies: memory audit, 2026-12-06)
REQUEST_WORKING_BYTES = 2 * MIB


def server_terms(max_held: int, max_body_bytes: int) -> dict[str, int]:
    """The server's terms, by name, for `max_held` requests (running and queued) of up to `max_body_bytes`."""
    return {"server libraries": SERVER_LIBRARIES_BYTES,
            "requests held": max_held * (REQUEST_BODY_COPIES * max_body_bytes + REQUEST_WORKING_BYTES)}
