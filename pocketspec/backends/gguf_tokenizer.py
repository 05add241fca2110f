"""llama.cpp's tokenizer for a GGUF, read vocabulary-only: the torch and ONNX backends' tokenizer."""

from __future__ import annotations

from pathlib import Path

from pocketspec.errors import UserError


def load_tokenizer(path: Path):
    """(the vocab-only llama.cpp model, which the caller closes; the Tokenizer over it)."""
    import llama_cpp
    from llama_cpp._internals import LlamaModel

    from pocketspec.backends.llama_context import init_llama
    from pocketspec.signals import stop_signals_held
    from pocketspec.tokenizer import Tokenizer

    if path.is_dir():
        raise UserError(f"{path} is a Hugging Face folder: --backend torch and onnx read the tokenizer from a GGUF, "
                        "so give the model's GGUF (load_model() reads HF folders from Python)")
    init_llama()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    try:
        with stop_signals_held():
            vocab_model = LlamaModel(path_model=str(path), params=params, verbose=False)
    except ValueError as error:
        raise UserError(f"llama.cpp could not read the vocabulary of {path}: {error}") from None
    return vocab_model, Tokenizer(vocab_model)
