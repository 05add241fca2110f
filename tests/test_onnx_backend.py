"""The ONNX Runtime backend on tiny F32 models and SmolLM2: its logits against the torch backend's,
rollback and chunked prefill, greedy speculative output equal to plain decoding on ORT for every
drafter it runs, sampling that keeps the target distribution, and the export cache."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace

import numpy as np
import onnx
import pytest

from conftest import assert_drafted_past_its_window, built_engine, same_distribution_pvalue, sampled_token_counts
from test_cli_errors import assert_one_line_error, run_cli
from memplanner.onnx_sizes import onnx_weight_bytes
from memplanner.shapes import shape_from_gguf
from memplanner.torch_sizes import gguf_layout
from pocketspec.backends.torch_open import open_backend
from pocketspec.file_digest import hash_file
from pocketspec.onnx_model import export
from pocketspec.onnx_model.export import MANIFEST_FILE, export_folder, exported_model, read_intact
from pocketspec.settings import ModelSettings
from tiny_models import write_tiny_pair

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT_TEXT = "the cat is def return"
ONNX = dict(backend="onnx", weights="fp32")
PROMPTS = ["the cat is def return", "import print class self true false none list", "a of to and in is it that"]


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    return write_tiny_pair(tmp_path_factory.mktemp("tiny_onnx"), quant=None)


def _settings(backend: str, **changes) -> ModelSettings:
    return replace(ModelSettings(backend=backend, weights="fp32", max_context=512, num_threads=1, max_logits_rows=128),
                   **changes)


def _prompt(engine, text: str = PROMPT_TEXT) -> list[int]:
    return engine.target.tokenizer.encode(text, add_bos=True)


def _cosines(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    return (first * second).sum(-1) / np.linalg.norm(first, axis=-1) / np.linalg.norm(second, axis=-1)


@pytest.mark.parametrize("model", ["tiny", "smollm2"])
def test_logits_match_the_torch_backend_at_every_position(model, tiny_pair, request):
    path = tiny_pair[0] if model == "tiny" else request.getfixturevalue("smollm2_path")
    with open_backend(path, _settings("torch")) as torch_backend, open_backend(path, _settings("onnx")) as onnx_backend:
        for text in PROMPTS:
            tokens = onnx_backend.tokenizer.encode(text, add_bos=True)
            expected = torch_backend.forward(tokens, range(len(tokens)))
            got = onnx_backend.forward(tokens, range(len(tokens)))
            assert got.shape == expected.shape == (len(tokens), onnx_backend.vocab_size)
            assert _cosines(got, expected).min() >= 0.9999
            assert (got.argmax(-1) == expected.argmax(-1)).all()
            torch_backend.rollback(0)
            onnx_backend.rollback(0)


def test_prefill_in_chunks_and_rollback_give_the_logits_of_one_pass(tiny_pair):
    tokens = [(7 * index) % 300 + 3 for index in range(70)]
    with open_backend(tiny_pair[0], _settings("onnx")) as whole:
        expected = whole.forward(tokens, range(len(tokens)))
    with open_backend(tiny_pair[0], _settings("onnx", n_batch=16)) as chunked:
        last = chunked.prefill(tokens[:50])  # 4 chunks of 16 and one of 2
        assert chunked.num_cached == 50
        np.testing.assert_allclose(last, expected[49], atol=1e-4)
        rejected = chunked.forward([5, 6, 7], range(3))  # a verify whose tokens are then rejected
        assert not np.allclose(rejected[0], expected[50], atol=1e-2)
        chunked.rollback(50)
        np.testing.assert_allclose(chunked.forward(tokens[50:56], range(6)), expected[50:56], atol=1e-4)
        assert chunked.cached_tokens == tokens[:56]


def test_greedy_ngram_equals_plain_on_onnx(tiny_pair):
    target, _ = tiny_pair
    with built_engine(target, drafter="none", **ONNX) as plain:
        expected = plain.generate(_prompt(plain), 200).tokens
    with built_engine(target, drafter="ngram", gamma=4, **ONNX) as engine:
        result = engine.generate(_prompt(engine), 200)
    assert result.tokens == expected
    assert result.stats.num_accepted > 0  # a random model falls into loops that n-grams predict


@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_draft_model_equals_plain_on_onnx(tiny_pair, gamma):
    target, draft = tiny_pair
    with built_engine(target, drafter="none", **ONNX) as plain:
        expected = plain.generate(_prompt(plain), 64).tokens
    with built_engine(target, draft_path=draft, drafter="model", gamma=gamma, **ONNX) as engine:
        result = engine.generate(_prompt(engine), 64)
    assert result.tokens == expected
    assert result.stats.num_drafted > 0 and 0 < result.stats.num_accepted < result.stats.num_drafted


def test_greedy_draft_model_equals_plain_while_its_window_slides(tiny_pair):
    """The draft's cache holds 128 positions: it slides (shift_out on the ONNX caches) to draft 300 tokens."""
    target, draft = tiny_pair
    with built_engine(target, drafter="none", max_context=512, **ONNX) as plain:
        expected = plain.generate(_prompt(plain), 300).tokens
    with built_engine(target, draft_path=draft, drafter="model", gamma=3, max_context=512, draft_max_context=128,
                      **ONNX) as engine:
        result = engine.generate(_prompt(engine), 300)
        assert engine.model.backend.max_context == 128
        assert_drafted_past_its_window(engine, result, len(_prompt(engine)), gamma=3)
    assert result.tokens == expected


