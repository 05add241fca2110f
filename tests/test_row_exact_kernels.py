"""native/patches/row-exact-verify.patch: ggml's CPU kernels compute every row of a verify batch (up to 32
rows) bit for bit as one-row decoding computes it, on random blocks and on a real Q4_K_M model; with
GGML_CPU_ROW_EXACT=0 the same build runs the stock kernels again and says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from pocketspec.backends import ggml_ops

ROW_EXACT_ROWS = ggml_ops.row_exact_max_rows()
needs_row_exact = pytest.mark.skipif(
    ROW_EXACT_ROWS == 0, reason="this llama.cpp build has no row-exact kernels (`pocketspec doctor` says so); "
                                "native/build_llama_cpp.sh builds them")
WIDTHS = 32


def test_the_build_covers_every_verify_width():
    """Not skipped where the kernels are missing: every exact comparison of the suite rests on them, and without
    this one failure a build that lost them would fail those with diffs that do not say why."""
    assert ROW_EXACT_ROWS == WIDTHS, ("this llama.cpp build has no row-exact kernels (`pocketspec doctor` says so); "
                                      "native/build_llama_cpp.sh builds them")


@needs_row_exact
@pytest.mark.parametrize("weight_type, repack, rows, columns", [
    ("q4_k", False, 256, 1536), ("q4_k", True, 256, 1536),
    ("q4_k", True, 24, 8960),  # many blocks per row, weight rows not a multiple of the threads' chunks
    ("q6_k", False, 40, 8960), ("q6_k", False, 256, 256),
    ("q5_k", False, 64, 512),  # no wide kernel: the one-row kernel at every width, never the tiled one
    ("q8_0", False, 64, 512), ("q4_1", False, 64, 512),
    ("iq4_nl", False, 64, 512), ("f16", False, 64, 512),  # llamafile's sgemm rounds these unlike one row
])
def test_every_row_of_a_verify_batch_is_the_one_row_matmul(weight_type, repack, rows, columns):
    exact = ggml_ops.matmul_exact_widths(weight_type, repack, WIDTHS, rows=rows, columns=columns, seed=rows)
    assert all(exact), f"{weight_type} repack={repack}: exact widths {ggml_ops.describe_widths(exact)}"


@needs_row_exact
@pytest.mark.parametrize("kv_type", ["f16", "bf16"])
@pytest.mark.parametrize("depth", [0, 1024])
def test_every_row_of_a_verify_batch_attends_as_one_token(kv_type, depth):
    """Past 512 cache cells a stock build splits one token's f16 attention over the threads."""
    exact = ggml_ops.attention_exact_widths(kv_type, depth, WIDTHS)
    assert all(exact), f"{kv_type} at depth {depth}: exact widths {ggml_ops.describe_widths(exact)}"


ATTENTION_SCRIPT = """
import sys
import numpy as np
from pocketspec.backends import ggml_ops
rng = np.random.default_rng(7)
out = {}
for width in (3, 5, 8):
    queries = rng.standard_normal((width, 12, 128)).astype(np.float32)
    keys, values = rng.standard_normal((2, 1100, 2, 128)).astype(np.float32)
    out[str(width)] = ggml_ops.attention("f16", queries, keys, values, 700)
np.savez(sys.argv[1], **out)
"""


@needs_row_exact
def test_the_wide_attention_pass_is_the_one_query_loop(tmp_path):
    """The patch's attention reads each key and value row once for all the queries of a K/V head; each
    query's result is still bit for bit what ggml's one-query loop gives (a stock build runs that loop
    for a batch of fewer than its tile's rows), whichever heads and rows a thread's chunk holds."""
    results = {}
    for mode, environment in (("wide", os.environ), ("stock", {**os.environ, "GGML_CPU_ROW_EXACT": "0"})):
        path = tmp_path / f"{mode}.npz"
        subprocess.run([sys.executable, "-c", ATTENTION_SCRIPT, str(path)], check=True, env=environment)
        results[mode] = np.load(path)
    for width in ("3", "5", "8"):
        wide, stock = results["wide"][width], results["stock"][width]
        assert np.array_equal(wide.view(np.uint32), stock.view(np.uint32)), f"{width} rows"


