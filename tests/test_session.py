"""The one way to open a session (pocketspec/session.py), on SmolLM2: what every front end relies on."""

from __future__ import annotations

import pytest

from pocketspec.budget import MemoryPlan
from pocketspec.errors import UserError
from pocketspec.session import open_session
from pocketspec.session_settings import SessionSettings

pytestmark = pytest.mark.real_model
SMOLLM2 = "smollm2-135m-instruct"


def test_reset_makes_the_next_generation_start_from_empty_caches():
    with open_session(SessionSettings(target=SMOLLM2, draft="ngram", max_context=512, threads=1)) as session:
        prompt = session.encode("Name three fruits.", chat=True)
        first = session.engine.generate(prompt, 16)
        again = session.engine.generate(prompt, 16)
        assert again.tokens == first.tokens and again.stats.num_reused_tokens > 0
        session.reset()
        fresh = session.engine.generate(prompt, 16)
        assert fresh.tokens == first.tokens and fresh.stats.num_reused_tokens == 0


def test_every_backend_budget_is_one_memory_plan_shown_the_same_way():
    """llama.cpp's planner and the torch backend's exact sizes both give a MemoryPlan whose first line is
    `memory plan (...): predicted peak P of B (...)`, and its notes reach on_note before loading."""
    for backend, scope in (("llama.cpp", "memory plan: "), ("torch", "memory plan (torch): ")):
        notes: list[str] = []
        settings = SessionSettings(target=SMOLLM2, draft="none", max_context=512, threads=1, memory_budget="3GiB",
                                   options={"backend": backend})
        with open_session(settings, on_note=notes.append) as session:
            plan = session.plan
            assert isinstance(plan, MemoryPlan) and plan.budget_bytes == 3 * 2**30
            assert plan.lines[0].startswith(scope + "predicted peak ") and " of 3.00 GiB (" in plan.lines[0]
            assert plan.describe().splitlines() == plan.lines and notes[:len(plan.lines)] == plan.lines
            assert session.stats_dict(session.engine.generate(session.encode("Hi", chat=True), 4).stats)[
                "memory_budget_bytes"] == 3 * 2**30


def test_a_budget_too_small_is_refused_before_anything_loads():
    with pytest.raises(UserError, match="below the minimum"):
        open_session(SessionSettings(target=SMOLLM2, draft="none", memory_budget="10MiB"))


def test_no_budget_means_no_plan():
    with open_session(SessionSettings(target=SMOLLM2, draft="none", max_context=256, threads=1)) as session:
        assert session.plan is None and session.budget_bytes is None
