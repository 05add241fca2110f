"""Every error the server answers, in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.

APIError is raised anywhere in a request's handling; install_error_handlers makes it, FastAPI's own
validation errors, Starlette's 404/405 and any unexpected exception answer in that shape, so a bad
request never reaches a client as a traceback or FastAPI's {"detail": ...}.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

log = logging.getLogger("pocketspec.serve")

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"
# pydantic's names for the members of a union in an error's location (`stop` -> ("stop", "str"))
_UNION_MEMBER_TAGS = {"str", "int", "float", "bool", "list", "dict"}


CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left before it was answered (no one reads it)


class APIError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 error_type: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.error_type = error_type or (SERVER_ERROR if status >= 500 else INVALID_REQUEST)
        self.headers = headers or {}
        self.is_counted = False  # a generation's own failure, which the metrics counted when it ended


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def shutting_down_error() -> APIError:
    return APIError(503, "the server is shutting down", code="shutting_down")


def error_body(error: APIError) -> dict:
    return {"error": {"message": error.message, "type": error.error_type, "param": error.param, "code": error.code}}


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error_body(error), status_code=error.status, headers=error.headers)


def param_of(location: tuple) -> str | None:
    """`messages[0].content` from pydantic's ("messages", 0, "content", "str")."""
    param = ""
    for part in location:
        if part == "body":  # FastAPI's prefix for a body field
            continue
        if isinstance(part, int):
            param += f"[{part}]"
        elif part in _UNION_MEMBER_TAGS or "[" in part:
            break
        else:
            param += f".{part}" if param else part
    return param or None


def validation_error(errors: list[dict]) -> APIError:
    """400 for a body that is not JSON, 422 naming the first field of the wrong type or shape."""
    first = errors[0]
    if first["type"] == "json_invalid":
        return bad_request(f"the body is not valid JSON: {first['msg']}", code="invalid_json")
    param = param_of(tuple(first["loc"]))
    where = f"{param}: " if param else "the body: "
    return APIError(422, where + first["msg"], param=param, code=first["type"])


def from_validation(error: ValidationError) -> APIError:
    return validation_error(error.errors(include_url=False))


def install_error_handlers(app: FastAPI, on_error=None) -> None:
    """on_error(request, api_error): told of every error answered (metrics)."""
    def answer(request: Request, error: APIError) -> JSONResponse:
        if on_error is not None and not error.is_counted:
            on_error(request, error)
        return error_response(error)

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError):
        return answer(request, error)

    @app.exception_handler(RequestValidationError)
    async def request_validation(request: Request, error: RequestValidationError):
        return answer(request, validation_error(list(error.errors())))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException):
        message = "no such endpoint" if error.status_code == 404 else str(error.detail)
        return answer(request, APIError(error.status_code, f"{message}: {request.method} {request.url.path}",
                                        headers=dict(error.headers or {})))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception):
        log.exception("request to %s failed", request.url.path)  # headers (the API key) are never logged
        return answer(request, APIError(500, f"internal error: {type(error).__name__}"))
