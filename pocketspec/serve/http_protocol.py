"""uvicorn's h11 protocol, with a request that is not valid HTTP (a malformed request line, header or
Content-Length) answered by a 400 in OpenAI's error shape rather than uvicorn's plain-text line, and a
header block past h11's limit by a 431 in the same shape.

uvicorn answers such a request itself, before any app sees it, so api_errors' handlers cannot: this
class is what the server's Config names as its `http` protocol.
"""

from __future__ import annotations

import json
import sys

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from pocketspec.serve.api_errors import APIError, error_body

MALFORMED_HTTP_MESSAGE = ("the request is not valid HTTP/1.1: its request line, a header or its Content-Length "
                          "could not be parsed")
MAX_HEADER_BYTES = 16 * 1024  # the request line and headers h11 buffers (its default); run_server sets it
HEADERS_TOO_LARGE = 431
HEADERS_TOO_LARGE_MESSAGE = (f"the request's headers are larger than this server reads ({MAX_HEADER_BYTES // 1024} "
                             "KiB); send fewer or shorter headers")
_REASONS = {400: b"Bad Request", HEADERS_TOO_LARGE: b"Request Header Fields Too Large"}


def http_error(status: int) -> APIError:
    if status == HEADERS_TOO_LARGE:
        return APIError(status, HEADERS_TOO_LARGE_MESSAGE, code="headers_too_large")
    return APIError(400, MALFORMED_HTTP_MESSAGE, code="invalid_http")


def refused_status(error: BaseException | None) -> int:
    """431 where h11 says the headers outgrew its buffer, else 400."""
    return HEADERS_TOO_LARGE if getattr(error, "error_status_hint", 400) == HEADERS_TOO_LARGE else 400


class OpenAIErrorH11Protocol(H11Protocol):
    def send_400_response(self, msg: str) -> None:
        # uvicorn 0.55 calls this inside `except h11.RemoteProtocolError`, whose status hint tells the two apart
        status = refused_status(sys.exc_info()[1])
        body = json.dumps(error_body(http_error(status))).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        for event in (h11.Response(status_code=status, headers=headers, reason=_REASONS[status]),
                      h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()
