"""The torch backend split by rows over several devices (tensor parallel), one process per device.

Every rank loads its slice of the target (torch_model/tensor_parallel.py) and its own KV cache
for its heads. Rank 0 runs the engine and the draft; its RowSplitBackend tells the followers
each forward before running it, and the all-reduces inside the model keep the ranks in step.
A FORWARD carries its start position, so a rollback needs no message: the follower rolls back
to that position first, exactly as rank 0 did. The followers ignore Ctrl-C: rank 0 decides
what it means and stops them when it closes.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from memplanner.device import is_gpu
from pocketspec.backends.distributed import WARM_UP_TIMEOUT_S, Command, Ranks, spawn_followers, torchrun_rank
from pocketspec.backends.torch_backend import TorchBackend
from pocketspec.errors import ModelLost, UserError
from pocketspec.settings import ModelSettings, default_num_threads
from pocketspec.stats import peak_rss_bytes
from pocketspec.torch_model.device import resolve_device, resolve_devices


class RowSplitBackend(TorchBackend):
    """Rank 0's backend: a TorchBackend over its slice whose every forward the followers mirror."""

    ranks: Ranks
    lost: ModelLost | None = None  # why the ranks were torn down, where a rank failed

    @contextlib.contextmanager
    def _failures_reported(self):
        """torch.distributed's errors (a rank died or timed out) as one line for the user, and the split
        torn down after any error or interruption: a follower may be left inside an all-reduce that the
        next forward's first all-reduce would silently pair with, and NCCL cannot cancel it."""
        if self.ranks is None:
            raise self.lost or ModelLost(
                "row split: an earlier forward failed or was interrupted, so its ranks were stopped; start again "
                "to keep generating")
        try:
            yield
        except torch.OutOfMemoryError:
            self._tear_down()
            raise
        except RuntimeError as error:
            self.lost = self.ranks.failure(error)  # said again to every later forward (a server's next requests)
            self._tear_down()
            raise self.lost from None
        except BaseException:
            self._tear_down()
            raise

    def _tear_down(self) -> None:
        self.ranks.close(stop_wait_s=0)  # a follower may be inside an all-reduce: no STOP reaches it (5 s lost)
        self.ranks = None

    def forward(self, tokens: Sequence[int], logits_rows: Sequence[int]) -> np.ndarray:
        self.check_forward(tokens, logits_rows)  # refused here, before any follower runs it
        with self._failures_reported():
            self.ranks.send(Command.FORWARD, start=self.num_cached, count=len(tokens), tokens=tokens)
            return super().forward(tokens, logits_rows)

    def shift_out(self, start: int, count: int) -> None:
        with self._failures_reported():
            self.ranks.send(Command.SHIFT, start=start, count=count, num_cached=self.num_cached)
            super().shift_out(start, count)

    def self_draft(self, settings: ModelSettings, **kwargs) -> TorchBackend:
        raise UserError("self-drafts run the target's own layers, which a row split spreads over every rank; "
                        "use --draft ngram, a draft model, or --split-mode layer")

    def _reports(self) -> list[tuple[dict, dict, int]]:
        with self._failures_reported():
            self.ranks.send(Command.REPORT)
            return self.ranks.gather(_report(self))

    def memory_by_device(self) -> dict[str, dict[str, int]]:
        """Every rank's weights and KV cache, under its device's name."""
        return {name: terms for memory, _, _ in self._reports() for name, terms in memory.items()}

    def allocator_peaks(self) -> dict[str, int]:
        """Every rank's allocator peak, on GPUs."""
        return {name: peak for _, peaks, _ in self._reports() for name, peak in peaks.items()}

    def followers_peak_rss_bytes(self) -> int:
        """The other ranks' processes' peak resident memory, summed: on cpu:N, what --memory-budget bounds beside
        this process's own."""
        return sum(peak_rss for _, _, peak_rss in self._reports()[1:])

    def close(self) -> None:
        if getattr(self, "ranks", None) is not None:
            self.ranks.close()
            self.ranks = None
        super().close()


def _report(backend: TorchBackend) -> tuple[dict, dict, int]:
    """What a rank answers REPORT with: its own tensor bytes, allocator peak and process's peak resident memory."""
    return TorchBackend.memory_by_device(backend), TorchBackend.allocator_peaks(backend), peak_rss_bytes()


