"""Batched speculative decoding equals decoding each prompt alone, token for token (100 %, no tolerance).

On a tiny random F32 model whose every greedy choice is a near-tie (hypothesis draws the
prompt sets, lengths, batch sizes, pool sizes, γ, drafter and scheduler) and on SmolLM2
with 8 real prompts. A plain tiny model has no near-ties: there, kernels that round
differently in a batch still give equal tokens, so the check could not see them; on the
near-tie model they make nearly every batched sequence diverge (measured), while the
batch-invariant kernels keep every one equal. With a fixed
per-request seed, sampling gives every request the target's distribution (chi-square
against unbatched plain sampling), and the same check rejects a deliberately wrong rule.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import same_distribution_pvalue
from pocketspec.backends.gguf_tokenizer import load_tokenizer
from pocketspec.batch.batched_model import BatchedModel
from pocketspec.batch.drafting import BatchModelDrafter
from pocketspec.batch.engine import BatchEngine
from pocketspec.batch.pool import BatchPool
from pocketspec.batch.sequence import Request
from pocketspec.drafters.suffix_index import ngram_key
from pocketspec.errors import UserError
from pocketspec.settings import BatchSettings, SamplingSettings, SpeculationSettings
from pocketspec.torch_model.invariant import TileShape, make_batch_invariant
from pocketspec.torch_model.load import load_model
from tiny_models import tiny_vocabulary, write_near_tie_model, write_tiny_pair

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DRAFTERS = ("none", "ngram", "model", "self-skip", "self-sparse", "self-sparse-attended")
SPARSE_WINDOW = 80  # a self-sparse draft's positions per row: 4 sinks, the slide's 64 slack and room for γ = 8
# a window of attended keys: 8 chosen, 16 recent and room for γ = 7, so that most contexts here make it choose
ATTENDED_WINDOW = 32
MAX_TOKEN = len(tiny_vocabulary()[0]) - 1


class Models:
    """A tiny target wrapped for batch invariance, a same-vocabulary draft, and engines over them."""

    def __init__(self, target_path, draft_path, max_context: int = 256, device: str = "cpu"):
        self.vocab_model, self.tokenizer = load_tokenizer(target_path)
        self.max_context = max_context
        self.settings = BatchSettings()
        self.tiles = TileShape(self.settings.row_tile)
        self.target = load_model(target_path, "fp32", torch.device(device))
        make_batch_invariant(self.target, self.tiles)
        self.draft = load_model(draft_path, "fp32", torch.device(device))

    def rows(self, model, num_rows: int, *, is_draft: bool = False, num_layers: int | None = None,
             n_batch: int = 64, max_context: int | None = None) -> BatchedModel:
        settings = replace(self.settings, is_batch_invariant=not is_draft)
        return BatchedModel(model, num_rows=num_rows, max_context=max_context or self.max_context, kv_dtype="fp32",
                            n_batch=n_batch,
                            settings=settings, tiles=self.tiles if model is self.target else None,
                            num_layers=num_layers)

    def engine(self, drafter: str, *, max_batch: int, num_rows: int, gamma: int | None = None, scheduler: str = "pad",
               sampling: SamplingSettings = SamplingSettings(), ngram_min: int = 2, n_batch: int = 64,
               window: int | None = None) -> BatchEngine:
        """drafter: one of DRAFTERS; window: a self-sparse draft's positions per row (default by kind)."""
        target, draft, attended_source = self.rows(self.target, num_rows, n_batch=n_batch), None, None
        if drafter == "model":
            draft = self.rows(self.draft, num_rows, is_draft=True, n_batch=n_batch)
        elif drafter == "self-skip":
            draft = self.rows(self.target, num_rows, is_draft=True, num_layers=1, n_batch=n_batch)
        elif drafter == "self-sparse":
            draft = self.rows(self.target, num_rows, is_draft=True, n_batch=n_batch,
                              max_context=window or SPARSE_WINDOW)
        elif drafter == "self-sparse-attended":
            draft = self.rows(self.target, num_rows, is_draft=True, n_batch=n_batch,
                              max_context=window or ATTENDED_WINDOW)
            attended_source = target
        kind = "model" if drafter.startswith("self-") else drafter
        return BatchEngine(target, is_end=self.tokenizer.is_end_of_generation,
                           draft=None if draft is None else BatchModelDrafter(draft, attended_source=attended_source),
                           sampling=sampling,
                           speculation=SpeculationSettings(drafter=kind, gamma=gamma, ngram_min=ngram_min),
                           batch=replace(self.settings, max_batch=max_batch, scheduler=scheduler))

    @lru_cache(maxsize=None)
    def alone(self, prompt: tuple[int, ...], max_new_tokens: int, n_batch: int = 64) -> tuple[tuple[int, ...], str]:
        """Plain greedy decoding of one prompt by itself, in a fresh engine: the reference."""
        engine = self.engine("none", max_batch=1, num_rows=1, n_batch=n_batch)
        result = engine.run([Request(list(prompt), max_new_tokens)])[0]
        return tuple(result.tokens), result.stop_reason


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_batch")
    draft = write_tiny_pair(folder, quant=None)[1]
    models = Models(write_near_tie_model(folder / "near-tie.gguf"), draft)
    yield models
    models.vocab_model.close()


