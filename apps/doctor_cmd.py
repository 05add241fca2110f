"""`pocketspec doctor`: what this machine and this install can run, for bug reports
(pocketspec/machine_report.py collects it), and `--calibrate`: this machine's forward costs."""

from __future__ import annotations

import json

import click

from apps.flags import (SettingValue, backend_options, is_given, kv_type_option, model_choice_options,
                        refuse_unread_backend_flags, repack_option, setting_option, threads_option)
from apps.json_refusals import JsonRefusals
from pocketspec.errors import UserError
from pocketspec.machine_report import collect_report
from pocketspec.settings import BatchSettings, ModelSettings

def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.1f} GiB"


def _describe_row_exact(max_rows: int, patch: str | None) -> str:
    """Which verify mode llama.cpp's CPU kernels allow for free, and why."""
    if max_rows:
        return (f"up to {max_rows} rows: CPU verify batches round like one-token decoding, so --exact-verify "
                f"(the default on the CPU) costs no speed (native/patches/row-exact-verify.patch {patch or ''})")
    if patch not in (None, "none"):
        return "off (GGML_CPU_ROW_EXACT=0): stock kernels, --exact-verify drafts less"
    return ("no: stock llama.cpp kernels, so --fast-verify is the CPU default; native/build_llama_cpp.sh builds "
            "the row-exact kernels")


def _print_human(report: dict) -> None:
    llama = report["llama_cpp"]
    build = llama["build"] or {}
    click.echo(f"python            {report['python']}")
    click.echo(f"llama-cpp-python  {llama['version'] or 'not installed'}"
               f"{'' if llama['importable'] else ' (not importable: ' + llama.get('import_error', '?') + ')'}")
    click.echo(f"built for         {build.get('accel', 'unknown (not built by native/build_llama_cpp.sh)')}")
    if build.get("cmake_args"):
        click.echo(f"cmake args        {build['cmake_args']}")
    if llama["system_info"]:
        click.echo(f"llama.cpp         {llama['system_info']}")
    if llama["importable"]:
        click.echo(f"row-exact verify  {_describe_row_exact(llama['row_exact_max_rows'], build.get('patch'))}")
    cpu = report["cpu"]
    flags = " ".join(f"{flag}={'yes' if present else 'no'}" for flag, present in cpu["flags"].items())
    click.echo(f"cpu               {cpu['model']} ({cpu['num_logical_cores']} logical cores)")
    click.echo(f"cpu flags         {flags}")
    gpu = report["gpu"]
    gpus = [f"nvidia: {gpu['nvidia_smi']}" if gpu["nvidia_smi"] else None,
            f"rocm: {gpu['rocm_smi']}" if gpu["rocm_smi"] else None,
            f"torch.cuda: {gpu['torch_cuda']}" if gpu["torch_cuda"] else None]
    click.echo(f"gpus              {'; '.join(g for g in gpus if g) or 'none found'}")
    torch_info = report["torch"]
    if torch_info is None:
        click.echo("torch             not installed (--backend torch unavailable)")
    elif "build" in torch_info:
        gpus = ", ".join(torch_info["devices"]) or "no GPU visible"
        note = "; ROCm GPUs appear as --device cuda" if torch_info["build"].startswith("rocm") else ""
        click.echo(f"torch             {torch_info['version']} ({torch_info['build']} build; {gpus}{note})")
    else:
        click.echo(f"torch             not importable: {torch_info['error']}")
    onnx_info = report["onnxruntime"]
    if onnx_info is None:
        click.echo("onnxruntime       not installed (--backend onnx unavailable)")
    elif "version" in onnx_info:
        click.echo(f"onnxruntime       {onnx_info['version']} (--ep {', '.join(onnx_info['execution_providers'])})")
    else:
        click.echo(f"onnxruntime       not importable: {onnx_info['error']}")
    memory = report["memory"]
    click.echo(f"memory            {_gib(memory['available_bytes'])} available of {_gib(memory['total_bytes'])}")
    click.echo(f"huge pages        {report['huge_pages']}")
    problem = report["pocketspec_home_problem"]
    click.echo(f"POCKETSPEC_HOME   {report['pocketspec_home']}"
               + (f" (cannot hold downloads: {problem})" if problem else ""))
    for name, model in report["models"].items():
        state = "present" if model["downloaded"] else "not downloaded"
        if model["incomplete"]:
            state = f"incomplete (not the catalog's size): pocketspec models pull {name}"
        click.echo(f"  {name:32} {state}")


def _calibrate(session_settings, as_json: bool) -> None:
    from pocketspec.backends.torch_open import check_self_draft
    from pocketspec.calibrate import calibrate_models, describe_costs
    from pocketspec.session_settings import settings_for
    from pocketspec.settings import SELF_DRAFTS

    choice, settings, speculation = settings_for(session_settings)
    if choice.drafter in SELF_DRAFTS:  # generate's own check, before anything loads
        check_self_draft(choice.drafter, settings, speculation)
    tables = calibrate_models(choice.target_path, choice.draft_path, settings,
                              on_measure=lambda line: click.echo(line, err=True))
    if as_json:  # each model's table as POCKETSPEC_HOME/costs keeps it
        click.echo(json.dumps({"tables": [{"model": json.loads(costs.key)["model"], **costs.to_json()}
                                          for costs in tables]}, indent=2))
        return
    for costs in tables:
        click.echo(f"{json.loads(costs.key)['model']}:")
        for line in describe_costs(costs):
            click.echo(line)


