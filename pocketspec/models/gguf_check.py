"""Checks a GGUF file before llama.cpp loads it, and reads the metadata PocketSpec needs.

A missing, foreign, truncated or unreadable file, or one whose shape values cannot be
trusted (memplanner.gguf_sanity), becomes one UserError line that names the path and the
fix, instead of a crash inside the planner or llama.cpp. Only the header is parsed (with
memplanner.gguf_header, which walks it over an mmap): tensor data is never read, so a
1 GB file is checked in well under a second.
"""

from __future__ import annotations

import functools
import hashlib
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

from memplanner.gguf_header import GGUFHeader, read_gguf_header
from memplanner.gguf_sanity import header_problem
from pocketspec.errors import UserError

GGUF_MAGIC = b"GGUF"
DEFAULT_FIX = "re-download it, or pass another GGUF file"


@dataclass(frozen=True)
class GGUFInfo:
    """What PocketSpec needs to know about a model file, read from its header."""

    path: Path
    arch: str
    name: str | None
    vocab_size: int
    tokens_sha256: str  # hash of the raw token-string array: equal hashes, equal vocabularies
    num_layers: int | None
    context_length: int | None
    embedding_length: int | None
    num_heads: int | None
    num_kv_heads: int | None
    chat_template: str | None
    bos_token_id: int | None
    eos_token_id: int | None
    num_tensors: int
    file_bytes: int
    metadata: dict = field(default_factory=dict, compare=False, repr=False)  # scalar keys only


def _parse(path: Path, header: GGUFHeader, buffer: mmap.mmap, fix: str) -> GGUFInfo:
    version = struct.unpack_from("<I", buffer, 4)[0]
    if version not in (2, 3):
        raise UserError(f"{path}: GGUF version {version} is not supported (need 2 or 3); {fix}")
    if header.data_end > header.file_bytes:
        raise UserError(
            f"{path} is truncated: it holds {header.file_bytes} bytes but its tensors need "
            f"{header.data_end}; {fix}"
        )
    metadata = header.metadata
    if "tokenizer.ggml.tokens" not in header.array_spans:
        raise UserError(f"{path} has no tokenizer vocabulary (tokenizer.ggml.tokens); {fix}")
    problem = header_problem(header)
    if problem is not None:
        raise UserError(f"{path} cannot be used: {problem}; {fix}")
    arch = metadata["general.architecture"]

    def arch_int(key: str) -> int | None:
        value = metadata.get(f"{arch}.{key}")
        return int(value) if isinstance(value, (int, float)) else None

    tokens_start, tokens_end = header.array_spans["tokenizer.ggml.tokens"]
    template = metadata.get("tokenizer.chat_template")
    name = metadata.get("general.name")
    return GGUFInfo(
        path=path,
        arch=arch,
        name=name if isinstance(name, str) else None,
        vocab_size=header.array_lengths["tokenizer.ggml.tokens"],
        tokens_sha256=hashlib.sha256(buffer[tokens_start:tokens_end]).hexdigest(),
        num_layers=arch_int("block_count"),
        context_length=arch_int("context_length"),
        embedding_length=arch_int("embedding_length"),
        num_heads=arch_int("attention.head_count"),
        num_kv_heads=arch_int("attention.head_count_kv"),
        chat_template=template if isinstance(template, str) else None,
        bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=metadata.get("tokenizer.ggml.eos_token_id"),
        num_tensors=len(header.tensors),
        file_bytes=header.file_bytes,
        metadata={key: value for key, value in metadata.items() if not isinstance(value, list)},
    )


@functools.lru_cache(maxsize=16)
def _check_cached(path: Path, file_bytes: int, mtime_ns: int, fix: str) -> GGUFInfo:
    if file_bytes < len(GGUF_MAGIC):
        raise UserError(f"{path} is not a GGUF model file (only {file_bytes} bytes); {fix}")
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
        if buffer[:4] != GGUF_MAGIC:
            raise UserError(f"{path} is not a GGUF model file (bad magic bytes); {fix}")
        try:
            return _parse(path, read_gguf_header(path), buffer, fix)
        except struct.error:  # a read past the end of the buffer: the header was cut off (or a length is garbage)
            raise UserError(f"{path} is truncated or damaged: its header runs past the end of the file "
                            f"({file_bytes} bytes); {fix}") from None
        except (ValueError, KeyError, OverflowError, UnicodeDecodeError) as error:
            raise UserError(f"{path}: GGUF metadata is unreadable ({error}); {fix}") from None


def check_gguf(path: str | Path, *, fix: str = DEFAULT_FIX) -> GGUFInfo:
    """Validate a GGUF file's header and size; return its metadata or raise UserError.

    `fix` is the advice appended to every error, e.g. "re-download with: pocketspec
    models pull NAME". Results are cached per (path, size, mtime).
    """
    path = Path(path).expanduser().resolve()
    if not path.exists():
        raise UserError(f"model file {path} does not exist; {fix}")
    if not path.is_file():
        raise UserError(f"{path} is not a file; pass the path of a .gguf model file")
    try:
        stat = path.stat()
        return _check_cached(path, stat.st_size, stat.st_mtime_ns, fix)
    except PermissionError:
        raise UserError(f"{path} cannot be read (permission denied)") from None


def check_same_vocab(target_info: GGUFInfo, draft_info: GGUFInfo) -> None:
    """Raise UserError unless draft and target share one vocabulary, token for token."""
    if (target_info.vocab_size != draft_info.vocab_size
            or target_info.tokens_sha256 != draft_info.tokens_sha256):
        detail = "" if target_info.vocab_size != draft_info.vocab_size else " but different tokens"
        raise UserError(
            f"draft {draft_info.path.name} has vocabulary {draft_info.vocab_size}, "
            f"target {target_info.path.name} has {target_info.vocab_size}{detail}: "
            "pick a draft from the same family"
        )