def test_the_tiny_target_has_near_ties(tiny):
    """Without near-ties, a greedy check cannot tell batch-invariant kernels from others."""
    target = tiny.engine("none", max_batch=1, num_rows=1).target
    logits = [target.prefill(0, [1, 40, 50, 60])]
    for _ in range(12):
        logits.append(target.forward([0], [[int(np.argmax(logits[-1]))]], [1])[0][0])
    best_two = np.sort(np.stack(logits), axis=-1)[:, -2:]
    relative_gaps = (best_two[:, 1] - best_two[:, 0]) / np.abs(best_two[:, 1])
    assert np.all(relative_gaps < 1e-5) and np.count_nonzero(relative_gaps) >= 6, relative_gaps


def _requests(prompts, max_new_tokens) -> list[Request]:
    return [Request([1, *prompt], count) for prompt, count in zip(prompts, max_new_tokens)]


def _assert_each_equals_alone(models: Models, requests, results, n_batch: int = 64) -> None:
    assert [result.index for result in results] == list(range(len(requests)))
    for request, result in zip(requests, results):
        alone = models.alone(tuple(request.prompt), request.max_new_tokens, n_batch)
        assert (tuple(result.tokens), result.stop_reason) == alone


@st.composite
def workloads(draw):
    num_prompts = draw(st.integers(1, 16))
    prompts = draw(st.lists(st.lists(st.integers(3, MAX_TOKEN), min_size=0, max_size=40), min_size=num_prompts,
                            max_size=num_prompts))
    max_new_tokens = draw(st.lists(st.integers(1, 20), min_size=num_prompts, max_size=num_prompts))
    max_batch = draw(st.integers(1, 16))
    num_rows = draw(st.integers(max_batch, 16))
    return dict(prompts=prompts, max_new_tokens=max_new_tokens, max_batch=max_batch, num_rows=num_rows,
                gamma=draw(st.none() | st.integers(1, 8)), drafter=draw(st.sampled_from(DRAFTERS)),
                scheduler=draw(st.sampled_from(["pad", "group"])))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=workloads())
def test_every_sequence_equals_its_plain_decoding_alone(tiny, workload):
    requests = _requests(workload["prompts"], workload["max_new_tokens"])
    engine = tiny.engine(workload["drafter"], max_batch=workload["max_batch"], num_rows=workload["num_rows"],
                         gamma=workload["gamma"], scheduler=workload["scheduler"])
    _assert_each_equals_alone(tiny, requests, engine.run(requests))


@pytest.mark.parametrize("drafter", ["ngram", "model", "self-skip", "self-sparse", "self-sparse-attended"])
def test_drafts_are_accepted_and_rejected_while_rows_join_and_leave(tiny, drafter):
    engine, results = _run_random_prompts(tiny, drafter, seed=3, num_prompts=12, prompt_lengths=(2, 30),
                                          new_tokens=(8, 48), max_batch=4, num_rows=6, gamma=3)
    assert _some_accepted_some_rejected(results)
    assert len(set(engine.rows_per_step)) > 1  # the batch shrank as sequences finished


