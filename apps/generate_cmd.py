"""`pocketspec generate`: one prompt in, the target's continuation out, sped up losslessly."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import click

from apps.batch_generate import run_batch
from apps.flags import (DashPath, backend_options, batch_options, model_choice_options, runtime_options,
                        sampling_options, session_settings, setting_option, take_batch_options)
from apps.json_refusals import JsonRefusals
from apps.terminal import note, progress_line
from apps.text_input import as_text, prompt_bytes_limit, read_text_file
from pocketspec.atomic_file import replaced_on_success
from pocketspec.conversation.chat_template import FALLBACK_NOTE
from pocketspec.errors import UserError
from pocketspec.session import open_session
from pocketspec.session_settings import check_output
from pocketspec.settings import GenerationSettings
from pocketspec.speculation.verify_mode import verify_label
from pocketspec.stats import drafting_text


def _read_prompt(prompt: str | None, prompt_file: Path | None, max_context: int | None) -> str:
    if (prompt is None) == (prompt_file is None):  # a piped prompt is not read unasked: stdin may be a shell's
        raise UserError("give exactly one of --prompt TEXT or --prompt-file FILE (--prompt-file - reads stdin)")
    if prompt_file is None:
        source, prompt = "--prompt", as_text(prompt, "--prompt")
    else:
        source = "stdin" if str(prompt_file) == "-" else f"--prompt-file {prompt_file}"
        prompt = read_text_file(prompt_file, "--prompt-file", prompt_bytes_limit(max_context))
    if not prompt.strip():
        held = "only whitespace" if prompt else "nothing"
        raise UserError(f"the prompt is empty: {source} holds {held}; give some text")
    return prompt


@click.command(cls=JsonRefusals)
@model_choice_options
@click.option("--prompt", default=None, help="Prompt text.")
@click.option("--prompt-file", type=DashPath(), default=None, help="Read the prompt from a file ('-': stdin).")
@setting_option("--max-tokens", GenerationSettings, "max_new_tokens", show_default=True)
@sampling_options
@runtime_options
@backend_options
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template (from GGUF metadata).")
@click.option("--json", "as_json", is_flag=True,
              help='Print one JSON object: text, tokens, stats; a refusal too: {"error": ...} (exit code 2).')
@batch_options
def generate(target, draft, pair, prompt, prompt_file, max_tokens, temperature, top_p, top_k, seed,
             gamma, memory_budget, max_context, kv_type, threads, repack, exact_verify, chat, as_json, **backend_args):
    """Generate a continuation of one prompt, or of every prompt of a JSONL file with --batch."""
    batch_args = take_batch_options(backend_args)
    settings = session_settings(
        target=target, draft=draft, pair=pair, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
        gamma=gamma, memory_budget=memory_budget, max_context=max_context, kv_type=kv_type, threads=threads,
        repack=repack, exact_verify=exact_verify, max_new_tokens=max_tokens, **backend_args)
    if batch_args["batch"] is not None:
        if as_json:
            raise UserError("--batch writes one JSON object per prompt already: leave --json out")
        run_batch(settings, prompt=prompt, prompt_file=prompt_file, chat=chat, batch_args=batch_args)
        return
    text = _read_prompt(prompt, prompt_file, settings.max_context)
    output = batch_args["output"]
    if output is not None:
        check_output(output, settings, prompt_file)
    # notes go to stderr; --json keeps stdout to one object
    with open_session(settings, on_note=note, on_progress=progress_line()) as session, \
            contextlib.ExitStack() as outputs:
        if output is None:
            stream = sys.stdout
        else:
            stream = outputs.enter_context(replaced_on_success(output, what="--output"))
        tokenizer = session.tokenizer
        if chat and session.template.is_fallback:
            note(FALLBACK_NOTE)
        prompt_tokens = session.encode(text, chat=chat)
        streamer = tokenizer.streamer()

        def show(tokens: list[int]) -> None:
            stream.write(streamer.push(tokens))
            stream.flush()

        result = session.engine.generate(prompt_tokens, max_tokens, on_tokens=None if as_json else show)
        stats = session.stats_dict(result.stats)
        if as_json:
            output_object = {"text": tokenizer.decode(result.tokens), "tokens": result.tokens,
                             "stop_reason": result.stop_reason, "seed": settings.sampling.seed, "stats": stats}
            stream.write(json.dumps(output_object) + "\n")
        else:
            stream.write(streamer.flush() + "\n")
        stream.flush()
        if not as_json:
            engine = session.engine
            verify = f"verify: {verify_label(engine.is_exact_verify)}, " if engine.drafts else ""
            click.echo(
                f"[{stats['num_tokens']} tokens, {stats['tokens_per_second']:.2f} tok/s, "
                f"{drafting_text(stats['num_drafted'], stats['num_accepted'], stats['num_steps'])}, {verify}"
                f"stop: {result.stop_reason}]",
                err=True,
            )


COMMANDS = [generate]
