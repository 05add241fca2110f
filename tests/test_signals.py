"""pocketspec/signals.py: a Ctrl-C or SIGTERM that lands while native code runs Python in a ctypes callback
(llama.cpp's log, while it loads a model) is delivered when the native call returns, not dropped by ctypes."""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
import sys

import pytest

from pocketspec.signals import Terminated, raise_terminated, stop_signals_held

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
        with stop_signals_held():
            _native_call_whose_callback_meets_a_ctrl_c()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_held_ctrl_c_goes_to_the_handler_that_was_set():
    noted = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))
    try:
        with stop_signals_held():
            _native_call_whose_callback_meets_a_ctrl_c()
        assert noted and signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_without_a_ctrl_c_nothing_is_raised():
    with stop_signals_held():
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_held_sigterm_or_sighup_goes_to_its_own_handler_once_the_block_ends(signum):
    """The CLI's SIGTERM (and SIGHUP) handler raises Terminated, a SystemExit: inside a ctypes callback it would
    be dropped too."""
    previous = signal.signal(signum, raise_terminated)
    try:
        with pytest.raises(Terminated) as raised:
            with stop_signals_held():
                signal.raise_signal(signum)
                signal.raise_signal(signum)  # twice: delivered once
                reached_the_end = True
        assert reached_the_end and raised.value.code == 128 + signum
        assert signal.getsignal(signum) is raise_terminated
    finally:
        signal.signal(signum, previous)


def test_a_held_sighup_that_nohup_ignores_stays_ignored():
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stop_signals_held():
            signal.raise_signal(signal.SIGHUP)
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
