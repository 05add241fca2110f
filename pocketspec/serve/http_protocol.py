"""uvicorn's h11 protocol, with a request that is not valid HTTP (a malformed request line, header or
Content-Length) answered by a 400 in OpenAI's error shape rather than uvicorn's plain-text line, and a
header block past h11's limit by a 431 in the same shape.

uvicorn answers such a request itself, before any app sees it, so api_errors' handlers cannot: this
class is what the server's Config names as its `http` protocol.
"""

from __future__ import annotations

import json
import sys
from http import HTTPStatus

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from pocketspec.serve.api_errors import APIError, error_body

MALFORMED_HTTP_MESSAGE = ("the request is not valid HTTP/1.1: its request line, a header or its Content-Length "
                          "could not be parsed")
MAX_HEADER_BYTES = 16 * 1024  # the request line and headers h11 buffers (its default); run_server sets it
HEADERS_TOO_LARGE_MESSAGE = (f"the request's headers are larger than this server reads ({MAX_HEADER_BYTES // 1024} "
                             "KiB); send fewer or shorter headers")


def header_block_bytes(scope: dict) -> int:
    """The size of a parsed request's request line and headers, as they came (near enough: h11 drops the
    whitespace around a header's value)."""
    target = len(scope.get("raw_path") or b"") + (len(scope["query_string"]) + 1 if scope.get("query_string") else 0)
    line = len(scope.get("method", "")) + 1 + target + len(" HTTP/1.1\r\n")
    return line + sum(len(name) + len(value) + 4 for name, value in scope.get("headers", []))


def check_header_size(scope: dict) -> None:
    """The 431 for a header block past MAX_HEADER_BYTES that h11 parsed whole (it checks only a block still
    incomplete past its limit: one that arrives in one read, up to 64 KiB, passed)."""
    if header_block_bytes(scope) > MAX_HEADER_BYTES:
        raise APIError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, HEADERS_TOO_LARGE_MESSAGE, code="headers_too_large")


def http_error(error: BaseException | None) -> APIError:
    """What a request h11 could not parse is told: 431 where h11 says its headers outgrew the buffer, else 400."""
    if getattr(error, "error_status_hint", None) == HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE:
        return APIError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, HEADERS_TOO_LARGE_MESSAGE, code="headers_too_large")
    return APIError(HTTPStatus.BAD_REQUEST, MALFORMED_HTTP_MESSAGE, code="invalid_http")


class OpenAIErrorH11Protocol(H11Protocol):
    def send_400_response(self, msg: str) -> None:
        # uvicorn 0.55 calls this inside `except h11.RemoteProtocolError`, whose status hint tells the two apart
        error = http_error(sys.exc_info()[1])
        body = json.dumps(error_body(error)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        for event in (h11.Response(status_code=error.status, headers=headers,
                                   reason=HTTPStatus(error.status).phrase.encode()),
                      h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()
