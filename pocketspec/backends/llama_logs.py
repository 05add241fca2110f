"""One process-wide llama.cpp log callback: keeps buffer-size lines, prints only errors.

llama.cpp reports the KV, compute and output buffers it allocates only in its
log, so the memory report reads them from here. A call that logs through it (a model's
load, a context's creation) runs Python inside a ctypes callback, where a Ctrl-C's
KeyboardInterrupt would be printed and dropped: such calls run under
pocketspec/signals.py's stop_signals_held().
"""

from __future__ import annotations

import ctypes
import re
import sys

import llama_cpp

_GGML_LOG_LEVEL_ERROR = 4  # ggml.h's enum ggml_log_level: NONE, DEBUG, INFO, WARN (3), ERROR (4), CONT
_BUFFER_LINE = re.compile(r"(\w[\w ]*?) buffer size\s*=\s*([\d.]+) MiB")

_captured_lines: list[str] = []


@llama_cpp.llama_log_callback
def _on_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    line = text.decode("utf-8", errors="replace")
    if "buffer size" in line:
        _captured_lines.append(line.strip())
    if level == _GGML_LOG_LEVEL_ERROR:
        print(line, end="", file=sys.stderr, flush=True)


def install() -> None:
    llama_cpp.llama_log_set(_on_log, ctypes.c_void_p(0))


def take_buffer_sizes() -> dict[str, int]:
    """Bytes per buffer kind logged since the last call, e.g. {'CPU KV': ..., 'CPU compute': ...}."""
    sizes: dict[str, int] = {}
    for line in _captured_lines:
        match = _BUFFER_LINE.search(line)
        if match:
            kind = match.group(1).strip()
            sizes[kind] = sizes.get(kind, 0) + int(float(match.group(2)) * 2**20)
    _captured_lines.clear()
    return sizes
