"""Replay PocketSpec's drafting on the text each system of a `pocketspec bench` run wrote: is a
system ahead by its drafter, or by its text?

    .venv/bin/python benchmarks/replay_bench_texts.py benchmarks/results/bench_spec_bench_peers_epyc \
        --costs ~/.cache/pocketspec/costs/TABLE.json [--out benchmarks/results/replay_texts_spec_bench]

At temperature 0 every system decodes the target greedily, but not every system writes the same
text: llama.cpp's own tools verify with batched kernels that round unlike PocketSpec's one-token
ones, so at a near-tie their answer parts from plain decoding's and goes on as another text
(results.json's "matches plain"). A text that repeats its prompt more is faster for any drafter
that copies. For each system and category, this replays the real engine's n-gram drafting
(benchmarks/replay_drafting.py: the controller, on the cost table, in the bench's rounds) on that
system's own answers, and sets the system's measured speedup over plain decoding beside it. A
system measured above PocketSpec's replay of its own text drafted better than PocketSpec there;
one measured below it owes its lead over PocketSpec's measured run to its text.

Texts are tokenized again with the target's tokenizer (results.json keeps text, not tokens) and
cut at the bench's --max-tokens; each answer's prompt is plain decoding's. A system whose rows hold
no text (transformers' assisted generation, llama-bench) is left out. A bench run before
2026-11-28 kept no texts: run it again.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from apps.bench.figures import OVERALL, speedups  # noqa: E402
from apps.report import markdown_table, write_results  # noqa: E402
from memplanner.measured_costs import load_measured_costs  # noqa: E402
from pocketspec.settings import SpeculationSettings  # noqa: E402
from replay_drafting import by_category, replay  # noqa: E402

TURN = re.compile(r"^(?P<category>.*) \(turn (?P<turn>\d+)\)$")


def category_and_turn(report_category: str) -> tuple[str, int]:
    """'writing (turn 2)' -> ('writing', 2); 'writing' -> ('writing', 1)."""
    found = TURN.match(report_category)
    return (found["category"], int(found["turn"])) if found else (report_category, 1)


def system_traces(results: dict, encode) -> dict[str, list[dict]]:
    """Each system's answers as replay traces, in the bench's order: plain's prompt, the system's
    text (its first repeat), tokenized by encode(text, special) and cut at the bench's max tokens."""
    max_tokens = results["settings"]["max_tokens"]
    first = [row for row in results["rows"] if row.get("repeat", 0) == 0]
    prompts = {row["prompt_id"]: row["prompt_text"] for row in first if row["system"] == "plain" and "prompt_text" in row}
    traces: dict[str, list[dict]] = defaultdict(list)
    for row in first:
        if row.get("text") is None or row["prompt_id"] not in prompts:
            continue
        category, turn = category_and_turn(row["category"])
        traces[row["system"]].append({
            "prompt_id": row["prompt_id"].split("/")[0], "category": category, "turn": turn,
            "prompt_tokens": encode(prompts[row["prompt_id"]], True),
            "output_tokens": encode(row["text"], False)[:max_tokens]})
    return traces


def compare(results: dict, encode, costs, vocab_size: int) -> dict:
    """{system: {category: {"measured": x, "replayed": y, "num_prompts": n}}}; measured: the bench report's
    speedup over plain decoding (plain's own: 1)."""
    measured = speedups(results)

    def measured_speedup(system: str, category: str) -> float | None:
        return 1.0 if system == "plain" else measured.get(OVERALL if category == "all" else category, {}).get(system)

    comparison: dict[str, dict] = {}
    for system, traces in system_traces(results, encode).items():
        rows = replay(traces, costs, SpeculationSettings(drafter="ngram"), vocab_size, fresh_rounds=True)
        replayed = by_category(rows)
        comparison[system] = {category: {"measured": measured_speedup(system, category),
                                         "replayed": item["speedup"], "num_prompts": item["num_prompts"]}
                              for category, item in replayed.items()}
    return comparison


def table(comparison: dict) -> tuple[list[str], list[list]]:
    systems = list(comparison)
    categories = list(dict.fromkeys(category for items in comparison.values() for category in items))
    columns = ["category", *(f"{system}: measured / replayed" for system in systems)]

    def cell(item: dict | None) -> str:
        if item is None:
            return "–"
        measured = "–" if item["measured"] is None else f"{item['measured']:.2f}×"
        return f"{measured} / {item['replayed']:.2f}×"

    return columns, [[category, *(cell(comparison[system].get(category)) for system in systems)]
                     for category in categories]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_dir", type=Path, help="a `pocketspec bench --out` folder (results.json)")
    parser.add_argument("--costs", type=Path, required=True, help="a cost table (POCKETSPEC_HOME/costs/*.json)")
    parser.add_argument("--target", type=Path, default=None,
                        help="the target's GGUF, for its tokenizer (default: the bench's target in POCKETSPEC_HOME/models)")
    parser.add_argument("--out", type=Path, default=None, help="write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    results_path = args.bench_dir / "results.json"
    if not results_path.is_file():
        parser.error(f"{results_path} does not exist: give a `pocketspec bench --out` folder")
    try:
        results = json.loads(results_path.read_text())
        rows = results["rows"]
    except (ValueError, KeyError, TypeError) as error:
        parser.error(f"{results_path} is not a bench's results.json ({error})")
    if not any("prompt_text" in row for row in rows):
        parser.error(f"{results_path} keeps no texts (a bench run before 2026-11-28): run the bench again")
    costs = load_measured_costs(args.costs)
    if costs is None:
        parser.error(f"--costs {args.costs}: not a cost table")

    from pocketspec.backends.gguf_tokenizer import load_tokenizer
    from pocketspec.models.catalog import models_dir

    target = args.target or models_dir() / results["settings"]["target"]
    if not target.is_file():
        parser.error(f"{target} does not exist: pass the bench's target with --target")
    vocab_model, tokenizer = load_tokenizer(target)
    try:
        comparison = compare(results, lambda text, special: tokenizer.encode(text, add_bos=False, parse_special=special),
                             costs, vocab_model.n_vocab())
    finally:
        vocab_model.close()
    columns, rows = table(comparison)
    print(markdown_table(columns, rows))
    if args.out is not None:
        title = f"PocketSpec's drafting replayed on each system's text: {results['settings']['command']}"
        notes = [f"cost table: {args.costs}", "measured: the system's decode tok/s over plain decoding's in the bench",
                 "replayed: PocketSpec's n-gram drafting on that system's own answers, predicted on the cost "
                 "table over plain decoding of the same answers, in the bench's rounds"]
        write_results(args.out.parent, args.out.name, {"bench": str(args.bench_dir), "comparison": comparison},
                      title, columns, rows, notes)


if __name__ == "__main__":
    main()