def test_int4_greedy_draft_model_equals_plain(tiny_pair):
    """MatMulNBits weights: the speculative output is that of the same int4 model decoding alone."""
    target, draft = tiny_pair
    with built_engine(target, drafter="none", backend="onnx", weights="int4") as plain:
        expected = plain.generate(_prompt(plain), 64).tokens
        assert plain.target.exported.weights_format == "int4"
    with built_engine(target, draft_path=draft, drafter="model", gamma=3, backend="onnx", weights="int4") as engine:
        result = engine.generate(_prompt(engine), 64)
    assert result.tokens == expected
    assert result.stats.num_accepted > 0


def test_speculative_sampling_keeps_the_target_distribution_on_onnx(tiny_pair):
    """Two-sample chi-square at the third generated token: with a draft model vs without, temperature 1."""
    target, draft = tiny_pair
    num_runs, position = 1200, 2
    with built_engine(target, drafter="none", temperature=1.0, **ONNX) as plain:
        plain_counts = sampled_token_counts(plain, _prompt(plain), position, num_runs)
    with built_engine(target, draft_path=draft, drafter="model", gamma=3, temperature=1.0, **ONNX) as engine:
        spec_counts = sampled_token_counts(engine, _prompt(engine), position, num_runs)
        assert engine.controller.acceptance["model"].num_tried > 0
    assert same_distribution_pvalue(plain_counts, spec_counts, num_runs) > 1e-3


@pytest.mark.parametrize("arch, weights", [("llama", "fp32"), ("llama", "int4"), ("llama", "fp16"), ("qwen2", "fp32")])
def test_the_planned_weights_are_the_exported_weights_file(tmp_path, arch, weights):
    target, _ = write_tiny_pair(tmp_path, quant=None, arch=arch)
    exported = exported_model(target, weights)
    is_tied, has_qkv_bias = gguf_layout(target)
    assert has_qkv_bias == (arch == "qwen2")
    weights_file = next(path for path in exported.folder.iterdir() if path.suffix == ".data")
    graph = onnx.load(str(exported.model_file), load_external_data=False)
    inline = sum(len(tensor.raw_data) for tensor in graph.graph.initializer  # tensors under 1 KiB stay in the graph
                 if tensor.data_location != onnx.TensorProto.EXTERNAL)
    assert onnx_weight_bytes(shape_from_gguf(target), weights, is_tied=is_tied,
                             has_qkv_bias=has_qkv_bias) == weights_file.stat().st_size + inline


