"""Opening an engine for a command: resolve models, apply the memory plan, load, measure, close."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field, replace

import click
import psutil

from apps.backend_options import apply_backend_options
from apps.options import GENERATION, MODEL, SPECULATION, parse_gamma, repack_allowed
from apps.split_budget import apply_split
from memplanner.split import is_split
from pocketspec.backends.device_check import check_devices
from pocketspec.loader import (ModelChoice, choose_models, close_engine, draft_settings_for, load_engine,
                               trained_context_limit)
from pocketspec.settings import ModelSettings, SamplingSettings
from pocketspec.stats import GenerationStats, gpu_allocator_peaks, peak_rss_bytes


@dataclass
class Session:
    engine: object
    choice: ModelChoice
    budget_bytes: int | None = None
    plan: object | None = None
    notes: list[str] = field(default_factory=list)

    def peak_memory_bytes(self) -> int:
        """What --memory-budget bounds: torch's allocator peaks, summed over every GPU used (target, draft,
        split devices, a row split's other ranks); on a CPU the whole process's peak resident memory
        (VmHWM, as `top` and /usr/bin/time -v show it), the interpreter and the CLI's own modules included."""
        gpu_peaks = {**gpu_allocator_peaks(), **getattr(self.engine.target, "allocator_peaks", dict)()}
        if gpu_peaks:
            return sum(gpu_peaks.values())
        return peak_rss_bytes()

    def memory_in_use_bytes(self) -> int:
        return psutil.Process().memory_info().rss

    def stats_dict(self, stats: GenerationStats) -> dict:
        result = stats.as_dict()
        result["peak_memory_bytes"] = self.peak_memory_bytes()
        reserved = gpu_allocator_peaks(reserved=True)
        if reserved:  # this process's GPUs (a row split's other ranks are not in it)
            result["peak_gpu_reserved_bytes"] = sum(reserved.values())
        if self.budget_bytes is not None:
            result["memory_budget_bytes"] = self.budget_bytes
        return result


@contextlib.contextmanager
def open_engine(*, target, draft, pair, temperature=0.0, top_p=1.0, top_k=0, seed=0, gamma="auto",
                memory_budget=None, max_context=None, kv_type=None, threads=0,
                max_new_tokens=GENERATION.max_new_tokens,
                repack=None, exact_verify=SPECULATION.exact_verify, announce=True,
                pull_if_missing=False, **backend_options):
    """backend_options: the flags of apps.backend_options (--backend, --device, --weights, ...)."""
    choice = choose_models(target=target, draft=draft, pair=pair, pull_if_missing=pull_if_missing)
    max_context = trained_context_limit(choice.target_path, max_context, MODEL.max_context)
    fixed_gamma = parse_gamma(gamma)
    target_settings = ModelSettings(
        num_threads=threads,
        max_context=max_context,
        kv_type=kv_type or MODEL.kv_type,
        repack_weights=MODEL.repack_weights if repack is None else repack,
    )
    speculation = replace(SPECULATION, gamma=fixed_gamma, exact_verify=exact_verify)
    target_settings = replace(target_settings, max_logits_rows=speculation.verify_width(choice.drafter != "none"))
    target_settings, speculation = apply_backend_options(target_settings, speculation, backend_options)
    if not is_split(target_settings.devices, memory_budget):
        check_devices(target_settings)  # a split checks the devices its budget may name (apps/split_budget.py)
    session_plan = None
    budget_bytes = None
    draft_max_context = draft_device = None
    notes: list[str] = []
    notes_after_loading: list[str] = []  # a split's plan is announced once loaded: a load error stays one line
    if is_split(target_settings.devices, memory_budget):
        applied = apply_split(choice, memory_budget, target_settings, speculation, max_new_tokens, temperature,
                              repack=repack_allowed(repack))
        choice, target_settings, speculation = applied.choice, applied.target_settings, applied.speculation
        draft_max_context, draft_device, budget_bytes = applied.draft_max_context, applied.draft_device, applied.budget_bytes
        session_plan, notes, notes_after_loading = applied, list(applied.notes), list(applied.notes)
    elif memory_budget is not None and target_settings.backend == "torch":
        from apps.budget import parse_budget
        from apps.torch_budget import TorchBudgetPlan, check_torch_budget

        budget_bytes = parse_budget(memory_budget)
        notes, target_settings = check_torch_budget(choice, budget_bytes, target_settings, speculation)
        session_plan = TorchBudgetPlan(tuple(notes))
        if announce:
            for note in notes:
                click.echo(note, err=True)
    elif memory_budget is not None:
        from apps.budget import apply_plan

        applied = apply_plan(choice, memory_budget, target_settings, speculation, max_new_tokens, temperature,
                             repack=repack_allowed(repack))
        choice, target_settings, speculation, draft_max_context = (
            applied.choice, applied.target_settings, applied.speculation, applied.draft_max_context)
        session_plan, budget_bytes, notes = applied.plan, applied.budget_bytes, applied.notes
        if announce:
            for note in notes:
                click.echo(note, err=True)
    sampling = SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    engine = load_engine(
        choice,
        target_settings=target_settings,
        draft_settings=draft_settings_for(target_settings, draft_max_context, draft_device, speculation.draft_kv_type),
        sampling=sampling,
        speculation=speculation,
        # a progress line for someone watching a terminal; a script's stderr keeps only what it must read
        notify=(lambda line: click.echo(line, err=True)) if announce and sys.stderr.isatty() else None,
    )
    if announce:
        for note in notes_after_loading + engine.notes:
            click.echo(note, err=True)
    notes.extend(engine.notes)
    try:
        yield Session(engine, choice, budget_bytes, session_plan, notes)
    finally:
        close_engine(engine)
