"""`pocketspec generate --prompt-file FILE.jsonl --batch N`: many prompts decoded together (torch or llama.cpp).

Outputs are JSONL, one line per prompt in input order, each written as soon as it and
every prompt before it are done, with the prompt's id and line in the file. The first Ctrl-C
(or SIGTERM, or SIGHUP unless ignored) stops after the current forward: prompts not finished are
written with what they have and stop reason `interrupted`, then the command exits with 130 (143,
129). An --output file appears under its name only once every line is in it (see
pocketspec/atomic_file.py), and is never one of the inputs; an interrupted run never replaces an
earlier file: its lines go beside it (out.jsonl: out.interrupted.jsonl).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

import click

from apps.flags import BATCH
from apps.prompt_file import PromptRow, read_batch_prompts
from apps.terminal import note
from pocketspec.atomic_file import replaced_on_success
from pocketspec.batch.sequence import BatchResult, Request
from pocketspec.batch_session import open_batch_session
from pocketspec.conversation.chat_template import FALLBACK_NOTE
from pocketspec.errors import UserError
from pocketspec.session_settings import SessionSettings, check_output
from pocketspec.setting_ranges import setting_range
from pocketspec.settings import SamplingSettings
from pocketspec.signals import STOP_SIGNALS, Terminated
from pocketspec.stats import drafting_text


class OrderedWriter:
    """Writes results in input order as soon as each one and all before it are done, each with the seed it
    sampled with (the same prompt alone with that --seed gives the same tokens)."""

    def __init__(self, stream, tokenizer, seeds: list[int], rows: list[PromptRow]):
        self.stream, self.tokenizer, self.seeds, self.rows = stream, tokenizer, seeds, rows
        self.pending: dict[int, BatchResult] = {}
        self.next_index = 0

    def __call__(self, result: BatchResult) -> None:
        self.pending[result.index] = result
        while self.next_index in self.pending:
            done = self.pending.pop(self.next_index)
            stats = {**done.stats.as_dict(), "latency_seconds": round(done.latency_seconds, 4)}
            row = self.rows[done.index]
            line = {"index": done.index, "id": row.given_id, "line": row.line_number,
                    "text": self.tokenizer.decode(done.tokens), "tokens": done.tokens,
                    "stop_reason": done.stop_reason, "seed": self.seeds[done.index], "stats": stats}
            self.stream.write(json.dumps(line) + "\n")
            self.stream.flush()
            self.next_index += 1


def refuse_single_prompt_flags(settings: SessionSettings) -> None:
    """The flags batched decoding has no use for: refused, not dropped (settings_for refuses --kv-type on torch)."""
    if settings.repack is not None and settings.options.get("backend") == "torch":
        flag = "--repack" if settings.repack else "--no-repack"
        raise UserError(f"{flag} applies to llama.cpp's weights, not --backend torch: leave it out")
    if settings.exact_verify:
        raise UserError("--exact-verify applies to one prompt at a time, not --batch: leave it out "
                        "(each prompt's tokens are independent of the batch with --batch-invariant on --backend torch, "
                        "and on llama.cpp's CPU backend with its row-exact kernels)")


def run_batch(settings: SessionSettings, *, prompt, prompt_file, chat: bool, batch_args: dict) -> None:
    refuse_single_prompt_flags(settings)
    if prompt is not None:
        raise UserError("--batch reads its prompts from --prompt-file FILE (one JSON object per line), not --prompt")
    if prompt_file is None:
        raise UserError("--batch needs --prompt-file FILE: one JSON object per line, e.g. {\"prompt\": \"...\"}")
    if 0 < batch_args["pool_rows"] < batch_args["batch"]:  # a step picks its rows among those held
        raise UserError(f"--pool-rows {batch_args['pool_rows']} holds fewer sequences than --batch "
                        f"{batch_args['batch']} steps together: raise it, or leave it out (the batch size)")
    lines = read_batch_prompts(prompt_file)
    output = batch_args["output"]
    if output is not None:
        check_output(output, settings, prompt_file)
    num_prompts = len(lines)  # more rows than prompts would hold (and plan) sequences no prompt fills
    batch = replace(BATCH, max_batch=min(batch_args["batch"], num_prompts),
                    num_rows=min(batch_args["pool_rows"], num_prompts), scheduler=batch_args["scheduler"],
                    is_batch_invariant=batch_args["batch_invariant"])
    with open_batch_session(settings, batch, on_note=note) as session:
        if chat and session.template.is_fallback:
            note(FALLBACK_NOTE)
        requests = [Request(session.encode(line.text, chat=chat), line.max_tokens or settings.max_new_tokens,
                            _line_seed(settings.sampling.seed, index) if line.seed is None else line.seed)
                    for index, line in enumerate(lines)]
        for line, request in zip(lines, requests):
            if len(request.prompt) >= session.max_context:
                raise UserError(f"--prompt-file {prompt_file} line {line.line_number}: the prompt has "
                                f"{len(request.prompt)} tokens but the context holds {session.max_context}; "
                                "shorten it or raise --max-context")
        seeds = [request.seed for request in requests]
        if output is None:
            stopped_by, is_cut = _decode(session.engine, requests,
                                         OrderedWriter(sys.stdout, session.tokenizer, seeds, lines))
        else:
            with replaced_on_success(output, what="--output") as stream:
                stopped_by, is_cut = _decode(session.engine, requests,
                                             OrderedWriter(stream, session.tokenizer, seeds, lines))
                if is_cut and Path(output).expanduser().is_file():  # an earlier file: kept
                    stream.keep_beside("interrupted")
            if stream.kept_as is not None:
                note(f"{output} is left as it was; this run's lines are in {stream.kept_as}")
    if stopped_by == signal.SIGINT:
        raise click.Abort()
    if stopped_by is not None:
        raise Terminated(128 + stopped_by)


def _line_seed(seed: int, index: int) -> int:
    """A line's seed when it names none: --seed plus its index, wrapped into --seed's range (so that it can be
    passed back as --seed)."""
    return (seed + index) % (int(setting_range(SamplingSettings, "seed").high) + 1)


def _decode(engine, requests: list[Request], writer: OrderedWriter) -> tuple[int | None, bool]:
    """Decode every request through `writer`. Returns the stop signal that came (Ctrl-C, SIGTERM, SIGHUP: `timeout`
    or `docker stop` keep the finished prompts as Ctrl-C does), else None; and whether it cut a prompt short (it
    may come after the last one). A signal ignored (`nohup`, a background job) stays ignored."""
    stopped_by: list[int] = []
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}

    def on_stop(signum, frame) -> None:
        stopped_by.append(signum)
        for other, handler in previous.items():  # a second signal stops at once
            signal.signal(other, handler)

    for signum, handler in previous.items():
        if handler != signal.SIG_IGN:
            signal.signal(signum, on_stop)
    started = time.perf_counter()
    try:
        results = engine.run(requests, on_finished=writer, should_stop=lambda: bool(stopped_by))
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    seconds = time.perf_counter() - started
    num_tokens = sum(len(result.tokens) for result in results)
    num_drafted = sum(result.stats.num_drafted for result in results)
    num_accepted = sum(result.stats.num_accepted for result in results)
    prompts = f"{len(results)} prompt{'s' if len(results) != 1 else ''}"
    click.echo(f"[{prompts}, {num_tokens} tokens, {num_tokens / seconds:.2f} tok/s in all, "
               f"{drafting_text(num_drafted, num_accepted)}, "
               f"{engine.alignment_seconds / seconds:.1%} of the time aligning rows]", err=True)
    is_cut = any(result.stop_reason == "interrupted" for result in results)
    return (stopped_by[0] if stopped_by else None), is_cut
