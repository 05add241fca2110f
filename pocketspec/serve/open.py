"""From SessionSettings to the slots a server runs. Every slot is a row of the continuous-batching
pool (pocketspec/serve/batch_slots.py: one step loop for every request running now; on llama.cpp
the sequences of one context, on torch the rows of a batched model), except a torch target split
over --devices and ONNX Runtime, which run one engine, one request at a time (a row split's rank 0
serves, its other ranks follow)."""

from __future__ import annotations

from typing import Callable

from pocketspec.errors import UserError
from pocketspec.serve.generation import Slots
from pocketspec.session_settings import SessionSettings, requested_devices

Notify = Callable[[str], None]


def open_slots(settings: SessionSettings, *, max_concurrency: int, on_note: Notify | None = None,
               on_progress: Notify | None = None) -> Slots:
    """The slots for `max_concurrency` requests at once; UserError when that many cannot run (the backend,
    the drafter, or the memory budget)."""
    backend = settings.options.get("backend")
    is_split = len(requested_devices(settings)) > 1
    if backend == "torch" and is_split and max_concurrency > 1:
        raise UserError(f"--max-concurrency {max_concurrency} with --devices on --backend torch: the batching pool "
                        "runs on one device, so a split target serves one request at a time (--max-concurrency 1); "
                        "--backend llama.cpp serves concurrent requests on split devices")
    if backend == "onnx" and max_concurrency > 1:
        raise UserError(f"--max-concurrency {max_concurrency} with --backend onnx: ONNX Runtime decodes one sequence "
                        "at a time, so it serves one request at a time (--max-concurrency 1); --backend llama.cpp "
                        "or torch serve concurrent requests")
    if (backend == "torch" and is_split) or backend == "onnx":
        from pocketspec.serve.engine_slots import EngineSlots
        from pocketspec.session import open_session

        return EngineSlots(open_session(settings, on_note=on_note, on_progress=on_progress))
    from pocketspec.serve.batch_slots import open_batch_slots

    return open_batch_slots(settings, max_concurrency, on_note=on_note, on_progress=on_progress)
