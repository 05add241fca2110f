"""Shared fixtures: the real catalog models that `make test` pulls, and engines built on them."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from pocketspec.catalog import model_path


def require_model(name: str) -> Path:
    path = model_path(name)
    if not path.exists():
        pytest.fail(f"{name} is not downloaded: run `make models-test` (or `pocketspec models pull {name}`)")
    return path


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return require_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def qwen_target_path() -> Path:
    return require_model("qwen2.5-coder-1.5b-instruct")


@pytest.fixture(scope="session")
def qwen_draft_path() -> Path:
    return require_model("qwen2.5-coder-0.5b-instruct")


@contextlib.contextmanager
def built_engine(target_path, *, draft_path=None, drafter="auto", gamma=None, temperature=0.0, seed=0,
                 max_context=1024, top_k=0, top_p=1.0, max_gamma=8, draft_max_context=None, exact_verify=True):
    from pocketspec.loader import ModelChoice, close_engine, draft_settings_for, load_engine
    from pocketspec.settings import ModelSettings, SamplingSettings, SpeculationSettings

    max_width = (gamma if gamma is not None else max_gamma) + 1
    target_settings = ModelSettings(max_context=max_context, max_logits_rows=max_width)
    choice = ModelChoice(Path(target_path), Path(draft_path) if draft_path else None,
                         "auto" if draft_path else ("none" if drafter == "none" else "ngram"))
    engine = load_engine(
        choice,
        target_settings=target_settings,
        draft_settings=draft_settings_for(target_settings, draft_max_context),
        sampling=SamplingSettings(temperature=temperature, seed=seed, top_k=top_k, top_p=top_p),
        speculation=SpeculationSettings(drafter=drafter, gamma=gamma, max_gamma=max_gamma, exact_verify=exact_verify),
    )
    try:
        yield engine
    finally:
        close_engine(engine)
