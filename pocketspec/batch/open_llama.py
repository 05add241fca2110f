"""Opening a batch engine on llama.cpp: a context of num_rows sequences for the target (and one for a
draft model), its rows stepped together by the batch engine (pocketspec/batch/llama_rows.py).

Before any request, row 0 stands in for one sequence alone, as the single engine's backend does
(pocketspec/loader.py): this machine's cost table is calibrated there (once, then cached), with
--exact-verify the widest exact verify is probed there, and a pair's draft model is loaded only
where those costs say it may pay. Where the plan gave the draft a shorter context than the
target's, each draft row slides a window of sinks and recent tokens (BatchModelDrafter).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from pocketspec.backends.llama_context import LlamaModelContext
from pocketspec.backends.llama_cpp_backend import LlamaSequence
from pocketspec.batch.drafting import BatchModelDrafter
from pocketspec.batch.engine import BatchEngine
from pocketspec.batch.llama_rows import LlamaRows
from pocketspec.batch.opened import OpenedBatch
from pocketspec.errors import UserError
from pocketspec.loader import ModelChoice, calibrated_for, draft_cannot_pay
from pocketspec.settings import BatchSettings, ModelSettings, SamplingSettings, SpeculationSettings
from pocketspec.speculation.draft_limits import requested_draft_limits, widest_verified_draft
from pocketspec.speculation.verify_mode import exact_batch_width

LLAMA_BATCH_DRAFTS = ("auto", "ngram", "none")  # a draft GGUF comes as choice.draft_path

Notify = Callable[[str], None]


def open_llama_batch_engine(choice: ModelChoice, *, target_settings: ModelSettings, draft_settings: ModelSettings,
                            speculation: SpeculationSettings, sampling: SamplingSettings, batch: BatchSettings,
                            on_note: Notify, on_progress: Notify | None = None) -> OpenedBatch:
    """target_settings, draft_settings: each row's (plan_sequences in pocketspec/session.py). on_note(line):
    what the user should know about the drafting (the draft model not loaded, --exact-verify's width);
    on_progress(line): told before a first-time cost measurement."""
    if choice.drafter not in LLAMA_BATCH_DRAFTS and choice.draft_path is None:
        raise UserError(f"--draft {choice.drafter} drafts on --backend torch; add --backend torch, or draft with "
                        "ngram, none or a draft model")
    if speculation.drafter == "auto" and choice.drafter in ("ngram", "none"):
        speculation = replace(speculation, drafter=choice.drafter)
    if speculation.drafter == "model" and choice.draft_path is None:
        raise UserError("--drafter model needs a draft model: pass --draft NAME or --pair NAME")
    num_rows = batch.num_rows or batch.max_batch
    owned = []
    notes: list[str] = []
    try:
        target = LlamaRows(LlamaModelContext(choice.target_path, target_settings, num_sequences=num_rows),
                           exact_width=exact_batch_width(target_settings))
        owned.append(target)
        target_costs = _calibrated_row(target, speculation, on_progress)
        if target_costs is not None and target.exact_width:
            target_costs = replace(target_costs, max_pass_tokens=target.exact_width)
        drafter = draft_costs = None
        if choice.draft_path is not None and speculation.drafter in ("auto", "model"):
            skip_reason = draft_cannot_pay(choice, target_costs, draft_settings, speculation)
            if skip_reason is not None:
                notes.append(skip_reason)
            else:
                draft = LlamaRows(LlamaModelContext(choice.draft_path, draft_settings, num_sequences=num_rows))
                owned.append(draft)
                draft_costs = _calibrated_row(draft, speculation, on_progress)
                drafter = BatchModelDrafter(draft)
        widest_draft = None
        if speculation.exact_verify:
            requested = requested_draft_limits(speculation, drafts=speculation.drafter != "none")
            widest_draft = widest_verified_draft(_alone(target), speculation, requested, notes)
        if target.exact_width:  # a row's verify within the row-exact kernels, as one prompt alone verifies
            widest_exact_draft = target.exact_width - 1
            widest_draft = widest_exact_draft if widest_draft is None else min(widest_draft, widest_exact_draft)
    except BaseException:
        for model in owned:
            model.close()
        raise
    for line in notes:
        on_note(line)
    tokenizer = target.native.tokenizer
    engine = BatchEngine(target, is_end=tokenizer.is_end_of_generation, draft=drafter, sampling=sampling,
                         speculation=speculation, batch=replace(batch, is_batch_invariant=False),
                         target_costs=target_costs, draft_costs=draft_costs, widest_draft=widest_draft)
    return OpenedBatch(engine, tokenizer, owned)


def _alone(rows: LlamaRows) -> LlamaSequence:
    """Row 0 as a backend of one sequence (its forwards decode at once), for measuring before any request."""
    return LlamaSequence(rows.native, 0)


def _calibrated_row(rows: LlamaRows, speculation: SpeculationSettings, on_progress: Notify | None):
    """This machine's cost table for the model, measured on row 0 once (then cached), the row emptied after."""
    row = _alone(rows)
    try:
        return calibrated_for(row, speculation, on_progress)
    finally:
        row.rollback(0)
