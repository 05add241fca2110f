"""`pocketspec generate --prompt-file FILE.jsonl --batch N`: many prompts decoded together (torch backend).

Outputs are JSONL, one line per prompt in input order, each written as soon as it and
every prompt before it are done. The first Ctrl-C stops after the current forward:
prompts not finished are written with what they have and stop reason `interrupted`,
then the command exits with 130. An --output file appears under its name only once every
line is in it (see pocketspec/atomic_file.py), and is never one of the inputs.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

import click

from apps.backend_options import apply_backend_options
from apps.options import MODEL, SPECULATION, parse_gamma, setting_option
from apps.prompt_jsonl import read_prompt_lines
from pocketspec.atomic_file import refuse_output_onto_inputs, replaced_on_success
from pocketspec.backends.device_check import check_devices
from pocketspec.batch.scheduler import SCHEDULERS
from pocketspec.batch.sequence import BatchResult, Request
from pocketspec.chat_template import FALLBACK_NOTE, encode_chat, template_for
from pocketspec.errors import UserError
from pocketspec.loader import ModelChoice, choose_models, trained_context_limit
from pocketspec.settings import BatchSettings, ModelSettings, SamplingSettings

BATCH = BatchSettings()
BATCH_OPTIONS = ("batch", "output", "scheduler", "batch_invariant", "pool_rows")


def batch_options(function):
    options = [
        setting_option("--batch", BatchSettings, "max_batch", default=None,
                       help="Decode the prompts of a JSONL --prompt-file (one {\"prompt\": ...} per line) N at a "
                            "time with continuous batching (--backend torch); writes one JSON line per prompt."),
        click.option("--output", type=click.Path(path_type=Path, dir_okay=False), default=None,
                     help="Write the output here instead of stdout (the JSONL lines with --batch); "
                          "the file appears once it is complete."),
        click.option("--scheduler", type=click.Choice(SCHEDULERS), default=BATCH.scheduler, show_default=True,
                     help="--batch: step the longest-waiting rows together (pad) or equal-length rows (group)."),
        click.option("--batch-invariant/--fast-batch", "batch_invariant", default=BATCH.is_batch_invariant,
                     show_default="invariant on a CPU, fast on a GPU", help="--batch: kernels whose result for a token does not depend on the rest "
                                             "of the batch (greedy output = each prompt alone), or faster ones."),
        setting_option("--pool-rows", BatchSettings, "num_rows", show_default=True,
                       help="--batch: sequences held at once, from which each step picks (0: the batch size)."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def take_batch_options(options: dict) -> dict:
    """Remove the batch flags from a command's keyword arguments and return them."""
    return {name: options.pop(name) for name in BATCH_OPTIONS}


def _encoder(tokenizer, chat: bool):
    """text -> prompt tokens, in the chat template with --chat (a model without one gets ChatML, said once)."""
    if not chat:
        return lambda text: tokenizer.encode(text, add_bos=tokenizer.adds_bos, parse_special=False)
    template = template_for(tokenizer)
    if template.is_fallback:
        click.echo(FALLBACK_NOTE, err=True)
    return lambda text: encode_chat(tokenizer, template, [{"role": "user", "content": text}])


def _plan(choice: ModelChoice, budget: str, target_settings: ModelSettings, speculation, batch: BatchSettings):
    from apps.budget import parse_budget
    from memplanner.batch_rows import BatchWorkload, kv_dtype_for, plan_batch
    from memplanner.shapes import shape_from_gguf
    from memplanner.sizes import format_bytes
    from memplanner.torch_peak import heap_reserve_bytes
    from memplanner.torch_sizes import gguf_layout, resolve_weights_format
    from pocketspec.batch.layout import round_up

    budget_bytes = parse_budget(budget)
    on_gpu = target_settings.is_on_gpu
    weights = resolve_weights_format(target_settings.weights, on_gpu)
    shape = shape_from_gguf(choice.target_path)
    is_tied, has_qkv_bias = gguf_layout(choice.target_path)
    capacity = round_up(target_settings.max_context, batch.key_block)
    workload = BatchWorkload(max_context=capacity, max_batch=batch.max_batch, num_rows=batch.num_rows,
                             max_gamma=speculation.max_gamma, query_tile=batch.query_tile, key_block=batch.key_block,
                             n_batch=target_settings.n_batch)
    draft_shape = shape_from_gguf(choice.draft_path) if choice.draft_path is not None else None
    draft_layers = 0
    if choice.drafter == "self-skip":
        draft_layers = speculation.skip_layers_kept(shape.num_layers)
    plan = plan_batch(shape, workload, budget_bytes=budget_bytes, weights_format=weights,
                      kv_dtype=kv_dtype_for(target_settings.torch_kv_type, weights, on_gpu), is_tied=is_tied,
                      has_qkv_bias=has_qkv_bias, on_gpu=on_gpu, draft_shape=draft_shape,
                      draft_is_tied=draft_shape is not None and gguf_layout(choice.draft_path)[0],
                      draft_layers=draft_layers)
    if not plan.feasible:
        raise UserError(plan.reason)
    parts = ", ".join(f"{name} {format_bytes(size)}" for name, size in plan.terms.items())
    reserve = heap_reserve_bytes(on_gpu)
    kept_free = f" + {format_bytes(reserve)} kept free" if reserve else ""
    notes = [f"memory plan (batch): predicted peak {format_bytes(plan.total_bytes)}{kept_free} of "
             f"{format_bytes(budget_bytes)} ({parts})", *(f"memory plan (batch): {note}" for note in plan.notes)]
    return replace(batch, max_batch=plan.max_batch, num_rows=plan.num_rows), notes


