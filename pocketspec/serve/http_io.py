"""The HTTP edges of a request: its body read up to --max-body, noticing a client that leaves or a
shutdown, and a streamed response that tells its generation when it ends, however it ends."""

from __future__ import annotations

import asyncio
from typing import Callable

from fastapi import Request
from starlette.responses import StreamingResponse

from pocketspec.serve.api_errors import CLIENT_CLOSED_REQUEST, APIError, bad_request, shutting_down_error

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
SHUTDOWN_POLL_SECONDS = 0.25  # how soon a body still arriving at a shutdown is answered 503


def _too_large(max_bytes: int) -> APIError:
    return APIError(413, f"the request body is larger than this server's --max-body ({max_bytes} bytes)",
                    code="request_too_large")


async def read_body(request: Request, max_bytes: int, is_shutting_down: Callable[[], bool]) -> bytes:
    """The whole body; 413 as soon as it is known to pass max_bytes (from Content-Length, else while reading).
    A shutdown answers a body still arriving with 503 at once: uvicorn would wait out --shutdown-seconds for
    it, then cancel the request and log the cancellation's traceback."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise bad_request(f"Content-Length {declared!r} is not a number of bytes")
        if int(declared) > max_bytes:
            raise _too_large(max_bytes)
    body = bytearray()
    while True:
        message = await _next_message(request, is_shutting_down)
        if message["type"] == "http.disconnect":  # no one is left to read the answer: counted, not logged
            raise APIError(CLIENT_CLOSED_REQUEST, "the client disconnected before its request body was read",
                           code="client_disconnected")
        body += message.get("body", b"")
        if len(body) > max_bytes:
            raise _too_large(max_bytes)
        if not message.get("more_body", False):
            return bytes(body)


async def _next_message(request: Request, is_shutting_down: Callable[[], bool]) -> dict:
    """The next ASGI message of the request; 503 once the server is shutting down, whether the message came or
    not (a body that keeps arriving is cut off too)."""
    receiving = asyncio.ensure_future(request.receive())
    try:
        while True:
            done, _ = await asyncio.wait({receiving}, timeout=SHUTDOWN_POLL_SECONDS)
            if is_shutting_down():
                raise shutting_down_error()
            if done:
                return receiving.result()
    finally:
        receiving.cancel()  # when the shutdown came first, or this request was cancelled while it waited


async def watch_disconnect(request: Request, on_gone: Callable[[], None]) -> None:
    """Call on_gone when the client disconnects; run as a task once the body is read, cancel when answered."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    on_gone()


class ClosingStream(StreamingResponse):
    """Server-sent events that call on_close when the response ends: sent whole, the client gone, or cancelled."""

    def __init__(self, events, on_close: Callable[[], None], headers: dict[str, str] | None = None):
        super().__init__(events, media_type="text/event-stream", headers={**SSE_HEADERS, **(headers or {})})
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
