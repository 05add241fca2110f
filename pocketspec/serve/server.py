"""uvicorn serving the app until SIGTERM, SIGHUP or Ctrl-C.

A signal stops taking requests, cancels every running generation (each stops within one step),
waits up to shutdown_seconds for the responses to end, and returns: the command then closes the
slots and exits 0. A step can outlast the wait (a long prompt's chunk of a large model on a CPU):
then the replies still waiting for it end there as a shutdown ends them (a 503, or a stream's error
event and [DONE]), and uvicorn, which would cut them off with tracebacks, waits a moment longer
for those responses to go out. A second Ctrl-C stops without waiting.
"""

from __future__ import annotations

import asyncio
import signal
import socket
from typing import Callable

import uvicorn

from pocketspec.serve.app import build_app
from pocketspec.serve.http_protocol import MAX_HEADER_BYTES, OpenAIErrorH11Protocol
from pocketspec.serve.listen import url_of
from pocketspec.serve.server_state import ServerState


# how long uvicorn waits, past the grace period, for the responses of the replies ended then to go out
RESPONSES_MARGIN_SECONDS = 2.0


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState):
        super().__init__(config)
        self.state = state

    def handle_exit(self, sig: int, frame) -> None:
        # uvicorn's own handler re-raises the signal once it has shut down, so SIGTERM would end the
        # process with -15 after a clean stop (uvicorn >= 0.29): a server stopped as asked exits 0.
        if not self.state.shutting_down.is_set():
            self._abandon_after_grace()
        self.state.shutting_down.set()
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True

    def _abandon_after_grace(self) -> None:
        """At the end of the grace period, the replies still waiting for the slots end (on the loop)."""
        try:
            # a signal handler runs on the loop's thread, maybe in the middle of a callback: the timer is set
            # from the loop itself (call_soon_threadsafe, which a signal handler may call)
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not serving yet: nothing to end
            return
        grace_seconds = self.config.timeout_graceful_shutdown - RESPONSES_MARGIN_SECONDS
        loop.call_soon_threadsafe(loop.call_later, grace_seconds, self.state.abandon_live_generations)


def run_server(state: ServerState, sock: socket.socket, *, shutdown_seconds: float,
               on_listening: Callable[[str], None]) -> None:
    """Serve on `sock` (bound) until a signal; returns once the running responses ended or were cut off.
    on_listening(url) is told once connections are taken (they queue until the loop runs)."""
    sock.listen(128)
    on_listening(url_of(sock))
    config = uvicorn.Config(build_app(state), log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=shutdown_seconds + RESPONSES_MARGIN_SECONDS,
                            server_header=False,
                            http=OpenAIErrorH11Protocol, h11_max_incomplete_event_size=MAX_HEADER_BYTES)
    server = _Server(config, state)
    # uvicorn catches SIGINT and SIGTERM only: a closed terminal (SIGHUP) stops the server as they do, where
    # `nohup` has not set it aside
    previous_sighup = signal.getsignal(signal.SIGHUP)
    if previous_sighup != signal.SIG_IGN:
        signal.signal(signal.SIGHUP, server.handle_exit)
    try:
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGHUP, previous_sighup)
    state.shutting_down.set()
