"""From SessionSettings to the slots a server runs: the torch backend's continuous-batching pool
(every slot a row, each request's output what it would be alone), else speculative engines:
on llama.cpp one per concurrent request, on sequences of one shared context that decode together."""

from __future__ import annotations

from typing import Callable

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
    from pocketspec.serve.engine_slots import EngineSlots
    from pocketspec.session import open_session

    return EngineSlots(open_session(settings, num_sequences=max_concurrency, on_note=on_note,
                                    on_progress=on_progress))
