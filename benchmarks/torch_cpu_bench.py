"""The torch backend on a CPU: plain vs n-gram vs self-sparse drafting on SmolLM2 at growing contexts.

    .venv/bin/python benchmarks/torch_cpu_bench.py [--contexts 512 2048 8192] [--max-tokens 64]

Per context, one worker process loads SmolLM2-135M (fp32 weights and KV). For each of --prompts
prompts (Spec-Bench summarization documents joined to about that many tokens, each prompt starting
at a later document) it prefills the prompt once, then decodes the same continuation several ways,
reusing the prefilled KV cache: plain, n-gram (γ fixed), self-sparse (the target drafting for itself
over 4 sinks + a recent window), self-sparse-attended (over the keys the target attended to most +
a recent window, --self-draft-keys attended) and self-skip (its first layers plus the head), γ fixed.
It records decode tok/s, acceptance, whether the tokens equal plain decoding, the mean
time of one draft forward (flat across contexts if the sparse window works) next to one
target forward, the bytes each part allocates and the process's peak RSS. Run it with --threads 1 on a
shared CPU: a second intra-op thread spinning against other processes made one forward 4x slower.
Results: benchmarks/results/torch_cpu_bench.{json,md} (or --name).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from worker_process import answer_if_worker, run_worker

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apps.prompt_file import read_prompt_rows  # noqa: E402

DATA_PATH = ROOT / "benchmarks" / "data" / "spec_bench.jsonl"
RESULTS = ROOT / "benchmarks" / "results"
MODEL = "smollm2-135m-instruct"


def _document(tokenizer, num_tokens: int, first: int = 0) -> str:
    """Summarization documents from the `first` on, joined until they hold num_tokens tokens, cut there."""
    texts = [row.text for row in read_prompt_rows(DATA_PATH, "Spec-Bench") if row.category == "summarization"]
    texts = texts[first:] + texts[:first]
    tokens: list[int] = []
    for text in texts:
        tokens += tokenizer.encode(text + "\n\n", add_bos=False)
        if len(tokens) >= num_tokens:
            break
    return tokenizer.decode(tokens[:num_tokens])


def _token_ms(backend, num_kept: int, num_repeats: int = 8) -> float:
    """Median milliseconds of one one-token forward after `num_kept` cached tokens."""
    seconds = []
    for _ in range(num_repeats):
        backend.rollback(num_kept)
        started = time.perf_counter()
        backend.forward([backend.cached_tokens[-1]], [0])
        seconds.append(time.perf_counter() - started)
    backend.rollback(num_kept)
    return round(1000 * sorted(seconds)[num_repeats // 2], 3)


def worker(config: dict) -> dict:
    from pocketspec.backends.torch_backend import TorchBackend
    from pocketspec.backends.torch_open import open_self_draft
    from pocketspec.models.catalog import model_path
    from pocketspec.conversation.chat_template import encode_chat, template_for
    from pocketspec.speculation.engine import SpeculativeEngine
    from pocketspec.settings import ModelSettings, SpeculationSettings
    from pocketspec.stats import peak_rss_bytes

    context = config["context"]
    settings = ModelSettings(backend="torch", weights="fp32", max_context=context + 2 * config["max_tokens"],
                             num_threads=config["threads"], max_logits_rows=config["gamma"] + 1)
    target = TorchBackend.open(model_path(MODEL), settings)
    tokenizer = target.tokenizer
    question = "Summarize the text above in three sentences.\n\n"
    speculation = SpeculationSettings(self_draft_window=config["window"], self_draft_kv_type=config["draft_kv"],
                                      self_skip_layers=config["skip_layers"])
    rows = []
    for prompt_index in range(config["prompts"]):
        document = _document(tokenizer, context - 64, first=prompt_index)
        prompt = encode_chat(tokenizer, template_for(tokenizer),
                             [{"role": "user", "content": document + "\n\n" + question}])
        target.rollback(0)
        started = time.perf_counter()
        target.prefill(prompt[:-1])
        prefill_seconds = time.perf_counter() - started
        num_prefilled = target.num_cached
        plain_tokens = None
        for mode in config["modes"]:
            target.rollback(num_prefilled)
            draft = None
            if mode.startswith("self-"):
                keys = "attended" if mode == "self-sparse-attended" else "sinks"
                draft = open_self_draft(target, mode.removesuffix("-attended"), settings,
                                        replace(speculation, self_draft_keys=keys))
            engine_speculation = SpeculationSettings(drafter={"plain": "none", "ngram": "ngram"}.get(mode, "model"),
                                                     gamma=None if mode == "plain" else config["gamma"])
            engine = SpeculativeEngine(target, draft_backend=draft, speculation=engine_speculation)
            result = engine.generate(prompt, config["max_tokens"])
            plain_tokens = result.tokens if mode == "plain" else plain_tokens
            memory = target.memory_report()
            rows.append({
                "mode": mode, "context": context, "prompt": prompt_index, "num_prompt_tokens": len(prompt),
                "num_tokens": result.stats.num_tokens,
                "decode_tokens_per_second": round(result.stats.tokens_per_second, 3),
                "acceptance_rate": round(result.stats.acceptance_rate, 4),
                "num_drafted": result.stats.num_drafted, "num_accepted": result.stats.num_accepted,
                "mean_accepted_per_step": round(result.stats.mean_accepted_per_step, 3),
                "equals_plain": result.tokens == plain_tokens,
                # one-token forwards: the target over the whole context, the draft over its full window
                "target_forward_ms": _token_ms(target, target.num_cached - 1),
                "draft_forward_ms": _token_ms(draft, draft.num_cached - 1) if draft is not None else None,
                "weight_bytes": memory["weights"], "target_kv_bytes": memory["kv_cache"],
                "draft_kv_bytes": draft.memory_report()["kv_cache"] if draft is not None else 0,
                "peak_rss_bytes": peak_rss_bytes(), "prefill_seconds": round(prefill_seconds, 2),
            })
    return {"rows": rows}


def _markdown(results: dict) -> str:
    lines = [f"# Torch backend on CPU: {MODEL}, fp32", "",
             f"{results['machine']}; torch {results['torch']}; {results['max_tokens']} new tokens per run, "
             f"γ = {results['gamma']} for the drafters; self-sparse window {results['window']}, draft KV "
             f"{results['draft_kv']}; self-skip keeps {results.get('skip_layers', '-')} of 30 layers. "
             "Peak RSS is the worker's, cumulative over its runs.", "",
             "| context | prompt | mode | tok/s | acceptance | accepted/step | = plain | target fwd ms | draft fwd ms "
             "| weights MiB | target KV MiB | draft KV MiB | peak RSS MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    mib = 2 ** 20
    for row in results["rows"]:
        lines.append(
            f"| {row['num_prompt_tokens']} | {row.get('prompt', 0)} | {row['mode']} | "
            f"{row['decode_tokens_per_second']:.2f} | "
            f"{row['acceptance_rate']:.0%} | {row['mean_accepted_per_step']:.2f} | {row['equals_plain']} | "
            f"{row['target_forward_ms']:.1f} | {row['draft_forward_ms'] if row['draft_forward_ms'] is not None else '-'} | "
            f"{row['weight_bytes'] / mib:.1f} | {row['target_kv_bytes'] / mib:.1f} | {row['draft_kv_bytes'] / mib:.2f} | "
            f"{row['peak_rss_bytes'] / mib:.0f} |")
    return "\n".join(lines + _summary_lines(results["rows"])) + "\n"


def _summary_lines(rows: list[dict]) -> list[str]:
    """Per context and drafting mode over the prompts: pooled acceptance (accepted ÷ drafted) and the
    median ratio of decode tok/s to plain decoding's on the same prompt."""
    plain = {(row["context"], row.get("prompt", 0)): row["decode_tokens_per_second"]
             for row in rows if row["mode"] == "plain"}
    lines = ["", "| context | mode | prompts | acceptance (pooled) | × plain (median over prompts) | all = plain |",
             "|---|---|---|---|---|---|"]
    for context in sorted({row["context"] for row in rows}):
        for mode in dict.fromkeys(row["mode"] for row in rows if row["mode"] != "plain"):
            group = [row for row in rows if row["context"] == context and row["mode"] == mode]
            if not group or "num_drafted" not in group[0]:
                continue
            drafted, accepted = sum(row["num_drafted"] for row in group), sum(row["num_accepted"] for row in group)
            ratios = [row["decode_tokens_per_second"] / plain[(context, row.get("prompt", 0))]
                      for row in group if (context, row.get("prompt", 0)) in plain]
            ratio = f"{statistics.median(ratios):.2f}×" if ratios else "-"
            lines.append(f"| {context} | {mode} | {len(group)} | {accepted / max(drafted, 1):.1%} | {ratio} | "
                         f"{all(row['equals_plain'] for row in group)} |")
    return lines


