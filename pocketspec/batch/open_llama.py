"""Opening a batch engine on llama.cpp: a context of num_rows sequences for the target (and one for a
draft model), its rows stepped together by the batch engine (pocketspec/batch/llama_rows.py). A draft
model's rows slide no window: where the plan gave the draft a shorter context, a row drafts with it
only while its context fits (BatchModelDrafter.fits), and with n-grams after."""

from __future__ import annotations

from dataclasses import replace

from pocketspec.backends.llama_context import LlamaModelContext
from pocketspec.batch.drafting import BatchModelDrafter
from pocketspec.batch.engine import BatchEngine
from pocketspec.batch.llama_rows import LlamaRows
from pocketspec.batch.open import OpenedBatch
from pocketspec.errors import UserError
from pocketspec.loader import ModelChoice
from pocketspec.settings import BatchSettings, ModelSettings, SamplingSettings, SpeculationSettings

LLAMA_BATCH_DRAFTS = ("auto", "ngram", "none")  # a draft GGUF comes as choice.draft_path


def open_llama_batch_engine(choice: ModelChoice, *, target_settings: ModelSettings, draft_settings: ModelSettings,
                            speculation: SpeculationSettings, sampling: SamplingSettings,
                            batch: BatchSettings) -> OpenedBatch:
    """target_settings, draft_settings: each row's (plan_sequences in pocketspec/session.py)."""
    if choice.drafter not in LLAMA_BATCH_DRAFTS and choice.draft_path is None:
        raise UserError(f"--draft {choice.drafter} drafts on --backend torch; add --backend torch, or draft with "
                        "ngram, none or a draft model")
    num_rows = batch.num_rows or batch.max_batch
    owned = []
    try:
        target = LlamaRows(LlamaModelContext(choice.target_path, target_settings, num_sequences=num_rows))
        owned.append(target)
        drafter = None
        if choice.draft_path is not None and speculation.drafter in ("auto", "model"):
            draft = LlamaRows(LlamaModelContext(choice.draft_path, draft_settings, num_sequences=num_rows))
            owned.append(draft)
            drafter = BatchModelDrafter(draft)
    except BaseException:
        for model in owned:
            model.close()
        raise
    if speculation.drafter == "auto" and choice.drafter in ("ngram", "none"):
        speculation = replace(speculation, drafter=choice.drafter)
    tokenizer = target.native.tokenizer
    engine = BatchEngine(target, is_end=tokenizer.is_end_of_generation, draft=drafter, sampling=sampling,
                         speculation=speculation, batch=replace(batch, is_batch_invariant=False))
    return OpenedBatch(engine, tokenizer, owned)