def _run_random_prompts(tiny, drafter: str, *, seed: int, num_prompts: int, prompt_lengths: tuple[int, int],
                        new_tokens: tuple[int, int], **engine_args):
    """(the engine, its results) for random prompts of random lengths, each checked against its plain decoding
    alone."""
    rng = np.random.default_rng(seed)
    prompts = [list(rng.integers(3, MAX_TOKEN, int(rng.integers(*prompt_lengths)))) for _ in range(num_prompts)]
    requests = _requests(prompts, [int(count) for count in rng.integers(*new_tokens, num_prompts)])
    engine = tiny.engine(drafter, **engine_args)
    results = engine.run(requests)
    _assert_each_equals_alone(tiny, requests, results)
    return engine, results


def _some_accepted_some_rejected(results) -> bool:
    return 0 < sum(result.stats.num_accepted for result in results) < sum(result.stats.num_drafted
                                                                          for result in results)


def test_self_sparse_rows_slide_their_own_windows_and_each_equals_it_alone(tiny):
    """Contexts past the self-sparse window: each row's draft cache keeps its sinks and recent tokens,
    shifted (its keys re-rotated) in that row only, while the other rows' windows stay where they are."""
    engine, results = _run_random_prompts(tiny, "self-sparse", seed=5, num_prompts=6, prompt_lengths=(40, 120),
                                          new_tokens=(40, 90), max_batch=3, num_rows=4, gamma=3)
    windows = engine.draft.windows
    assert any(window.num_dropped for window in windows)  # rows slid
    assert all(engine.draft.draft.num_cached(row) <= SPARSE_WINDOW for row in range(4))
    assert sum(result.stats.steps_by_drafter.get("model", 0) for result in results) > len(results)
    assert _some_accepted_some_rejected(results)


def test_rows_choose_the_keys_their_own_target_row_attended_to_and_each_equals_it_alone(tiny):
    """Contexts past a window of attended keys: each row chooses its keys again and again from its own row of
    the target's pool, as rows join and leave, and every output is still its plain decoding alone."""
    engine, results = _run_random_prompts(tiny, "self-sparse-attended", seed=6, num_prompts=7,
                                          prompt_lengths=(2, 60), new_tokens=(30, 70), max_batch=3, num_rows=4,
                                          gamma=3)
    choices = [window.num_choices for window in engine.draft.windows]
    assert sum(choices) >= 2 * len(results) and all(choices)
    assert all(engine.draft.draft.num_cached(row) <= ATTENDED_WINDOW for row in range(4))
    assert _some_accepted_some_rejected(results)


def test_a_prompt_longer_than_the_attended_window_costs_the_draft_no_catching_up(tiny):
    """The draft never sees such a prompt whole: its first proposal chooses keys from the target's row, so the
    controller must not price a catch-up over the whole prompt (it would then never draft)."""
    engine = tiny.engine("self-sparse-attended", max_batch=2, num_rows=2, gamma=3)
    prompt = [1, *range(3, 3 + 3 * ATTENDED_WINDOW)]
    engine.target.prefill(1, prompt)
    engine.draft.admit(1, prompt)
    window = engine.draft.windows[1]
    assert window.lag(prompt) == 0 and window.fits(prompt, 3)
    assert window.feed(prompt, 3) == prompt[-1:] and window.num_choices == 1
    assert window.lag(prompt) == 0  # what the choice left: the draft holds all but the last token's view


