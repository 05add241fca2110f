"""Every flag of the commands that load models, in one place: click options whose defaults,
choices and ranges come from their homes (pocketspec/settings.py, memplanner.defaults).

A command passes what they parse to pocketspec.session_settings.SessionSettings; nothing here
builds runtime settings itself."""

from __future__ import annotations

from pathlib import Path

import click
from click.core import ParameterSource

from pocketspec.errors import UserError
from pocketspec.setting_ranges import parse_setting, setting_range
from pocketspec.serve.serve_settings import ServeSettings
from pocketspec.session_settings import SessionSettings, check_read_by
from pocketspec.settings import (ATTENTION_SINK_TOKENS, AUTO, BACKENDS, DECODE_STEPS, LLAMA_KV_TYPES, RANDOM_SEED, SCHEDULERS,
                                 EXECUTION_PROVIDERS, SELF_DRAFT_KEYS, SPLIT_MODES, TORCH_KV_TYPES, TORCH_WEIGHTS,
                                 BatchSettings,
                                 GenerationSettings, ModelSettings, SamplingSettings, SpeculationSettings,
                                 default_num_threads, resolve_weights_format)

SAMPLING = SamplingSettings()
SPECULATION = SpeculationSettings()
MODEL = ModelSettings()
GENERATION = GenerationSettings()
BATCH = BatchSettings()
BATCH_ONLY_OPTIONS = ("scheduler", "batch_invariant", "pool_rows")  # read by --batch alone
BATCH_OPTIONS = ("batch", "output", *BATCH_ONLY_OPTIONS)


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


def _seed_option(*, is_per_request: bool):
    same_reply = ("A seed gives plain sampling's reply whatever drafts it, at any --gamma (where a verify or a "
                  "batch rounds differently, a near-tie can part them).")
    if is_per_request:
        return setting_option("--seed", SamplingSettings, "seed", default=ServeSettings().default_seed,
                              show_default=True, help="Seed of a request that gives none; -1 draws one for each "
                              "request, named in its x-pocketspec-seed header. " + same_reply)
    return setting_option("--seed", SamplingSettings, "seed", show_default=True, callback=_draw_seed,
                          help="Sampling seed; -1 draws a random one and shows it. " + same_reply)


def sampling_options(function, *, is_per_request: bool = False):
    """--temperature, --top-p, --top-k and --seed; is_per_request (serve): they are defaults of requests, and
    --seed -1 is drawn again for every request rather than once."""
    function = _seed_option(is_per_request=is_per_request)(function)
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


def kv_type_option(function):
    return click.option("--kv-type", type=click.Choice(LLAMA_KV_TYPES), default=None,
                        help="The target's KV cache type [default: f16]; a memory plan never changes it, "
                             "only the draft's. bf16, as big as f16, keeps llama.cpp's CPU batches rounding like "
                             "one-token decoding past 256 cached tokens on a stock llama.cpp build, so --exact-verify "
                             "drafts there (wider with --no-repack).")(function)


def runtime_options(function):
    function = click.option("--exact-verify/--fast-verify", default=SPECULATION.exact_verify,
                            help="Only verify batches proven to round bit for bit like one-token decoding, or "
                                 "draft freely: a greedy token may then differ where the target's two best logits "
                                 "are within kernel rounding [default: exact where that costs no speed (llama.cpp "
                                 "on the CPU with PocketSpec's row-exact kernels, see `pocketspec doctor`), fast "
                                 "elsewhere].")(function)
    function = repack_option(function)
    function = threads_option(function)
    function = kv_type_option(function)
    function = click.option("--max-context", type=SettingValue(ModelSettings, "max_context"), default=None,
                            help=f"Target context in tokens [default: {MODEL.max_context}].")(function)
    function = click.option("--memory-budget", default=None, help="Memory budget for everything, e.g. 512MiB, 3GiB, 3.5G.")(function)
    function = click.option("--gamma", default="auto", show_default=True, help="Draft length: `auto` (adaptive) or a fixed N.")(function)
    return function


def _backend_option(help_text: str):
    return click.option("--backend", type=click.Choice(BACKENDS), default=MODEL.backend, show_default=True,
                        help=help_text)


TORCH_WEIGHTS_HELP = (f"torch weight format (auto: {resolve_weights_format(AUTO, on_gpu=False)} on a CPU, "
                      f"{resolve_weights_format(AUTO, on_gpu=True)} on a GPU, fp16 where bf16 is emulated); "
                      "int8/int4 quantize on load.")


def _weights_option(help_text: str):
    return click.option("--weights", type=click.Choice(TORCH_WEIGHTS), default=MODEL.weights, show_default=True,
                        help=help_text)


