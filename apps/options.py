"""Click options shared by the commands that load models; defaults come from pocketspec.settings."""

from __future__ import annotations

import click

from memplanner.defaults import LLAMA_KV_TYPES
from pocketspec.errors import UserError
from pocketspec.setting_ranges import parse_setting, setting_range
from pocketspec.settings import (RANDOM_SEED, GenerationSettings, ModelSettings, SamplingSettings,
                                 SpeculationSettings, default_num_threads)

SAMPLING = SamplingSettings()
SPECULATION = SpeculationSettings()
MODEL = ModelSettings()
GENERATION = GenerationSettings()


class SettingValue(click.ParamType):
    """A flag's type made from the range its settings field declares (pocketspec/settings.py)."""

    def __init__(self, settings_class, field_name: str):
        self.settings_class, self.field_name = settings_class, field_name
        self.name = "integer" if setting_range(settings_class, field_name).is_integer else "number"

    def convert(self, value, param, ctx):
        return parse_setting(self.settings_class, self.field_name, value)  # UserError: one line, exit 2


_FIELD_DEFAULT = object()


def setting_option(flag: str, settings_class, field_name: str, default=_FIELD_DEFAULT, **options):
    """click.option for a numeric setting; the default is the field's own unless given."""
    if default is _FIELD_DEFAULT:
        default = getattr(settings_class(), field_name)
    return click.option(flag, type=SettingValue(settings_class, field_name), default=default, **options)


def _draw_seed(ctx, param, seed: int) -> int:
    if seed != RANDOM_SEED:
        return seed
    drawn = SamplingSettings(seed=seed).with_seed_drawn().seed
    click.echo(f"--seed -1: drew seed {drawn} (pass --seed {drawn} to repeat this run)", err=True)
    return drawn


def _cap_threads(ctx, param, num_threads: int) -> int:
    num_cores = default_num_threads()
    if num_threads <= num_cores:
        return num_threads
    click.echo(f"--threads {num_threads} is more than the {num_cores} cores this process may use; using "
               f"{num_cores}", err=True)
    return num_cores


def threads_option(function, help_text: str = "CPU threads (0: all this process may use)."):
    return setting_option("--threads", ModelSettings, "num_threads", callback=_cap_threads, help=help_text)(function)


def model_choice_options(function):
    """--target/--draft/--pair: catalog names or GGUF paths; the draft may be `ngram` or `none`."""
    function = click.option("--pair", default=None, help="Catalog pair preset, e.g. qwen-coder (the default).")(function)
    function = click.option("--draft", default=None, help="Draft: catalog name, GGUF path, `ngram`, `none`, "
                            "or (--backend torch) `self-sparse` or `self-skip`.")(function)
    function = click.option("--target", default=None, help="Target: catalog name or GGUF path.")(function)
    return function


def sampling_options(function):
    function = setting_option("--seed", SamplingSettings, "seed", show_default=True, callback=_draw_seed,
                              help="-1 draws a random seed and shows it. "
                                   "Sampling seed. A fixed --gamma makes a seeded run repeatable; with --gamma auto "
                                 "the draft lengths follow measured timings, and so do the random draws.")(function)
    function = setting_option("--top-k", SamplingSettings, "top_k", show_default=True, help="0 keeps all tokens.")(function)
    function = setting_option("--top-p", SamplingSettings, "top_p", show_default=True)(function)
    function = setting_option("--temperature", SamplingSettings, "temperature", show_default=True,
                              help="0 is greedy.")(function)
    return function


def parse_gamma(value: str) -> int | None:
    """`auto` (None: adaptive) or a fixed draft length in SpeculationSettings.gamma's range."""
    if value.strip() == "auto":
        return None
    try:
        return parse_setting(SpeculationSettings, "gamma", value)
    except UserError:
        raise UserError(f"--gamma must be `auto` or {setting_range(SpeculationSettings, 'gamma').describe()}, "
                        f"got {value!r}") from None


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
    function = threads_option(function)
    function = click.option("--kv-type", type=click.Choice(LLAMA_KV_TYPES), default=None,
                            help="The target's KV cache type [default: f16]; a memory plan never changes it, "
                                 "only the draft's.")(function)
    function = click.option("--max-context", type=SettingValue(ModelSettings, "max_context"), default=None,
                            help=f"Target context in tokens [default: {MODEL.max_context}].")(function)
    function = click.option("--memory-budget", default=None, help="Memory budget for everything, e.g. 512MiB, 3GiB, 3.5G.")(function)
    function = click.option("--gamma", default="auto", show_default=True, help="Draft length: `auto` (adaptive) or a fixed N.")(function)
    return function
