"""Replay the speculative loop against recorded target outputs, on this machine's cost table.

    .venv/bin/python benchmarks/replay_drafting.py benchmarks/results/traces/code_edit.jsonl \
        [--gamma auto|N] [--max-gamma 31] [--verdict-on-device] [--out benchmarks/results/replay_code_edit]

At temperature 0 a speculative run emits exactly what plain decoding emitted
(benchmarks/record_traces.py keeps that). So the real engine (pocketspec/speculation/engine.py: its
drafter, controller and verification) runs here on a stand-in target (replay_target.py) whose
logits pick the recorded next token, and whose forwards take the calibrated cost of their width at
their depth on a virtual clock instead of running the model. The speedup it reports is the
controller's decode time against plain decoding's (one-token forwards) on the same costs:
what the mechanism gains, free of the machine's noise, on hundreds of prompts in seconds.
Beside it, the oracle: a controller that knew how much of each proposal will be accepted,
the bound on any choice of γ with these proposals and costs. And the tree oracle: the same
bound for a token tree of up to --tree-branches branches, one per continuation the suffix
match has seen, verified together (their rows all paid for): whether trees could pay here. And
the copy bound, for any drafter that copies from what it has read (n-gram, suffix, prompt lookup):
it knows the recorded output and drafts all of it up to the first token that never followed the
token before it in the prompt, the output so far or an earlier output, with the widths of all
its steps chosen together. No such drafter proposes that token, so none can beat this bound on
these costs (the bounds: benchmarks/replay_bounds.py).
The real bench (`pocketspec bench`) remains the measurement; this is for designing.

Equality with plain decoding: with --exact-width N (and --exact-until DEPTH) the recorded
target's batches round like its one-token forwards only up to N rows (and, past DEPTH cached
tokens, not at all: llama.cpp's CPU attention over an f16 cache, 256). One batch past that
changes every later logit (the cache rows it wrote differ), so the replay counts the answers
whose every forward stayed exact: those certainly equal plain decoding; the others equal it
only where no near-tie fell after their first inexact batch. --exact-verify caps the engine's
verifies at that width, as `pocketspec generate --exact-verify` does.

Prompts run in file order on one engine, so the drafter's cross-request corpus fills and the
controller learns over them all, as in a chat or a server. With --fresh-rounds they run as
`pocketspec bench` runs them: in its rounds (a category's conversations, five at a time), each on
a fresh engine, as the bench starts a process a round, which starts from the cost table's
corrections the round before learned (pocketspec/learned_costs.py).

Results: per category, speedup, tokens per step, acceptance, the verify widths used, and the share of decode time spent on rows past the match: what each verify cost beyond the cheapest
verify that still holds its pending token and the drafts the target accepted (drafts that failed
at their first token included), time a controller that knew where each proposal breaks would not
have spent.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apps.report import markdown_table, write_results  # noqa: E402
from memplanner.measured_costs import MeasuredCosts, load_measured_costs  # noqa: E402
from pocketspec.speculation.draft_limits import requested_draft_limits  # noqa: E402
from pocketspec.drafters.ngram import NgramDrafter  # noqa: E402
from pocketspec.speculation.engine import SpeculativeEngine  # noqa: E402
from pocketspec.settings import BenchSettings, SpeculationSettings  # noqa: E402
from clock_noise import ClockNoise, ProcessTime  # noqa: E402
from replay_bounds import copy_bound_seconds, oracle_seconds  # noqa: E402
from replay_target import ReplayTarget, VirtualClock  # noqa: E402


def plain_seconds(costs: MeasuredCosts, num_prompt_tokens: int, num_tokens: int,
                  process_time: ProcessTime | None = None) -> float:
    """Decode time of plain decoding: one one-token forward per token after the first (through the process's
    wandering speed, when the replay has one)."""
    table_seconds = [costs.forward_seconds(1, num_prompt_tokens + index) for index in range(num_tokens - 1)]
    return sum(table_seconds) if process_time is None else process_time.plain_decoding(table_seconds)


def open_replay(costs: MeasuredCosts, speculation: SpeculationSettings, vocab_size: int,
                exact_width: int | None = None, exact_until: int | None = None,
                calibrated: MeasuredCosts | None = None,
                target_class: type[ReplayTarget] = ReplayTarget,
                verdict_on_device: bool = False) -> tuple[SpeculativeEngine, ReplayTarget]:
    """The real engine on a stand-in target whose forwards take `costs` on a virtual clock; the
    engine's controller is given `calibrated` as its table (default: the same costs), so a table
    that is off can be replayed against the machine it was measured on. verdict_on_device: the
    stand-in verifies as a torch static step does, with no logits on the host (replay_target.py)."""
    clock = VirtualClock()
    target = target_class(costs, clock, vocab_size, max_logits_rows=requested_draft_limits(speculation).verify_width,
                          exact_width=exact_width, exact_until=exact_until, verdict_on_device=verdict_on_device)
    engine = SpeculativeEngine(target, speculation=speculation, target_costs=calibrated or costs, clock=clock)
    return engine, target


def time_request_work(drafter: NgramDrafter) -> dict[str, float]:
    """Times the drafter's work once a request, apart from the loop's steps: indexing the prompt with the
    prefill (begin) and remembering the output for later requests; {"seconds": the total so far}."""
    spent = {"seconds": 0.0}
    for name in ("begin", "remember"):
        def timed(*args, _method=getattr(drafter, name)):
            started = time.perf_counter()
            try:
                return _method(*args)
            finally:
                spent["seconds"] += time.perf_counter() - started
        setattr(drafter, name, timed)
    return spent


def replay_trace(engine: SpeculativeEngine, target: ReplayTarget, trace: dict):
    """Generates one recorded output again (the engine's corpus and learned costs carry on)."""
    prompt, output = trace["prompt_tokens"], trace["output_tokens"]
    target.follow(prompt + output)
    target.widths.clear()
    target.past_match_seconds = 0.0
    target.stayed_exact = True
    target.stand_in_wall_seconds = 0.0
    engine.reset()
    result = engine.generate(prompt, len(output))
    if result.tokens != output:
        raise AssertionError(f"{trace['prompt_id']}: the replay left the recorded output")
    return result


def bench_rounds(traces: list[dict]) -> list[list[dict]]:
    """The traces as `pocketspec bench` groups its prompts into rounds (apps/bench/rounds.py): by
    category in order of first appearance, a conversation's turns together, at most
    BenchSettings.max_prompts_per_round conversations a round."""
    per_round = BenchSettings.max_prompts_per_round
    by_category: dict[str, dict[str, list[dict]]] = {}
    for trace in traces:
        by_category.setdefault(trace["category"], {}).setdefault(trace["prompt_id"], []).append(trace)
    rounds = []
    for conversations in by_category.values():
        group = list(conversations.values())
        rounds += [[turn for conversation in group[start:start + per_round] for turn in conversation]
                   for start in range(0, len(group), per_round)]
    return rounds


def replay(traces: list[dict], costs: MeasuredCosts, speculation: SpeculationSettings, vocab_size: int,
           max_branches: int = 1, exact_width: int | None = None, exact_until: int | None = None,
           calibrated: MeasuredCosts | None = None, fresh_rounds: bool = False,
           verdict_on_device: bool = False, clock_noise: ClockNoise | None = None) -> list[dict]:
    """fresh_rounds: the traces in `pocketspec bench`'s rounds, each round on a new engine (priors, no
    corpus) that starts from the cost corrections the round before learned, as the bench starts a process a
    round and each adopts what the last one kept in POCKETSPEC_HOME; else in their order, one engine
    learning over them all. verdict_on_device: as open_replay's. clock_noise: each round is a process
    whose speed wanders (clock_noise.py), for the engine and for plain decoding alike."""
    widest = requested_draft_limits(speculation).widest
    rows = []
    rounds = bench_rounds(traces) if fresh_rounds else [traces]
    engine, process_time, num_processes = None, None, 0
    for trace, starts_round in ((trace, index == 0) for chunk in rounds for index, trace in enumerate(chunk)):
        if starts_round:
            learned = None if engine is None else engine.controller.target_costs.learned()
            engine, target = open_replay(costs, speculation, vocab_size, exact_width, exact_until, calibrated,
                                         verdict_on_device=verdict_on_device)
            if clock_noise is not None:
                process_time = target.process_time = clock_noise.process(num_processes)
                target.process_started = target.clock.now
            num_processes += 1
            if learned is not None:  # as the bench's next process adopts it (pocketspec/learned_costs.py)
                engine.controller.target_costs.adopt(learned)
            request_work = time_request_work(engine.ngram)
            chain_drafter = NgramDrafter(speculation.ngram_min, speculation.ngram_max)
            tree_drafter = NgramDrafter(speculation.ngram_min, speculation.ngram_max)
            earlier_pairs: set[tuple[int, int]] = set()
        prompt, output = trace["prompt_tokens"], trace["output_tokens"]
        if len(output) < 2:
            continue
        started, request_work["seconds"] = time.perf_counter(), 0.0
        stats = replay_trace(engine, target, trace).stats
        host_seconds = time.perf_counter() - started - target.stand_in_wall_seconds - request_work["seconds"]
        rows.append({"prompt_id": trace["prompt_id"], "category": trace["category"], "turn": trace.get("turn", 1),
                     "num_tokens": len(output), "decode_seconds": stats.decode_seconds,
                     "plain_seconds": plain_seconds(costs, len(prompt), len(output), process_time),
                     "oracle_seconds": oracle_seconds(chain_drafter, costs, prompt, output, widest),
                     "tree_oracle_seconds": oracle_seconds(tree_drafter, costs, prompt, output, widest, max_branches),
                     "copy_bound_seconds": copy_bound_seconds(costs, prompt, output, widest, earlier_pairs),
                     "num_steps": stats.num_steps, "num_drafted": stats.num_drafted,
                     "num_accepted": stats.num_accepted, "widths": dict(target.widths),
                     "past_match_seconds": target.past_match_seconds, "stayed_exact": target.stayed_exact,
                     "host_seconds": host_seconds, "request_host_seconds": request_work["seconds"]})
    return rows


def summarize(rows: list[dict]) -> dict:
    spec = sum(row["decode_seconds"] for row in rows)
    plain = sum(row["plain_seconds"] for row in rows)
    drafted = sum(row["num_drafted"] for row in rows)
    widths: Counter = Counter()
    for row in rows:
        widths.update(row["widths"])
    oracle = sum(row["oracle_seconds"] for row in rows)
    tree_oracle = sum(row["tree_oracle_seconds"] for row in rows)
    copy_bound = sum(row["copy_bound_seconds"] for row in rows)
    num_steps = max(sum(row["num_steps"] for row in rows), 1)
    return {"num_prompts": len(rows), "speedup": plain / spec if spec else 0.0,
            "oracle_speedup": plain / oracle if oracle else 0.0,
            "tree_oracle_speedup": plain / tree_oracle if tree_oracle else 0.0,
            "copy_bound_speedup": plain / copy_bound if copy_bound else 0.0,
            "tokens_per_step": sum(row["num_tokens"] for row in rows) / num_steps,
            "acceptance": sum(row["num_accepted"] for row in rows) / drafted if drafted else None,
            "past_match_share": sum(row["past_match_seconds"] for row in rows) / spec if spec else 0.0,
            "stayed_exact_share": sum(row["stayed_exact"] for row in rows) / len(rows) if rows else 0.0,
            "host_ms_per_step": 1e3 * sum(row["host_seconds"] for row in rows) / num_steps,
            "request_host_ms": 1e3 * sum(row["request_host_seconds"] for row in rows) / len(rows) if rows else 0.0,
            "step_ms": 1e3 * spec / num_steps,  # on the table's costs
            "common_widths": [width for width, _ in widths.most_common(4)]}


def by_category(rows: list[dict]) -> dict[str, dict]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        key = row["category"] if row["turn"] == 1 else f"{row['category']} (turn {row['turn']})"
        groups[key].append(row)
    return {**{key: summarize(group) for key, group in groups.items()}, "all": summarize(rows)}


COLUMNS = ["category", "prompts", "× plain", "oracle × plain", "tree oracle × plain", "copy bound × plain",
           "tokens/step", "acceptance", "past the match", "common widths", "answers that stayed exact", "host ms/step",
           "host ms/request"]


def table_rows(summary: dict[str, dict]) -> list[list]:
    return [[category, item["num_prompts"], f"{item['speedup']:.2f}×", f"{item['oracle_speedup']:.2f}×",
             f"{item['tree_oracle_speedup']:.2f}×", f"{item['copy_bound_speedup']:.2f}×", f"{item['tokens_per_step']:.2f}",
             "–" if item["acceptance"] is None else f"{item['acceptance']:.2f}", f"{item['past_match_share']:.1%}",
             ", ".join(map(str, item["common_widths"])), f"{item['stayed_exact_share']:.0%}",
             f"{item['host_ms_per_step']:.3f}", f"{item['request_host_ms']:.2f}"]
            for category, item in summary.items()]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", type=Path, nargs="+")
    parser.add_argument("--costs", type=Path, required=True, help="a cost table (POCKETSPEC_HOME/costs/*.json)")
    parser.add_argument("--calibrated-costs", type=Path, default=None,
                        help="the table the controller is given, when it is not --costs (one measured on a busy machine)")
    parser.add_argument("--gamma", default="auto", help="auto (the controller) or a fixed draft length")
    parser.add_argument("--max-gamma", type=int, default=None, help="the draftless γ ceiling (default: the runtime's)")
    parser.add_argument("--tree-branches", type=int, default=3, help="most branches of the tree oracle's trees")
    parser.add_argument("--exact-width", type=int, default=None,
                        help="widest batch that rounds like one-token forwards (default: every width)")
    parser.add_argument("--exact-until", type=int, default=None,
                        help="cached tokens past which only one-token forwards round alike (f16 cache on CPU: 256)")
    parser.add_argument("--exact-verify", action="store_true", help="cap verifies at the exact width")
    parser.add_argument("--ngram-min", type=int, default=None, help="the shortest suffix the n-gram drafter matches")
    parser.add_argument("--ngram-max", type=int, default=None, help="the longest suffix the n-gram drafter indexes")
    parser.add_argument("--fresh-rounds", action="store_true",
                        help="replay in the bench's rounds, each from a fresh engine (priors, no corpus, the cost "
                             "corrections the round before learned), as the bench does")
    parser.add_argument("--verdict-on-device", action="store_true",
                        help="the stand-in verifies as a torch static step (a GPU's) does, with no logits on the host: "
                             "for the host ms/step of a GPU table (default: logits rows on the host, as llama.cpp)")
    parser.add_argument("--clock-noise", default=None, metavar="PROCESS,PASS,SPELL",
                        help="a machine whose speed wanders (benchmarks/clock_noise.py): standard deviations of the log "
                             "speed of each process (a --fresh-rounds round, else the whole replay), of its slow "
                             "spells' steps and of each pass, e.g. 0.08,0.03,0.03")
    parser.add_argument("--noise-seed", type=int, default=0, help="the --clock-noise draw")
    parser.add_argument("--vocab-size", type=int, default=151936)
    parser.add_argument("--out", type=Path, default=None, help="write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    costs = load_measured_costs(args.costs)
    if costs is None:
        parser.error(f"--costs {args.costs}: not a cost table")
    calibrated = None if args.calibrated_costs is None else load_measured_costs(args.calibrated_costs)
    if args.calibrated_costs is not None and calibrated is None:
        parser.error(f"--calibrated-costs {args.calibrated_costs}: not a cost table")
    try:
        clock_noise = None if args.clock_noise is None else ClockNoise.parse(args.clock_noise, args.noise_seed)
    except ValueError as error:
        parser.error(f"--clock-noise: {error}")
    traces = [json.loads(line) for path in args.traces for line in path.read_text().splitlines() if line.strip()]
    speculation = SpeculationSettings(drafter="ngram", gamma=None if args.gamma == "auto" else int(args.gamma),
                                      exact_verify=args.exact_verify)
    if args.max_gamma is not None:
        speculation = replace(speculation, max_draftless_gamma=args.max_gamma)
    if args.ngram_min is not None:
        speculation = replace(speculation, ngram_min=args.ngram_min)
    if args.ngram_max is not None:
        speculation = replace(speculation, ngram_max=args.ngram_max)
    if not 1 <= speculation.ngram_min <= speculation.ngram_max:
        parser.error(f"need 1 <= --ngram-min <= --ngram-max, got {speculation.ngram_min} and {speculation.ngram_max}")
    rows = replay(traces, costs, speculation, args.vocab_size, args.tree_branches, args.exact_width, args.exact_until,
                  calibrated, args.fresh_rounds, args.verdict_on_device, clock_noise)
    summary = by_category(rows)
    title = f"Replay of {', '.join(path.name for path in args.traces)} (γ {args.gamma})"
    print(markdown_table(COLUMNS, table_rows(summary)))
    if args.out is not None:
        notes = [f"cost table: {args.costs}", "speedups are predicted from the table, not timed"
                 + ("" if clock_noise is None else
                    f", on a clock whose speed wanders (clock_noise.py): sigmas {clock_noise.process_sigma} a process, "
                    f"{clock_noise.spell_sigma} a spell's step, {clock_noise.pass_sigma} a pass; seed {clock_noise.seed} "
                    "(the oracles and the copy bound stay on the quiet table, so compare them only without it)"),
                 *([f"the controller's table: {args.calibrated_costs}"] if calibrated is not None else []),
                 f"tree oracle: up to {args.tree_branches} branches, every verified row paid for",
                 "copy bound: the recorded output drafted up to its first pair of tokens not seen before",
                 "host ms/step: the engine's own work a step on this machine's wall clock (drafting, the controller, "
                 "bookkeeping), without the stand-in's own time; "
                 + ("its verdicts as a torch static step reaches them, on the device: no logits on the host"
                    if args.verdict_on_device else "its verdicts from logits rows on the host, as llama.cpp's "
                    "(20 MB a step of 33 rows, which also take the host's caches)"),
                 "host ms/request: the drafter's work once a request on the same clock, apart from the steps: "
                 "indexing the prompt with the prefill and remembering the output for later requests"]
        if args.exact_width is not None:
            notes.append(f"batches round like one-token forwards up to {args.exact_width} rows"
                         + (f" and {args.exact_until} cached tokens" if args.exact_until is not None else "")
                         + ("; verifies capped there (--exact-verify)" if args.exact_verify else ""))
        write_results(args.out.parent, args.out.name, {"summary": summary, "rows": rows}, title, COLUMNS,
                      table_rows(summary), notes)

if __name__ == "__main__":
    main()
