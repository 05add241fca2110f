"""Record what the target alone says: plain greedy outputs of a prompt suite, for replaying drafters.

    .venv/bin/python benchmarks/record_traces.py --suite benchmarks/data/code_edit.jsonl \
        --per-category 8 --max-tokens 192 --out benchmarks/results/traces/code_edit.jsonl

Every turn of a conversation is recorded (a later turn follows the model's own earlier replies),
as one JSON line: suite, prompt id, category, turn, the prompt's tokens and the output's tokens.
At temperature 0 a speculative run must produce these same tokens, so a drafter and the
controller can be replayed against them offline with this machine's cost table
(benchmarks/replay_drafting.py) and tried on many prompts in seconds instead of hours.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apps.bench.suite import select_prompts  # noqa: E402
from apps.prompt_file import read_prompt_rows  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", type=Path, required=True, help="JSONL prompts (apps/prompt_file.py)")
    parser.add_argument("--pair", default="qwen-coder")
    parser.add_argument("--target", default=None, help="a target model instead of the pair's")
    parser.add_argument("--per-category", type=int, default=10)
    parser.add_argument("--skip-per-category", type=int, default=0, help="start after this many prompts per category")
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--max-context", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


def chosen_rows(args: argparse.Namespace):
    rows = read_prompt_rows(args.suite, "--suite")
    by_id = {row.prompt_id: row for row in rows}
    wanted = select_prompts(rows, (), args.skip_per_category + args.per_category)
    seen: dict[str, int] = {}
    for prompt in wanted:
        seen[prompt.category] = seen.get(prompt.category, 0) + 1
        if seen[prompt.category] > args.skip_per_category:
            yield by_id[prompt.prompt_id]


def main(argv=None) -> None:
    from pocketspec.conversation.chat import Chat
    from pocketspec.conversation.conversation import Conversation
    from pocketspec.session import open_session
    from pocketspec.session_settings import SessionSettings

    args = parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    settings = SessionSettings(pair=None if args.target else args.pair, target=args.target, draft="none",
                               max_context=args.max_context, threads=args.threads, max_new_tokens=args.max_tokens)
    started = time.perf_counter()
    with open_session(settings) as session, args.out.open("w", encoding="utf-8") as out:
        for row in chosen_rows(args):
            chat = Chat(session.engine, Conversation(), max_new_tokens=args.max_tokens)
            for turn_index, text in enumerate(row.turns, start=1):
                # from empty caches, as the bench decodes every turn: a later turn that reused the first
                # turn's cached keys (computed a token at a time, not in one batch) could part at a near-tie
                session.reset(0)
                turn = chat.reply(text)
                out.write(json.dumps({"suite": args.suite.name, "prompt_id": row.prompt_id,
                                      "category": row.category, "turn": turn_index,
                                      "prompt_tokens": turn.prompt_tokens, "output_tokens": turn.tokens,
                                      "stop_reason": turn.stop_reason}) + "\n")
                out.flush()
            print(f"{row.prompt_id} ({row.category}): {len(row.turns)} turn(s), "
                  f"{time.perf_counter() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