def _calibrate_batch(session_settings, max_batch: int, as_json: bool) -> None:
    from pocketspec.batch.step_calibration import calibrate_batch, describe_step_costs
    from pocketspec.budget.batch_preview import preview_contexts

    batch = BatchSettings(max_batch=max_batch)
    tables = calibrate_batch(session_settings, batch, on_measure=lambda line: click.echo(line, err=True))
    if as_json:
        click.echo(json.dumps({"tables": [{"role": name, **costs.to_json()} for name, costs in tables]}, indent=2))
        return
    for name, costs in tables:
        contexts = preview_contexts(max(1, max(costs.kv_seconds) // max_batch))
        click.echo(f"{name}:")
        for line in describe_step_costs(costs, max_batch, contexts):
            click.echo(line)


def _refuse_calibration_flags(ctx: click.Context) -> None:
    """Without --calibrate, the flags that choose what it measures would be ignored: refuse the first one given."""
    for param in ctx.command.params:
        if param.name not in ("as_json", "calibrate") and \
                ctx.get_parameter_source(param.name) == click.core.ParameterSource.COMMANDLINE:
            raise UserError(f"{param.opts[0]} chooses what --calibrate measures (the models, their backend and "
                            "settings); add --calibrate, or leave it out for the machine's report")


def _refuse_batch_only_flags() -> None:
    """--calibrate alone measures the models' forward costs at every width up to MAX_CALIBRATED_WIDTH, which
    neither a self-draft flag nor --max-gamma changes: refuse one given."""
    from pocketspec.calibrate import MAX_CALIBRATED_WIDTH
    from pocketspec.session_settings import SELF_DRAFT_FIELDS, flag_for

    given = next((name for name in (*SELF_DRAFT_FIELDS, "max_gamma") if is_given(name)), None)
    if given is not None:
        flag = flag_for(given)
        what = "the verify width" if given == "max_gamma" else "a self-draft"
        raise UserError(f"{flag} sets {what} --calibrate --batch N prices; add --batch N, or leave {flag} out "
                        f"(--calibrate alone measures the models' forward costs at every width up to "
                        f"{MAX_CALIBRATED_WIDTH})")


def _check_costs_writable() -> None:
    """The tables --calibrate measures are for later runs: a home that cannot keep them is refused before the
    measuring (a minute for the 1.5B target), not after it."""
    from pocketspec.measured_cache import costs_dir
    from pocketspec.models.catalog import writable_home_folder

    writable_home_folder(costs_dir(), "measured cost tables")


@click.command(name="doctor", cls=JsonRefusals)
@click.option("--json", "as_json", is_flag=True,
              help='Print the report as JSON (with --calibrate: the measured cost tables); a refusal too: '
                   '{"error": ...} (exit code 2).')
@click.option("--calibrate", is_flag=True,
              help="Measure the models' forward costs by width and context on this machine again (the table "
                   "the adaptive γ and the planner use; otherwise measured once at first use).")
@model_choice_options
@threads_option
@kv_type_option
@repack_option
@backend_options
@setting_option("--batch", BatchSettings, "max_batch", default=None,
                help="With --calibrate and --backend torch: measure the forward costs of a batch of N rows "
                     "(what `generate --batch N` and `plan --batch N` price drafting with).")
@click.option("--max-context", type=SettingValue(ModelSettings, "max_context"), default=None,
              help="With --calibrate --batch: each row's context.")
def doctor(as_json: bool, calibrate: bool, target, draft, pair, threads, kv_type, repack, batch, max_context,
           **backend_args) -> None:
    """Report the llama.cpp build, CPU, GPUs, memory and downloaded models."""
    from pocketspec.session_settings import SessionSettings

    if max_context is not None and batch is None:
        raise UserError("--max-context sizes the rows of the batch --calibrate measures; add --batch N")
    if batch is not None and not calibrate:
        raise UserError("--batch N chooses which batch --calibrate measures; add --calibrate")
    if calibrate:
        refuse_unread_backend_flags(backend_args)
        if batch is None:
            _refuse_batch_only_flags()
        _check_costs_writable()
    if batch is not None:
        _calibrate_batch(SessionSettings(target=target, draft=draft, pair=pair, threads=threads,
                                         max_context=max_context, options=backend_args), batch, as_json)
        return
    if calibrate:
        _calibrate(SessionSettings(target=target, draft=draft, pair=pair, threads=threads, kv_type=kv_type,
                                   repack=repack, options=backend_args), as_json)
        return
    _refuse_calibration_flags(click.get_current_context())
    report = collect_report()
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        _print_human(report)


COMMANDS = [doctor]
