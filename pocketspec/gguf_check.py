"""Checks a GGUF file before llama.cpp loads it, and reads the metadata PocketSpec needs.

A missing, foreign, truncated or unreadable file becomes one UserError line that names the
path and the fix, instead of a crash inside llama.cpp. Only the header is parsed: tensor
data is never read, so a 1 GB file is checked in well under a second.

gguf.GGUFReader is not used for parsing: it builds a numpy view per array element and
takes over 10 s on a 151936-token Qwen vocabulary (gguf 0.19). We walk the header over
an mmap instead and take the type tables (value types, quant block sizes) from `gguf`.
"""

from __future__ import annotations

import functools
import hashlib
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from pocketspec.errors import UserError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
DEFAULT_FIX = "re-download it, or pass another GGUF file"

_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.FLOAT64: "<d",
    GGUFValueType.BOOL: "<?",
}


@dataclass(frozen=True)
class GGUFArray:
    """Where an array value lies in the file; elements are decoded only on demand."""

    element_type: GGUFValueType
    num_elements: int
    start: int  # byte offset of the first element
    end: int  # byte offset just past the last element


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


class _Header:
    """A forward-only reader over the header bytes; raises struct.error past the end."""

    def __init__(self, buffer: mmap.mmap):
        self.buffer = buffer
        self.offset = 0

    def scalar(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self.buffer, self.offset)
        self.offset += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        num_bytes = self.scalar("<Q")
        self._need(num_bytes)
        raw = self.buffer[self.offset:self.offset + num_bytes]
        self.offset += num_bytes
        return raw.decode("utf-8", errors="replace")

    def skip_strings(self, num_strings: int) -> None:
        buffer, offset = self.buffer, self.offset
        for _ in range(num_strings):
            (num_bytes,) = struct.unpack_from("<Q", buffer, offset)
            offset += 8 + num_bytes
        self.offset = offset
        self._need(0)

    def value(self, value_type: GGUFValueType):
        if value_type == GGUFValueType.STRING:
            return self.string()
        if value_type == GGUFValueType.ARRAY:
            element_type = GGUFValueType(self.scalar("<I"))
            num_elements = self.scalar("<Q")
            start = self.offset
            if element_type == GGUFValueType.STRING:
                self._need(num_elements * 8)  # each string has at least its length field
                self.skip_strings(num_elements)
            elif element_type in _SCALAR_FORMATS:
                num_bytes = num_elements * struct.calcsize(_SCALAR_FORMATS[element_type])
                self._need(num_bytes)
                self.offset += num_bytes
            else:
                raise ValueError(f"unsupported array element type {element_type}")
            return GGUFArray(element_type, num_elements, start, self.offset)
        return self.scalar(_SCALAR_FORMATS[value_type])

    def _need(self, num_bytes: int) -> None:
        if self.offset + num_bytes > len(self.buffer):
            raise ValueError("header runs past the end of the file")


def _tensor_bytes(dims: list[int], ggml_type: int) -> int:
    block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    num_elements = 1
    for dim in dims:
        num_elements *= dim
    return num_elements // block_size * type_size


def _parse(path: Path, buffer: mmap.mmap, fix: str) -> GGUFInfo:
    header = _Header(buffer)
    header.offset = len(GGUF_MAGIC)
    version = header.scalar("<I")
    if version not in (2, 3):
        raise UserError(f"{path}: GGUF version {version} is not supported (need 2 or 3); {fix}")
    num_tensors = header.scalar("<Q")
    num_kv = header.scalar("<Q")
    metadata: dict = {}
    for _ in range(num_kv):
        key = header.string()
        metadata[key] = header.value(GGUFValueType(header.scalar("<I")))

    data_end = 0
    tensor_infos = []
    for _ in range(num_tensors):
        header.string()  # tensor name
        num_dims = header.scalar("<I")
        dims = [header.scalar("<Q") for _ in range(num_dims)]
        ggml_type = header.scalar("<I")
        tensor_infos.append((header.scalar("<Q"), _tensor_bytes(dims, ggml_type)))
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    data_start = -(-header.offset // alignment) * alignment
    for relative_offset, num_bytes in tensor_infos:
        data_end = max(data_end, data_start + relative_offset + num_bytes)

    file_bytes = len(buffer)
    if data_end > file_bytes:
        raise UserError(
            f"{path} is truncated: it holds {file_bytes} bytes but its tensors need "
            f"{data_end}; {fix}"
        )
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, GGUFArray):
        raise UserError(f"{path} has no tokenizer vocabulary (tokenizer.ggml.tokens); {fix}")
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise UserError(f"{path} does not name its architecture (general.architecture); {fix}")

    def arch_int(key: str) -> int | None:
        value = metadata.get(f"{arch}.{key}")
        return int(value) if isinstance(value, (int, float)) else None

    template = metadata.get("tokenizer.chat_template")
    return GGUFInfo(
        path=path,
        arch=arch,
        name=metadata.get("general.name") if isinstance(metadata.get("general.name"), str) else None,
        vocab_size=tokens.num_elements,
        tokens_sha256=hashlib.sha256(buffer[tokens.start:tokens.end]).hexdigest(),
        num_layers=arch_int("block_count"),
        context_length=arch_int("context_length"),
        embedding_length=arch_int("embedding_length"),
        num_heads=arch_int("attention.head_count"),
        num_kv_heads=arch_int("attention.head_count_kv"),
        chat_template=template if isinstance(template, str) else None,
        bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=metadata.get("tokenizer.ggml.eos_token_id"),
        num_tensors=num_tensors,
        file_bytes=file_bytes,
        metadata={k: v for k, v in metadata.items() if not isinstance(v, GGUFArray)},
    )


@functools.lru_cache(maxsize=16)
def _check_cached(path: Path, file_bytes: int, mtime_ns: int, fix: str) -> GGUFInfo:
    if file_bytes < len(GGUF_MAGIC):
        raise UserError(f"{path} is not a GGUF model file (only {file_bytes} bytes); {fix}")
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
        if buffer[:4] != GGUF_MAGIC:
            raise UserError(f"{path} is not a GGUF model file (bad magic bytes); {fix}")
        try:
            return _parse(path, buffer, fix)
        except (struct.error, ValueError, KeyError, OverflowError) as error:
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
