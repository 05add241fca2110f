"""The bench's rounds: prompts grouped by category, and in each round plain first, then the others."""

from __future__ import annotations

from apps.bench.rounds import plan_rounds, schedule
from apps.bench.run import System
from apps.bench.suite import DEFAULT_CATEGORY, SuitePrompt, with_later_turns


def prompts(*categories: str) -> list[SuitePrompt]:
    return [SuitePrompt(str(number), category, f"prompt {number}") for number, category in enumerate(categories)]


def systems() -> list[System]:
    ngram = System("pocketspec-ngram", "pocketspec", "pocketspec", "pocketspec-ngram")
    plain = System("plain", "plain", "pocketspec", "plain")
    lookup = System("prompt-lookup", "peer", "prompt-lookup", "prompt-lookup")
    skipped = System("llama.cpp-speculative", "peer", "llama-speculative", "llama.cpp-speculative")
    skipped.skip("no draft model")
    return [ngram, plain, skipped, lookup]


def test_one_round_per_category_in_suite_order():
    rounds = plan_rounds(prompts("coding", "writing", "coding", "math", "writing"), max_prompts_per_round=5)
    assert [(round_.index, round_.label) for round_ in rounds] == [(0, "coding"), (1, "writing"), (2, "math")]
    assert [[prompt.prompt_id for prompt in round_.prompts] for round_ in rounds] == [["0", "2"], ["1", "4"], ["3"]]


def test_large_categories_and_suites_without_categories_are_cut_into_groups():
    rounds = plan_rounds(prompts(*[DEFAULT_CATEGORY] * 7, "math"), max_prompts_per_round=3)
    assert [round_.label for round_ in rounds] == [f"{DEFAULT_CATEGORY} 1/3", f"{DEFAULT_CATEGORY} 2/3",
                                                   f"{DEFAULT_CATEGORY} 3/3", "math"]
    assert [len(round_.prompts) for round_ in rounds] == [3, 3, 1, 1]


def test_a_conversation_keeps_its_turns_together_in_one_round():
    first = [SuitePrompt(str(number), "chat", f"q{number}", later_turns=("again",)) for number in range(3)]
    rounds = plan_rounds(with_later_turns(first), max_prompts_per_round=2)
    assert [[prompt.prompt_id for prompt in round_.prompts] for round_ in rounds] == [
        ["0", "0/turn2", "1", "1/turn2"], ["2", "2/turn2"]]


def test_each_round_runs_plain_first_then_every_runnable_system_once():
    rounds = plan_rounds(prompts("coding", "writing", "coding"), max_prompts_per_round=5)
    runs = [(round_.label, system.name) for round_, system in schedule(rounds, systems())]
    assert runs == [("coding", "plain"), ("coding", "pocketspec-ngram"), ("coding", "prompt-lookup"),
                    ("writing", "plain"), ("writing", "pocketspec-ngram"), ("writing", "prompt-lookup")]


def test_each_repeat_rotates_the_systems_after_plain():
    """A system's place in a round is no advantage: each repeat moves every system after plain one place on."""
    rounds = plan_rounds(prompts("coding"), max_prompts_per_round=5, num_repeats=3)
    runs = [(round_.repeat, system.name) for round_, system in schedule(rounds, systems())]
    assert runs == [(0, "plain"), (0, "pocketspec-ngram"), (0, "prompt-lookup"),
                    (1, "plain"), (1, "prompt-lookup"), (1, "pocketspec-ngram"),
                    (2, "plain"), (2, "pocketspec-ngram"), (2, "prompt-lookup")]


def test_every_prompt_meets_every_runnable_system_exactly_once():
    suite = prompts("a", "b", "a", "c", "a", "a", "b")
    measured = [(prompt.prompt_id, system.name) for round_, system in schedule(plan_rounds(suite, 2), systems())
                for prompt in round_.prompts]
    assert sorted(measured) == sorted((prompt.prompt_id, name) for prompt in suite
                                      for name in ("plain", "pocketspec-ngram", "prompt-lookup"))


def test_repeats_run_the_whole_pass_again_with_rounds_of_their_own():
    rounds = plan_rounds(prompts("coding", "writing", "coding"), max_prompts_per_round=5, num_repeats=2)
    assert [(round_.index, round_.label, round_.repeat) for round_ in rounds] == [
        (0, "coding, repeat 1/2", 0), (1, "writing, repeat 1/2", 0),
        (2, "coding, repeat 2/2", 1), (3, "writing, repeat 2/2", 1)]
    assert rounds[0].prompts == rounds[2].prompts
