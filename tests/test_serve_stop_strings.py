"""Stop strings cut the streamed text before them, however the text is split into pieces."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pocketspec.serve.stop_strings import StopText, first_stop, held_length


def _streamed(pieces: list[str], stops: list[str]) -> tuple[str, bool]:
    stop_text = StopText(stops)
    text = "".join(stop_text.push(piece) for piece in pieces) + stop_text.finish()
    return text, stop_text.is_stopped


def test_first_stop_is_the_earliest_of_any():
    assert first_stop("abc END xyz STOP", ["STOP", "END"]) == 4
    assert first_stop("nothing here", ["STOP"]) is None


def test_the_first_stop_is_the_one_that_completes_first_not_the_one_that_starts_first():
    assert first_stop("baa", ["a", "baa"]) == 1  # 'a' completes at 2, before 'baa' can at 3
    assert first_stop("xabcd", ["bc", "abcd"]) == 2
    assert first_stop("xabc", ["bc", "abc"]) == 1  # both complete at 4: the one that starts earlier


def test_a_stop_string_that_completes_first_cuts_the_stream_wherever_the_pieces_split():
    for pieces in (["ba", "a"], ["b", "aa"], ["baa"], ["b", "a", "a"]):
        assert _streamed(pieces, ["a", "baa"]) == ("b", True)


def test_held_length_is_the_longest_prefix_at_the_end():
    assert held_length("hello wor", ["world"]) == 3
    assert held_length("hello", ["world"]) == 0
    assert held_length("ab", ["abc", "b"]) == 2


def test_a_stop_string_split_over_pieces_is_cut():
    assert _streamed(["Hello wo", "r", "ld and more"], ["world"]) == ("Hello ", True)


def test_a_held_tail_that_does_not_become_a_stop_string_is_handed_on():
    stop_text = StopText(["world"])
    assert stop_text.push("Hello wor") == "Hello "
    assert stop_text.push("k") == "work"
    assert stop_text.push("wo") == "" and stop_text.finish() == "wo"


def test_nothing_is_handed_on_after_a_stop():
    stop_text = StopText(["\n\n"])
    assert stop_text.push("one\n") == "one"
    assert stop_text.push("\ntwo") == "" and stop_text.push("three") == "" and stop_text.finish() == ""


@given(st.text(alphabet="abc ", max_size=40), st.lists(st.integers(1, 40), max_size=8),
       st.lists(st.text(alphabet="abc", min_size=1, max_size=4), min_size=1, max_size=3))
def test_any_split_gives_the_text_up_to_the_first_stop(text, cuts, stops):
    pieces, start = [], 0
    for cut in sorted(cuts):
        pieces.append(text[start:cut])
        start = max(start, cut)
    pieces.append(text[start:])
    stop_at = first_stop(text, stops)
    expected = text if stop_at is None else text[:stop_at]
    assert _streamed(pieces, stops) == (expected, stop_at is not None)
