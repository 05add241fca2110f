"""llama.cpp's own tokenizer for a loaded model, plus a UTF-8-safe streaming detokenizer."""

from __future__ import annotations

import codecs
import ctypes
from functools import lru_cache
from typing import Sequence

import llama_cpp


# encode(max_tokens=N) first reads a part of N x this many characters (English runs 3-5 a token), and stops at a
# part that has more than N + the margin tokens: cutting a text mid-word or mid-special-token adds a few at most
FIRST_PART_CHARS_PER_TOKEN = 8
PART_TOKENS_MARGIN = 64


def counted_tokens(num_tokens: int, max_tokens: int) -> str:
    """A count from encode(max_tokens=max_tokens) as a message says it: exact, or "more than max_tokens" where
    the count stopped at a first part past the margin."""
    return f"more than {max_tokens}" if num_tokens > max_tokens + PART_TOKENS_MARGIN else str(num_tokens)


class Tokenizer:
    def __init__(self, llama_model):
        self._model = llama_model
        self._vocab = llama_model.vocab

    def encode(self, text: str, *, add_bos: bool = True, parse_special: bool = False,
               max_tokens: int | None = None) -> list[int]:
        """The text's tokens. max_tokens: a text whose first part already has more tokens than that (and a
        margin) returns that part's tokens, which the caller refuses as too long, rather than being read whole:
        llama.cpp's search for special tokens takes time that grows with their count times the text's length."""
        if max_tokens is not None:
            part_chars = FIRST_PART_CHARS_PER_TOKEN * max(1, max_tokens)
            while part_chars < len(text):
                part_tokens = self._model.tokenize(text[:part_chars].encode("utf-8"), add_bos, parse_special)
                if len(part_tokens) > max_tokens + PART_TOKENS_MARGIN:
                    return part_tokens
                part_chars *= 4
        return self._model.tokenize(text.encode("utf-8"), add_bos, parse_special)

    def decode(self, tokens: Sequence[int]) -> str:
        """The tokens' text, as a streamer shows it (a character they end in the middle of is left out)."""
        return self.streamer().push(tokens)

    def piece(self, token: int, special: bool = False) -> bytes:
        return self._piece(token, special)

    @lru_cache(maxsize=65536)
    def _piece(self, token: int, special: bool) -> bytes:
        # llama-cpp-python 0.3.36's LlamaModel.token_to_piece returns the whole
        # NUL-padded buffer, so call the C function and keep only the written bytes.
        size = 64
        while True:
            buffer = ctypes.create_string_buffer(size)
            num_bytes = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, size, 0, special)
            if num_bytes >= 0:
                return buffer.raw[:num_bytes]
            size = -num_bytes

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    @property
    def vocab_size(self) -> int:
        """The number of token ids the tokenizer knows (a model's embedding may have more rows)."""
        return llama_cpp.llama_vocab_n_tokens(self._vocab)

    @property
    def adds_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))

    @property
    def bos_token(self) -> int:
        return self._model.token_bos()

    @property
    def eos_token(self) -> int:
        return self._model.token_eos()

    def metadata(self) -> dict[str, str]:
        return self._model.metadata()

    def streamer(self) -> "TextStreamer":
        return TextStreamer(self)


class TextStreamer:
    """Turns tokens into text as they arrive, holding back an unfinished UTF-8 sequence.

    Bytes that can never be UTF-8 become U+FFFD as they come. What is still held at the end is a character the
    reply stopped in the middle of (max_tokens, a stop, a Ctrl-C): flush() leaves it out, rather than showing
    and saving a U+FFFD the model never meant.
    """

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, tokens: Sequence[int]) -> str:
        return self._decoder.decode(b"".join(self._tokenizer.piece(token) for token in tokens))

    def flush(self) -> str:
        """'': the end of the text. An unfinished character held back is dropped (see the class)."""
        self._decoder.reset()
        return ""
