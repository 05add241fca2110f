"""The server's own settings (`pocketspec serve`): where it listens, how many requests it holds, how large
a body it reads. The single home of their defaults and ranges; apps/serve_cmd.py makes its flags from them."""

from __future__ import annotations

from dataclasses import dataclass, field

from memplanner.sizes import parse_size
from pocketspec.errors import UserError
from pocketspec.settings import RANDOM_SEED
from pocketspec.setting_ranges import check_ranges, in_range

LOOPBACK_HOST = "127.0.0.1"
API_KEY_VARIABLE = "POCKETSPEC_API_KEY"


@dataclass(frozen=True)
class ServeSettings:
    host: str = LOOPBACK_HOST  # without an API key only a loopback address is allowed
    port: int = field(default=8000, metadata=in_range("--port", 0, 65535, is_integer=True))  # 0: a free port
    # requests generating at once (llama.cpp: 1); more wait in the queue
    max_concurrency: int = field(default=1, metadata=in_range("--max-concurrency", 1, 1024, is_integer=True))
    # requests waiting for a slot; one more gets 503 with Retry-After
    max_queue: int = field(default=16, metadata=in_range("--max-queue", 0, 1 << 16, is_integer=True))
    max_body: str = "4MiB"  # a request body larger than this gets 413
    # how long a shutdown waits for running requests to end once they were cancelled
    shutdown_seconds: float = field(default=10.0, metadata=in_range("--shutdown-seconds", 0.0, 3600.0))
    retry_after_seconds: int = 1  # what a 503 for a full queue tells clients to wait
    # the seed of a request that gives none (`--seed`): RANDOM_SEED draws one per request, as OpenAI's API and
    # llama-server do, so the same request sampled twice varies; the reply's x-pocketspec-seed header names it
    default_seed: int = RANDOM_SEED

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.max_body_bytes < 1:
            raise UserError(f"--max-body must be at least one byte, got {self.max_body!r}")

    @property
    def max_body_bytes(self) -> int:
        try:
            return parse_size(self.max_body)
        except ValueError as error:
            raise UserError(f"--max-body: {error}") from None

    @property
    def max_held(self) -> int:
        """Requests held at once, generating or queued."""
        return self.max_concurrency + self.max_queue
