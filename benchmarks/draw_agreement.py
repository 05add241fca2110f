"""How often a draft model's sampled token is accepted: shared draws against the min(1, p/q) rule.

    .venv/bin/python benchmarks/draw_agreement.py [--pair qwen-coder] [--suite FILE] [--temperature 1.0]
        [--tokens 48] [--keys 64] [--out benchmarks/results/draw_agreement]

Along a reply the target samples to each suite prompt (the first turn of each category's first row),
it takes the target's distribution p and the draft's q at every position, after --temperature (top-k and
top-p off), and reports per category:
- `min_rule`: sum(min(p, q)) = 1 - TV, the chance the usual rule accepts a draft token (what
  PocketSpec's verification accepted before the shared draws);
- `shared_draws`: the chance that the draft's draw and the target's draw for the same position are the
  same token, over --keys position keys, with pocketspec/speculation/draws.py's own race (what it accepts
  now);
- `race_bound`: (1 - TV) / (1 + TV), the race's guaranteed floor.
Writes draw_agreement.json and draw_agreement.md under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apps.report import write_results  # noqa: E402
from pocketspec.backends.llama_cpp_backend import LlamaCppBackend  # noqa: E402
from pocketspec.conversation.chat_template import encode_chat, template_for  # noqa: E402
from pocketspec.machine_report import cpu_name  # noqa: E402
from pocketspec.models.catalog import model_path, resolve_pair  # noqa: E402
from pocketspec.settings import ModelSettings, SamplingSettings  # noqa: E402
from pocketspec.speculation.draws import SeededDraws, position_key, race  # noqa: E402
from pocketspec.speculation.sampling import distribution  # noqa: E402

DEFAULT_SUITE = ROOT / "benchmarks" / "results" / "bench_spec_bench_heldout_peers_2x2_zen4" / "suite.jsonl"


def _first_prompts(suite: Path) -> list[tuple[str, str]]:
    """(category, first turn) of each category's first row."""
    firsts: dict[str, str] = {}
    for line in suite.read_text().splitlines():
        row = json.loads(line)
        firsts.setdefault(row["category"], row["turns"][0])
    return list(firsts.items())


def _position(p: np.ndarray, q: np.ndarray, keys: list[int]) -> dict[str, float]:
    tv = 0.5 * float(np.abs(p - q).sum())
    agreed = np.mean([race(p, key) == race(q, key) for key in keys])
    return {"min_rule": 1.0 - tv, "shared_draws": float(agreed), "race_bound": (1.0 - tv) / (1.0 + tv)}


def measure(target, draft, prompt: list[int], sampling: SamplingSettings, num_tokens: int,
            num_keys: int, seed: int) -> list[dict[str, float]]:
    target.rollback(0)
    draft.rollback(0)
    target_logits, draft_logits = target.prefill(prompt).copy(), draft.prefill(prompt).copy()
    rows = []
    for position in range(num_tokens):
        p = distribution(target_logits, sampling)
        q = distribution(draft_logits[:p.shape[0]], sampling)
        q = np.pad(q, (0, p.shape[0] - q.shape[0]))
        keys = [position_key(seed + 1 + index, position) for index in range(num_keys)]
        rows.append(_position(p, q, keys))
        token = SeededDraws(seed, len(prompt) + position).token(p)  # the plain sampled reply
        if target.tokenizer.is_end_of_generation(token):
            break
        target_logits = target.forward([token], [0])[0].copy()
        draft_logits = draft.forward([token], [0])[0].copy()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="qwen-coder")
    parser.add_argument("--suite", type=Path, default=DEFAULT_SUITE)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--keys", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "draw_agreement")
    args = parser.parse_args()
    pair = resolve_pair(args.pair)
    sampling = SamplingSettings(temperature=args.temperature)
    settings = ModelSettings(num_threads=args.threads, max_context=2048)
    started = time.perf_counter()
    categories = {}
    with LlamaCppBackend(model_path(pair.target), settings) as target, \
            LlamaCppBackend(model_path(pair.draft), settings) as draft:
        template = template_for(target.tokenizer)
        for index, (category, text) in enumerate(_first_prompts(args.suite)):
            prompt = encode_chat(target.tokenizer, template, [{"role": "user", "content": text}])
            rows = measure(target, draft, prompt, sampling, args.tokens, args.keys, seed=1000 * index)
            categories[category] = {name: float(np.mean([row[name] for row in rows])) for name in rows[0]}
            categories[category]["positions"] = len(rows)
            print(category, categories[category], flush=True)
    mean = {name: float(np.mean([row[name] for row in categories.values()])) for name in
            ("min_rule", "shared_draws", "race_bound")}
    mean["positions"] = sum(row["positions"] for row in categories.values())
    seconds = time.perf_counter() - started
    rows = [[name, row["positions"], row["min_rule"], row["shared_draws"], row["race_bound"]]
            for name, row in [*categories.items(), ("mean", mean)]]
    _, report = write_results(
        args.out, "draw_agreement",
        {"pair": args.pair, "temperature": args.temperature, "tokens": args.tokens, "keys": args.keys,
         "suite": str(args.suite), "cpu": cpu_name(), "seconds": seconds, "categories": categories, "mean": mean},
        f"Draft acceptance: shared draws against min(1, p/q), {args.pair}, temperature {args.temperature}",
        ["category", "positions", "min(1, p/q) rule", "shared draws", "race floor"], rows,
        [f"{cpu_name()}; {args.tokens} sampled tokens per prompt, {args.keys} keys per position; {seconds:.0f} s"])
    print(f"wrote {report}")

if __name__ == "__main__":
    main()
