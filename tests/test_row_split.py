"""The torch backend's row split (tensor parallel) over 2 gloo ranks on the CPU: greedy output equals
single-device plain decoding token for token, plain and speculative, on a tiny random model and
on SmolLM2 (whose 3 KV heads split 2 + 1); a rank that dies or a forward cut short ends cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch

from conftest import built_engine
from pocketspec.backends.torch_backend import TorchBackend
from pocketspec.backends.row_split import rank_settings
from pocketspec.backends.torch_open import open_backend
from pocketspec.conversation.chat_template import encode_chat, template_for
from pocketspec.speculation.engine import SpeculativeEngine
from pocketspec.errors import ModelLost, UserError
from pocketspec.settings import ModelSettings, SpeculationSettings
from tiny_models import write_tiny_pair

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT_TEXT = "the cat is def return"
REPETITIVE_TEXT = "Copy this list exactly, twice: alpha, beta, gamma, delta, epsilon, zeta, eta, theta, iota\n"
ROW = dict(backend="torch", weights="fp32", max_context=512, max_logits_rows=9, num_threads=1,
           devices=("cpu:0", "cpu:1"), split_mode="row")


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    return write_tiny_pair(tmp_path_factory.mktemp("tiny_rows"), quant=None, num_layers=4)


def _plain(target, num_tokens: int) -> list[int]:
    with built_engine(target, drafter="none", backend="torch", weights="fp32", max_context=512) as engine:
        return engine.generate(engine.target.tokenizer.encode(PROMPT_TEXT, add_bos=True), num_tokens).tokens


def _chat(backend, text: str) -> list[int]:
    return encode_chat(backend.tokenizer, template_for(backend.tokenizer), [{"role": "user", "content": text}])


def _generate(target, num_tokens: int, drafter: str, draft=None, gamma: int | None = 4, prompt=None):
    speculation = SpeculationSettings(drafter=drafter, gamma=None if drafter == "none" else gamma)
    engine = SpeculativeEngine(target, draft_backend=draft, speculation=speculation)
    return engine.generate(prompt or target.tokenizer.encode(PROMPT_TEXT, add_bos=True), num_tokens)


def test_row_split_greedy_equals_single_device_plain(tiny_pair):
    """One row split per process (torch.distributed's default group), so every drafter runs on this one."""
    target, draft_path = tiny_pair
    expected = _plain(target, 96)
    draft_settings = ModelSettings(backend="torch", weights="fp32", max_context=512, max_logits_rows=1)
    with open_backend(target, ModelSettings(**ROW)) as rows, TorchBackend.open(draft_path, draft_settings) as draft:
        by_device = rows.memory_by_device()
        assert set(by_device) == {"cpu:0", "cpu:1"}
        assert by_device["cpu:0"] == by_device["cpu:1"]  # 2 of 4 heads and 64 of 128 columns each
        assert rows.model.layers[0].attention.num_heads == 2 and rows.cache.keys[0].shape[1] == 1
        # rank 1's own process (the interpreter and torch, over 100 MiB): counted in the run's peak on cpu:N
        assert rows.followers_peak_rss_bytes() > 100 * 2**20
        assert _generate(rows, 96, "none").tokens == expected
        for drafter in ("ngram", "model"):
            result = _generate(rows, 96, drafter, draft if drafter == "model" else None)
            assert result.tokens == expected, drafter
            assert result.stats.num_accepted > 0, drafter


@pytest.mark.parametrize("devices", [("cpu:0", "cpu:1"), ("cuda:0", "cuda:1")])
@pytest.mark.parametrize("decode_step, compile", [("auto", None), ("auto", True), ("static", None)])
def test_every_rank_decodes_with_the_dynamic_step_as_the_split_model_does(devices, decode_step, compile):
    """A rank's settings name one device, where `auto` picked the static step on a GPU (or with --compile): its
    verify skipped RowSplitBackend.forward, the followers never heard of it, and the split hung."""
    settings = ModelSettings(**{**ROW, "devices": devices}, decode_step=decode_step, compile=compile)
    assert not settings.uses_static_step
    assert not any(rank_settings(settings, rank, 2).uses_static_step for rank in range(2))


def test_self_drafts_are_refused(tiny_pair):
    with pytest.raises(UserError, match="split-mode row"):
        with built_engine(tiny_pair[0], drafter="model", self_draft="self-skip", backend="torch", weights="fp32",
                          devices=("cpu:0", "cpu:1"), split_mode="row"):
            pass


@pytest.mark.real_model
def test_smollm2_row_split_equals_single_device_plain(smollm2_path):
    """SmolLM2's 3 KV heads (9 query heads) split 2 + 1; the all-reduce sums in another order than one
    device does (logits differ by about 1e-5), and greedy tokens stay equal here."""
    with built_engine(smollm2_path, drafter="none", backend="torch", weights="fp32", max_context=512) as engine:
        prompt = _chat(engine.target, REPETITIVE_TEXT)
        expected = engine.generate(prompt, 24).tokens
    # the draft: SmolLM2 itself, whole, on rank 0 (no other model shares its vocabulary here)
    draft_settings = ModelSettings(backend="torch", weights="fp32", max_context=512, max_logits_rows=1)
    with open_backend(smollm2_path, ModelSettings(**ROW)) as rows, TorchBackend.open(smollm2_path, draft_settings) as draft:
        assert rows.model.layers[0].attention.num_heads == 6
        assert _generate(rows, 12, "none", prompt=prompt).tokens == expected[:12]
        speculative = _generate(rows, 24, "model", draft, prompt=prompt)
        assert speculative.tokens == expected and speculative.stats.num_accepted > 0


def test_a_follower_that_dies_ends_generation_with_one_clear_error(tiny_pair):
    backend = open_backend(tiny_pair[0], ModelSettings(**ROW))
    follower = backend.ranks.followers[0]
    try:
        backend.forward([5, 6, 7], [2])
        os.kill(follower.pid, signal.SIGKILL)
        follower.join(10)
        with pytest.raises(ModelLost, match="rank 1 was killed by signal 9"):
            backend.forward([8], [0])
    finally:
        backend.close()
    assert not follower.is_alive()


def _follower_of(process: subprocess.Popen, timeout_s: float = 120) -> psutil.Process:
    """The rank `process` spawned, once it runs (multiprocessing's spawn: a new interpreter importing torch)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for child in psutil.Process(process.pid).children():
            if "spawn_main" in " ".join(child.cmdline()):
                return child
        time.sleep(0.05)
    raise AssertionError("no rank was spawned")


@pytest.mark.parametrize("sig, exit_code, line", [(signal.SIGINT, 130, "interrupted"),
                                                  (signal.SIGTERM, 143, "terminated")])
def test_a_signal_to_the_terminals_group_while_the_ranks_load_stops_at_once(tiny_pair, sig, exit_code, line):
    """Ctrl-C as the follower imported torch: a KeyboardInterrupt's traceback from it, then rank 0 waited two
    minutes inside init_process_group for a rank that was gone."""
    generate = subprocess.Popen([sys.executable, "-m", "apps.cli", "generate", "--target", str(tiny_pair[0]),
                                 "--backend", "torch", "--devices", "cpu:0,cpu:1", "--split-mode", "row",
                                 "--threads", "1", "--max-tokens", "8", "--prompt", PROMPT_TEXT],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    follower = _follower_of(generate)
    time.sleep(0.3)  # into its imports
    started = time.monotonic()
    os.killpg(generate.pid, sig)
    stderr = generate.communicate(timeout=60)[1]
    assert generate.returncode == exit_code and time.monotonic() - started < 20, stderr
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == line, stderr
    assert not follower.is_running() or follower.status() == psutil.STATUS_ZOMBIE


def test_a_forward_cut_short_on_rank_0_still_closes_every_rank(tiny_pair):
    """Ctrl-C between two all-reduces leaves the follower waiting inside one: close must not hang."""
    backend = open_backend(tiny_pair[0], ModelSettings(**ROW))
    follower = backend.ranks.followers[0]

    def interrupt(*args):
        raise KeyboardInterrupt

    backend.model.layers[2].register_forward_pre_hook(interrupt)
    with pytest.raises(KeyboardInterrupt):
        backend.forward([5, 6, 7], [2])
    started = time.monotonic()
    backend.close()
    assert time.monotonic() - started < 15
    assert not follower.is_alive()


def test_an_error_mid_forward_tears_the_split_down(tiny_pair):
    """The follower is left inside an all-reduce that the next forward's first all-reduce would pair with
    (wrong logits, no error; NCCL cannot cancel it): after any error the ranks are stopped, and a later
    forward says so instead of computing."""
    backend = open_backend(tiny_pair[0], ModelSettings(**ROW))
    follower = backend.ranks.followers[0]

    def fail(*args):
        raise ValueError("a failure inside the forward")

    hook = backend.model.layers[2].register_forward_pre_hook(fail)
    try:
        with pytest.raises(ValueError):
            backend.forward([5, 6, 7], [2])
        hook.remove()
        follower.join(15)
        assert not follower.is_alive()
        with pytest.raises(UserError, match="its ranks were stopped"):
            backend.forward([8], [0])
    finally:
        backend.close()


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs that torch sees")
def test_two_gpu_row_split_over_nccl_equals_one_gpu_plain(tiny_pair):
    target, _ = tiny_pair
    with built_engine(target, drafter="none", backend="torch", weights="fp32", device="cuda:0",
                      max_context=512) as engine:
        expected = engine.generate(engine.target.tokenizer.encode(PROMPT_TEXT, add_bos=True), 64).tokens
    settings = ModelSettings(**{**ROW, "devices": ("cuda:0", "cuda:1")})
    with open_backend(target, settings) as rows:
        assert set(rows.allocator_peaks()) == {"cuda:0", "cuda:1"}
        assert _generate(rows, 64, "ngram").tokens == expected
