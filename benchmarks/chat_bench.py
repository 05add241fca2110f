"""Chat speed on MT-Bench: the two-turn conversations replayed through `pocketspec chat`'s turn logic.

    .venv/bin/python benchmarks/chat_bench.py [--limit N] [--pair qwen-coder] [--memory-budget 3GiB]

Each conversation runs twice, plain (`--draft none`) and speculative (the pair's draft
model plus n-grams), at temperature 0 with up to 128 new tokens per turn. Each mode
runs in its own worker process so that its peak RSS is its own. Turn 2 reuses the KV
cache of turn 1, as in the chat. Per turn it records tok/s, time to first token and
whether the two modes produced the same tokens (they must: decoding is lossless).
Results: benchmarks/results/chat_bench.{json,md}.

Data: the 80 MT-Bench conversations of Spec-Bench (benchmarks/data/mt_bench.jsonl,
Apache-2.0, see benchmarks/data/SPEC_BENCH_LICENSE).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from worker_process import answer_if_worker, run_worker

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apps.prompt_file import PromptRow, read_prompt_rows  # noqa: E402

DATA_PATH = ROOT / "benchmarks" / "data" / "mt_bench.jsonl"
MODES = {"plain": "none", "speculative": None}  # mode -> --draft (None: the pair's draft model)


def load_conversations(limit: int | None) -> list[PromptRow]:
    rows = read_prompt_rows(DATA_PATH, "MT-Bench")
    return rows[:limit] if limit else rows


def worker(config: dict) -> dict:
    """Replay the conversations on one engine; returns per-turn rows and the peak memory."""
    from pocketspec.conversation.chat import Chat
    from pocketspec.conversation.conversation import Conversation
    from pocketspec.session import open_session
    from pocketspec.session_settings import SessionSettings

    rows = []
    settings = SessionSettings(pair=config["pair"], draft=config["draft"], memory_budget=config["memory_budget"],
                               max_context=config["max_context"], threads=config["threads"],
                               max_new_tokens=config["max_tokens"])
    with open_session(settings) as session:
        for conversation in load_conversations(config["limit"]):
            chat = Chat(session.engine, Conversation(), max_new_tokens=config["max_tokens"])
            for turn_index, question in enumerate(conversation.turns, start=1):
                started = time.perf_counter()
                first_text_at = []
                turn = chat.reply(question, on_text=lambda _text: first_text_at.append(time.perf_counter()))
                stats = turn.stats
                rows.append({
                    "question_id": conversation.prompt_id, "category": conversation.category,
                    "turn": turn_index, "tokens": turn.tokens, "num_tokens": stats.num_tokens,
                    "num_prompt_tokens": stats.num_prompt_tokens, "num_reused_tokens": stats.num_reused_tokens,
                    "seconds": stats.seconds,
                    # decode rate: the prefill shows up in the time to first token instead
                    "tokens_per_second": stats.decode_tokens_per_second,
                    "time_to_first_token": (first_text_at[0] - started) if first_text_at else None,
                    "acceptance_rate": stats.acceptance_rate, "mean_accepted_per_step": stats.mean_accepted_per_step,
                    "num_dropped": turn.num_dropped, "stop_reason": turn.stop_reason,
                })
                if turn_index == 2:
                    rows[-1]["cold_prefill_seconds"] = _cold_prefill_seconds(session.engine, stats.num_prompt_tokens)
        return {"rows": rows, "peak_memory_bytes": session.peak_memory_bytes(), "budget_bytes": session.budget_bytes,
                "notes": session.notes}


def _cold_prefill_seconds(engine, num_prompt_tokens: int) -> float:
    """The control for KV reuse: the same turn-2 prompt prefilled from an empty cache."""
    target = engine.target
    prompt = list(target.cached_tokens[:num_prompt_tokens])
    target.rollback(0)
    started = time.perf_counter()
    target.prefill(prompt)
    return time.perf_counter() - started


def _slope_per_100_tokens(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys against xs, in ms per 100 tokens of xs."""
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return 1e5 * sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread if spread else 0.0


def _mean(values) -> float:
    values = [value for value in values if value is not None]
    return statistics.fmean(values) if values else 0.0