BACKEND_OPTIONS = {  # flag -> its click option, in --help's order
    "--backend": _backend_option(
        "Inference backend: llama.cpp (GGUF, CPU/GPU builds), torch (PyTorch; CPU, CUDA, ROCm) or onnx "
        "(ONNX Runtime, the GGUF exported once; its device is --ep)."),
    "--ep": click.option(
        "--ep", "execution_provider", type=click.Choice(EXECUTION_PROVIDERS), default=MODEL.execution_provider,
        show_default=True, help="--backend onnx: ONNX Runtime's execution provider (pocketspec doctor lists "
                                "those present)."),
    "--device": click.option(
        "--device", default=MODEL.device, show_default=True, help="torch device: cpu, cuda, cuda:N or rocm."),
    "--devices": click.option(
        "--devices", default=",".join(MODEL.devices) or None,
        help="Split the target over several devices, e.g. cuda:0,cuda:1 (cpu:0,cpu:1 simulates two on one CPU); "
             "with --memory-budget 6GiB,4GiB (or cuda:0=6GiB,...) the plan gives each its blocks and places the "
             "draft."),
    "--split-mode": click.option(
        "--split-mode", type=click.Choice(SPLIT_MODES), default=MODEL.split_mode, show_default=True,
        help="With --devices: layer gives each device a run of blocks; row splits every matrix over them (tensor "
             "parallel; torch: one process per device, or run under torchrun)."),
    "--weights": _weights_option(
        TORCH_WEIGHTS_HELP + " --backend onnx: fp32, fp16 or int4 (MatMulNBits; auto: fp32 on the cpu provider, "
                             "fp16 on a GPU's)."),
    "--torch-kv-type": click.option(
        "--torch-kv-type", type=click.Choice(TORCH_KV_TYPES), default=MODEL.torch_kv_type, show_default=True,
        help="torch KV cache dtype (auto: the weights' compute dtype)."),
    "--compile": click.option(
        "--compile/--no-compile", "compile", default=MODEL.compile,
        help="torch.compile the torch model's forward (default: on a GPU with the static decode step, whose every "
             "step is a CUDA graph replay either way; asked for, it takes the static step unless --decode-step "
             "dynamic or --devices: compiled, the dynamic step decodes several times slower). On a CPU it does not "
             "pay."),
    "--decode-step": click.option(
        "--decode-step", type=click.Choice(DECODE_STEPS), default=MODEL.decode_step, show_default=True,
        help="torch decode step: static (fixed shapes, tokens chosen and verified on the device, one read back "
             "per step), dynamic, or auto (static on a GPU or with --compile)."),
    "--max-gamma": setting_option(
        "--max-gamma", SpeculationSettings, "max_gamma", show_default=True,
        help="Longest draft of a draft model (the adaptive γ's ceiling); `pocketspec plan` takes the same flag."),
    "--self-draft-window": setting_option(
        "--self-draft-window", SpeculationSettings, "self_draft_window", show_default=True,
        help=f"--draft self-sparse: KV positions the draft keeps ({ATTENTION_SINK_TOKENS} sinks + recent)."),
    "--self-draft-kv-type": click.option(
        "--self-draft-kv-type", type=click.Choice(TORCH_KV_TYPES), default=SPECULATION.self_draft_kv_type,
        show_default=True, help="--draft self-sparse: the draft's KV dtype."),
    "--self-draft-keys": click.option(
        "--self-draft-keys", type=click.Choice(SELF_DRAFT_KEYS), default=SPECULATION.self_draft_keys,
        show_default=True,
        help="--draft self-sparse: what the window keeps besides recent tokens: the attention sinks, or the keys "
             "the target attended to most (SnapKV-style, chosen again as the window fills)."),
    "--self-skip-layers": setting_option(
        "--self-skip-layers", SpeculationSettings, "self_skip_layers", show_default=True,
        help="--draft self-skip: first layers the draft runs (0: half)."),
}


# the torch flags `pocketspec plan` takes, for a batch (--batch N, on one device) or a split (--devices); it has its
# own --max-gamma
PLAN_BATCH_FLAGS = ("--backend", "--device", "--split-mode", "--weights", "--torch-kv-type", "--self-draft-window",
                    "--self-draft-kv-type", "--self-skip-layers")  # not --self-draft-keys: either window plans alike
# plan's own help for two of them: it plans llama.cpp sessions and torch batches or splits, never onnx
PLAN_BACKEND_OPTIONS = {
    "--backend": _backend_option(
        "What to plan: llama.cpp sessions, or with torch a --batch N pool or a --devices split. onnx is not "
        "planned here: `generate --backend onnx --memory-budget ...` prints its plan before it runs."),
    "--weights": _weights_option(TORCH_WEIGHTS_HELP),
}


