"""Click options shared by the commands that load models; defaults come from pocketspec.settings."""

from __future__ import annotations

import click

from memplanner.defaults import LLAMA_KV_TYPES
from pocketspec.errors import UserError
from pocketspec.settings import GenerationSettings, ModelSettings, SamplingSettings, SpeculationSettings

SAMPLING = SamplingSettings()
SPECULATION = SpeculationSettings()
MODEL = ModelSettings()
GENERATION = GenerationSettings()
LARGEST_GAMMA = 32  # the longest draft --gamma and plan's --max-gamma accept


def model_choice_options(function):
    """--target/--draft/--pair: catalog names or GGUF paths; the draft may be `ngram` or `none`."""
    function = click.option("--pair", default=None, help="Catalog pair preset, e.g. qwen-coder (the default).")(function)
    function = click.option("--draft", default=None, help="Draft: catalog name, GGUF path, `ngram`, `none`, "
                            "or (--backend torch) `self-sparse` or `self-skip`.")(function)
    function = click.option("--target", default=None, help="Target: catalog name or GGUF path.")(function)
    return function


def sampling_options(function):
    function = click.option("--seed", type=int, default=SAMPLING.seed, show_default=True,
                            help="Sampling seed. A fixed --gamma makes a seeded run repeatable; with --gamma auto "
                                 "the draft lengths follow measured timings, and so do the random draws.")(function)
    function = click.option("--top-k", type=click.IntRange(min=0), default=SAMPLING.top_k, show_default=True, help="0 keeps all tokens.")(function)
    function = click.option("--top-p", type=click.FloatRange(min=0.0, max=1.0, min_open=True), default=SAMPLING.top_p, show_default=True)(function)
    function = click.option("--temperature", type=click.FloatRange(min=0.0), default=SAMPLING.temperature, show_default=True, help="0 is greedy.")(function)
    return function


def parse_gamma(value: str) -> int | None:
    if value == "auto":
        return None
    try:
        gamma = int(value)
    except ValueError:
        raise UserError(f"--gamma must be `auto` or a whole number from 0 to {LARGEST_GAMMA}, got {value!r}") from None
    if not 0 <= gamma <= LARGEST_GAMMA:
        raise UserError(f"--gamma must be `auto` or a whole number from 0 to {LARGEST_GAMMA}, got {gamma}")
    return gamma


def repack_option(function):
    return click.option("--repack/--no-repack", default=None,
                        help="Repack llama.cpp's CPU weights: faster decoding, a second copy of most weights in "
                             "memory [default: repack, unless --memory-budget needs that memory].")(function)


def repack_allowed(repack: bool | None) -> tuple[bool, ...]:
    """The weight layouts a plan may choose: the user's, or either when --repack/--no-repack is not given."""
    return (MODEL.repack_weights, not MODEL.repack_weights) if repack is None else (repack,)


def runtime_options(function):
    function = click.option("--exact-verify/--fast-verify", default=SPECULATION.exact_verify, show_default=True,
                            help="Only verify batches proven to round bit for bit like one-token decoding "
                                 "(on a CPU that means plain decoding), or draft freely: a greedy token may then "
                                 "differ where the target's two best logits are within kernel rounding.")(function)
    function = repack_option(function)
    function = click.option("--threads", type=click.IntRange(min=0), default=MODEL.num_threads, help="CPU threads (0: all this process may use).")(function)
    function = click.option("--kv-type", type=click.Choice(LLAMA_KV_TYPES), default=None,
                            help="The target's KV cache type [default: f16]; a memory plan never changes it, "
                                 "only the draft's.")(function)
    function = click.option("--max-context", type=click.IntRange(min=64, max=131072), default=None, help=f"Target context in tokens [default: {MODEL.max_context}].")(function)
    function = click.option("--memory-budget", default=None, help="Memory budget for everything, e.g. 512MiB, 3GiB, 3.5G.")(function)
    function = click.option("--gamma", default="auto", show_default=True, help="Draft length: `auto` (adaptive) or a fixed N.")(function)
    return function
