"""Shared fixtures: the real catalog models that `make test` pulls, and engines built on them."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import hypothesis
import pytest

from pocketspec.models.catalog import model_path, pocketspec_home

# The home `make test` pulled the models into; the cost tables and exact widths measured in it
# are this test session's, shared by the fresh homes tests make (home_with_measurements).
SESSION_HOME = pocketspec_home()

# `make test` runs two pytest-xdist workers: each keeps to a core of its own, and so does every process
# it starts. Its models then default to one thread (pocketspec.settings.default_num_threads reads the
# affinity, and so does torch), and no test's threads spin against the other worker's: llama.cpp's
# threads wait for each other by spinning, and two 2-thread processes on two cores ran a tiny model's
# sampling test in 199 s instead of 6 (measured on the 2-core EPYC).
if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw") and hasattr(os, "sched_setaffinity"):
    _cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {_cores[int(os.environ["PYTEST_XDIST_WORKER"][2:]) % len(_cores)]})

# A shell without job control starts background commands (`make test &`, some CI runners)
# with SIGINT ignored, and children inherit that: then no Ctrl-C test could interrupt
# anything. Give the test run, and so every process it starts, the terminal's default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# Property tests draw the same examples on every run and machine, with no time limit per example: a gate that
# passed once passes again, a loaded 2-core machine cannot fail one on time (DeadlineExceeded, Flaky), and the
# two workers share no example database in the checkout. A failure prints the example that broke it.
hypothesis.settings.register_profile("pocketspec", derandomize=True, deadline=None, database=None)
hypothesis.settings.load_profile("pocketspec")


def hang_up_as_a_terminal_does() -> None:
    """A spawned child's preexec_fn: SIGHUP at its default, as a terminal's child has it. A test run started under
    `nohup` would otherwise hand its ignored SIGHUP on to the child, which keeps an ignored SIGHUP ignored
    (apps/cli.py), so a test that hangs the child up would wait for an exit that never comes."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def require_model(name: str) -> Path:
    path = model_path(name)
    if not path.exists():
        pytest.fail(f"{name} is not downloaded: run `make models-test` (or `pocketspec models pull {name}`)")
    return path


def home_with_measurements(home: Path) -> Path:
    """A fresh POCKETSPEC_HOME at `home` whose models, cost tables, exact verify widths and ONNX exports are the
    session home's: nothing is downloaded, and nothing an earlier test measured is measured again
    (pocketspec/measured_cache.py: measured once, under a lock, by whichever process needs it first)."""
    home.mkdir(parents=True, exist_ok=True)
    for name in ("models", "costs", "exact_widths", "onnx"):
        shared = SESSION_HOME / name
        shared.mkdir(parents=True, exist_ok=True)
        (home / name).symlink_to(shared, target_is_directory=True)
    return home


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return require_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def qwen_target_path() -> Path:
    return require_model("qwen2.5-coder-1.5b-instruct")


@pytest.fixture(scope="session")
def qwen_draft_path() -> Path:
    return require_model("qwen2.5-coder-0.5b-instruct")


CATALOG_MODEL_FIXTURES = {"smollm2_path", "qwen_target_path", "qwen_draft_path"}


def pytest_collection_modifyitems(items) -> None:
    """Every test that reaches a catalog model through its fixtures, directly or through another fixture,
    is marked real_model (`-m "not real_model"` runs the rest), so no test can forget the marker."""
    for item in items:
        if CATALOG_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.real_model)