FALLBACK_SCRIPT = """
import json, logging
from pocketspec.backends import ggml_ops
logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
print(json.dumps({"rows": ggml_ops.row_exact_max_rows(),
                  "q4_k_repacked": ggml_ops.matmul_exact_widths("q4_k", True, 8),
                  "f16_deep": ggml_ops.attention_exact_widths("f16", 1024, 4)}))
"""


@needs_row_exact
def test_turned_off_the_build_runs_the_stock_kernels_and_says_so():
    """GGML_CPU_ROW_EXACT=0: what a build without the patch computes (the repacked gemm from 4 rows,
    f16 attention split over the threads), and doctor names the mode."""
    environment = {**os.environ, "GGML_CPU_ROW_EXACT": "0"}
    done = subprocess.run([sys.executable, "-c", FALLBACK_SCRIPT], capture_output=True, text=True, check=True,
                          env=environment)
    stock = json.loads(done.stdout.strip().splitlines()[-1])
    assert stock["rows"] == 0
    assert stock["q4_k_repacked"][:3] == [True] * 3 and not any(stock["q4_k_repacked"][3:])
    assert stock["f16_deep"][0] and not any(stock["f16_deep"][1:])
    doctor = subprocess.run([sys.executable, "-m", "apps.cli", "doctor"], capture_output=True, text=True, check=True,
                            env=environment)
    assert "row-exact verify  off (GGML_CPU_ROW_EXACT=0)" in doctor.stdout


@needs_row_exact
def test_doctor_names_the_row_exact_kernels():
    doctor = subprocess.run([sys.executable, "-m", "apps.cli", "doctor"], capture_output=True, text=True, check=True)
    assert f"row-exact verify  up to {WIDTHS} rows" in doctor.stdout


@needs_row_exact
def test_the_qwen_target_verifies_32_rows_exactly_at_the_start_and_deep_in_the_context(qwen_target_path):
    """The real Q4_K_M model (Q4_K and Q6_K weights, repacked; f16 cache past 512 cells): every width
    the probe tries, at 0 and at 320 cached tokens, gives one-token logits bit for bit. The probe is the one
    a session runs (cached per model, build and settings: a test of this session that already probed this
    build's kernels on these settings is not repeated)."""
    from conftest import built_engine

    with built_engine(qwen_target_path, drafter="ngram", max_gamma=WIDTHS - 1) as engine:
        assert engine.target.settings.repack_weights and engine.target.settings.kv_type == "f16"
        assert engine.target.max_logits_rows >= WIDTHS
        assert engine.target.exact_verify_width(WIDTHS) == WIDTHS


@needs_row_exact
def test_by_default_speculation_is_exact_and_drafts_at_full_width_past_256_cached_tokens(qwen_target_path):
    """No verify flag: the session picks exact, drafts as wide as it asks (no note caps it) and equals
    plain decoding."""
    from test_engine_real import _chat_tokens, _long_document_prompt, _plain_tokens

    from conftest import built_engine

    document = _long_document_prompt()
    expected = _plain_tokens(qwen_target_path, document, 48, max_context=2048)
    gamma = 8
    with built_engine(qwen_target_path, drafter="ngram", gamma=gamma, max_context=2048, exact_verify=None) as engine:
        prompt = _chat_tokens(engine, document)
        assert len(prompt) > 256  # one token then attends over 512 cells, where a stock build splits them
        result = engine.generate(prompt, 48)
        assert engine.controller.fixed_gamma == gamma
        assert engine.is_exact_verify and not any("verify" in note for note in engine.notes), engine.notes
    assert result.stats.num_drafted > 0
    assert result.tokens == expected