def main() -> None:
    answer_if_worker(worker)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--draft-kv", default="auto")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--modes", nargs="+", default=["plain", "ngram", "self-sparse", "self-skip"],
                        help="of plain, ngram, self-sparse, self-sparse-attended, self-skip")
    parser.add_argument("--prompts", type=int, default=1, help="prompts a context, each from a later document")
    parser.add_argument("--skip-layers", type=int, default=20, help="self-skip: layers the draft keeps (of 30)")
    parser.add_argument("--name", default="torch_cpu_bench", help="results file stem under benchmarks/results")
    args = parser.parse_args()
    import torch

    results = {"machine": f"{platform.machine()} CPU, {len(__import__('os').sched_getaffinity(0))} cores",
               "torch": torch.__version__, "max_tokens": args.max_tokens, "gamma": args.gamma,
               "window": args.window, "draft_kv": args.draft_kv, "skip_layers": args.skip_layers, "rows": []}
    for context in args.contexts:
        config = {"context": context, "max_tokens": args.max_tokens, "gamma": args.gamma, "window": args.window,
                  "draft_kv": args.draft_kv, "threads": args.threads, "modes": args.modes, "prompts": args.prompts,
                  "skip_layers": args.skip_layers}
        results["rows"] += run_worker(__file__, config, what=f"context {context} worker")["rows"]
        print(_markdown(results).splitlines()[-1], flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(results, indent=1))
    (RESULTS / f"{args.name}.md").write_text(_markdown(results))
    print(_markdown(results))


if __name__ == "__main__":
    main()