@contextlib.contextmanager
def built_engine(target_path, *, draft_path=None, drafter="auto", gamma=None, temperature=0.0, seed=0,
                 max_context=1024, top_k=0, top_p=1.0, max_gamma=None, draft_max_context=None, exact_verify=False,
                 backend="llama.cpp", weights="auto", device="cpu", self_draft=None, self_draft_settings=None,
                 devices=(), split_mode="layer", layers_per_device=(), num_threads=0, decode_step="auto",
                 compile=None, kv_type=None, repack=None, on_progress=None):
    """An engine opened the way every front end opens one (pocketspec.session.open_session).

    drafter: SpeculationSettings.drafter; the draft is `draft_path`, else `self_draft` (`self-sparse`
    or `self-skip`, torch; self_draft_settings: SpeculationSettings fields for it), else n-grams (or
    nothing for drafter="none"). max_gamma: None is SpeculationSettings' default. devices, split_mode,
    layers_per_device: ModelSettings' fields (a split over several devices); 0 threads: every core;
    decode_step, compile: ModelSettings' (torch); kv_type: the target's llama.cpp KV type (None: the default);
    repack: --repack/--no-repack (None: the default layout); on_progress: open_session's (a watching terminal's
    progress lines)."""
    from pocketspec.session import open_session
    from pocketspec.session_settings import SessionSettings
    from pocketspec.settings import SamplingSettings, SpeculationSettings

    draft = str(draft_path) if draft_path else self_draft or ("none" if drafter == "none" else "ngram")
    options = dict(drafter=drafter, backend=backend, weights=weights, device=device, devices=tuple(devices),
                   decode_step=decode_step, compile=compile,
                   split_mode=split_mode, layers_per_device=tuple(layers_per_device), **(self_draft_settings or {}))
    max_gamma = SpeculationSettings().max_gamma if max_gamma is None else max_gamma
    # draftless drafts as long as the draft model's: the verify width (logits rows, and what --exact-verify
    # probes) stays max_gamma + 1, as these tests were written for
    options.update(max_gamma=max_gamma, max_draftless_gamma=max_gamma)
    settings = SessionSettings(
        target=str(target_path), draft=draft, gamma=gamma, max_context=max_context, threads=num_threads,
        kv_type=kv_type, repack=repack, exact_verify=exact_verify, draft_window=draft_max_context, options=options,
        sampling=SamplingSettings(temperature=temperature, seed=seed, top_k=top_k, top_p=top_p))
    with open_session(settings, on_progress=on_progress) as session:
        yield session.engine


# llama.cpp's batched and one-token CPU kernels disagree by up to 0.86 logits on the qwen
# target and 1.23 on SmolLM2 (llama-cpp-python 0.3.36, measured 2026-11-21): a greedy
# choice can only flip where the two best logits are closer than this.
KERNEL_ROUNDING_LOGITS = 1.5


def assert_matches_plain(backend, prompt: list[int], got: list[int], expected: list[int]) -> None:
    """Token for token equal; at the first difference, if any, the target must nearly tie.

    The comparison is not loosened: everything before the difference is equal, and the
    difference itself must sit where plain decoding's own top-2 logit gap is within
    kernel rounding (measured one token at a time, as plain decoding saw it). Where one output
    is a prefix of the other, the shorter one chose end-of-generation there: that choice is
    the difference, and it is checked the same way.
    """
    if got == expected:
        return
    position = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    import numpy as np

    backend.rollback(0)
    logits = backend.prefill(prompt)
    for token in expected[:position]:
        logits = backend.forward([token], [0])[0]
    best_two = np.sort(logits)[-2:]
    gap = float(best_two[1] - best_two[0])
    assert gap < KERNEL_ROUNDING_LOGITS, f"diverged at {position} where the top-2 gap is {gap:.3f}"


def assert_drafted_past_its_window(engine, result, num_prompt_tokens: int, gamma: int) -> None:
    """The draft model drafted every step but the last while the context outgrew the draft's own
    cache, which it only can by sliding its window (sinks + recent tokens)."""
    draft_backend = engine.model.backend
    num_context = num_prompt_tokens + len(result.tokens)
    # the last step the model drafted saw all but the last two steps' tokens at most
    assert num_context - 2 * (gamma + 1) > draft_backend.max_context >= draft_backend.num_cached
    assert result.stats.steps_by_drafter.get("model", 0) >= result.stats.num_steps - 1


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny torch models spend their time in per-op overhead; a second intra-op thread only
    spins against other processes on a shared CPU (10x slower under load, measured)."""
    import torch

    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(num_threads)


def sampled_token_counts(engine, prompt: list[int], position: int, num_runs: int):
    """How often each token is generated at `position`, over num_runs seeds (-1: generation ended first)."""
    from collections import Counter

    counts = Counter()
    for seed in range(num_runs):
        engine.reseed(seed)
        tokens = engine.generate(prompt, position + 4).tokens  # room for a γ = 3 draft after the first token
        counts[tokens[position] if len(tokens) > position else -1] += 1
    return counts


def same_distribution_pvalue(plain_counts, spec_counts, num_runs: int) -> float:
    """Two-sample chi-square over tokens seen 20+ times, the rest pooled; asserts there are 3+ such tokens."""
    from scipy.stats import chi2_contingency

    common = [token for token in plain_counts if plain_counts[token] + spec_counts[token] >= 20]
    table = [[plain_counts[token] for token in common] + [num_runs - sum(plain_counts[t] for t in common)],
             [spec_counts[token] for token in common] + [num_runs - sum(spec_counts[t] for t in common)]]
    assert len(common) >= 3
    return chi2_contingency(table).pvalue
