"""The batched front door: SessionSettings and BatchSettings to a BatchEngine whose rows --memory-budget
sized (torch, or llama.cpp), the way pocketspec/session.py opens a single-sequence engine."""

from __future__ import annotations

from typing import Callable

from pocketspec.backends.device_check import check_devices
from pocketspec.budget import MemoryPlan
from pocketspec.conversation.prompt_encoding import PromptEncoding
from pocketspec.errors import BudgetError, UserError
from pocketspec.loader import ModelChoice
from pocketspec.session_settings import SessionSettings, settings_for
from pocketspec.settings import BatchSettings
from pocketspec.speculation.draft_limits import batch_speculation


class BatchSession(PromptEncoding):
    def __init__(self, opened, choice: ModelChoice, plan: MemoryPlan | None, max_context: int):
        self._opened = opened  # pocketspec.batch.open.OpenedBatch
        self.engine = opened.engine
        self.tokenizer = opened.tokenizer
        self.choice = choice
        self.plan = plan
        self.max_context = max_context

    def close(self) -> None:
        self._opened.close()

    def __enter__(self) -> BatchSession:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def open_batch_session(settings: SessionSettings, batch: BatchSettings, *,
                       on_note: Callable[[str], None] | None = None, on_progress: Callable[[str], None] | None = None,
                       min_rows: int = 0) -> BatchSession:
    """Resolve, plan the rows, load. A fixed --gamma is every row's longest draft. on_note(line): the
    memory plan's lines and the drafting's notes; on_progress(line): told before a first-time cost
    measurement (llama.cpp). min_rows: the sequences that must run at once (a server's --max-concurrency); a
    budget that fits fewer is refused before loading. torch plans its rows (pocketspec/budget/batch_plan.py);
    llama.cpp plans a context of its sequences (plan_sequences)."""
    choice, target_settings, speculation = settings_for(settings)
    if target_settings.backend == "onnx":
        flag = "--max-concurrency" if min_rows else "--batch"
        raise UserError(f"{flag} runs on --backend llama.cpp or torch; --backend onnx decodes one sequence at a time")
    if target_settings.backend == "llama.cpp":  # one context, split over --devices by llama.cpp if asked
        # the flag that asked for the sequences, named where they do not fit
        count_flag = "--max-concurrency" if min_rows else "--pool-rows" if batch.num_rows else "--batch"
        return _open_llama(settings, batch, on_note or (lambda line: None), on_progress, count_flag=count_flag)
    if len(target_settings.devices) > 1:
        raise UserError(f"--devices {','.join(target_settings.devices)}: the batching pool runs on one device; "
                        "give one --device, or decode one prompt at a time on the split")
    if target_settings.compile:  # asked for (unset: None), and the pool would silently not
        raise UserError(f"--compile applies to one sequence at a time: the {'server' if min_rows else '--batch'} "
                        "pool runs its forwards eagerly; leave it out")
    from pocketspec.batch.open import open_batch_engine
    from pocketspec.budget.batch_plan import apply_batch_plan

    speculation = batch_speculation(speculation)
    check_devices(target_settings)
    plan = None
    if settings.budget is not None:
        plan = apply_batch_plan(choice, settings.budget.total_bytes, target_settings, speculation, batch)
        batch = plan.batch
        if batch.max_batch < min_rows:
            raise BudgetError(f"--max-concurrency {min_rows} does not fit --memory-budget {settings.memory_budget}: "
                              f"it holds {batch.max_batch} sequence{'s' if batch.max_batch != 1 else ''} of "
                              f"{target_settings.max_context} tokens; lower "
                              "--max-concurrency or --max-context")
        for line in plan.lines:
            (on_note or (lambda line: None))(line)
    opened = open_batch_engine(choice, target_settings=target_settings, speculation=speculation,
                               sampling=settings.sampling, batch=batch)
    return BatchSession(opened, choice, plan, target_settings.max_context)


def _open_llama(settings: SessionSettings, batch: BatchSettings, on_note: Callable[[str], None],
                on_progress: Callable[[str], None] | None, count_flag: str) -> BatchSession:
    from pocketspec.backends.llama_context import max_sequences
    from pocketspec.batch.open_llama import open_llama_batch_engine
    from pocketspec.session import plan_sequences

    if batch.is_batch_invariant:
        raise UserError("--batch-invariant sets the torch backend's kernels; add --backend torch or leave it out")
    num_sequences = batch.num_rows or batch.max_batch
    if num_sequences > max_sequences():
        raise UserError(f"{count_flag} {num_sequences}: one llama.cpp context holds at most {max_sequences()} "
                        f"sequences; lower {count_flag}")
    planned = plan_sequences(settings, num_sequences, count_flag=count_flag)
    for line in planned.plan.lines if planned.plan is not None else []:
        on_note(line)
    opened = open_llama_batch_engine(planned.choice, target_settings=planned.target_settings,
                                     draft_settings=planned.draft_settings, speculation=planned.speculation,
                                     sampling=settings.sampling, batch=batch, on_note=on_note,
                                     on_progress=on_progress)
    return BatchSession(opened, planned.choice, planned.plan, planned.target_settings.max_context)
