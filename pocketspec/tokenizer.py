"""llama.cpp's own tokenizer for a loaded model, plus a UTF-8-safe streaming detokenizer."""

from __future__ import annotations

import codecs
import ctypes
from functools import lru_cache
from typing import Sequence

import llama_cpp


class Tokenizer:
    def __init__(self, llama_model):
        self._model = llama_model
        self._vocab = llama_model.vocab

    def encode(self, text: str, *, add_bos: bool = True, parse_special: bool = False) -> list[int]:
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
