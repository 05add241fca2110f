"""`pocketspec plan`: print the memory plan for a target/draft pair, budget and context, loading nothing."""

from __future__ import annotations

import json

import click

from apps.flags import (PLAN_BACKEND_OPTIONS, PLAN_BATCH_FLAGS, backend_options, is_given, kv_type_option,
                        model_choice_options, refuse_unread_backend_flags, repack_option, setting_option,
                        threads_option)
from apps.json_refusals import JsonRefusals
from memplanner import format_bytes
from memplanner.batch_step_costs import CONTEXT_GRID
from memplanner.memory_budget import is_split
from memplanner.torch_split import TorchSplitPlan
from pocketspec.budget.batch_preview import BatchPreview, preview_batch_plan
from pocketspec.budget.preview import preview_plan
from pocketspec.errors import BudgetError, UserError
from pocketspec.session_settings import SessionSettings, requested_devices
from pocketspec.settings import (ACCEPTANCE_PRIORS, SELF_DRAFTS, BatchSettings, GenerationSettings,
                                 ModelSettings, SamplingSettings, SpeculationSettings)


def _settings_line(plan_) -> str:
    s = plan_.settings
    parts = [f"drafter {s.drafter}"]
    if s.drafter != "none":
        parts.append(f"max gamma {s.max_gamma}")
    parts.append(f"target KV {s.target_kv_type} x {s.target_n_ctx} cells")
    if s.drafter == "model":
        parts.append(f"draft KV {s.draft_kv_type}, window {s.draft_kv_window} tokens ({s.draft_n_ctx} cells)")
    parts += [f"n_batch {s.n_batch}", f"n_ubatch {s.n_ubatch}", f"logits rows {s.logits_rows}",
              f"flash attention {s.flash_attn}"]
    if s.target_device == "cpu":
        parts.append(f"weights {'repacked' if s.repack_weights else 'not repacked'}")
    parts.append(f"device {s.target_device}")
    return ", ".join(parts)


def _print_terms(terms: dict[str, int]) -> int:
    """The memory terms as a table; returns its name column's width."""
    width = max(len(name) for name in terms) + 2
    click.echo(f"{'TERM'.ljust(width)}{'BYTES':>14}  SIZE")
    for name, size in terms.items():
        click.echo(f"{name.ljust(width)}{size:>14}  {format_bytes(size)}")
    return width


def _print_plan(plan_, title: str) -> None:
    click.echo(title)
    width = _print_terms(plan_.terms)
    click.echo(f"{'predicted peak'.ljust(width)}{plan_.predicted_peak_bytes:>14}  "
               f"{format_bytes(plan_.predicted_peak_bytes)}")
    click.echo(f"settings: {_settings_line(plan_)}")
    click.echo("degradations: " + ("none" if not plan_.degradations else ""))
    for step in plan_.degradations:
        click.echo(f"  - {step}")
    click.echo(f"predicted speed: {plan_.predicted_tokens_per_second:.1f} tok/s")
    # rounded up: either figure typed back as --memory-budget is enough
    runs = "with the draft model" if plan_.min_budget_loads_draft else "plain decoding"
    click.echo(f"minimum to run at all: {format_bytes(plan_.min_budget_any_bytes, round_up=True)} ({runs}, "
               f"{plan_.settings.target_kv_type} KV); "
               f"to keep 95% of the best speed: {format_bytes(plan_.min_budget_keep_bytes, round_up=True)}")
    if plan_.reason:
        click.echo(f"note: {plan_.reason}")


def _print_shares(plan_, title: str, *, is_row: bool = False) -> None:
    click.echo(title)
    for share in plan_.shares:
        layers = (f"target blocks {share.first_layer}-{share.first_layer + share.num_layers - 1}"
                  if share.num_layers else "no target blocks")
        if is_row:
            layers = f"a slice of all {share.num_layers} target blocks"
        click.echo(f"{share.device}: {layers}{', the draft model' if share.holds_draft else ''}; predicted peak "
                   f"{format_bytes(share.peak_bytes)} of {format_bytes(share.budget_bytes)}")
        for name, size in share.terms.items():
            click.echo(f"  {name.ljust(24)}{size:>14}  {format_bytes(size)}")


