"""Proof that the memory plan is right: predicted peak vs measured peak RSS over a grid of real runs.

    .venv/bin/python benchmarks/memory_grid.py [--quick]

Each configuration runs in a fresh worker process. The worker imports the CLI's modules (as
`pocketspec generate` does), plans with memplanner for the budget, loads exactly what the plan
says, prefills a prompt that fills the context and, after generating, verifies one batch as
wide as every logits row planned (the plan's two worst cases), and reports the whole process's
peak resident memory, what a budget bounds (VmHWM, and psutil's RSS sampled every 5 ms). A
configuration with a draft model plans from the reference tables (plan_as_uncalibrated), so
that its draft-model terms are measured even on a machine whose own costs say the draft does
not pay. Results: benchmarks/results/memory_grid.{json,md}.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from worker_process import WorkerFailed, answer_if_worker, run_worker

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NEW_TOKENS = 24
PAIR = "qwen-coder"  # the grid's draft model is this pair's, not one named with --draft


def pair_draft() -> str:
    from pocketspec.models.catalog import resolve_pair

    return resolve_pair(PAIR).draft


def plan_as_uncalibrated() -> None:
    """Plan from the reference tables, as on a machine whose forward costs were never measured:
    this process gets a POCKETSPEC_HOME of its own (the models linked in, no cost tables). Where
    the measured costs say the draft model cannot pay, the planner would never pick it, and its
    memory terms would go unchecked."""
    from pocketspec.models.catalog import models_dir

    home = Path(tempfile.mkdtemp(prefix="memory-grid-home-"))
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    (home / "models").symlink_to(models_dir())
    os.environ["POCKETSPEC_HOME"] = str(home)


def worker(config: dict) -> dict:
    import apps.cli  # noqa: F401  (what `generate` holds before it loads anything)

    if config.get("uncalibrated"):
        plan_as_uncalibrated()

    sampled_peak = [psutil.Process().memory_info().rss]
    stop = threading.Event()

    def sample() -> None:
        process = psutil.Process()
        while not stop.is_set():
            sampled_peak[0] = max(sampled_peak[0], process.memory_info().rss)
            time.sleep(0.005)

    threading.Thread(target=sample, daemon=True).start()
    from pocketspec.session import open_session
    from pocketspec.session_settings import SessionSettings
    from pocketspec.stats import peak_rss_bytes

    # a draft model comes as the pair's, which a tight budget may give up for n-gram drafting; one named
    # with --draft (SessionSettings.draft) the plan would keep or refuse
    is_pair_draft = config["draft"] == pair_draft()
    session = open_session(SessionSettings(
        target=config["target"], draft=None if is_pair_draft else config["draft"],
        pair=PAIR if is_pair_draft else None, memory_budget=config["budget"],
        max_context=config["context"], max_new_tokens=NEW_TOKENS,
        options={"expected_acceptance": config.get("alpha")}))
    applied, engine = session.plan, session.engine
    tokenizer = session.tokenizer
    text = (ROOT / "benchmarks" / "data" / "spec_bench.jsonl").read_text()
    # fill the context: the plan's peak is the worst case, a full KV cache at full attention length
    num_prompt = config["context"] - NEW_TOKENS - applied.planner_result.settings.logits_rows - 1
    # tokenize only what the prompt needs: a list of every token in the file would count as peak
    prompt = tokenizer.encode(text[:8 * num_prompt], add_bos=False)[:num_prompt]
    assert len(prompt) == num_prompt, "benchmark text too short for the context"
    started = time.perf_counter()
    result = engine.generate(prompt, NEW_TOKENS)
    seconds = time.perf_counter() - started
    # the plan's other worst case, which 24 tokens of ordinary text may never reach: a verify of every
    # logits row planned (a long accepted copy), at the end of the full context
    width = engine.target.max_logits_rows
    if width > 1:
        engine.target.rollback(len(prompt))
        engine.target.forward(prompt[:width], range(width))
    stop.set()
    session.close()
    settings = applied.planner_result.settings
    return {
        "predicted_peak_bytes": applied.planner_result.predicted_peak_bytes,
        "measured_peak_bytes": peak_rss_bytes(),
        "sampled_peak_bytes": sampled_peak[0],
        "budget_bytes": applied.budget_bytes,
        "terms": applied.planner_result.terms,
        "drafter": settings.drafter, "max_gamma": settings.max_gamma, "kv_type": settings.target_kv_type, "draft_kv_type": settings.draft_kv_type,
        "draft_window": settings.draft_kv_window, "n_ubatch": settings.n_ubatch,
        "degradations": applied.planner_result.degradations,
        "decode_tokens_per_second": result.stats.decode_tokens_per_second,
        "num_prompt_tokens": len(prompt), "wall_seconds": seconds,
    }


def grid(quick: bool) -> list[dict]:
    from memplanner.planner import Workload, min_budget_any, plan
    from memplanner.shapes import shape_from_gguf
    from memplanner.sizes import format_bytes
    from pocketspec.models.catalog import model_path

    models = {name: shape_from_gguf(model_path(name)) for name in
              ("smollm2-135m-instruct", "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")}
    configs = []

    def add(target, draft, context, alpha, fractions):
        workload = Workload(max_context=context, max_new_tokens=NEW_TOKENS)
        draft_shape = models[draft] if draft not in ("ngram", "none") else None
        low = min_budget_any(models[target], workload)
        high = plan(1 << 40, models[target], draft_shape, workload, alpha=alpha).predicted_peak_bytes
        for fraction in fractions:
            budget = int(low + fraction * (high - low))
            configs.append({"target": target, "draft": draft, "context": context, "alpha": alpha,
                            "budget": str(budget), "budget_label": format_bytes(budget),
                            "uncalibrated": draft_shape is not None})

    small, target, draft = "smollm2-135m-instruct", "qwen2.5-coder-1.5b-instruct", pair_draft()
    for context in (512, 2048, 8192):
        add(small, "ngram", context, None, (0.0, 1.0))
    add(small, "none", 4096, None, (1.0,))
    add(small, "ngram", 1024, None, (0.5,))
    for context in (512, 1024, 2048, 4096, 8192) if not quick else (1024,):
        add(target, draft, context, 0.95, (1.0, 0.6, 0.3) if context in (1024, 4096) else (1.0,))
    add(target, draft, 4096, 0.95, (0.0, 0.1))
    add(target, "none", 2048, None, (0.0,))
    add(target, "none", 512, None, (1.0,))
    add(target, "ngram", 8192, None, (1.0,))
    return configs


def main() -> None:
    from pocketspec.huge_pages import restart_with_huge_pages

    restart_with_huge_pages()  # as the pocketspec command does: the workers' malloc gets the same huge pages
    answer_if_worker(worker)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", type=int, nargs="+", help="Rerun these configuration numbers (0-based) and "
                        "merge them into the existing results.")
    args = parser.parse_args()
    from apps.report import write_results
    from memplanner.sizes import format_bytes

    configs = grid(args.quick)
    results_path = ROOT / "benchmarks" / "results" / "memory_grid.json"
    records = json.loads(results_path.read_text())["records"] if args.only else [None] * len(configs)
    for index, config in enumerate(configs):
        if args.only and index not in args.only:
            continue
        try:
            record = {**config, **run_worker(__file__, config)}
        except WorkerFailed as failure:
            records[index] = {**config, "error": failure.stderr.strip().splitlines()[-1:]}
            print(f"{config} failed: {failure.stderr.strip()[-300:]}", file=sys.stderr)
            continue
        record["error_fraction"] = (record["predicted_peak_bytes"] - record["measured_peak_bytes"]) / record["measured_peak_bytes"]
        record["within_budget"] = record["measured_peak_bytes"] <= record["budget_bytes"]
        records[index] = record
        print(f"{config['target'][:12]} {config['draft'][:12]:>12} ctx {config['context']:>5} budget {config['budget_label']:>10}: "
              f"predicted {format_bytes(record['predicted_peak_bytes'])} measured {format_bytes(record['measured_peak_bytes'])} "
              f"({record['error_fraction']:+.1%}) {record['drafter']} γ{record['max_gamma']} {record['kv_type']} "
              f"draft KV {record['draft_kv_type']}", file=sys.stderr)
    measured = [r for r in records if "error" not in r]
    rows = [[r["target"].split("-instruct")[0], r["draft"].split("-instruct")[0], r["context"], r["budget_label"],
             r["drafter"], r["max_gamma"], r["kv_type"], r["draft_kv_type"], r["draft_window"], r["n_ubatch"],
             format_bytes(r["predicted_peak_bytes"]), format_bytes(r["measured_peak_bytes"]),
             f"{r['error_fraction']:+.1%}", "yes" if r["within_budget"] else "NO", round(r["decode_tokens_per_second"], 1)]
            for r in measured]
    worst = max((abs(r["error_fraction"]) for r in measured), default=float("nan"))
    notes = [f"{len(measured)} of {len(records)} configurations ran; worst |predicted - measured| = {worst:.1%} of measured",
             f"runs over budget: {sum(not r['within_budget'] for r in measured)}",
             "measured = the whole worker process's peak RSS (VmHWM), interpreter and CLI modules included; "
             f"{NEW_TOKENS} new tokens after a prompt that fills the rest of the context"]
    columns = ["target", "draft", "context", "budget", "drafter", "γ", "KV", "draft KV", "draft window", "n_ubatch",
               "predicted", "measured", "error", "in budget", "decode tok/s"]
    _, markdown_path = write_results(ROOT / "benchmarks" / "results", "memory_grid", {"records": records},
                                     "Memory plan: predicted vs measured peak", columns, rows, notes)
    print(markdown_path.read_text())


if __name__ == "__main__":
    main()
