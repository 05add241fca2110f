"""The recorded suites replayed on every CPU's recorded cost table, as measured and as a busy calibration would
have left it: what a change to the controller gains or costs on each machine, free of the machine's noise.

    .venv/bin/python benchmarks/replay_tables.py [--tables benchmarks/results/traces/costs_*.json] \
        [--inflate-from 5] [--inflate-by 1.5] [--out benchmarks/results/replay_tables]

For each table (benchmarks/results/traces/costs_qwen2.5-coder-1.5b_2threads*.json: the EPYC of 2026-11-26, the
Xeon with its bf16 variants, the Zen 3, 4 and 5 EPYCs) and each suite (the recorded code edits; Spec-Bench's two halves together), the
n-gram engine's speedup over plain decoding on that table (benchmarks/replay_drafting.py), in one engine over the
whole suite and in the bench's fresh rounds, with two calibrations: the table itself, and the table made
--inflate-by too dear from --inflate-from rows on (issue 38's busy calibration). Beside them, the learned cost of
16 rows at 512 cached tokens after 200 steps of the code edits, over the table's own: issue 38 asks for 1.00 within
15 % from an inflated table. Results: OUT.json and OUT.md. It takes about 2 minutes on one core (8 tables).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from apps.report import write_results  # noqa: E402
from memplanner.measured_costs import MeasuredCosts, load_measured_costs  # noqa: E402
from pocketspec.settings import SpeculationSettings  # noqa: E402
from replay_drafting import open_replay, replay, replay_trace, summarize  # noqa: E402

TRACES = ROOT / "benchmarks" / "results" / "traces"
SUITES = {"code edits": ("code_edit_qwen.jsonl",), "Spec-Bench": ("spec_bench_a_qwen.jsonl", "spec_bench_b_qwen.jsonl")}
HEAL_STEPS, HEAL_WIDTH, HEAL_DEPTH = 200, 16, 512
VOCAB_SIZE = 151936  # the qwen2.5-coder pair's, whose outputs the traces recorded


def inflated_from(costs: MeasuredCosts, first_width: int, factor: float) -> MeasuredCosts:
    """The table a calibration on a busy machine gave: every width from first_width on `factor` too dear."""
    return MeasuredCosts("inflated", {depth: {width: seconds * (factor if width >= first_width else 1.0)
                                              for width, seconds in row.items()}
                                      for depth, row in costs.seconds.items()})


def recorded(*names: str) -> list[dict]:
    return [json.loads(line) for name in names for line in (TRACES / name).read_text().splitlines() if line.strip()]


def healed_ratio(truth: MeasuredCosts, calibrated: MeasuredCosts, traces: list[dict]) -> float:
    """The controller's cost of HEAL_WIDTH rows once HEAL_STEPS steps of `traces` ran, over the truth's."""
    engine, target = open_replay(truth, SpeculationSettings(drafter="ngram"), vocab_size=VOCAB_SIZE,
                                 calibrated=calibrated)
    num_steps = 0
    for trace in traces:
        num_steps += replay_trace(engine, target, trace).stats.num_steps
        if num_steps >= HEAL_STEPS:
            break
    learned = engine.controller.target_costs.seconds(HEAL_WIDTH, HEAL_DEPTH)
    return learned / truth.forward_seconds(HEAL_WIDTH, HEAL_DEPTH)


def speedup(truth: MeasuredCosts, calibrated: MeasuredCosts, traces: list[dict], fresh_rounds: bool) -> float:
    return summarize(replay(traces, truth, SpeculationSettings(drafter="ngram"), VOCAB_SIZE, calibrated=calibrated,
                            fresh_rounds=fresh_rounds))["speedup"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=Path, nargs="+",
                        default=sorted(TRACES.glob("costs_qwen2.5-coder-1.5b_2threads*.json")))
    parser.add_argument("--inflate-from", type=int, default=5)
    parser.add_argument("--inflate-by", type=float, default=1.5)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "replay_tables")
    args = parser.parse_args(argv)
    suites = {name: recorded(*files) for name, files in SUITES.items()}
    results, rows = [], []
    for path in args.tables:
        truth = load_measured_costs(path)
        if truth is None:
            parser.error(f"{path}: not a cost table")
        busy = inflated_from(truth, args.inflate_from, args.inflate_by)
        for suite, traces in suites.items():
            for calibration, calibrated in (("as measured", truth), ("inflated", busy)):
                one, fresh = (speedup(truth, calibrated, traces, fresh_rounds) for fresh_rounds in (False, True))
                healed = healed_ratio(truth, calibrated, suites["code edits"]) if suite == "code edits" else None
                results.append({"table": path.name, "suite": suite, "calibration": calibration,
                                "speedup_one_engine": one, "speedup_fresh_rounds": fresh,
                                "learned_over_true_16_rows_after_200_steps": healed})
                rows.append([path.name.removeprefix("costs_qwen2.5-coder-1.5b_2threads").removesuffix(".json") or
                             "(EPYC, 2026-11-26)", suite, calibration, f"{one:.3f}×", f"{fresh:.3f}×",
                             "–" if healed is None else f"{healed:.3f}"])
                print(*rows[-1], flush=True)
    notes = [f"inflated: every width from {args.inflate_from} rows on {args.inflate_by}x the table's cost, as the "
             "controller's calibration; the replay's forwards still cost the table's own",
             f"learned / true: the controller's cost of {HEAL_WIDTH} rows at {HEAL_DEPTH} cached tokens after "
             f"{HEAL_STEPS} steps of the code edits, over the table's",
             "Re-run: .venv/bin/python benchmarks/replay_tables.py"]
    json_path, _ = write_results(args.out.parent, args.out.name,
                                 {"inflate_from": args.inflate_from, "inflate_by": args.inflate_by, "results": results},
                                 "Replays on every recorded CPU table, as measured and inflated",
                                 ["table", "suite", "calibration", "× plain, one engine", "× plain, fresh rounds",
                                  "learned / true, 16 rows"], rows, notes)
    print(f"wrote {json_path}")


if __name__ == "__main__":
    main()