def _print_split(plan_, title: str) -> None:
    _print_shares(plan_, title)
    if plan_.host_terms:
        click.echo("host memory: " + ", ".join(f"{name} {format_bytes(size)}" for name, size in plan_.host_terms.items()))
    click.echo(f"settings: {_settings_line(plan_)}")
    click.echo("tensor split: " + ", ".join(f"{share:.3f}" for share in plan_.tensor_split))
    click.echo("degradations: " + ("none" if not plan_.degradations else ""))
    for step in plan_.degradations:
        click.echo(f"  - {step}")
    click.echo(f"predicted speed: {plan_.predicted_tokens_per_second:.1f} tok/s (a layer split runs the blocks "
               "one device after another, so batch-1 speed is the single-device speed)")


def _print_batch(preview: BatchPreview) -> None:
    click.echo(preview.title)
    _print_terms(preview.plan.planner_result.terms)
    for line in preview.plan.lines:
        click.echo(line)
    if not preview.predictions:
        click.echo("predicted speedup: none without a draft model or a self-draft (n-gram drafts are priced by "
                   "their matches as they come)")
        return
    source = ("this machine's measured batch costs" if preview.is_measured else
              "the roofline of the models' shapes (`pocketspec doctor --calibrate --backend torch --batch N` "
              "measures this machine)")
    rows = preview.plan.batch.max_batch
    click.echo(f"predicted over plain decoding at {rows} rows, acceptance {preview.alpha:.2f} (--alpha), "
               f"from {source}:")
    click.echo(f"{'CONTEXT':>9}{'PLAIN TOK/S':>13}{'DRAFTING TOK/S':>16}{'SPEEDUP':>9}{'GAMMA':>7}")
    for prediction in preview.predictions:
        click.echo(f"{prediction.context:>9}{prediction.plain_tokens_per_second:>13.1f}"
                   f"{prediction.speculative_tokens_per_second:>16.1f}{prediction.speedup:>8.2f}x"
                   f"{prediction.gamma:>7}")
    max_context = preview.predictions[-1].context
    if preview.crossover is None:
        click.echo(f"crossover: drafting does not pay within {max_context} cached tokens a row at {rows} rows")
    elif preview.crossover <= CONTEXT_GRID[0]:
        click.echo(f"crossover: drafting pays at every context tried (from {preview.crossover} cached tokens a row)")
    else:
        click.echo(f"crossover: drafting pays from {preview.crossover} cached tokens a row")


def _batch_json(preview: BatchPreview) -> dict:
    return {"title": preview.title, "terms": preview.plan.planner_result.terms,
            "predicted_peak_bytes": preview.plan.predicted_peak_bytes, "max_batch": preview.plan.batch.max_batch,
            "num_rows": preview.plan.batch.num_rows, "alpha": preview.alpha, "costs_measured": preview.is_measured,
            "crossover_context": preview.crossover,
            "predictions": [{"context": item.context, "plain_tokens_per_second": item.plain_tokens_per_second,
                             "speculative_tokens_per_second": item.speculative_tokens_per_second,
                             "speedup": item.speedup, "gamma": item.gamma} for item in preview.predictions]}


def _refuse_unused_by_a_torch_split() -> None:
    """A torch split's plan counts tensors and processes: the flags that price llama.cpp's speed are refused,
    not ignored."""
    for name, flag in (("max_tokens", "--max-tokens"), ("temperature", "--temperature"), ("alpha", "--alpha"),
                       ("repack", "--repack/--no-repack")):
        if is_given(name):
            raise UserError(f"{flag} does not change a torch split's plan (each device's tensors and processes); "
                            "leave it out")


def _plan_batch(settings: SessionSettings, max_batch: int, as_json: bool) -> None:
    preview = preview_batch_plan(settings, BatchSettings(max_batch=max_batch))
    if as_json:
        click.echo(json.dumps(_batch_json(preview), sort_keys=True))
    else:
        _print_batch(preview)


class PlanCommand(JsonRefusals):
    def refusal_json(self, error: Exception) -> dict:
        """--json's refusal; a budget refused as too small is also `"feasible": false`, as a torch split's plan
        that does not fit says."""
        return {**super().refusal_json(error), **({"feasible": False} if isinstance(error, BudgetError) else {})}


@click.command(name="plan", cls=PlanCommand)
@model_choice_options
@click.option("--memory-budget", default=None,
              help="Budget for everything, e.g. 512MiB, 3GiB, 3.5G (G = GiB) [default: memory available now]; "
                   "with --devices one per device (6GiB,4GiB), or cuda:0=6GiB,cuda:1=4GiB.")