def test_with_an_adaptive_gamma_each_row_drafts_by_its_match_evidence(tiny):
    """γ auto: each row's proposal is scored from its match evidence (a walk stops where the rest cannot
    pay) and the group drafts by the rows' mean survival; what groups of any size learn is shared. Asked
    again, the prompts are drafted from their first answers (the shared corpus), and mostly accepted."""
    rng = np.random.default_rng(11)
    prompts = [list(rng.integers(3, MAX_TOKEN, int(rng.integers(4, 20)))) for _ in range(8)]
    requests = _requests(prompts, [48] * len(prompts))
    engine = tiny.engine("ngram", max_batch=4, num_rows=4)
    engine.run(requests)
    again = engine.run(requests)
    _assert_each_equals_alone(tiny, requests, again)
    num_drafted = sum(result.stats.num_drafted for result in again)
    num_accepted = sum(result.stats.num_accepted for result in again)
    assert num_accepted > 0.8 * num_drafted > 0
    group_sizes = set(engine.rows_per_step)
    assert len(group_sizes) > 1
    assert all(engine.controller_for(size).match_acceptance is engine.match_acceptance for size in group_sizes)


def test_a_request_drafts_from_the_outputs_of_requests_that_finished_before_it(tiny):
    """The n-gram drafter of every row reads one corpus of finished outputs: a prompt asked again
    (its context holding none of the answer) is drafted from the first answer."""
    engine = tiny.engine("ngram", max_batch=1, num_rows=2, gamma=4)
    request = Request([1, *np.random.default_rng(5).integers(3, MAX_TOKEN, 12)], 24)
    first = engine.run([request])[0]
    again = engine.run([request])[0]
    _assert_each_equals_alone(tiny, [request], [again])
    assert first.stats.num_accepted < again.stats.num_accepted
    assert engine.corpus.counts(ngram_key(first.tokens[:2]))  # the corpus holds the first answer


@pytest.mark.parametrize("drafter", ["none", "model"])
def test_a_conversation_reuses_its_prefilled_chunks_and_each_turn_still_equals_it_alone(tiny, drafter):
    """Each turn's prompt is the last one, its answer and a new message. It goes to the row that
    holds the last prompt and prefills only what follows that prompt's whole chunks (8 tokens
    here); on the near-tie model, where any other rounding would show, every turn and the
    request beside it still equal the same prompt decoded alone in a fresh engine."""
    engine = tiny.engine(drafter, max_batch=2, num_rows=2, gamma=3, n_batch=8)
    rng = np.random.default_rng(3)
    conversation, previous_length = [1, *rng.integers(3, MAX_TOKEN, 13)], 0
    for turn in range(3):
        beside = [1, *rng.integers(3, MAX_TOKEN, 20)]
        requests = [Request(conversation, 8), Request(beside, 6)]
        results = engine.run(requests)
        _assert_each_equals_alone(tiny, requests, results, n_batch=8)
        expected_reuse = 0 if turn == 0 else previous_length - previous_length % 8
        assert results[0].stats.num_reused_tokens == expected_reuse and results[1].stats.num_reused_tokens == 0
        previous_length = len(conversation)
        conversation = conversation + results[0].tokens + [*rng.integers(3, MAX_TOKEN, 5)]
    assert expected_reuse >= 16


def test_a_sequence_that_fills_its_context_stops_there(tiny):
    engine = tiny.engine("ngram", max_batch=2, num_rows=2, gamma=4)
    requests = [Request([1] + [7, 8, 9] * 80, 100), Request([1, 5, 6], 30)]  # 241 tokens: 15 positions left
    results = engine.run(requests)
    # the last token is emitted without ever entering the cache, as in SpeculativeEngine
    assert results[0].stop_reason == "context_full" and len(results[0].tokens) == 256 - 241 + 1
    assert results[1].stop_reason in ("max_tokens", "end_of_generation")
    _assert_each_equals_alone(tiny, requests, results)


def test_stopping_marks_what_is_unfinished(tiny):
    engine = tiny.engine("ngram", max_batch=2, num_rows=2)
    finished = []
    requests = _requests([[5, 6], [7, 8], [9], [10, 11]], [40, 40, 40, 40])
    results = engine.run(requests, on_finished=finished.append, should_stop=lambda: engine.num_steps >= 5)
    assert [result.stop_reason for result in results] == ["interrupted"] * 4
    assert [len(result.tokens) for result in results] == [6, 6, 0, 0]
    assert sorted(result.index for result in finished) == [0, 1, 2, 3]