def summarize(results: dict[str, dict], config: dict) -> tuple[dict, list[list], list[str]]:
    from memplanner.sizes import format_bytes

    plain, speculative = results["plain"]["rows"], results["speculative"]["rows"]
    turns = []
    for plain_row, spec_row in zip(plain, speculative):
        turns.append({
            "question_id": plain_row["question_id"], "category": plain_row["category"], "turn": plain_row["turn"],
            "same_output": plain_row["tokens"] == spec_row["tokens"],
            "plain": {key: value for key, value in plain_row.items() if key != "tokens"},
            "speculative": {key: value for key, value in spec_row.items() if key != "tokens"},
        })
    table = []
    for turn_index in (1, 2):
        chosen = [turn for turn in turns if turn["turn"] == turn_index]
        plain_tps = _mean(turn["plain"]["tokens_per_second"] for turn in chosen)
        spec_tps = _mean(turn["speculative"]["tokens_per_second"] for turn in chosen)
        table.append([f"turn {turn_index}", len(chosen), plain_tps, spec_tps, spec_tps / plain_tps if plain_tps else 0.0,
                      _mean(turn["plain"]["time_to_first_token"] for turn in chosen),
                      _mean(turn["speculative"]["time_to_first_token"] for turn in chosen),
                      _mean(turn["speculative"]["acceptance_rate"] for turn in chosen),
                      _mean(turn["speculative"]["num_reused_tokens"] for turn in chosen),
                      sum(turn["same_output"] for turn in chosen)])
    second = [turn["speculative"] for turn in turns if turn["turn"] == 2 and turn["speculative"]["time_to_first_token"]]
    turn_one_lengths = [row["num_reused_tokens"] for row in second]
    reuse_slope = _slope_per_100_tokens(turn_one_lengths, [row["time_to_first_token"] for row in second])
    cold_slope = _slope_per_100_tokens(turn_one_lengths, [row["cold_prefill_seconds"] for row in second])
    budget = config["memory_budget"] or "none"
    notes = [f"pair {config['pair']}, temperature 0, up to {config['max_tokens']} new tokens per turn, "
             f"{len(turns) // 2} conversations, memory budget {budget}",
             f"turn-2 time to first token vs turn-1 length (speculative): {reuse_slope:+.1f} ms per 100 tokens "
             f"with KV reuse; the same prompts prefilled from an empty cache: {cold_slope:+.1f} ms per 100 tokens"]
    for mode, result in results.items():
        notes.append(f"{mode}: peak memory {format_bytes(result['peak_memory_bytes'])}"
                     + (f" of a {format_bytes(result['budget_bytes'])} budget" if result["budget_bytes"] else ""))
    payload = {"config": config, "turns": turns,
               "ttft_slope_ms_per_100_tokens": {"with_reuse": reuse_slope, "cold_prefill": cold_slope},
               "peak_memory_bytes": {mode: result["peak_memory_bytes"] for mode, result in results.items()},
               "budget_bytes": results["speculative"]["budget_bytes"],
               "plan_notes": {mode: result["notes"] for mode, result in results.items()}}
    return payload, table, notes


def main() -> None:
    answer_if_worker(worker)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=None, help="First N conversations (default: all 80).")
    parser.add_argument("--pair", default="qwen-coder")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-context", type=int, default=None)
    parser.add_argument("--memory-budget", default=None)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    from apps.report import write_results

    config = {"pair": args.pair, "max_tokens": args.max_tokens, "max_context": args.max_context,
              "memory_budget": args.memory_budget, "threads": args.threads, "limit": args.limit}
    results = {}
    for mode, draft in MODES.items():
        print(f"running {mode} ...", file=sys.stderr)
        results[mode] = run_worker(__file__, {**config, "mode": mode, "draft": draft}, what=f"{mode} worker")
    payload, table, notes = summarize(results, config)
    columns = ["turn", "n", "plain tok/s", "spec tok/s", "speedup", "plain TTFT s", "spec TTFT s",
               "acceptance", "reused prompt tokens", "same output"]
    json_path, markdown_path = write_results(args.out_dir, "chat_bench", payload, "Chat on MT-Bench: plain vs speculative",
                                             columns, table, notes)
    print(f"wrote {json_path} and {markdown_path}", file=sys.stderr)


if __name__ == "__main__":
    main()
