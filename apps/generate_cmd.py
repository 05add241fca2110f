"""`pocketspec generate`: one prompt in, the target's continuation out, sped up losslessly."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import click

from apps.backend_options import backend_options
from apps.batch_generate import batch_options, model_inputs, run_batch, take_batch_options
from apps.options import GENERATION, model_choice_options, runtime_options, sampling_options, setting_option
from apps.session import open_engine
from apps.text_input import as_text, read_text_file
from pocketspec.atomic_file import refuse_output_onto_inputs, replaced_on_success
from pocketspec.chat_template import FALLBACK_NOTE, encode_chat, template_for
from pocketspec.errors import UserError
from pocketspec.settings import GenerationSettings


def _read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    if (prompt is None) == (prompt_file is None):
        raise UserError("give exactly one of --prompt TEXT or --prompt-file FILE")
    prompt = read_text_file(prompt_file, "--prompt-file") if prompt_file is not None else as_text(prompt, "--prompt")
    if not prompt.strip():
        raise UserError("the prompt is empty: pass some text with --prompt or --prompt-file")
    return prompt


@click.command()
@model_choice_options
@click.option("--prompt", default=None, help="Prompt text.")
@click.option("--prompt-file", type=click.Path(path_type=Path, dir_okay=False), default=None, help="Read the prompt from a file.")
@setting_option("--max-tokens", GenerationSettings, "max_new_tokens", show_default=True)
@sampling_options
@runtime_options
@backend_options
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template (from GGUF metadata).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: text, tokens, stats.")
@batch_options
def generate(target, draft, pair, prompt, prompt_file, max_tokens, temperature, top_p, top_k, seed,
             gamma, memory_budget, max_context, kv_type, threads, repack, exact_verify, chat, as_json, **backend_args):
    """Generate a continuation of one prompt, or of every prompt of a JSONL file with --batch."""
    batch_args = take_batch_options(backend_args)
    if batch_args["batch"] is not None:
        run_batch(target=target, draft=draft, pair=pair, prompt=prompt, prompt_file=prompt_file, max_tokens=max_tokens,
                  temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, gamma=gamma,
                  memory_budget=memory_budget, max_context=max_context, threads=threads, kv_type=kv_type,
                  repack=repack, exact_verify=exact_verify, chat=chat, batch_args=batch_args,
                  backend_args=backend_args)
        return
    text = _read_prompt(prompt, prompt_file)
    output = batch_args["output"]
    if output is not None:
        refuse_output_onto_inputs(output, [("--prompt-file", prompt_file)], flag="--output")
    with open_engine(
        target=target, draft=draft, pair=pair, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
        gamma=gamma, memory_budget=memory_budget, max_context=max_context, kv_type=kv_type, threads=threads, repack=repack, exact_verify=exact_verify,
        max_new_tokens=max_tokens, announce=True, **backend_args,  # notes go to stderr; --json keeps stdout to one object
    ) as session, contextlib.ExitStack() as outputs:
        if output is None:
            stream = sys.stdout
        else:
            refuse_output_onto_inputs(output, model_inputs(session.choice), flag="--output")
            stream = outputs.enter_context(replaced_on_success(output, what="--output"))
        tokenizer = session.engine.target.tokenizer
        if chat:
            template = template_for(tokenizer)
            if template.is_fallback:
                click.echo(FALLBACK_NOTE, err=True)
            prompt_tokens = encode_chat(tokenizer, template, [{"role": "user", "content": text}])
        else:
            prompt_tokens = tokenizer.encode(text, add_bos=tokenizer.adds_bos, parse_special=False)
        streamer = tokenizer.streamer()

        def show(tokens: list[int]) -> None:
            stream.write(streamer.push(tokens))
            stream.flush()

        result = session.engine.generate(prompt_tokens, max_tokens, on_tokens=None if as_json else show)
        stats = session.stats_dict(result.stats)
        if as_json:
            output_object = {"text": tokenizer.decode(result.tokens), "tokens": result.tokens,
                             "stop_reason": result.stop_reason, "stats": stats}
            stream.write(json.dumps(output_object) + "\n")
        else:
            stream.write(streamer.flush() + "\n")
        stream.flush()
        if not as_json:
            click.echo(
                f"[{stats['num_tokens']} tokens, {stats['tokens_per_second']:.2f} tok/s, "
                f"acceptance {stats['acceptance_rate']:.0%}, {stats['mean_accepted_per_step']:.2f} accepted/step, "
                f"stop: {result.stop_reason}]",
                err=True,
            )


COMMANDS = [generate]
