"""pocketspec/backends/llama_logs.py: a Ctrl-C that lands while native code runs Python in a ctypes callback
(llama.cpp's log, while it loads a model) is delivered when the native call returns, not dropped by ctypes."""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
import sys

import pytest

from pocketspec.backends.llama_logs import ctrl_c_held

COMPARE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


def _native_call_whose_callback_meets_a_ctrl_c() -> None:
    """libc's qsort calls back into Python, as llama.cpp calls its log callback; a SIGINT is raised from inside."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))

    def compare(first, second) -> int:
        signal.raise_signal(signal.SIGINT)  # a Ctrl-C while the native call runs Python
        return 0

    values = (ctypes.c_int * 4)(3, 1, 2, 0)
    callback = COMPARE(compare)
    libc.qsort(values, len(values), ctypes.sizeof(ctypes.c_int), callback)


def test_without_the_hold_ctypes_drops_the_ctrl_c(monkeypatch):
    """What the hold is for: the interrupt goes to the unraisable hook ("Exception ignored") and the call goes on."""
    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: dropped.append(unraisable.exc_type))
    _native_call_whose_callback_meets_a_ctrl_c()  # returns: nothing is raised here
    assert KeyboardInterrupt in dropped


def test_a_held_ctrl_c_is_raised_once_the_native_call_returns():
    with pytest.raises(KeyboardInterrupt):
        with ctrl_c_held():
            _native_call_whose_callback_meets_a_ctrl_c()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_held_ctrl_c_goes_to_the_handler_that_was_set():
    noted = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))
    try:
        with ctrl_c_held():
            _native_call_whose_callback_meets_a_ctrl_c()
        assert noted and signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_without_a_ctrl_c_nothing_is_raised():
    with ctrl_c_held():
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_llama_cpp_errors_are_printed_and_its_warnings_are_not(capfd):
    """A batch's context logs `n_ctx_seq (12288) > n_ctx_train (8192)` as a warning (level 3) though every row
    keeps to --max-context: noise to a user. An error (level 4) says why a native call failed."""
    from pocketspec.backends.llama_logs import _on_log

    _on_log(3, b"llama_context: n_ctx_seq (12288) > n_ctx_train (8192) -- possible training context overflow\n",
            None)
    _on_log(4, b"llama_model_load: error loading model\n", None)
    assert capfd.readouterr().err == "llama_model_load: error loading model\n"