def rank_settings(settings: ModelSettings, rank: int, world_size: int) -> ModelSettings:
    """One rank's own settings: its device alone, on a CPU its share of the cores, and the dynamic step that a
    split model decodes with (ModelSettings.uses_static_step). With one device left, `auto` would pick the static
    step on a GPU, whose verify and choose skip this class's forward: the followers were never told of a verify,
    and the split hung (found on gloo ranks on the CPU, with the static step asked for)."""
    num_threads = settings.num_threads or max(1, default_num_threads() // world_size)
    device = settings.devices[rank]
    return replace(settings, devices=(), device=device, num_threads=0 if is_gpu(device) else num_threads,
                   decode_step="dynamic")


def _shard(model_path: Path, rank: int, world_size: int):
    """This rank's TensorShard, from the model's config (refused where the heads cannot be split)."""
    from pocketspec.torch_model.load import open_weights
    from pocketspec.torch_model.tensor_parallel import TensorShard

    weights = open_weights(model_path)
    weights.close()
    return TensorShard(weights.config, rank, world_size)


def _load_rank(model_path: Path, settings: ModelSettings, ranks: Ranks, backend_class=TorchBackend):
    """This rank's backend; a load that fails on any rank raises on every rank (the others would wait for it)."""
    from pocketspec.torch_model.tensor_parallel import install_all_reduce

    backend, error = None, ""
    try:
        shard = _shard(model_path, ranks.rank, ranks.world_size)
        backend = backend_class.open(model_path, rank_settings(settings, ranks.rank, ranks.world_size),
                                     shard=shard, with_tokenizer=ranks.rank == 0)
        install_all_reduce(backend.model)
    except Exception as found:  # noqa: BLE001 - every rank must hear of it, or the others wait for this one
        error = str(found) or type(found).__name__
    errors = [(rank, text) for rank, text in enumerate(ranks.gather(error)) if text]
    if errors:
        if backend is not None:
            backend.close()
        rank, text = errors[0]
        raise UserError(text if rank == 0 else f"row split: rank {rank} could not load the model: {text}")
    _warm_up(backend, ranks, settings.distributed_timeout_s)
    return backend


def _warm_up(backend: TorchBackend, ranks: Ranks, timeout_s: float) -> None:
    """One forward on every rank together under the long warm-up timeout (a --compile model compiles
    here, on every rank, before serving), then back to the serving timeout."""
    ranks.set_timeout(WARM_UP_TIMEOUT_S)
    TorchBackend.forward(backend, [0], [])
    backend.rollback(0)
    ranks.set_timeout(timeout_s)


def _follow(backend: TorchBackend, ranks: Ranks) -> None:
    """A follower's loop: run rank 0's commands until STOP."""
    while True:
        command, start, count, num_cached, tokens = ranks.receive()
        if command == Command.FORWARD:
            backend.rollback(start)
            backend.forward(tokens, [])
        elif command == Command.SHIFT:
            backend.rollback(num_cached)
            backend.shift_out(start, count)
        elif command == Command.REPORT:
            ranks.gather(_report(backend))
        else:
            return


def run_follower(ranks: Ranks, model_path: Path, settings: ModelSettings, init_method: str | None = None) -> None:
    """Join, load this rank's slice, follow rank 0; a failure is left in the rendezvous folder for rank 0."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's Ctrl-C reaches every rank; rank 0 handles it
    backend = None
    try:
        ranks.join(_rank_device(settings, ranks.rank), settings.distributed_timeout_s, init_method)
        backend = _load_rank(model_path, settings, ranks)
        _follow(backend, ranks)
    except Exception as error:  # noqa: BLE001 - the process ends here; rank 0 reports it
        path = ranks.error_file(ranks.rank)
        if path is not None and "Connection closed by peer" not in str(error):
            path.write_text(f"{type(error).__name__}: {error}".splitlines()[0])
        sys.exit(1)
    finally:
        if backend is not None:
            backend.close()
        ranks.close()


def _spawned_follower(rank: int, world_size: int, init_method: str, rendezvous_dir: str, model_path: str,
                      settings: ModelSettings) -> None:
    ranks = Ranks(rank, world_size, settings.n_batch, rendezvous_dir=Path(rendezvous_dir))
    run_follower(ranks, Path(model_path), settings, init_method)


def _rank_device(settings: ModelSettings, rank: int):
    return resolve_device(settings.devices[rank], "--devices")


def open_row_split(model_path: Path, settings: ModelSettings) -> RowSplitBackend:
    """Rank 0's backend, its followers spawned, or (under torchrun) joined; a follower never returns."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise UserError("a row split is already open in this process (torch.distributed has one default "
                        "group): close it first")
    resolve_devices(settings.devices)  # one kind: ranks on a CPU and on GPUs would pick different collectives
    world_size = len(settings.devices)
    _shard(model_path, 0, world_size)  # refused here, before any process starts
    under_torchrun = torchrun_rank()
    if under_torchrun is not None:
        rank, torchrun_world_size = under_torchrun
        if torchrun_world_size != world_size:
            raise UserError(f"torchrun started {torchrun_world_size} ranks but --devices names {world_size}; "
                            "give one device per rank")
        ranks = Ranks(rank, world_size, settings.n_batch)
        if rank != 0:
            run_follower(ranks, model_path, settings)
            sys.exit(0)
        init_method = None
    else:
        ranks, init_method = spawn_followers(world_size, settings.n_batch, _spawned_follower,
                                             (str(model_path), settings))
    try:
        ranks.wait_for_followers(settings.distributed_timeout_s)
        try:
            ranks.join(_rank_device(settings, 0), settings.distributed_timeout_s, init_method)
        except RuntimeError as error:  # a follower never came (it failed to start, or timed out)
            raise ranks.failure(error) from None
        backend = _load_rank(model_path, settings, ranks, RowSplitBackend)
    except BaseException:
        ranks.close(stop_wait_s=0)  # the followers wait in the load's collectives, not for a command
        raise
    backend.ranks = ranks
    return backend