class OrderedWriter:
    """Writes results in input order as soon as each one and all before it are done."""

    def __init__(self, stream, tokenizer):
        self.stream, self.tokenizer = stream, tokenizer
        self.pending: dict[int, BatchResult] = {}
        self.next_index = 0

    def __call__(self, result: BatchResult) -> None:
        self.pending[result.index] = result
        while self.next_index in self.pending:
            done = self.pending.pop(self.next_index)
            stats = {**done.stats.as_dict(), "latency_seconds": round(done.latency_seconds, 4)}
            line = {"index": done.index, "text": self.tokenizer.decode(done.tokens), "tokens": done.tokens,
                    "stop_reason": done.stop_reason, "stats": stats}
            self.stream.write(json.dumps(line) + "\n")
            self.stream.flush()
            self.next_index += 1


def refuse_single_prompt_flags(*, kv_type: str | None, repack: bool | None, exact_verify: bool) -> None:
    """The llama.cpp and one-prompt flags that batched decoding on torch has no use for: refused, not dropped."""
    if kv_type is not None:
        raise UserError(f"--kv-type {kv_type} sizes llama.cpp's KV cache and --batch runs on torch: "
                        "use --torch-kv-type instead")
    if repack is not None:
        flag = "--repack" if repack else "--no-repack"
        raise UserError(f"{flag} applies to llama.cpp's weights and --batch runs on torch: leave it out")
    if exact_verify:
        raise UserError("--exact-verify applies to one prompt at a time, not --batch: leave it out "
                        "(--batch-invariant keeps each prompt's tokens independent of the batch)")


def run_batch(*, target, draft, pair, prompt, prompt_file, max_tokens, temperature, top_p, top_k, seed, gamma,
              memory_budget, max_context, threads, kv_type, repack, exact_verify, chat, batch_args: dict,
              backend_args: dict) -> None:
    from pocketspec.batch.open import open_batch_engine

    refuse_single_prompt_flags(kv_type=kv_type, repack=repack, exact_verify=exact_verify)
    if prompt is not None or prompt_file is None:
        raise UserError("--batch reads its prompts from --prompt-file FILE (one JSON object per line), not --prompt")
    lines = read_prompt_lines(prompt_file)
    choice = choose_models(target=target, draft=draft, pair=pair)
    output = batch_args["output"]
    if output is not None:
        refuse_output_onto_inputs(output, [("--prompt-file", prompt_file), *model_inputs(choice)], flag="--output")
    fixed_gamma = parse_gamma(gamma)
    max_context = trained_context_limit(choice.target_path, max_context, MODEL.max_context)
    target_settings = ModelSettings(num_threads=threads, max_context=max_context)
    speculation = replace(SPECULATION, gamma=fixed_gamma,
                          max_gamma=SPECULATION.max_gamma if fixed_gamma is None else fixed_gamma)
    target_settings, speculation = apply_backend_options(target_settings, speculation, backend_args)
    check_devices(target_settings)
    if target_settings.backend != "torch":
        raise UserError("--batch decodes on --backend torch only; add --backend torch")
    batch = replace(BATCH, max_batch=batch_args["batch"], num_rows=batch_args["pool_rows"],
                    scheduler=batch_args["scheduler"], is_batch_invariant=batch_args["batch_invariant"])
    if memory_budget is not None:
        batch, notes = _plan(choice, memory_budget, target_settings, speculation, batch)
        for note in notes:
            click.echo(note, err=True)
    sampling = SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    opened = open_batch_engine(choice, target_settings=target_settings, speculation=speculation, sampling=sampling,
                               batch=batch)
    try:
        encode = _encoder(opened.tokenizer, chat)
        requests = [Request(encode(line.text), line.max_tokens or max_tokens,
                            seed + index if line.seed is None else line.seed) for index, line in enumerate(lines)]
        for line, request in zip(lines, requests):
            if len(request.prompt) >= target_settings.max_context:
                raise UserError(f"--prompt-file {prompt_file} line {line.line_number}: the prompt has "
                                f"{len(request.prompt)} tokens but the context holds {target_settings.max_context}; "
                                "shorten it or raise --max-context")
        if output is None:
            is_interrupted = _decode(opened.engine, requests, OrderedWriter(sys.stdout, opened.tokenizer))
        else:
            with replaced_on_success(output, what="--output") as stream:
                is_interrupted = _decode(opened.engine, requests, OrderedWriter(stream, opened.tokenizer))
    finally:
        opened.close()
    if is_interrupted:
        raise click.Abort()


def model_inputs(choice: ModelChoice) -> list[tuple[str, Path | None]]:
    """The model files a run reads, named by their flags, for refuse_output_onto_inputs."""
    return [("--target", choice.target_path), ("--draft", choice.draft_path)]


def _decode(engine, requests: list[Request], writer: OrderedWriter) -> bool:
    """Decode every request through `writer`; True when a Ctrl-C cut the run short."""
    interrupted = []

    def on_sigint(signum, frame) -> None:
        interrupted.append(True)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C stops at once

    previous_handler = signal.signal(signal.SIGINT, on_sigint)
    started = time.perf_counter()
    try:
        results = engine.run(requests, on_finished=writer, should_stop=lambda: bool(interrupted))
    finally:
        signal.signal(signal.SIGINT, previous_handler)
    seconds = time.perf_counter() - started
    num_tokens = sum(len(result.tokens) for result in results)
    num_drafted = sum(result.stats.num_drafted for result in results)
    num_accepted = sum(result.stats.num_accepted for result in results)
    click.echo(f"[{len(results)} prompts, {num_tokens} tokens, {num_tokens / seconds:.2f} tok/s in all, "
               f"acceptance {num_accepted / max(num_drafted, 1):.0%}, "
               f"{engine.alignment_seconds / seconds:.1%} of the time aligning rows]", err=True)
    return bool(interrupted)
