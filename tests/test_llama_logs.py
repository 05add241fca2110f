"""pocketspec/backends/llama_logs.py: which of llama.cpp's log lines reach the user."""

from __future__ import annotations


def test_llama_cpp_errors_are_printed_and_its_warnings_are_not(capfd):
    """A batch's context logs `n_ctx_seq (12288) > n_ctx_train (8192)` as a warning (level 3) though every row
    keeps to --max-context: noise to a user. An error (level 4) says why a native call failed."""
    from pocketspec.backends.llama_logs import _on_log

    _on_log(3, b"llama_context: n_ctx_seq (12288) > n_ctx_train (8192) -- possible training context overflow\n",
            None)
    _on_log(4, b"llama_model_load: error loading model\n", None)
    assert capfd.readouterr().err == "llama_model_load: error loading model\n"
