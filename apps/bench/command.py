"""`pocketspec bench`: PocketSpec against plain decoding and against the peers people use,
on the same machine, models and prompts, written to --out as results.json, report.md and plots.

    pocketspec bench --pair qwen-coder --per-category 3 --max-tokens 128 --out docs/bench

The systems (plain, each PocketSpec drafter at each --memory-budget, each peer) run in
rounds, one category at a time, each system in its own process so that its peak memory is
its own (apps/bench/rounds.py). Ctrl-C or SIGTERM writes the rounds completed so far, marked partial (none
completed: --out is left as it was). An earlier run's files in --out are kept unless --force; --out is made
before the first round.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import sys
from pathlib import Path

import click

from apps.bench.plots import PLOTS
from apps.bench.report import build_report
from apps.bench.rounds import BenchProgress, plan_rounds, run_rounds
from apps.bench.run import BenchJob, System, add_closing_notes, pocketspec_settings
from apps.bench.suite import read_suite, select_prompts, with_later_turns
from apps.flags import (MODEL, SPECULATION, DashPath, backend_options, kv_type_option, model_choice_options,
                        refuse_unread_backend_flags, repack_option, sampling_options, setting_option, threads_option)
from apps.bench.peers import PEERS, parse_peers
from apps.bench.peers.llama_speculative import default_tools_dir, missing_binary
from apps.bench.peers.transformers_assisted import missing_requirement as transformers_missing
from memplanner.memory_budget import parse_memory_budget
from pocketspec.backends.device_check import check_devices
from pocketspec.backends.torch_open import check_self_draft
from pocketspec.models.catalog import resolve_pair
from pocketspec.atomic_file import refuse_output_onto_inputs, replaced_on_success
from pocketspec.signals import Terminated, stop_signals_held
from pocketspec.errors import UserError
from pocketspec.loader import choose_models
from pocketspec.session_settings import apply_backend_options, check_self_draft_flags, settings_for
from pocketspec.settings import (SELF_DRAFTS, BenchSettings, ModelSettings, SpeculationSettings,
                                 default_num_threads)

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SUITE = REPO / "benchmarks" / "data" / "spec_bench.jsonl"
DEFAULT_OUT = REPO / "benchmarks" / "results" / "bench"
BENCH = BenchSettings()
DRAFTERS = ("auto", "ngram", *SELF_DRAFTS)  # auto: the draft model (--pair/--draft), if any, with n-grams
BENCH_FILES = ("results.json", "report.md", *PLOTS)  # what a run writes into --out


def _split(values: tuple[str, ...]) -> list[str]:
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def _self_draft_problem(kind: str, settings: ModelSettings, speculation: SpeculationSettings) -> str | None:
    """Why a self-draft cannot run on this --backend (generate's check, check_self_draft), or None: the system
    is skipped then. Any other refusal of its flags (a window too small) is the user's to fix: raised."""
    try:
        check_self_draft(kind, settings, speculation)
    except UserError as error:
        if settings.backend == "torch":
            raise
        return str(error)
    return None


def _parse_drafters(text: str, settings: ModelSettings, speculation: SpeculationSettings, draft_path,
                    draft_from_pair: bool = False) -> list[tuple[str, str | None, str | None]]:
    """(drafter, --draft value for the worker, reason it cannot run) for each requested drafter.

    draft_from_pair: the draft model is the pair's, not named with --draft, so `auto` runs as
    `generate --pair` does (no --draft: the loader may leave a draft that cannot pay unloaded)."""
    names = _split((text,))
    unknown = [name for name in names if name not in DRAFTERS]
    if unknown or not names:
        raise UserError(f"--drafters {text!r}: use a comma-separated list of {', '.join(DRAFTERS)}")
    drafters = []
    for name in dict.fromkeys(names):
        if name == "auto":
            # without a draft model auto drafts n-grams alone, as `generate` does
            drafters.append((name, str(draft_path) if draft_path and not draft_from_pair else None, None))
        elif name in SELF_DRAFTS:
            drafters.append((name, name, _self_draft_problem(name, settings, speculation)))
        else:
            drafters.append((name, name, None))
    return drafters


def _parse_budgets(text: str | None) -> list[tuple[str | None, int | None]]:
    if text is None:
        return [(None, None)]
    try:  # each is one run's budget: the bench compares systems at several
        return [(budget, parse_memory_budget(budget).total_bytes) for budget in _split((text,))]
    except ValueError as error:
        raise UserError(str(error)) from None


def _peer_system(peer: str, job: BenchJob, *, is_named: bool) -> System:
    """The peer as a system to run, or skipped with its reason; a peer the user named (not `auto` or `all`) that
    cannot run is a UserError before anything runs."""
    name, runner, spec_type = PEERS[peer]
    system = System(name, "peer", runner, name, spec_type=spec_type)
    needs_draft = runner == "transformers" or spec_type == "draft-simple"
    reason = None
    if needs_draft and job.draft_path is None:
        reason = "needs a draft model: pass --pair or --draft NAME"
    elif runner == "llama-speculative":
        reason = missing_binary(job.llama_tools_dir)
    elif runner == "transformers":
        reason = transformers_missing()
    if reason and is_named:
        raise UserError(f"--peers {peer} cannot run: {reason}")
    if reason:
        system.skip(reason)
    return system


def _command_line() -> str:
    args = sys.argv[1:]
    if args[:1] == ["bench"]:
        args = args[1:]
    return shlex.join(["pocketspec", "bench", *args])


@click.command(name="bench")
@model_choice_options
@click.option("--suite", type=DashPath(), default=DEFAULT_SUITE,
              help="JSONL prompts: rows with `turns` (list) or `prompt`; `category` and an id optional "
                   "[default: Spec-Bench].")
@click.option("--categories", "--category", "categories", multiple=True,
              help="Only these categories (comma-separated or repeated).")
@setting_option("--per-category", BenchSettings, "per_category", show_default=True, help="Prompts per category.")
@setting_option("--max-tokens", BenchSettings, "max_new_tokens", show_default=True, help="New tokens per prompt.")
@setting_option("--repeats", BenchSettings, "num_repeats", show_default=True,
                help="Run every round this many times (one pass over all of them after another), so each ratio "
                     "is reported with its spread over the repeats.")
@setting_option("--turns", BenchSettings, "max_turns",
                help="Turns of each conversation, each after plain decoding's earlier replies [default: all].")
@sampling_options
@click.option("--memory-budget", default=None,
              help="Memory budget for PocketSpec, or a comma-separated list (one run per budget: the frontier).")
@backend_options
@click.option("--drafters", default=None,
              help=f"PocketSpec drafters to run, comma-separated: {', '.join(DRAFTERS)} [default: {BENCH.drafters}].")
@click.option("--peers", "peers_text", default=BENCH.peers, show_default=True,
              help=f"Peers: auto (those on --backend's engine; --backend onnx has none), none, all, or a list of "
                   f"{', '.join(PEERS)}.")
@setting_option("--peer-draft-max", BenchSettings, "peer_draft_max",
                help="llama-speculative-simple's fixed draft length [default: llama.cpp's].")
@click.option("--llama-tools", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Folder with llama-speculative-simple [default: the one `make peers` builds].")
@functools.partial(threads_option, help_text="CPU threads for every system (0: all this process may use).")
@setting_option("--max-context", BenchSettings, "max_context", show_default=True, help="Context of every system, in tokens.")
@repack_option
@kv_type_option
@click.option("--exact-verify/--fast-verify", default=SPECULATION.exact_verify,
              help="PocketSpec's verify width: proven bit-exact, or free [default: as `pocketspec generate`].")
@click.option("--out", "--out-dir", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=DEFAULT_OUT,
              help="Folder for results.json, report.md and the plots [default: benchmarks/results/bench].")
@click.option("--force", is_flag=True, help="Replace the results an earlier run left in --out.")
def bench(target, draft, pair, suite, categories, per_category, max_tokens, repeats, turns, temperature, top_p, top_k, seed,
          memory_budget, drafters, peers_text, peer_draft_max, llama_tools, threads, max_context, repack,
          kv_type, exact_verify, out_dir, force, **backend_args):
    """Benchmark plain decoding, PocketSpec's drafters and the peers on a prompt suite."""
    if categories and not _split(categories):
        raise UserError("--categories is empty: name one or more of the suite's categories, or leave it out")
    prompts = with_later_turns(select_prompts(read_suite(suite), tuple(_split(categories)), per_category), turns)
    refuse_unread_backend_flags(backend_args)
    settings, speculation = apply_backend_options(MODEL, SPECULATION, backend_args)  # refuse what every worker would
    if memory_budget is None or "=" not in memory_budget:  # a budget naming devices is checked as a split
        check_devices(settings)
    backend = backend_args["backend"]
    choice = choose_models(target=target, draft=draft, pair=pair)
    if drafters is None:
        drafters = draft if draft in DRAFTERS[1:] else BENCH.drafters
    pair_name = resolve_pair(pair).name if draft is None and choice.draft_path is not None else None
    drafter_specs = _parse_drafters(drafters, settings, speculation, choice.draft_path,
                                    draft_from_pair=pair_name is not None)
    check_self_draft_flags(speculation, tuple(drafter for drafter, _, reason in drafter_specs if reason is None),
                           how_to_add="{drafter} to --drafters (--backend torch)")
    budgets = _parse_budgets(memory_budget)
    peers = parse_peers(peers_text, backend)
    num_threads = threads or default_num_threads()
    job = BenchJob(choice.target_path, choice.draft_path, prompts, max_tokens, temperature, top_k, top_p, seed,
                   num_threads, max_context, BENCH.num_warmup_tokens,
                   {"exact_verify": exact_verify, "repack": repack, "kv_type": kv_type, **backend_args},
                   llama_tools or default_tools_dir(), peer_draft_max, pair_name)
    systems = [System("plain", "plain", "pocketspec", "plain", draft="none")]
    for drafter, draft_value, reason in drafter_specs:
        for budget, budget_bytes in budgets:
            name = f"pocketspec-{drafter}" + (f"@{budget}" if budget else "")
            systems.append(System(name, "pocketspec", "pocketspec", f"pocketspec-{drafter}", draft_value, budget,
                                  budget_bytes))
            if reason:
                systems[-1].skip(reason)
    systems += [_peer_system(peer, job, is_named=peers_text not in ("auto", "all")) for peer in peers]
    _check_before_the_first_round(systems, job)
    for name in BENCH_FILES:  # even with --force: --force replaces results, never the suite
        refuse_output_onto_inputs(out_dir / name, [("--suite", suite)], flag="--out")
    made_folders = _prepare_out_dir(out_dir, force)
    progress = BenchProgress(plan_rounds(prompts, BENCH.max_prompts_per_round, repeats))
    click.echo(f"{len(prompts)} prompts × {sum(s.status == 'ok' for s in systems)} systems in "
               f"{len(progress.rounds)} rounds, {max_tokens} new tokens, target {choice.target_path.name}", err=True)
    for system in systems:
        if system.status != "ok":
            click.echo(f"{system.name}: skipped: {system.reason}", err=True)

    try:
        run_rounds(systems, job, progress)
        add_closing_notes(systems, job, progress.rows)
    except (KeyboardInterrupt, Terminated, UserError):  # Ctrl-C, SIGTERM, a failed plain run
        if progress.num_rounds_completed:
            _write_outputs(out_dir, systems, progress, job, suite)
        else:
            for folder in made_folders:  # the deepest first; one the user put something into meanwhile stays
                with contextlib.suppress(OSError):
                    folder.rmdir()
            click.echo(f"no round completed: --out {out_dir} is left as it was", err=True)
        raise
    _write_outputs(out_dir, systems, progress, job, suite)
    if not any(system.kind != "plain" and system.status == "ok" for system in systems):
        raise UserError("nothing was compared with plain decoding: every other system was skipped or failed "
                        f"(the reasons are in {out_dir / 'report.md'})")


def _check_before_the_first_round(systems: list[System], job: BenchJob) -> None:
    """Refuse, before plain decoding runs a round, what would leave nothing compared: the settings `generate`
    refuses (settings_for: its checks of the flags, as each PocketSpec worker makes them), or every other system
    skipped."""
    for system in systems:
        if system.runner == "pocketspec" and system.status == "ok":
            settings_for(pocketspec_settings(system, job))
    others = [system for system in systems if system.kind != "plain"]
    if not any(system.status == "ok" for system in others):
        raise UserError("nothing to compare with plain decoding: " +
                        "; ".join(f"{system.name}: {system.reason}" for system in others))


def _prepare_out_dir(out_dir: Path, force: bool) -> list[Path]:
    """--out made ready before the first round, so that an hour's run cannot fail at its end for want of a
    folder; an earlier run's results are kept unless --force. The folders it made, the deepest first."""
    existing = [name for name in BENCH_FILES if (out_dir / name).exists()]
    if existing and not force:
        raise UserError(f"--out {out_dir} already holds {', '.join(existing)}; choose another --out, or add --force "
                        "to replace them")
    missing = [folder for folder in (out_dir, *out_dir.parents) if not folder.exists()]
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"cannot make --out {out_dir}: {error.strerror or error}") from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise UserError(f"cannot write into --out {out_dir}: permission denied")
    return missing


def _write_outputs(out_dir: Path, systems: list[System], progress: BenchProgress, job: BenchJob,
                   suite: Path) -> None:
    from apps.bench.plots import write_plots
    from pocketspec.machine_report import collect_report
    from apps.report import machine_description

    results = {
        "machine": {**machine_description(), "doctor": collect_report()},
        "settings": {"command": _command_line(), "suite": str(suite), "suite_name": suite.name,
                     "target": job.target_path.name, "draft": job.draft_path.name if job.draft_path else None,
                     "backend": job.pocketspec_options["backend"],
                     "temperature": job.temperature, "top_k": job.top_k, "top_p": job.top_p, "seed": job.seed,
                     "max_tokens": job.max_tokens, "num_prompts": len(job.prompts), "num_threads": job.num_threads,
                     "max_context": job.max_context, "pocketspec_options": job.pocketspec_options,
                     "peer_draft_max": job.peer_draft_max, "max_prompts_per_round": BENCH.max_prompts_per_round,
                     "num_repeats": max([round_.repeat + 1 for round_ in progress.rounds], default=1)},
        "systems": [system.describe() for system in systems],
        "rounds": progress.describe(),
        "rows": progress.rows,
    }
    with stop_signals_held():  # a second Ctrl-C (or a SIGTERM) waits for the files: a set of them, all of one run
        with replaced_on_success(out_dir / "results.json", what="the bench's results") as file:
            file.write(json.dumps(results, indent=1))
        plots = [path.name for path in write_plots(results, out_dir)] if progress.rows else []
        for stale in set(PLOTS) - set(plots):  # an earlier run's plot (--force) would pass for this run's
            with contextlib.suppress(FileNotFoundError):
                (out_dir / stale).unlink()
        report = build_report(results, plots)
        with replaced_on_success(out_dir / "report.md", what="the bench's report") as file:
            file.write(report)
    click.echo(report)
    partial = (f" (partial: {progress.num_rounds_completed} of {len(progress.rounds)} rounds completed)"
               if progress.is_partial else "")
    click.echo(f"wrote {out_dir / 'results.json'}, {out_dir / 'report.md'} and {len(plots)} plots{partial}", err=True)


COMMANDS = [bench]
