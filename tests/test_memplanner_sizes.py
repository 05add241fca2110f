"""memplanner.sizes: sizes typed by people, and sizes shown to them."""

import pytest

from memplanner.sizes import format_bytes, parse_size


@pytest.mark.parametrize("text, expected", [
    ("512MiB", 512 * 2**20), ("3GiB", 3 * 2**30), ("3.5G", int(3.5 * 2**30)), ("1500M", 1500 * 2**20),
    ("123456", 123456), ("2gb", 2 * 2**30), (" 1.5 GiB ", int(1.5 * 2**30)), ("64k", 64 * 1024),
    ("10B", 10), ("1T", 2**40), (4096, 4096),
])
def test_parse_size_reads_binary_units(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "3X", "-1G", "GiB", "3iB", "1.2.3G", "3 G B"])
def test_parse_size_rejects_garbage_with_the_value_in_the_message(text):
    with pytest.raises(ValueError) as error:
        parse_size(text)
    assert repr(text) in str(error.value) or text.strip() in str(error.value)


@pytest.mark.parametrize("text", ["-1", "-1G", " -512MiB", "-0.5GiB"])
def test_a_negative_size_is_called_negative(text):
    """`--memory-budget -1` was "cannot read '-1' as a size", while 0 was "must be positive"."""
    with pytest.raises(ValueError, match=r"is negative; write a size such as 512MiB or 3GiB"):
        parse_size(text)


@pytest.mark.parametrize("text", ["3.5", "0.5", "10.5B"])
def test_a_fraction_of_a_byte_is_refused_asking_for_a_unit(text):
    """`--memory-budget 3.5` read as 3.5 bytes (4 B) and was then refused as below the minimum."""
    with pytest.raises(ValueError, match="is a fraction of a byte: give a unit"):
        parse_size(text)


@pytest.mark.parametrize("num_bytes, expected", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (512 * 2**20, "512.00 MiB"),
    (int(1.23 * 2**30), "1.23 GiB"), (3 * 2**40, "3.00 TiB"), (-2048, "-2.00 KiB"),
])
def test_format_bytes(num_bytes, expected):
    assert format_bytes(num_bytes) == expected


def test_round_trip():
    for text in ("1.50 GiB", "512.00 MiB", "3.00 KiB"):
        assert format_bytes(parse_size(text)) == text


def test_a_size_shown_rounded_up_is_enough_when_typed_back():
    for num_bytes in (234_555_000, 234_552_000, 1_394_892_683, 2**30 + 1):
        shown = format_bytes(num_bytes, round_up=True)
        assert parse_size(shown.replace(" ", "")) >= num_bytes, shown
    assert format_bytes(2**30, round_up=True) == "1.00 GiB"  # an exact size keeps its figure
