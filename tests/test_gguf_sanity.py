"""GGUF headers with values the planner or llama.cpp cannot rely on are refused before anything loads.

Malformed models are written with the gguf package: tiny_models' weights, with one header
value changed. A property test changes random shape values and checks the promise: the file
is refused in one line, or the planner and llama.cpp both take it without a crash.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from memplanner.gguf_header import read_gguf_header
from memplanner.gguf_sanity import header_problem
from memplanner.shapes import shape_from_gguf
from pocketspec.errors import UserError
from pocketspec.models.gguf_check import check_gguf
from tiny_models import SHAPE_KEYS, write_header_variant as write_model

MALFORMED = {
    "unknown architecture": (dict(arch="notallama"), "architecture 'notallama'"),
    "zero heads": (dict(attention__head_count=0), "attention.head_count is 0"),
    "zero kv heads": (dict(attention__head_count_kv=0), "head_count_kv is 0"),
    "more kv heads than heads": (dict(attention__head_count_kv=8), "head_count_kv is 8"),
    "heads not a multiple of kv heads": (dict(attention__head_count=6, attention__head_count_kv=4),
                                         "not a multiple"),
    "width not a multiple of heads": (dict(attention__head_count=3, attention__head_count_kv=1), "not a multiple"),
    "zero layers": (dict(block_count=0), "block_count is 0"),
    "more layers than blocks": (dict(block_count=3), "block_count is 3"),
    "absurd layer count": (dict(block_count=4_000_000_000), "block_count is 4000000000"),
    "zero width": (dict(embedding_length=0), "embedding_length is 0"),
    "width unlike the embedding": (dict(embedding_length=128), "token_embd.weight"),
    "kv heads unlike attn_k": (dict(attention__head_count_kv=4), "attn_k.weight"),
    "zero context": (dict(context_length=0), "context_length is 0"),
    "no head count": (dict(drop=("attention.head_count",)), "lacks llama.attention.head_count"),
    "eos past the vocabulary": (dict(token_eos=10**6), "eos_token_id is 1000000"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_header_is_refused_before_loading(tmp_path, case):
    values, fragment = MALFORMED[case]
    path = write_model(tmp_path / "bad.gguf", **values)
    with pytest.raises(UserError) as caught:
        check_gguf(path)
    message = str(caught.value)
    assert fragment in message and str(path) in message and "\n" not in message
    with pytest.raises(ValueError, match="cannot be planned for"):
        shape_from_gguf(path)


def test_the_untouched_model_passes(tmp_path):
    path = write_model(tmp_path / "good.gguf")
    assert header_problem(read_gguf_header(path)) is None
    assert check_gguf(path).num_heads == 4


def test_real_models_pass(smollm2_path, qwen_draft_path):
    for path in (smollm2_path, qwen_draft_path):
        assert header_problem(read_gguf_header(path)) is None


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apps.cli", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("case", ["unknown architecture", "zero heads", "more layers than blocks"])
@pytest.mark.parametrize("command", [["plan"], ["plan", "--memory-budget", "1GiB"],
                                     ["generate", "--prompt", "hi", "--memory-budget", "1GiB"],
                                     ["generate", "--prompt", "hi"]])
def test_cli_refuses_in_one_line(tmp_path, case, command):
    values, fragment = MALFORMED[case]
    path = write_model(tmp_path / "bad.gguf", **values)
    result = _cli(*command, "--target", str(path), "--draft", "none")
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr and fragment in lines[0], result.stderr


SHAPE_VALUES = st.fixed_dictionaries({}, optional={
    key.replace(".", "__"): st.sampled_from([0, 1, 2, 3, 4, 6, 8, 16, 32, 64, 65, 128, 2**31, 2**32 - 1])
    for key in SHAPE_KEYS})


@given(values=SHAPE_VALUES)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_header_is_refused_or_runs(tmp_path_factory, values):
    """Whatever shape values a header holds, the CLI never crashes: refused (exit 2) or it runs."""
    path = write_model(tmp_path_factory.mktemp("prop") / "model.gguf", **values)
    for command in (["plan", "--max-context", "256"], ["generate", "--prompt", "the", "--max-tokens", "2",
                                                       "--max-context", "256"]):
        result = _cli(*command, "--target", str(path), "--draft", "none")
        assert "Traceback" not in result.stderr, (values, result.stderr)
        assert result.returncode in (0, 2), (values, command, result.returncode, result.stderr[-2000:])
        if result.returncode == 2:
            assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1, result.stderr
