"""Every numeric setting is checked against the range its settings field declares, and every
numeric flag of the CLI takes its type from that range (pocketspec/setting_ranges.py)."""

from __future__ import annotations

import dataclasses
import math

import click
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from apps.cli import main
from apps.flags import SettingValue
from pocketspec import settings as settings_module
from pocketspec.errors import UserError
from pocketspec.speculation.sampling import distribution
from pocketspec.setting_ranges import Range, parse_setting
from pocketspec.settings import SamplingSettings

SETTINGS_CLASSES = [value for value in vars(settings_module).values()
                    if isinstance(value, type) and dataclasses.is_dataclass(value)]
RANGED_FIELDS = [(cls, item.name, item.metadata["range"]) for cls in SETTINGS_CLASSES
                 for item in dataclasses.fields(cls) if "range" in item.metadata]
FLOAT_FIELDS = [entry for entry in RANGED_FIELDS if not entry[2].is_integer]
INTEGER_FIELDS = [entry for entry in RANGED_FIELDS if entry[2].is_integer]
any_float = st.floats(allow_nan=True, allow_infinity=True)


def _ids(entries):
    return [f"{cls.__name__}.{name}" for cls, name, _ in entries]


def _expected(value: float, range_: Range) -> bool:
    if value in range_.also:
        return True
    above_low = value > range_.low if range_.is_low_open else value >= range_.low
    return math.isfinite(value) and above_low and value <= range_.high


def test_every_numeric_setting_declares_a_range():
    for cls in SETTINGS_CLASSES:
        for item in dataclasses.fields(cls):
            declared = item.type.replace(" | None", "") if isinstance(item.type, str) else item.type
            if declared in ("int", "float") and item.name not in ("n_batch", "n_ubatch", "max_logits_rows",
                                                                  "gpu_layers", "distributed_timeout_s",
                                                                  "max_prompts_per_round", "num_warmup_tokens",
                                                                  "ngram_min", "ngram_max", "row_tile",
                                                                  "query_tile", "key_block"):
                assert "range" in item.metadata, f"{cls.__name__}.{item.name} has no flag range"


def test_each_default_is_in_its_own_range():
    for cls, name, range_ in RANGED_FIELDS:
        default = getattr(cls(), name)
        assert default is None or range_.contains(default), (cls.__name__, name, default)


@pytest.mark.parametrize("cls, name, range_", FLOAT_FIELDS, ids=_ids(FLOAT_FIELDS))
@given(value=any_float)
@settings(max_examples=150, deadline=None)
def test_float_settings_accept_exactly_their_finite_range(cls, name, range_, value):
    for typed in (value, repr(value)):
        if _expected(value, range_):
            assert parse_setting(cls, name, typed) == value
        else:
            with pytest.raises(UserError) as caught:
                parse_setting(cls, name, typed)
            message = str(caught.value)
            assert message.startswith(range_.flag) and "\n" not in message


@pytest.mark.parametrize("cls, name, range_", INTEGER_FIELDS, ids=_ids(INTEGER_FIELDS))
@given(value=st.integers(min_value=-(2**70), max_value=2**70) | st.sampled_from([-1, 0, 1, 2**63 - 1, 2**63]))
@settings(max_examples=100, deadline=None)
def test_integer_settings_accept_exactly_their_range(cls, name, range_, value):
    if _expected(value, range_):
        assert parse_setting(cls, name, str(value)) == value
    else:
        with pytest.raises(UserError, match=f"^{range_.flag} must be"):
            parse_setting(cls, name, str(value))


@pytest.mark.parametrize("text", ["", "abc", "1.5", "0x10", "1e3", "nan", "inf", " ", "--1"])
def test_an_integer_flag_refuses_what_is_not_a_whole_number(text):
    with pytest.raises(UserError, match="^--top-k must be a whole number"):
        parse_setting(SamplingSettings, "top_k", text)


@given(temperature=any_float, top_p=any_float, top_k=st.integers(-5, 200),
       logits=st.lists(st.floats(-1e4, 1e4, width=32), min_size=2, max_size=64))
@settings(max_examples=300, deadline=None)
def test_sampling_settings_that_construct_give_a_distribution(temperature, top_p, top_k, logits):
    """The point of the ranges: any SamplingSettings that exists shapes logits into probabilities."""
    try:
        sampling = SamplingSettings(temperature=temperature, top_p=top_p, top_k=top_k)
    except UserError:
        return
    if sampling.is_greedy:
        return
    probs = distribution(np.array(logits, dtype=np.float32), sampling)
    assert np.all(np.isfinite(probs)) and np.all(probs >= 0)
    assert probs.sum() == pytest.approx(1.0)


def test_random_seed_is_drawn_and_in_range():
    drawn = SamplingSettings(seed=settings_module.RANDOM_SEED).with_seed_drawn()
    assert 0 <= drawn.seed < 2**31 and SamplingSettings(seed=5).with_seed_drawn().seed == 5


def _numeric_params(command: click.Command, path: str):
    for param in command.params:
        if isinstance(param.type, (click.types.IntParamType, click.types.FloatParamType)):
            yield f"{path} {param.opts[0]}"
    for name, sub in getattr(command, "commands", {}).items():
        yield from _numeric_params(sub, f"{path} {name}")


def test_no_cli_flag_checks_a_number_on_its_own():
    """click's INT, FLOAT, IntRange and FloatRange each hold a range apart from the settings (and
    FloatRange lets nan through): every numeric flag must use SettingValue instead."""
    assert list(_numeric_params(main, "pocketspec")) == []
    assert any(isinstance(param.type, SettingValue) for param in main.commands["generate"].params)


def _generate(smollm2_path, *flags: str):
    import json
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "apps.cli", "generate", "--target", str(smollm2_path), "--draft",
                             "none", "--prompt", "Once upon a time", "--max-tokens", "6", "--json", *flags],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    output = json.loads(result.stdout)
    return output["tokens"], result.stderr, output["seed"]


def test_seed_minus_one_draws_a_seed_that_repeats_the_run(smollm2_path):
    tokens, stderr, seed = _generate(smollm2_path, "--temperature", "1.5", "--seed", "-1")
    line = next(line for line in stderr.splitlines() if line.startswith("--seed -1: drew seed "))
    drawn = line.split()[4]
    assert seed == int(drawn)  # --json carries it too, for a script that keeps stdout alone
    assert _generate(smollm2_path, "--temperature", "1.5", "--seed", drawn)[0] == tokens


def test_threads_far_above_the_cores_are_capped_with_a_warning(smollm2_path):
    _, stderr, _ = _generate(smollm2_path, "--threads", "100000")
    cores = settings_module.default_num_threads()
    assert f"--threads 100000 is more than the {cores} cores this process may use; using {cores}" in stderr
