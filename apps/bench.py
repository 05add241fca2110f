"""`pocketspec bench`: plain vs speculative decoding on Spec-Bench prompts, written as JSON and Markdown.

Both modes share one loaded target; each prompt runs plain then speculative from
an empty KV cache, so every ratio compares two runs taken moments apart.
"""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict
from pathlib import Path

import click

from apps.report import write_results
from pocketspec.chat_template import encode_chat, template_for
from pocketspec.loader import choose_models, draft_settings_for
from pocketspec.settings import ModelSettings, SpeculationSettings

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "benchmarks" / "data" / "spec_bench.jsonl"


def load_prompts(per_category: int, categories: tuple[str, ...]) -> list[dict]:
    chosen: dict[str, list[dict]] = defaultdict(list)
    for line in DATA.read_text().splitlines():
        row = json.loads(line)
        if (not categories or row["category"] in categories) and len(chosen[row["category"]]) < per_category:
            chosen[row["category"]].append(row)
    return [row for rows in chosen.values() for row in rows]


def run_llama_bench(binary: str, model_path: Path, num_threads: int) -> float:
    """tg128 tok/s from llama.cpp's own llama-bench, built from the same source and flags."""
    output = subprocess.run([binary, "-m", str(model_path), "-p", "0", "-n", "128", "-t", str(num_threads),
                             "-r", "3", "-o", "json"], capture_output=True, text=True, check=True).stdout
    return float(json.loads(output)[0]["avg_ts"])


def summarize(records: list[dict]) -> list[list]:
    by_category: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        by_category[record["category"]].append(record)
    by_category["ALL"] = records
    rows = []
    for category, group in by_category.items():
        plain_tokens = sum(r["plain"]["num_tokens"] - 1 for r in group)
        plain_seconds = sum(r["plain"]["decode_seconds"] for r in group)
        spec_tokens = sum(r["spec"]["num_tokens"] - 1 for r in group)
        spec_seconds = sum(r["spec"]["decode_seconds"] for r in group)
        drafted = sum(r["spec"]["num_drafted"] for r in group)
        accepted = sum(r["spec"]["num_accepted"] for r in group)
        steps = sum(r["spec"]["num_steps"] for r in group)
        plain_rate, spec_rate = plain_tokens / plain_seconds, spec_tokens / spec_seconds
        rows.append([category, len(group), round(plain_rate, 2), round(spec_rate, 2), round(spec_rate / plain_rate, 3),
                     round(accepted / drafted, 3) if drafted else 0.0, round(accepted / steps, 3) if steps else 0.0,
                     round(sum(r["identical"] for r in group) / len(group), 3)])
    return rows


@click.command(name="bench")
@click.option("--pair", default=None, help="Pair preset [default: qwen-coder].")
@click.option("--per-category", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--category", "categories", multiple=True, help="Only these categories (repeatable).")
@click.option("--max-tokens", type=click.IntRange(min=2), default=128, show_default=True)
@click.option("--threads", type=click.IntRange(min=0), default=0)
@click.option("--repack/--no-repack", default=True, show_default=True)
@click.option("--exact-verify/--fast-verify", default=SpeculationSettings.exact_verify, show_default=True)
@click.option("--llama-bench", "llama_bench", default=None, help="Path to llama.cpp's llama-bench, for the reference tok/s.")
@click.option("--out-dir", type=click.Path(path_type=Path, file_okay=False), default=REPO / "benchmarks" / "results")
@click.option("--name", default="bench_spec", show_default=True)
def bench(pair, per_category, categories, max_tokens, threads, repack, exact_verify, llama_bench, out_dir, name):
    """Benchmark plain vs speculative decoding per Spec-Bench category (temperature 0)."""
    from pocketspec.backends.llama_cpp_backend import LlamaCppBackend
    from pocketspec.engine import SpeculativeEngine

    choice = choose_models(target=None, draft=None, pair=pair)
    settings = ModelSettings(num_threads=threads, max_context=2048, repack_weights=repack)
    target = LlamaCppBackend(choice.target_path, settings)
    draft = LlamaCppBackend(choice.draft_path, draft_settings_for(settings))
    plain_engine = SpeculativeEngine(target, speculation=SpeculationSettings(drafter="none"))
    spec_engine = SpeculativeEngine(target, draft_backend=draft,
                                    speculation=SpeculationSettings(drafter="auto", exact_verify=exact_verify))
    template = template_for(target.tokenizer)
    records = []
    try:
        for row in load_prompts(per_category, tuple(categories)):
            prompt = encode_chat(target.tokenizer, template, [{"role": "user", "content": row["turns"][0]}])
            results = {}
            for mode, engine in (("plain", plain_engine), ("spec", spec_engine)):
                target.rollback(0)
                draft.rollback(0)
                result = engine.generate(prompt, max_tokens)
                results[mode] = (result.tokens, result.stats.as_dict())
            identical = results["plain"][0] == results["spec"][0]
            records.append({"question_id": row["question_id"], "category": row["category"], "identical": identical,
                            "plain": results["plain"][1], "spec": results["spec"][1]})
            click.echo(f"{row['category']:>15} q{row['question_id']}: plain {results['plain'][1]['tokens_per_second']:.1f} "
                       f"spec {results['spec'][1]['tokens_per_second']:.1f} tok/s, identical={identical}", err=True)
    finally:
        target.close()
        draft.close()
    rows = summarize(records)
    notes = [f"pair {choice.target_path.name} + {choice.draft_path.name}, temperature 0, {max_tokens} new tokens, "
             f"{per_category} prompts per category, threads={settings.resolved_num_threads}, repack={repack}, "
             f"exact_verify={exact_verify}",
             "tok/s are decode rates (prefill excluded); speedup = speculative / plain, measured prompt by prompt in one run",
             f"γ at most {spec_engine.controller.max_gamma}"
             + (" (the exact-verify-width probe's cap)" if exact_verify else " (--fast-verify)")]
    payload = {"settings": {"max_tokens": max_tokens, "per_category": per_category, "repack": repack,
                            "exact_verify": exact_verify,
                            "max_gamma": spec_engine.controller.max_gamma}, "records": records}
    if llama_bench:
        reference = run_llama_bench(llama_bench, choice.target_path, settings.resolved_num_threads)
        plain_all = rows[-1][2]
        payload["llama_bench_tg128_tokens_per_second"] = reference
        notes.append(f"llama-bench tg128 on the target: {reference:.2f} tok/s; PocketSpec plain decode "
                     f"{plain_all:.2f} tok/s = {plain_all / reference:.3f}x")
    columns = ["category", "prompts", "plain tok/s", "spec tok/s", "speedup", "acceptance", "accepted/step", "identical"]
    json_path, markdown_path = write_results(out_dir, name, payload, "Speculative vs plain decoding (Spec-Bench)",
                                             columns, rows, notes)
    click.echo(markdown_path.read_text())
    click.echo(f"wrote {json_path} and {markdown_path}", err=True)


COMMANDS = [bench]

if __name__ == "__main__":
    bench()