def test_a_request_that_fails_its_admission_gives_its_row_back(tiny):
    """A server's pool goes on after a request fails: the row it was given is free again for the next."""
    engine = tiny.engine("ngram", max_batch=1, num_rows=1)
    pool = BatchPool(engine)
    pool.add(0, Request([1] + [7, 8, 9] * 100, 4))  # 301 tokens: past the 256-token context, refused in admit
    with pytest.raises(UserError):
        pool.step()
    assert pool.num_rows_in_use == 0
    pool.add(1, Request([1, 5, 6], 8))
    finished = [result for _ in range(20) if pool.has_work for result in pool.step()]
    assert [tuple(result.tokens) for result in finished] == [tiny.alone((1, 5, 6), 8)[0]]


def test_a_request_told_to_stop_before_its_prefill_is_left_waiting_unprefilled(tiny):
    """A server shutting down: the pool admitted every waiting request, prefilling each prompt, before the slots
    looked at the signal again (past the grace period). Told to stop, they wait for stop_all, never prefilled."""
    engine = tiny.engine("ngram", max_batch=2, num_rows=2)
    pool = BatchPool(engine)
    pool.add(0, Request([1, 5, 6], 40))
    pool.step()  # the first request runs
    for index in (1, 2):
        pool.add(index, Request([1, 7, 8, 9], 8))
    pool.step(should_stop=lambda index: index > 0)
    assert [waiting[0] for waiting in pool.waiting] == [1, 2] and list(pool.active) == [0]
    assert [result.stop_reason for result in pool.stop_all()] == ["interrupted"] * 3


# the first prompt holds many tokens, so that the n-gram drafter (from one token on) has proposals to make
SAMPLED_PROMPTS = [[1, *range(40, 100, 2)], [1, 90, 100, 90, 100]]
NUM_RUNS, POSITION = 1000, 2
SAMPLING = SamplingSettings(temperature=1.0)


def _first_prompt_counts(engine: BatchEngine, max_new_tokens: int, mixed: bool):
    """How often each token comes at POSITION for the first prompt over NUM_RUNS seeds; with `mixed`,
    every other request in the run is the second prompt, so each row's neighbours change."""
    from collections import Counter

    prompts = SAMPLED_PROMPTS if mixed else SAMPLED_PROMPTS[:1]
    requests = [Request(prompts[index % len(prompts)], max_new_tokens, seed=index)
                for index in range(len(prompts) * NUM_RUNS)]
    results = engine.run(requests)[::len(prompts)]
    return Counter(result.tokens[POSITION] if len(result.tokens) > POSITION else -1 for result in results)


@pytest.fixture(scope="module")
def plain_counts(tiny):
    """Unbatched plain sampling: each request alone, one token per forward."""
    return _first_prompt_counts(tiny.engine("none", max_batch=1, num_rows=1, sampling=SAMPLING), POSITION + 1, False)


@pytest.mark.parametrize("drafter", ["model", "ngram", "self-sparse", "self-sparse-attended"])
def test_batched_sampling_keeps_each_request_distribution(tiny, plain_counts, drafter):
    batched = tiny.engine(drafter, max_batch=8, num_rows=8, gamma=3, sampling=SAMPLING, ngram_min=1)
    batched_counts = _first_prompt_counts(batched, POSITION + 4, True)
    assert batched.acceptance["ngram" if drafter == "ngram" else "model"].num_tried > 0
    assert same_distribution_pvalue(plain_counts, batched_counts, NUM_RUNS) > 1e-3


