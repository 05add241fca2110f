"""Count the instructions of the speculative loop's host work: a measure of it that a noisy machine cannot move.

    .venv/bin/python benchmarks/host_instructions.py benchmarks/results/traces/code_edit_qwen.jsonl \
        --costs benchmarks/results/gpu_suite_costs_qwen2.5-1.5b_bf16.json [--out benchmarks/results/host_instructions]

Timing the loop's host work (benchmarks/replay_drafting.py: host ms/step) on a shared machine moves
by ±20 % from one run to the next, more than most changes to that work. Counted instructions move by
about 3 %. So each trace file is replayed (the real engine on recorded outputs, as replay_drafting.py
does) under valgrind's cachegrind, three times in fresh processes:

1. up to the replay, without it: the interpreter, the imports and the traces, subtracted from the others;
2. the replay;
3. the replay with the drafter's work once a request (indexing the prompt, remembering the output)
   done twice, the second time on a drafter and corpus of their own: the difference is that work.

The stand-in target here hands the engine the recorded tokens themselves rather than vocabulary-wide
logits, and keeps no reports, so what is counted is the engine's own work: its loop per step and its
work once a request. Instructions are not time (a dict lookup's cache misses count as one), but
between two versions of the code on the same traces they compare the work done. Needs valgrind
(`apt-get install valgrind`); the replay is greedy, so the decisions are the recorded run's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from apps.report import markdown_table, write_results  # noqa: E402

COLUMNS = ["traces", "answers", "steps", "loop M instructions/step", "once a request M instructions/answer",
           "all M instructions/step"]
PHASES = ("setup", "replay", "request twice")


def replay_once(traces_path: Path, costs_path: Path, phase: str) -> int:
    """The child's work: replay every trace on one engine (or stop before, for "setup"); the steps taken."""
    from memplanner.measured_costs import load_measured_costs
    from pocketspec.drafters.corpus import OutputCorpus
    from pocketspec.drafters.ngram import NgramDrafter
    from pocketspec.settings import SpeculationSettings
    from replay_drafting import open_replay, replay_trace
    from replay_target import ReplayTarget

    class RecordedChoices(ReplayTarget):
        """The stand-in with its verdict on the device (no logits on the host) and no reports."""

        def _advance(self, tokens):
            start = len(self._cached)
            self.clock.now += self.costs.forward_seconds(len(tokens), start)
            self._cached.extend(tokens)
            return start

    costs = load_measured_costs(costs_path)
    traces = [json.loads(line) for line in traces_path.read_text().splitlines() if line.strip()]
    engine, target = open_replay(costs, SpeculationSettings(drafter="ngram"), 151936, target_class=RecordedChoices,
                                 verdict_on_device=True)
    if phase == "setup":
        return 0
    if phase == "request twice":
        shadow_corpus = OutputCorpus(engine.ngram.min_n, engine.ngram.max_n)
        begin, remember = engine.ngram.begin, engine.ngram.remember

        def begin_twice(prompt):
            NgramDrafter(engine.ngram.min_n, engine.ngram.max_n, corpus=shadow_corpus).begin(prompt)
            begin(prompt)

        def remember_twice(tokens):
            shadow_corpus.remember(tokens)
            remember(tokens)

        engine.ngram.begin, engine.ngram.remember = begin_twice, remember_twice
    return sum(replay_trace(engine, target, trace).stats.num_steps for trace in traces if len(trace["output_tokens"]) > 1)


def count_instructions(traces_path: Path, costs_path: Path, phase: str) -> tuple[int, int]:
    """(instructions, steps) of one phase, in a fresh process under cachegrind."""
    done = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
         sys.executable, __file__, "--child", phase, str(traces_path), "--costs", str(costs_path)],
        capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if done.returncode != 0 or found is None:
        last_line = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"valgrind failed on {traces_path.name} ({phase}): {last_line}")
    return int(found.group(1).replace(",", "")), int(done.stdout.strip().splitlines()[-1])


def measure(traces_path: Path, costs_path: Path) -> dict:
    counted = {phase: count_instructions(traces_path, costs_path, phase) for phase in PHASES}
    steps = counted["replay"][1]
    answers = sum(1 for line in traces_path.read_text().splitlines()
                  if line.strip() and len(json.loads(line)["output_tokens"]) > 1)
    replay = counted["replay"][0] - counted["setup"][0]
    request = counted["request twice"][0] - counted["replay"][0]
    return {"traces": traces_path.name, "answers": answers, "steps": steps,
            "loop_instructions_per_step": (replay - request) / steps,
            "request_instructions_per_answer": request / answers,
            "instructions_per_step": replay / steps}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", type=Path, nargs="+")
    parser.add_argument("--costs", type=Path, required=True, help="a cost table (POCKETSPEC_HOME/costs/*.json)")
    parser.add_argument("--out", type=Path, default=None, help="write OUT.json and OUT.md")
    parser.add_argument("--child", choices=PHASES, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    missing = [str(path) for path in [*args.traces, args.costs] if not path.is_file()]
    if missing:
        parser.error(f"no such file: {', '.join(missing)}")
    if args.child is not None:
        print(replay_once(args.traces[0], args.costs, args.child))
        return
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (apt-get install valgrind)")
    rows = [measure(path, args.costs) for path in args.traces]
    table = [[row["traces"], row["answers"], row["steps"], f"{row['loop_instructions_per_step'] / 1e6:.3f}",
              f"{row['request_instructions_per_answer'] / 1e6:.2f}", f"{row['instructions_per_step'] / 1e6:.3f}"]
             for row in rows]
    print(markdown_table(COLUMNS, table))
    if args.out is not None:
        notes = [f"cost table: {args.costs}", "valgrind --tool=cachegrind --cache-sim=no, PYTHONHASHSEED=0; "
                 "the interpreter's start, the imports and the traces subtracted",
                 "once a request: indexing the prompt and remembering the output, counted by doing it twice"]
        write_results(args.out.parent, args.out.name, {"rows": rows}, "Instructions of the speculative loop's host "
                      "work", COLUMNS, table, notes)


if __name__ == "__main__":
    main()
