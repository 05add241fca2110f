"""From SessionSettings to the slots a server runs. Every slot is a row of the continuous-batching
pool (pocketspec/serve/batch_slots.py: one step loop for every request running now; on llama.cpp
the sequences of one context, on torch the rows of a batched model), except a torch target split
over --devices and ONNX Runtime, which run one engine, one request at a time (a row split's rank 0
serves, its other ranks follow)."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from memplanner.server_terms import server_terms
from memplanner.sizes import format_bytes
from pocketspec.budget.memory_plan import sizes_text
from pocketspec.errors import BudgetError, UserError
from pocketspec.serve.generation import Slots
from pocketspec.serve.serve_settings import ServeSettings
from pocketspec.session_settings import MODEL, SPECULATION, SessionSettings, apply_backend_options, requested_devices

Notify = Callable[[str], None]


def open_slots(settings: SessionSettings, *, max_concurrency: int, on_note: Notify | None = None,
               on_progress: Notify | None = None, server: ServeSettings | None = None) -> Slots:
    """The slots for `max_concurrency` requests at once; UserError when that many cannot run (the backend,
    the drafter, or the memory budget). server: the settings of the server they run in, whose own memory
    (server_terms) a whole-process --memory-budget keeps beside the models."""
    terms = server_terms(server.max_held, server.max_body_bytes) if _bounds_this_process(settings, server) else {}
    if not terms:
        return _open_slots(settings, max_concurrency=max_concurrency, on_note=on_note, on_progress=on_progress)
    budget_bytes, kept_bytes = settings.budget.total_bytes, sum(terms.values())
    kept = (f"the server keeps {format_bytes(kept_bytes)} of --memory-budget {format_bytes(budget_bytes)} "
            f"({sizes_text(terms)}: {server.max_held} request{'s' if server.max_held != 1 else ''}, running and "
            f"queued, of up to --max-body {server.max_body})")
    if kept_bytes >= budget_bytes:
        raise BudgetError(f"{kept}, which leaves nothing for the models: raise --memory-budget, or lower --max-body "
                          "or --max-queue")
    try:
        slots = _open_slots(replace(settings, kept_bytes=kept_bytes), max_concurrency=max_concurrency,
                            on_note=on_note, on_progress=on_progress)
    except BudgetError as error:  # the budget the models were refused is what the server left them
        raise BudgetError(f"{error} (the budget above is what is left for the models: {kept}; add that, or lower "
                          "--max-body or --max-queue)") from None
    if on_note is not None:
        on_note(f"memory plan (serve): {kept}; the models plan within the rest")
    return slots


def _bounds_this_process(settings: SessionSettings, server: ServeSettings | None) -> bool:
    """Whether --memory-budget bounds the memory the server's own objects take: one budget for the whole process
    (not one per device), with the models in host memory (not a GPU's)."""
    if server is None or settings.budget is None or settings.budget.per_device:
        return False
    model, _ = apply_backend_options(MODEL, SPECULATION, settings.options)
    return not model.is_on_gpu and (model.backend != "onnx" or model.execution_provider == "cpu")


def _open_slots(settings: SessionSettings, *, max_concurrency: int, on_note: Notify | None,
                on_progress: Notify | None) -> Slots:
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