def backend_options(function=None, *, flags: tuple[str, ...] | None = None, replaced: dict | None = None):
    """The backend flags, as @backend_options, or only those named: @backend_options(flags=(...)); replaced:
    flag -> the option a command takes in its place (PLAN_BACKEND_OPTIONS)."""
    def decorate(command):
        for flag, option in reversed(BACKEND_OPTIONS.items()):
            if flags is None or flag in flags:
                command = (replaced or {}).get(flag, option)(command)
        return command

    return decorate if function is None else decorate(function)


class DashPath(click.Path):
    """A path where "-" means stdin or stdout; ./- (which pathlib prints as "-") is the file named "-"."""

    def __init__(self, **options):
        super().__init__(path_type=Path, dir_okay=False, **options)

    def convert(self, value, param, ctx):
        path = super().convert(value, param, ctx)
        if isinstance(value, str) and value != "-" and str(path) == "-":
            return Path.cwd() / "-"
        return path


def _dash_is_stdout(ctx, param, path: Path | None) -> Path | None:
    """--output -: stdout, as --prompt-file - is stdin (a file named "-" is ./-)."""
    return None if path is not None and str(path) == "-" else path


def batch_options(function):
    options = [
        setting_option("--batch", BatchSettings, "max_batch", default=None,
                       help="Decode the prompts of a JSONL --prompt-file (one {\"prompt\": ...} per line) N at a "
                            "time with continuous batching (torch or llama.cpp); writes one JSON line per prompt."),
        click.option("--output", type=DashPath(allow_dash=True), default=None,
                     callback=_dash_is_stdout,
                     help="Write the output here instead of stdout (the JSONL lines with --batch); "
                          "the file appears once it is complete ('-': stdout). A --batch stopped by Ctrl-C or "
                          "SIGTERM writes what it has, beside an earlier out.jsonl as out.interrupted.jsonl."),
        click.option("--scheduler", type=click.Choice(SCHEDULERS), default=BATCH.scheduler, show_default=True,
                     help="--batch: step the longest-waiting rows together (pad) or equal-length rows (group)."),
        click.option("--batch-invariant/--fast-batch", "batch_invariant", default=BATCH.is_batch_invariant,
                     show_default="invariant on a CPU, fast on a GPU", help="--batch on torch: kernels whose result for a token does not depend on the rest "
                                             "of the batch (greedy output = each prompt alone), or faster ones."),
        setting_option("--pool-rows", BatchSettings, "num_rows", show_default=True,
                       help="--batch: sequences held at once, from which each step picks (0: the batch size)."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def is_given(name: str) -> bool:
    """Whether the running command's line gave the parameter `name`, rather than leaving its default."""
    return click.get_current_context().get_parameter_source(name) not in (None, ParameterSource.DEFAULT)


def refuse_unread_backend_flags(backend_args: dict) -> None:
    """Refuse a flag of backend_options (their values by name) that the command line gave and its --backend does
    not read, even at its default value: apply_backend_options compares values, so `--ep cpu` passed unread on
    llama.cpp."""
    check_read_by(backend_args["backend"], [name for name in backend_args if is_given(name)])


def take_batch_options(options: dict) -> dict:
    """Remove the batch flags from a command's keyword arguments and return them; without --batch, a flag
    that only --batch reads is refused rather than ignored."""
    taken = {name: options.pop(name) for name in BATCH_OPTIONS}
    if taken["batch"] is None:
        context = click.get_current_context()
        for name in BATCH_ONLY_OPTIONS:
            if is_given(name):
                flag = "/".join(next(param.opts + param.secondary_opts for param in context.command.params
                                     if param.name == name))
                raise UserError(f"{flag} applies to --batch; add --batch N or leave it out")
    elif is_given("batch_invariant") and options.get("backend") != "torch":  # the default is every backend's
        flag = "--batch-invariant" if taken["batch_invariant"] else "--fast-batch"
        raise UserError(f"{flag} sets the torch backend's kernels; add --backend torch or leave it out")
    return taken


def session_settings(*, target, draft, pair, temperature, top_p, top_k, seed, gamma, memory_budget, max_context,
                     kv_type, threads, repack, exact_verify, max_new_tokens, pull_if_missing=False,
                     **backend_args) -> SessionSettings:
    """The flags of model_choice_options, sampling_options, runtime_options and backend_options, as the
    one SessionSettings every command opens its session from."""
    refuse_unread_backend_flags(backend_args)
    return SessionSettings(
        target=target, draft=draft, pair=pair,
        sampling=SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed),
        gamma=parse_gamma(gamma), memory_budget=memory_budget, max_context=max_context, kv_type=kv_type,
        threads=threads, max_new_tokens=max_new_tokens, repack=repack, exact_verify=exact_verify,
        options=backend_args, pull_if_missing=pull_if_missing)
