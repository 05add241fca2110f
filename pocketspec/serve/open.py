"""From SessionSettings to the slots a server runs: the torch backend's continuous-batching pool
(every slot a row, each request's output what it would be alone), else one speculative engine
that serves requests in turn."""

from __future__ import annotations

from typing import Callable

from pocketspec.errors import UserError
from pocketspec.serve.generation import Slots
from pocketspec.session_settings import SessionSettings

Notify = Callable[[str], None]


def open_slots(settings: SessionSettings, *, max_concurrency: int, on_note: Notify | None = None,
               on_progress: Notify | None = None) -> Slots:
    """The slots for `max_concurrency` requests at once; UserError when that many cannot run (the backend,
    the drafter, or the memory budget)."""
    is_torch = settings.options.get("backend") == "torch"
    if is_torch and not (settings.draft == "self-sparse" and max_concurrency == 1):  # batching slides no window
        from pocketspec.serve.batch_slots import open_batch_slots

        return open_batch_slots(settings, max_concurrency, on_note=on_note)
    if max_concurrency > 1:
        raise UserError(f"--max-concurrency {max_concurrency}: llama.cpp serves one request at a time in this "
                        "version (requests queue for the slot); use --max-concurrency 1, or --backend torch for "
                        "continuous batching")
    from pocketspec.serve.engine_slots import EngineSlots
    from pocketspec.session import open_session

    return EngineSlots(open_session(settings, on_note=on_note, on_progress=on_progress))
