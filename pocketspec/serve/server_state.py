"""What every request handler of one server shares: the slots, the model's name, the defaults for
requests, the limits, the API key, the metrics, and whether it is shutting down."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from pocketspec.models.catalog import resolve_pair
from pocketspec.serve.api_errors import APIError
from pocketspec.serve.generation import Slots
from pocketspec.serve.metrics import ServerMetrics
from pocketspec.serve.request_checks import RequestDefaults
from pocketspec.serve.serve_settings import ServeSettings
from pocketspec.session_settings import SessionSettings


def served_model_id(settings: SessionSettings) -> str:
    """The name clients pass as `model`: the target's catalog name, or its GGUF file's name without .gguf."""
    target = settings.target or resolve_pair(settings.pair).target
    name = Path(target).name
    return name[: -len(".gguf")] if name.endswith(".gguf") else name


def budget_bytes(settings: SessionSettings) -> int | None:
    """--memory-budget in bytes (a per-device budget: summed over the devices); None without one."""
    return None if settings.budget is None else settings.budget.total_bytes


class Admission:
    """The requests a server holds, generating or waiting: past max_held the next one gets 503 with Retry-After.
    Used on the event loop's thread only."""

    def __init__(self, max_held: int, retry_after_seconds: int):
        self.max_held, self.retry_after_seconds = max_held, retry_after_seconds
        self.num_held = 0

    def admit(self) -> None:
        if self.num_held >= self.max_held:
            raise APIError(503, f"the server is busy: {self.num_held} requests are generating or queued; "
                                f"retry after {self.retry_after_seconds} s", code="queue_full",
                           headers={"Retry-After": str(self.retry_after_seconds)})
        self.num_held += 1

    def release(self) -> None:
        self.num_held -= 1


@dataclass
class ServerState:
    slots: Slots
    model_id: str
    defaults: RequestDefaults
    admission: Admission
    metrics: ServerMetrics
    max_body_bytes: int
    api_key: str | None = None
    shutting_down: threading.Event = field(default_factory=threading.Event)
    started_at: int = field(default_factory=lambda: int(time.time()))
    live: set = field(default_factory=set)  # the LiveGenerations not ended yet (the event loop's thread only)
    model_lost: str | None = None  # why the model cannot run any more (errors.ModelLost): /health says so

    def abandon_live_generations(self) -> None:
        """The shutdown's grace period is over: every reply still waiting for the slots ends now, as a
        shutdown ends it (pocketspec/serve/live_generation.py), not cut off with its connection."""
        for live in list(self.live):
            live.abandon()


def new_server_state(slots: Slots, settings: SessionSettings, serve: ServeSettings, *, max_tokens: int,
                     api_key: str | None) -> ServerState:
    """The state of a server on these slots: requests default to the session's sampling and max_tokens."""
    return ServerState(slots, served_model_id(settings), RequestDefaults(settings.sampling, max_tokens),
                       Admission(serve.max_held, serve.retry_after_seconds),
                       ServerMetrics(slots, budget_bytes(settings)), serve.max_body_bytes, api_key or None)
