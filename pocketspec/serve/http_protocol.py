"""uvicorn's h11 protocol, with a request that is not valid HTTP (a malformed request line, header or
Content-Length) answered by a 400 in OpenAI's error shape rather than uvicorn's plain-text line.

uvicorn answers such a request itself, before any app sees it, so api_errors' handlers cannot: this
class is what the server's Config names as its `http` protocol.
"""

from __future__ import annotations

import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from pocketspec.serve.api_errors import bad_request, error_body

MALFORMED_HTTP_MESSAGE = ("the request is not valid HTTP/1.1: its request line, a header or its Content-Length "
                          "could not be parsed")


def malformed_http_body() -> bytes:
    return json.dumps(error_body(bad_request(MALFORMED_HTTP_MESSAGE, code="invalid_http"))).encode()


class OpenAIErrorH11Protocol(H11Protocol):
    def send_400_response(self, msg: str) -> None:
        body = malformed_http_body()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                      h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()