@click.option("--devices", default=None,
              help="Split the target's layers over these devices, e.g. cuda:0,cuda:1 (they need not be here).")
@setting_option("--max-context", ModelSettings, "max_context", show_default=True, help="Prompt + generated tokens.")
@setting_option("--max-tokens", GenerationSettings, "max_new_tokens", show_default=True,
                help="Taken as generate takes it, so that its flags plan as they are; it changes no plan "
                     "(--max-context holds prompt and reply).")
@setting_option("--temperature", SamplingSettings, "temperature", show_default=True,
                help="Above 0, the plan holds the target's probabilities that sampled verification needs.")
@setting_option("--max-gamma", SpeculationSettings, "max_gamma", show_default=True,
                help=f"Longest draft of a draft model; n-gram drafts go to "
                     f"{SpeculationSettings().max_draftless_gamma}, or to this where it is larger.")
@kv_type_option
@setting_option("--alpha", SpeculationSettings, "expected_acceptance",
                help=f"Expected per-token acceptance of the draft model [default: {ACCEPTANCE_PRIORS['model']}].")
@repack_option
@setting_option("--batch", BatchSettings, "max_batch", default=None,
                help="Plan the torch batch pool of `generate --batch N` (with --backend torch): its rows, and the "
                     "speedup a draft (e.g. --draft self-sparse) is predicted to give by context.")
@backend_options(flags=PLAN_BATCH_FLAGS, replaced=PLAN_BACKEND_OPTIONS)
@threads_option
@click.option("--json", "as_json", is_flag=True,
              help='Print one JSON object; a refusal too: {"error": ...}, with "feasible": false for a budget too '
                   'small (exit code 2).')
def plan_command(target, draft, pair, memory_budget, devices, max_context, max_tokens, temperature, max_gamma,
                 kv_type, alpha, repack, batch, threads, as_json, **backend_args):
    """Show which settings fit a memory budget, every memory term, and the predicted speed."""
    refuse_unread_backend_flags(backend_args)
    options = {"max_gamma": max_gamma, "devices": devices, **backend_args}
    if alpha is not None:
        options["expected_acceptance"] = alpha
    settings = SessionSettings(
        target=target, draft=draft, pair=pair, sampling=SamplingSettings(temperature=temperature),
        memory_budget=memory_budget, max_context=max_context, kv_type=None if batch else kv_type,
        max_new_tokens=max_tokens, repack=repack, threads=threads, options=options)
    backend = backend_args["backend"]
    is_torch_split = backend == "torch" and is_split(requested_devices(settings), settings.budget) and batch is None
    if is_given("split_mode") and not is_torch_split:
        raise UserError("--split-mode applies to a torch target split over --devices (pocketspec plan --backend "
                        "torch --devices A,B); leave it out")
    if batch is not None:
        _plan_batch(settings, batch, as_json)
        return
    if backend != "llama.cpp" and not is_torch_split:
        torch_plans = " and --backend torch batches (--batch N) or splits (--devices)" if backend == "torch" else ""
        raise UserError(f"pocketspec plan plans llama.cpp sessions{torch_plans}; `generate --backend {backend} "
                        "--memory-budget ...` prints one sequence's plan before it runs")
    if is_torch_split:
        _refuse_unused_by_a_torch_split()
    if draft in SELF_DRAFTS and not is_torch_split:  # planned as n-grams otherwise: llama.cpp cannot run it
        raise UserError(f"--draft {draft} drafts with the target's own weights and needs --backend torch; pocketspec "
                        "plan plans it for --backend torch batches (--batch N)")
    preview = preview_plan(settings)
    if as_json:
        click.echo(json.dumps(preview.result.to_dict(), sort_keys=True))
        return
    if isinstance(preview.result, TorchSplitPlan):
        _print_shares(preview.result, preview.title, is_row=backend_args["split_mode"] == "row")
        return
    if preview.is_split:  # devices that need not be here: priced by the reference tables
        _print_split(preview.result, preview.title)
    else:
        for note in preview.notes:
            click.echo(note)
        _print_plan(preview.result, preview.title)
    click.echo("speed predicted from: " + ("this machine's measured forward costs (POCKETSPEC_HOME/costs)"
                                           if preview.uses_measured_costs else
                                           "reference tables (`pocketspec doctor --calibrate` measures this "
                                           "machine)"))


COMMANDS = [plan_command]