@pytest.mark.parametrize("drafter", ["model", "ngram", "self-sparse", "self-skip"])
def test_a_seeded_sampled_request_in_a_batch_samples_what_it_samples_alone(tiny, drafter):
    """Seeded sampling repeats whatever drafted a request's tokens and whichever rows shared its steps: each
    request of a mixed batch (its neighbours' drafts, acceptance and corpus moving the controller) emits
    the tokens plain sampling emits for it alone (pocketspec/speculation/draws.py)."""
    sampling = SamplingSettings(temperature=0.8)
    rng = np.random.default_rng(21)
    requests = [Request([1, *rng.integers(3, MAX_TOKEN, int(rng.integers(3, 25)))], 24, seed=100 + index)
                for index in range(8)]
    batched = tiny.engine(drafter, max_batch=4, num_rows=4, gamma=3, sampling=sampling, ngram_min=1)
    results = batched.run(requests)
    assert sum(result.stats.num_accepted for result in results) > 0
    for request, result in zip(requests, results):
        alone = tiny.engine("none", max_batch=1, num_rows=1, sampling=sampling).run([request])[0]
        assert result.tokens == alone.tokens


def test_the_distribution_check_rejects_a_wrong_rule(tiny, plain_counts, monkeypatch):
    """Accepting every draft token samples the draft's distribution, not the target's: the check must see it."""
    import pocketspec.batch.rows_target as engine_module
    from pocketspec.speculation.verify import Verdict

    monkeypatch.setattr(engine_module, "verify_logits", lambda tokens, logits, sampling, draws: Verdict(
        len(tokens), int(np.argmax(logits[len(tokens)]))))
    wrong = tiny.engine("model", max_batch=8, num_rows=8, gamma=3, sampling=SAMPLING)
    assert same_distribution_pvalue(plain_counts, _first_prompt_counts(wrong, POSITION + 4, True), NUM_RUNS) < 1e-3


SMOLLM2_PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Summarize in two sentences: The quick brown fox jumps over the lazy dog while the farmer sleeps.",
    "Translate to French: The weather is nice today and we are going to the beach.",
    "What is 17 times 23? Explain step by step.",
    "List three uses of a paperclip.",
    "Write a haiku about autumn leaves.",
    "Explain what a hash table is to a ten-year-old.",
    "Give a short recipe for pancakes.",
]


@pytest.mark.real_model
def test_smollm2_batched_equals_each_prompt_alone(smollm2_path):
    from pocketspec.conversation.chat_template import encode_chat, template_for

    models = Models(smollm2_path, smollm2_path, max_context=512)
    try:
        template = template_for(models.tokenizer)
        requests = [Request(encode_chat(models.tokenizer, template, [{"role": "user", "content": text}]), 16)
                    for text in SMOLLM2_PROMPTS]
        # a window of 48 attended keys: 12 chosen and 24 recent, chosen again every 12 tokens or so
        for drafter, max_batch in (("ngram", 8), ("self-skip", 4), ("self-sparse-attended", 4)):
            engine = models.engine(drafter, max_batch=max_batch, num_rows=max_batch, gamma=3, window=48)
            if drafter == "self-skip":  # 20 of 30 layers: a draft that is right often
                engine.draft = BatchModelDrafter(models.rows(models.target, max_batch, is_draft=True, num_layers=20))
            results = engine.run(requests)
            _assert_each_equals_alone(models, requests, results)
            if drafter == "self-sparse-attended":
                assert sum(window.num_choices for window in engine.draft.windows) > 0
            assert max(engine.rows_per_step) == max_batch
            assert sum(result.stats.num_accepted for result in results) > 0
    finally:
        models.vocab_model.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA/ROCm GPU")
def test_batched_on_a_gpu_equals_each_prompt_alone(tmp_path):
    """Rows, positions and masks on a GPU. Bit-invariance there is not claimed (invariant.py): the
    tiny model here has no near-ties, so this checks the bookkeeping, not the kernels' rounding."""
    models = Models(*write_tiny_pair(tmp_path, quant=None), device="cuda")
    try:
        rng = np.random.default_rng(5)
        requests = _requests([list(rng.integers(3, MAX_TOKEN, int(rng.integers(2, 30)))) for _ in range(10)],
                             [int(count) for count in rng.integers(4, 40, 10)])
        for drafter in ("ngram", "model", "self-skip"):
            _assert_each_equals_alone(models, requests, models.engine(drafter, max_batch=4, num_rows=6).run(requests))
    finally:
        models.vocab_model.close()