def test_a_corrupt_export_is_found_and_exported_again(tiny_pair, tmp_path, monkeypatch):
    monkeypatch.setenv("POCKETSPEC_HOME", str(tmp_path))
    exported = exported_model(tiny_pair[0], "fp32")
    weights_file = next(path for path in exported.folder.iterdir() if path.suffix == ".data")
    data = bytearray(weights_file.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, same size
    weights_file.write_bytes(bytes(data))
    assert read_intact(exported.folder) is None
    lines = []
    again = exported_model(tiny_pair[0], "fp32", lines.append)
    assert again.folder == exported.folder and read_intact(again.folder) is not None
    assert any("corrupt" in line for line in lines)
    (again.folder / "model.onnx").unlink()  # half an export (no graph) is exported again too
    assert exported_model(tiny_pair[0], "fp32").model_file.exists()
    assert not [path for path in tmp_path.joinpath("onnx").iterdir() if path.name.startswith(".")]  # no leftovers


@pytest.mark.parametrize("spoil", [lambda config: config.update(num_layers=str(config["num_layers"])),
                                   lambda config: config.pop("rope_base"), lambda config: config.update(num_kv_heads=0),
                                   lambda config: config.update(cache_dtype="int3"),
                                   lambda config: config.update(rope_base=float("nan"))],
                         ids=["a count as text", "a key missing", "no heads", "a cache type", "NaN"])
def test_a_manifest_whose_config_no_export_wrote_is_exported_again(tiny_pair, tmp_path, monkeypatch, spoil):
    """An older layout or a hand edit of the manifest's config was a traceback from the backend (a KeyError, a
    TypeError, ONNX Runtime's RuntimeError); it is a corrupt export, as a changed file is."""
    monkeypatch.setenv("POCKETSPEC_HOME", str(tmp_path))
    exported = exported_model(tiny_pair[0], "fp32")
    manifest_path = exported.folder / MANIFEST_FILE
    manifest = json.loads(manifest_path.read_text())
    spoil(manifest["config"])
    manifest_path.write_text(json.dumps(manifest))
    assert read_intact(exported.folder) is None
    assert exported_model(tiny_pair[0], "fp32").config == exported.config


def test_a_killed_exports_hidden_folder_is_removed_by_the_next_export(tiny_pair, tmp_path, monkeypatch):
    """SIGKILL or an out-of-memory kill mid-export leaves .NAME.XXXX.partial/ behind: no finally ran."""
    monkeypatch.setenv("POCKETSPEC_HOME", str(tmp_path))
    leftover = tmp_path / "onnx" / ".0123456789abcdef-fp32-g3-killed.x1y2.partial"
    leftover.mkdir(parents=True)
    (leftover / "model.onnx.data").write_bytes(b"half of the weights")
    assert exported_model(tiny_pair[0], "fp32").model_file.exists()
    assert not [path for path in tmp_path.joinpath("onnx").iterdir() if path.name.startswith(".")]


def test_a_file_in_the_exports_place_is_replaced_by_the_export(tiny_pair, tmp_path, monkeypatch):
    """A file (or a dangling link) under the export's name made the export fail after its minute of work."""
    monkeypatch.setenv("POCKETSPEC_HOME", str(tmp_path))
    folder = export_folder(tiny_pair[0], "fp32")
    folder.parent.mkdir(parents=True)
    folder.write_text("not an export")
    assert exported_model(tiny_pair[0], "fp32").folder == folder and read_intact(folder) is not None
    shutil.rmtree(folder)
    folder.symlink_to(tmp_path / "nowhere")
    assert exported_model(tiny_pair[0], "fp32").folder == folder and not folder.is_symlink()


def test_an_export_by_an_older_exporter_is_replaced(tiny_pair, tmp_path, monkeypatch):
    monkeypatch.setenv("POCKETSPEC_HOME", str(tmp_path))
    current = exported_model(tiny_pair[0], "fp32")
    older = current.folder.with_name(current.folder.name.replace("-g", "-g0-old-"))
    current.folder.rename(older)
    assert exported_model(tiny_pair[0], "fp32").folder == current.folder
    assert not older.exists()


def test_a_changed_gguf_gets_its_own_export(tmp_path, monkeypatch):
    monkeypatch.setenv("POCKETSPEC_HOME", str(tmp_path / "home"))
    (tmp_path / "models").mkdir()
    first_target, _ = write_tiny_pair(tmp_path / "models", quant=None, seed=1)
    first = exported_model(first_target, "fp32")
    second_target, _ = write_tiny_pair(tmp_path / "models", quant=None, seed=2)  # the same path, new weights
    assert second_target == first_target
    second = exported_model(second_target, "fp32")
    assert second.folder != first.folder
    manifest = json.loads((second.folder / MANIFEST_FILE).read_text())
    assert manifest["weights_format"] == "fp32" and manifest["config"]["num_layers"] == 2


def test_a_gguf_without_a_pull_stamp_is_hashed_once_while_it_is_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv("POCKETSPEC_HOME", str(tmp_path / "home"))
    (tmp_path / "models").mkdir()
    target, _ = write_tiny_pair(tmp_path / "models", quant=None)
    hashed = []
    monkeypatch.setattr(export, "hash_file", lambda path, progress: hashed.append(path) or hash_file(path,
                                                                                                   progress=progress))
    digest = export.gguf_sha256(target)
    assert export.gguf_sha256(target) == digest and hashed == [target]  # the second open reads the home's note
    os.utime(target, ns=(target.stat().st_atime_ns, target.stat().st_mtime_ns + 10 ** 9))  # touched: hashed again
    assert export.gguf_sha256(target) == digest and hashed == [target, target]
    assert digest == hashlib.sha256(target.read_bytes()).hexdigest()


@pytest.mark.parametrize("flags, fragments", [
    (["--backend", "onnx", "--ep", "coreml"], ["--ep coreml", "CoreMLExecutionProvider", "macOS"]),
    (["--ep", "cuda"], ["--ep applies to --backend onnx"]),
    (["--ep", "cpu"], ["--ep applies to --backend onnx"]),  # given, though it is the default's value
    (["--weights", "int8"], ["--weights applies to --backend torch or onnx; add --backend torch or --backend onnx"]),
    (["--backend", "onnx", "--weights", "int8"], ["--weights fp32, fp16, int4 or auto, not int8"]),
    (["--backend", "onnx", "--device", "cuda"], ["--device applies to --backend torch"]),
    (["--backend", "onnx", "--devices", "cpu:0,cpu:1"], ["--backend onnx runs on one device"]),
    (["--backend", "onnx", "--memory-budget", "100MiB"], ["--memory-budget 100.00 MiB is below the ONNX backend's",
                                                         "weights", "even --weights int4 --max-context 512 need"]),
    (["--backend", "onnx", "--draft", "self-sparse"], ["needs --backend torch"]),
    (["--backend", "onnx", "--ep", "npu"], ["'npu' is not one of"]),
])
def test_what_onnx_cannot_run_is_refused_in_one_line(tiny_pair, flags, fragments):
    """coreml: a provider no onnxruntime build on Linux has, so the refusal is the same on any test machine."""
    result = run_cli("generate", "--target", str(tiny_pair[0]), "--prompt", "the cat", "--max-tokens", "2", *flags)
    assert_one_line_error(result, *fragments)


@pytest.mark.parametrize("flags, fragments", [
    (["--draft", "self-sparse"], ["--draft self-sparse", "needs --backend torch"]),
    (["--weights", "bf16"], ["--weights fp32, fp16, int4 or auto, not bf16"]),
])
def test_doctor_calibrate_refuses_what_generate_refuses(tiny_pair, flags, fragments):
    """Before anything is measured: self-sparse measured the target alone, at exit 0."""
    result = run_cli("doctor", "--calibrate", "--backend", "onnx", "--target", str(tiny_pair[0]), *flags)
    assert_one_line_error(result, *fragments)


def test_plan_says_it_does_not_plan_onnx(tiny_pair):
    """plan takes --backend onnx only to say where its plan is (`generate --memory-budget`); its help says so."""
    assert_one_line_error(run_cli("plan", "--backend", "onnx", "--target", str(tiny_pair[0])),
                          "pocketspec plan plans llama.cpp sessions", "generate --backend onnx --memory-budget")
    shown = " ".join(run_cli("plan", "--help").stdout.split())
    assert "onnx is not planned here: `generate --backend onnx --memory-budget ...`" in shown
    assert "--backend onnx: fp32" not in shown and "--ep" not in shown


def test_batches_are_refused_in_one_line(tiny_pair, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "the cat"}\n{"prompt": "a dog"}\n')
    result = run_cli("generate", "--target", str(tiny_pair[0]), "--backend", "onnx", "--prompt-file", str(prompts),
                     "--batch", "2")
    assert_one_line_error(result, "--batch runs on --backend llama.cpp or torch")


def test_ctrl_c_during_an_export_leaves_no_export_behind(tiny_pair, tmp_path):
    """Interrupted while it traces the graph: exit 130, no folder under the export's name, no hidden partial one;
    the next run exports whole."""
    import os

    import pexpect

    home = tmp_path / "home"
    env = {**os.environ, "POCKETSPEC_HOME": str(home)}
    command = [sys.executable, "-m", "apps.cli", "generate", "--target", str(tiny_pair[0]), "--backend", "onnx",
               "--prompt", "the cat", "--max-tokens", "2", "--draft", "none"]
    child = pexpect.spawn(command[0], command[1:], env=env, encoding="utf-8", timeout=300)
    child.expect("tracing and translating the graph 0 s")  # shown on a terminal, like every progress line
    child.sendintr()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130, child.before
    assert "Traceback" not in child.before
    assert not list((home / "onnx").iterdir())
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert [read_intact(folder) is not None for folder in (home / "onnx").iterdir()] == [True]


def test_a_watching_terminal_sees_the_int4_quantization_go_to_its_end(tiny_pair, tmp_path):
    """The quantizer reports nothing itself: the export counts its MatMuls in a bar that reaches 100 %."""
    import pexpect

    env = {**os.environ, "POCKETSPEC_HOME": str(tmp_path / "home")}
    command = [sys.executable, "-m", "apps.cli", "generate", "--target", str(tiny_pair[0]), "--backend", "onnx",
               "--weights", "int4", "--prompt", "the cat", "--max-tokens", "2", "--draft", "none"]
    child = pexpect.spawn(command[0], command[1:], env=env, encoding="utf-8", timeout=300)
    child.expect("quantizing the weights to int4")
    child.expect("100%")
    child.expect("writing the quantized model")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
