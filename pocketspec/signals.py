"""SIGTERM as an exception, and Ctrl-C and SIGTERM held back over a block that must not be cut.

The CLI (apps/cli.py) turns SIGTERM (`kill`, `timeout`, `docker stop`, systemd) into Terminated, a
SystemExit: the command ends as Python's exit ends it, not at once, so every `finally` runs (an
--output or a transcript being written is left whole or as it was, and no hidden temporary file
stays behind). `serve` has its own handler (pocketspec/serve/server.py).

A block that runs Python inside a ctypes callback (llama.cpp's log, while it loads a model) would
have the KeyboardInterrupt, or the SystemExit that SIGTERM raises (apps/cli.py), printed and
dropped by ctypes ("Exception ignored"): the load, and the whole run, went on. A block that writes
a set of files (the bench's results) would leave half of the set. Under stop_signals_held() a
signal is noted, and handed to the handler that was set once the block ends.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Terminated(SystemExit):
    """SIGTERM (or SIGHUP) arrived; its exit code is the shell's, 128 + the signal's number."""


def raise_terminated(signum: int, frame) -> None:
    raise Terminated(128 + signum)


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """Off the main thread, where no handler can be set, the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: received.append(signum))
                for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    for signum in dict.fromkeys(received):  # each once, in the order they came
        handler = previous[signum]
        if callable(handler):
            handler(signum, None)  # Python's own SIGINT handler raises KeyboardInterrupt; chat's notes it
        elif handler == signal.SIG_DFL:
            signal.raise_signal(signum)
