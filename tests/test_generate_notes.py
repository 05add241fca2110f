"""What `pocketspec generate` says on stderr beside its text: which verify mode ran (docs/exactness.md, "The
default"), also in --json's stats."""

from __future__ import annotations

import json

import pytest

from test_cli_errors import run_cli

pytestmark = pytest.mark.real_model

FLAGS = ["--target", "smollm2-135m-instruct", "--prompt", "Count to five:", "--max-tokens", "6", "--threads", "1"]


def test_the_summary_names_the_verify_mode_where_anything_drafts():
    fast = run_cli("generate", *FLAGS, "--draft", "ngram", "--fast-verify")
    assert fast.returncode == 0, fast.stderr
    assert ", verify: fast, stop: " in fast.stderr.splitlines()[-1]
    exact = run_cli("generate", *FLAGS, "--draft", "ngram", "--exact-verify", "--json")
    assert exact.returncode == 0, exact.stderr
    assert json.loads(exact.stdout)["stats"]["exact_verify"] is True
    plain = run_cli("generate", *FLAGS, "--draft", "none")
    assert plain.returncode == 0 and "verify" not in plain.stderr.splitlines()[-1], plain.stderr
