"""The server's Prometheus metrics (GET /metrics): requests by endpoint and outcome, tokens (prompt,
completion, drafted, accepted, found cached), queue depth, slots in use, and the peak memory the budget
bounds beside it. One registry per server, so several can live in one process (tests)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from pocketspec.serve.api_errors import CLIENT_CLOSED_REQUEST
from pocketspec.serve.generation import GenerationOutcome, Slots

ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
# outcome labels: stop, length (finish reasons); disconnected (the client left), shutdown (cancelled by a
# shutdown), failed (an error while generating); rejected (4xx), busy (503: queue full or shutting down)


def endpoint_label(path: str) -> str:
    return ENDPOINTS.get(path, "other")


def refusal_label(status: int) -> str:
    if status == CLIENT_CLOSED_REQUEST:
        return "disconnected"
    return "busy" if status == 503 else "rejected" if status < 500 else "failed"


class ServerMetrics:
    def __init__(self, slots: Slots, budget_bytes: int | None):
        self.registry = CollectorRegistry()
        self.requests = Counter("pocketspec_requests", "Requests answered, by endpoint and outcome",
                                ["endpoint", "outcome"], registry=self.registry)
        self.tokens = Counter("pocketspec_tokens", "Tokens by kind: prompt, completion, drafted, accepted, cached "
                              "(prompt tokens reused from the KV cache)", ["kind"], registry=self.registry)
        self._gauge("pocketspec_queue_depth", "Requests waiting for a slot").set_function(slots.queued)
        self._gauge("pocketspec_slots_in_use", "Slots generating now").set_function(slots.in_use)
        self._gauge("pocketspec_slots", "Slots: requests that can generate at once").set(slots.num_slots)
        self._gauge("pocketspec_peak_memory_bytes", "Peak memory as --memory-budget counts it: GPU allocator peaks, "
                    "or on a CPU the peak resident memory of the server and of a row split's other ranks"
                    ).set_function(slots.peak_memory_bytes)
        if budget_bytes is not None:
            self._gauge("pocketspec_memory_budget_bytes", "--memory-budget").set(budget_bytes)

    def _gauge(self, name: str, documentation: str) -> Gauge:
        return Gauge(name, documentation, registry=self.registry)

    def record_generation(self, endpoint: str, outcome_label: str, outcome: GenerationOutcome | None,
                          num_completion_tokens: int) -> None:
        """num_completion_tokens: the reply's tokens, as its usage counts them (up to a stop string)."""
        self.requests.labels(endpoint, outcome_label).inc()
        if outcome is None:
            return
        counts = {"prompt": outcome.num_prompt_tokens, "completion": num_completion_tokens,
                  "drafted": outcome.num_drafted, "accepted": outcome.num_accepted,
                  "cached": outcome.num_reused_tokens}
        for kind, count in counts.items():
            self.tokens.labels(kind).inc(count)

    def record_refusal(self, path: str, status: int) -> None:
        self.requests.labels(endpoint_label(path), refusal_label(status)).inc()

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
