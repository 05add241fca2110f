"""Sharding the torch target: one device vs a layer split vs a row (tensor-parallel) split, plain and speculative.

    .venv/bin/python benchmarks/shard_bench.py --devices cpu:0,cpu:1                 # CPU ranks (2 cores: overhead)
    .venv/bin/python benchmarks/shard_bench.py --devices cuda:0,cuda:1 --pair qwen-coder --weights bf16
    .venv/bin/python benchmarks/shard_bench.py --devices cuda:0 --modes single       # one GPU: plan vs allocator

Per mode (single: the first device alone; layer; row) one worker process loads the target split
that way and generates the same Spec-Bench chat prompts with each drafter: none (plain decoding),
ngram, a draft model (--draft or --pair; whole, on the first device) and self-skip (not under a
row split), γ fixed. It records decode tok/s, acceptance, whether the tokens equal the
single-device plain tokens, each device's tensor bytes as planned (memplanner/torch_split.py) and
as allocated, and on GPUs each device's allocator peak (torch.cuda.max_memory_allocated, which
also counts activations and the draft). On a CPU, cpu:0,cpu:1 share the same cores: a layer
split runs the same work plus its hops, and each row-split rank gets half the threads, so CPU
rows measure the cost of splitting, not a speedup.
Results: benchmarks/results/{--name}.{json,md}.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from worker_process import answer_if_worker, run_worker

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from apps.prompt_file import read_prompt_rows  # noqa: E402

DATA_PATH = ROOT / "benchmarks" / "data" / "spec_bench.jsonl"
RESULTS = ROOT / "benchmarks" / "results"
HUGE_BUDGET = 1 << 50  # the plan's bytes per device, not a fit


def _prompts(tokenizer, num_prompts: int) -> list[list[int]]:
    """The first turn of one Spec-Bench question per category, in the model's chat template."""
    from pocketspec.conversation.chat_template import encode_chat, template_for

    rows = read_prompt_rows(DATA_PATH, "Spec-Bench")
    firsts = list({row.category: row for row in reversed(rows)}.values())[::-1][:num_prompts]
    return [encode_chat(tokenizer, template_for(tokenizer), [{"role": "user", "content": row.text}])
            for row in firsts]


def _planned(config: dict, settings, target_path: Path) -> dict[str, int]:
    from pocketspec.budget.torch_plan import torch_layout
    from memplanner.split import DeviceBudget
    from memplanner.torch_split import plan_layer_split, plan_row_split, tensor_bytes
    from pocketspec.loader import ModelChoice
    from pocketspec.settings import SpeculationSettings

    devices = [DeviceBudget(name, HUGE_BUDGET) for name in settings.all_devices]
    shape, layout = torch_layout(ModelChoice(target_path, None, "none"), settings, SpeculationSettings())
    found = (plan_row_split(devices, shape, layout) if config["mode"] == "row"
             else plan_layer_split(devices, shape, layout, settings.layers_per_device))
    return {share.device: tensor_bytes(share) for share in found.shares}


def _run(engine_target, draft, drafter: str, prompts, config: dict) -> dict:
    from pocketspec.speculation.engine import SpeculativeEngine
    from pocketspec.settings import SpeculationSettings

    speculation = SpeculationSettings(drafter={"none": "none", "ngram": "ngram"}.get(drafter, "model"),
                                      gamma=None if drafter == "none" else config["gamma"])
    tokens, num_tokens, decode_seconds, num_drafted, num_accepted = [], 0, 0.0, 0, 0
    for prompt in prompts:
        engine = SpeculativeEngine(engine_target, draft_backend=draft, speculation=speculation)
        result = engine.generate(prompt, config["max_tokens"])
        tokens.append(result.tokens)
        num_tokens += result.stats.num_tokens - 1
        decode_seconds += result.stats.decode_seconds
        num_drafted, num_accepted = num_drafted + result.stats.num_drafted, num_accepted + result.stats.num_accepted
    return {"tokens": tokens, "decode_tokens_per_second": round(num_tokens / max(decode_seconds, 1e-9), 3),
            "acceptance_rate": round(num_accepted / num_drafted, 4) if num_drafted else 0.0}


def worker(config: dict) -> dict:
    from pocketspec.backends.torch_backend import TorchBackend
    from pocketspec.backends.torch_open import open_backend, open_self_draft
    from pocketspec.models.model_files import resolve_model
    from pocketspec.settings import draft_settings_for
    from pocketspec.settings import ModelSettings, SpeculationSettings

    devices = tuple(config["devices"])
    is_single = config["mode"] == "single"
    settings = ModelSettings(backend="torch", weights=config["weights"], max_context=config["max_context"],
                             max_logits_rows=config["gamma"] + 1, num_threads=config["threads"],
                             device=devices[0], devices=() if is_single else devices,
                             split_mode="row" if config["mode"] == "row" else "layer")
    target_path = resolve_model(config["target"])
    target = open_backend(target_path, settings)
    rows = []
    try:
        prompts = _prompts(target.tokenizer, config["num_prompts"])
        for drafter in config["drafters"]:
            if drafter == "self-skip" and config["mode"] == "row":
                continue
            draft = None
            if drafter == "model":
                draft_settings = draft_settings_for(settings, draft_device=devices[0]) if not is_single else replace(
                    settings, max_logits_rows=1)
                draft = TorchBackend.open(resolve_model(config["draft"]), draft_settings)
            elif drafter == "self-skip":
                draft = open_self_draft(target, "self-skip", settings, SpeculationSettings(self_skip_layers=0))
            run = _run(target, draft, drafter, prompts, config)
            rows.append({"mode": config["mode"], "drafter": drafter, **run,
                         "draft_bytes": sum(draft.memory_report().values()) if draft is not None else 0})
            if draft is not None and drafter == "model":
                draft.close()
        memory = {name: sum(terms.values()) for name, terms in target.memory_by_device().items()}
        peaks = target.allocator_peaks()
    finally:
        target.close()
    return {"rows": rows, "planned_bytes": _planned(config, settings, target_path), "tensor_bytes": memory,
            "allocator_peak_bytes": peaks}


