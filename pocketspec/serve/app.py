"""The FastAPI application of `pocketspec serve`: OpenAI's /v1 endpoints, /health and /metrics.

With an API key, /v1/* and /metrics need `Authorization: Bearer KEY` (401 otherwise); /health stays
open for load balancers' probes. The key is compared in constant time and never logged.
"""

from __future__ import annotations

import hmac

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from pocketspec.serve import endpoints
from pocketspec.serve.api_errors import APIError, install_error_handlers
from pocketspec.serve.http_protocol import check_header_size
from pocketspec.serve.server_state import ServerState


def is_authorized(authorization: str | None, api_key: str | None) -> bool:
    """Whether an Authorization header carries the key (any header, when the server has none)."""
    if api_key is None:
        return True
    scheme, _, token = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


def _model_card(state: ServerState) -> dict:
    return {"id": state.model_id, "object": "model", "created": state.started_at, "owned_by": "pocketspec"}


def build_app(state: ServerState) -> FastAPI:
    async def headers_within_limit(request: Request) -> None:
        check_header_size(request.scope)

    app = FastAPI(title="PocketSpec", docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[Depends(headers_within_limit)])
    install_error_handlers(app, on_error=lambda request, error: state.metrics.record_refusal(request.url.path,
                                                                                              error.status))

    async def require_key(request: Request) -> None:
        if not is_authorized(request.headers.get("authorization"), state.api_key):
            raise APIError(401, "missing or wrong API key: send the header `Authorization: Bearer KEY`",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    with_key = [Depends(require_key)]

    @app.post("/v1/chat/completions", dependencies=with_key)
    async def chat_completions(request: Request):
        return await endpoints.chat_completions(request, state)

    @app.post("/v1/completions", dependencies=with_key)
    async def completions(request: Request):
        return await endpoints.completions(request, state)

    @app.get("/v1/models", dependencies=with_key)
    async def models():
        return {"object": "list", "data": [_model_card(state)]}

    @app.get("/v1/models/{model_id:path}", dependencies=with_key)
    async def model(model_id: str):
        endpoints.check_model(model_id, state.model_id)
        return _model_card(state)

    # HEAD too: uptime monitors probe with it by default (UptimeRobot), and a 405 reads to them as down
    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health():
        slots = state.slots
        status = "shutting_down" if state.shutting_down.is_set() else "model_lost" if state.model_lost else "ok"
        body = {"status": status, "model": state.model_id, "slots": slots.num_slots,
                "slots_in_use": slots.in_use(), "queued": slots.queued()}  # the reason is logged, not shown to all
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    @app.get("/metrics", dependencies=with_key)
    async def metrics():
        text, content_type = state.metrics.render()
        return Response(text, media_type=content_type)

    return app
