"""The one way from settings to a running engine, for every front end (generate, chat, bench's
workers, the benchmark scripts, the server):

    with open_session(SessionSettings(pair="qwen-coder", memory_budget="3GiB")) as session:
        result = session.engine.generate(session.encode("Hello", chat=True), 64)

open_session resolves the models (pocketspec/loader.py), applies --memory-budget
(pocketspec/budget/), loads the engine and measures what the budget bounds. A session owns
the engine, the applied memory plan and the tokenizer, and closes them. Several sequences at
once (`generate --batch`, a server) open a BatchSession (pocketspec/batch_session.py), planned
here too (plan_sequences).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import psutil

from memplanner.memory_budget import is_split
from pocketspec.backends.device_check import check_devices
from pocketspec.budget import MemoryPlan, apply_budget
from pocketspec.budget.sequences_plan import per_sequence_plan
from pocketspec.conversation.prompt_encoding import PromptEncoding
from pocketspec.errors import BudgetError
from pocketspec.learned_costs import adopt_learned_costs, keep_learned_costs
from pocketspec.loader import ModelChoice, load_engine
from pocketspec.settings import ModelSettings, SpeculationSettings, draft_settings_for
from pocketspec.session_settings import SessionSettings, repack_allowed, settings_for
from pocketspec.speculation.verify_mode import resolve_verify_mode
from pocketspec.stats import GenerationStats, budgeted_peak_bytes, gpu_allocator_peaks

Notify = Callable[[str], None]


class Session(PromptEncoding):
    def __init__(self, engine, choice: ModelChoice, plan: MemoryPlan | None, notes: list[str],
                 settings: SessionSettings):
        self.engine = engine  # a SpeculativeEngine; None once closed
        self.choice = choice
        self.plan = plan
        self.notes = notes  # what the plan and the loader said, in order
        self.settings = settings
        for table in self._cost_tables():
            adopt_learned_costs(table)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def budget_bytes(self) -> int | None:
        return self.plan.budget_bytes if self.plan is not None else None

    def reset(self, seed: int | None = None) -> None:
        """The next generation starts from empty caches (see SpeculativeEngine.reset)."""
        self.engine.reset(seed)

    def peak_memory_bytes(self) -> int:
        """What --memory-budget bounds: torch's allocator peaks, summed over every GPU used (target, draft,
        split devices, a row split's other ranks); on a CPU the whole process's peak resident memory
        (VmHWM, as `top` and /usr/bin/time -v show it), the interpreter and the front end's modules included,
        and a row split's other ranks' processes' too."""
        return budgeted_peak_bytes(self.engine.allocator_peaks(), self.engine.followers_peak_rss_bytes)

    def memory_in_use_bytes(self) -> int:
        return psutil.Process().memory_info().rss

    def stats_dict(self, stats: GenerationStats) -> dict:
        result = stats.as_dict()
        result["peak_memory_bytes"] = self.peak_memory_bytes()
        result["exact_verify"] = self.engine.is_exact_verify  # docs/exactness.md, "The default"
        reserved = gpu_allocator_peaks(reserved=True)
        if reserved:  # this process's GPUs (a row split's other ranks are not in it)
            result["peak_gpu_reserved_bytes"] = sum(reserved.values())
        if self.budget_bytes is not None:
            result["memory_budget_bytes"] = self.budget_bytes
        return result

    def _cost_tables(self):
        """The engine's cost tables, which start from what earlier sessions learned and are kept for later ones
        (pocketspec/learned_costs.py)."""
        return (self.engine.controller.target_costs, self.engine.controller.draft_costs)

    def close(self) -> None:
        if self.engine is not None:
            for table in self._cost_tables():
                keep_learned_costs(table)
            self.engine.close()
        self.engine = None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


@dataclass(frozen=True)
class PlannedSequences:
    """What --memory-budget (if given) makes of the settings for num_sequences sequences of one context."""

    choice: ModelChoice
    target_settings: ModelSettings  # each sequence's
    draft_settings: ModelSettings
    speculation: SpeculationSettings
    plan: MemoryPlan | None


def plan_sequences(settings: SessionSettings, num_sequences: int = 1,
                   count_flag: str = "--max-concurrency") -> PlannedSequences:
    """Resolve the models and apply --memory-budget to a context of num_sequences x --max-context (the
    KV cache is the same bytes whoever holds the tokens; per_sequence_plan adds every sequence's logits).
    count_flag: the flag that asked for num_sequences, named when they do not fit."""
    choice, target_settings, speculation = settings_for(settings)
    if not is_split(target_settings.devices, settings.budget):
        check_devices(target_settings)  # a split checks the devices its budget may name
    all_sequences = replace(target_settings, max_context=target_settings.max_context * num_sequences)
    try:
        plan = apply_budget(choice, settings.budget, all_sequences, speculation,
                            max_new_tokens=settings.max_new_tokens, temperature=settings.sampling.temperature,
                            repack=repack_allowed(settings.repack), num_sequences=num_sequences)
    except BudgetError as error:
        if num_sequences == 1:
            raise
        raise BudgetError(f"{count_flag} {num_sequences} with {target_settings.max_context} tokens each: {error}; "
                          f"or lower {count_flag} (the need counts each one's logits rows)") from None
    if plan is not None:
        plan = per_sequence_plan(plan, num_sequences, count_flag)
        choice, target_settings, speculation = plan.choice, plan.target_settings, plan.speculation
    draft_max_context = plan.draft_max_context if plan is not None else settings.draft_window
    draft_device = plan.draft_device if plan is not None else None
    draft_settings = draft_settings_for(target_settings, draft_max_context, draft_device, speculation.draft_kv_type)
    return PlannedSequences(choice, target_settings, draft_settings, speculation, plan)


def open_session(settings: SessionSettings, *, on_note: Notify | None = None,
                 on_progress: Notify | None = None) -> Session:
    """Resolve, plan, load. on_note(line): each line of the memory plan and the loader's notes, as soon as
    it is final; on_progress(line): told before a first-time cost measurement (seconds to a minute)."""
    notify = on_note or (lambda line: None)
    planned = plan_sequences(settings)
    choice, plan = planned.choice, planned.plan
    notes = list(plan.lines) if plan is not None else []
    if plan is not None and not plan.shown_after_loading:
        for line in notes:
            notify(line)
    speculation = resolve_verify_mode(planned.speculation, planned.target_settings)  # one sequence: exact if free
    engine = load_engine(choice, target_settings=planned.target_settings, draft_settings=planned.draft_settings,
                         sampling=settings.sampling, speculation=speculation, notify=on_progress)
    if plan is not None and plan.shown_after_loading:
        for line in notes:
            notify(line)
    for line in engine.notes:
        notify(line)
    notes.extend(engine.notes)
    return Session(engine, choice, plan, notes, settings)