def _table(results: dict) -> tuple[list[str], list[list]]:
    columns = ["mode", "drafter", "decode tok/s", "acceptance", "= single plain", "device", "planned MiB",
               "tensors MiB", "allocator peak MiB"]
    mib = 2**20
    found = []
    for run in results["runs"]:
        for row in run["rows"]:
            for index, (device, planned) in enumerate(run["planned_bytes"].items()):
                peak = run["allocator_peak_bytes"].get(device)
                found.append([row["mode"], row["drafter"], row["decode_tokens_per_second"], row["acceptance_rate"],
                              row["equals_single_plain"], device, round(planned / mib, 2),
                              round(run["tensor_bytes"].get(device, 0) / mib, 2),
                              "-" if peak is None else round(peak / mib, 2)])
    return columns, found


def main() -> None:
    answer_if_worker(worker)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="cpu:0,cpu:1")
    parser.add_argument("--modes", nargs="+", default=["single", "layer", "row"], choices=["single", "layer", "row"])
    parser.add_argument("--target", default=None, help="catalog name or GGUF [default: smollm2-135m-instruct]")
    parser.add_argument("--draft", default=None, help="a draft model (same vocabulary) for the `model` drafter")
    parser.add_argument("--pair", default=None, help="catalog pair, e.g. qwen-coder (sets --target and --draft)")
    parser.add_argument("--drafters", nargs="+", default=["none", "ngram", "model", "self-skip"])
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--max-context", type=int, default=2048)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--threads", type=int, default=0, help="per process (0: every core, split among row ranks)")
    parser.add_argument("--name", default="shard_bench", help="results file stem under benchmarks/results")
    args = parser.parse_args()
    from apps.report import write_results
    from pocketspec.models.catalog import resolve_pair

    target, draft = args.target, args.draft
    if args.pair is not None:
        pair = resolve_pair(args.pair)
        target, draft = target or pair.target, draft or pair.draft
    target = target or "smollm2-135m-instruct"
    drafters = [drafter for drafter in args.drafters if drafter != "model" or draft is not None]
    devices = [name.strip() for name in args.devices.split(",")]
    modes = [mode for mode in args.modes if mode == "single" or len(devices) > 1]
    results = {"target": target, "draft": draft, "devices": devices, "weights": args.weights,
               "max_tokens": args.max_tokens, "num_prompts": args.num_prompts, "gamma": args.gamma,
               "threads": args.threads, "runs": []}
    single_plain = None
    for mode in modes:
        config = {"mode": mode, "devices": devices, "target": target, "draft": draft, "drafters": drafters,
                  "weights": args.weights, "max_tokens": args.max_tokens, "num_prompts": args.num_prompts,
                  "max_context": args.max_context, "gamma": args.gamma, "threads": args.threads}
        run = run_worker(__file__, config, what=f"{mode} worker", capture_stderr=False)
        for row in run["rows"]:
            if mode == "single" and row["drafter"] == "none":
                single_plain = list(row["tokens"])
            row["equals_single_plain"] = "-" if single_plain is None else row["tokens"] == single_plain
            del row["tokens"]
        results["runs"].append(run)
        print(f"{mode}: " + ", ".join(f"{row['drafter']} {row['decode_tokens_per_second']:.2f} tok/s"
                                      for row in run["rows"]), flush=True)
    columns, rows = _table(results)
    notes = [f"target {target}, draft {draft or '-'}, weights {args.weights}, devices {', '.join(devices)}; "
             f"{args.num_prompts} Spec-Bench prompts x {args.max_tokens} new tokens, γ = {args.gamma}",
             "planned: the target's tensors per device (memplanner/torch_split.py); tensors: what the backend "
             "allocated for the target; allocator peak (GPU): torch.cuda.max_memory_allocated, draft and "
             "activations included",
             "cpu:N devices share one CPU's cores: split rows there measure overhead, not speedup; and a tied "
             "head's copy on the last device, planned, shares the embeddings' memory when both are the CPU"]
    paths = write_results(RESULTS, args.name, results, f"Sharding the torch target over {', '.join(devices)}",
                          columns, rows, notes)
    print("\n".join(str(path) for path in paths))


if __name__ == "__main__":
    main()
