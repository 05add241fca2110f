"""Tests for pocketspec.models.gguf_check on the real cached models and damaged copies of them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import SESSION_HOME

from pocketspec.errors import UserError
from pocketspec.models.gguf_check import check_gguf, check_same_vocab

CACHE = SESSION_HOME / "models"  # where `make test` pulled them
SMOLLM2 = CACHE / "smollm2-135m-instruct.gguf"
QWEN_DRAFT = CACHE / "qwen2.5-coder-0.5b-instruct.gguf"
QWEN_TARGET = CACHE / "qwen2.5-coder-1.5b-instruct.gguf"


def _require(path: Path) -> Path:
    if not path.exists():
        pytest.fail(f"{path} is absent; run `make models-test` (or `pocketspec models pull {path.stem}`)")
    return path


def _copy_prefix(source: Path, destination: Path, num_bytes: int) -> Path:
    with open(source, "rb") as src:
        destination.write_bytes(src.read(num_bytes))
    return destination


def test_reads_smollm2_metadata():
    info = check_gguf(_require(SMOLLM2))
    assert info.arch == "llama"
    assert info.vocab_size == 49152
    assert info.num_layers == 30
    assert info.embedding_length == 576
    assert (info.num_heads, info.num_kv_heads) == (9, 3)
    assert info.file_bytes == 98362432
    assert "<|im_start|>" in info.chat_template
    assert isinstance(info.eos_token_id, int) and isinstance(info.bos_token_id, int)


def test_reads_qwen_metadata():
    info = check_gguf(_require(QWEN_DRAFT))
    assert (info.arch, info.vocab_size, info.num_layers) == ("qwen2", 151936, 24)
    assert info.context_length == 32768


def test_truncated_file_is_caught_before_loading(tmp_path):
    truncated = _copy_prefix(_require(SMOLLM2), tmp_path / "truncated.gguf", 50 * 2**20)
    with pytest.raises(UserError, match="truncated") as caught:
        check_gguf(truncated, fix="re-download with: pocketspec models pull smollm2-135m-instruct")
    message = str(caught.value)
    assert str(truncated) in message and "pocketspec models pull" in message and "\n" not in message


def test_one_byte_short_is_truncated(tmp_path):
    source = _require(SMOLLM2)
    short = tmp_path / "short.gguf"
    shutil.copyfile(source, short)
    with open(short, "r+b") as file:
        file.truncate(source.stat().st_size - 1)
    with pytest.raises(UserError, match="truncated"):
        check_gguf(short)


def test_bad_magic_is_not_a_gguf(tmp_path):
    corrupt = tmp_path / "corrupt.gguf"
    with open(_require(SMOLLM2), "rb") as src:
        corrupt.write_bytes(b"GGML" + src.read(2**20)[4:])
    with pytest.raises(UserError, match="not a GGUF"):
        check_gguf(corrupt)


@pytest.mark.parametrize("num_bytes", [8, 100, 4096, 1_000_000])
def test_header_cut_short_is_truncated(tmp_path, num_bytes):
    """`head -c N model.gguf` cut inside the header: said as truncated, not as struct's own words
    ("unpack_from requires a buffer of at least ...")."""
    cut = _copy_prefix(_require(SMOLLM2), tmp_path / "cut.gguf", num_bytes)
    with pytest.raises(UserError, match="is truncated") as caught:
        check_gguf(cut)
    message = str(caught.value)
    assert str(cut) in message and f"({num_bytes} bytes)" in message and "unpack" not in message


def test_empty_and_text_files_are_not_gguf(tmp_path):
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    text = tmp_path / "notes.gguf"
    text.write_text("this is not a model\n")
    for path in (empty, text):
        with pytest.raises(UserError, match="not a GGUF"):
            check_gguf(path)


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nowhere.gguf"
    with pytest.raises(UserError, match="does not exist") as caught:
        check_gguf(missing)
    assert str(missing) in str(caught.value)


def test_directory_is_not_a_model(tmp_path):
    with pytest.raises(UserError, match="not a file"):
        check_gguf(tmp_path)


def test_vocab_mismatch_between_families_raises():
    target = check_gguf(_require(QWEN_DRAFT))
    draft = check_gguf(_require(SMOLLM2))
    with pytest.raises(UserError, match="vocabulary 49152.*has 151936.*same family"):
        check_same_vocab(target, draft)


def test_qwen_coder_pair_shares_its_vocabulary():
    check_same_vocab(check_gguf(_require(QWEN_TARGET)), check_gguf(_require(QWEN_DRAFT)))
