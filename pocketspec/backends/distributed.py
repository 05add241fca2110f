"""torch.distributed for a row (tensor-parallel) split: starting the ranks, rank 0's commands, shutting down.

pocketspec is rank 0 and spawns one follower process per further device (torch.multiprocessing);
under torchrun every rank is started by torchrun, which sets RANK and WORLD_SIZE. There are two
process groups: the default one carries the all-reduces (nccl on NVIDIA, which is RCCL on ROCm
builds of torch; gloo on a CPU) and gives up after distributed_timeout_s; a gloo group carries rank
0's commands, on which a follower may wait as long as a chat sits idle. A follower whose rank 0
dies sees that gloo connection close and exits; rank 0 stops its followers on close, and
terminates one that has not stopped in time.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from enum import IntEnum
from pathlib import Path

import torch
import torch.distributed as dist

from pocketspec.errors import ModelLost

# The first forward (where --compile compiles, on every rank at once) may take minutes longer on one
# rank than on another; NCCL's watchdog would end the process at the serving timeout.
WARM_UP_TIMEOUT_S = 900.0
COMMAND_WAIT = timedelta(days=30)  # a follower waits for rank 0's next command as long as a chat is open
STOP_WAIT_S = 5.0  # how long stopping followers may take before they are killed
HEADER_SIZE = 4  # command, start, count, num_cached


class Command(IntEnum):
    FORWARD = 1  # append `count` tokens at position `start` (every earlier position is kept)
    SHIFT = 2  # drop `count` cached tokens from `start` of `num_cached`, moving the later ones down
    REPORT = 3  # send rank 0 this rank's memory use
    STOP = 4


def torchrun_rank() -> tuple[int, int] | None:
    """(rank, world size) when torchrun started this process with other ranks, else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def collective_backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


@dataclass
class Ranks:
    """This process's place among the ranks of one row split, and the command channel."""

    rank: int
    world_size: int
    max_tokens: int  # most tokens one FORWARD carries (n_batch)
    control: object = None  # the gloo group for commands
    followers: list = field(default_factory=list)  # processes rank 0 spawned (none under torchrun)
    rendezvous_dir: Path | None = None  # where spawned ranks meet and leave their errors

    def join(self, device: torch.device, timeout_s: float, init_method: str | None = None) -> None:
        """Meet the other ranks (bounded by timeout_s) and open the command group."""
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if self.rank and self.rendezvous_dir is not None:  # a spawned follower, its imports done
            self._joining_mark(self.rank).touch()
        dist.init_process_group(collective_backend(device), init_method=init_method or "env://", rank=self.rank,
                                world_size=self.world_size, timeout=timedelta(seconds=timeout_s))
        self.control = dist.new_group(backend="gloo", timeout=COMMAND_WAIT)

    def _joining_mark(self, rank: int) -> Path:
        return self.rendezvous_dir / f"rank{rank}.joining"

    def wait_for_followers(self, timeout_s: float) -> None:
        """Rank 0: wait until every spawned follower is about to join (seconds of importing torch), in Python, so
        that Ctrl-C stops the wait and a follower that died is said at once: inside init_process_group rank 0
        waited out timeout_s (two minutes) in C++ for either."""
        deadline = time.monotonic() + timeout_s
        for rank, process in enumerate(self.followers, start=1):
            while not self._joining_mark(rank).exists():
                if not process.is_alive() or time.monotonic() > deadline:
                    raise self.failure(RuntimeError(f"rank {rank} did not join"))
                time.sleep(0.02)

    def set_timeout(self, timeout_s: float) -> None:
        """The all-reduces' timeout from now on (set at join: the serving one)."""
        from torch.distributed.distributed_c10d import _set_pg_timeout  # no public setter (torch 2.13)

        _set_pg_timeout(timedelta(seconds=timeout_s))

    def send(self, command: Command, start: int = 0, count: int = 0, num_cached: int = 0,
             tokens: list[int] = (), wait_s: float | None = None) -> bool:
        """Rank 0: broadcast one command (one fixed-size message, tokens included).

        With wait_s, give up after that long (False): gloo's send waits for the followers to
        take it, and a follower left inside an all-reduce by an interrupted forward never does.
        """
        message = torch.zeros(HEADER_SIZE + self.max_tokens, dtype=torch.long)
        message[:HEADER_SIZE] = torch.tensor([int(command), start, count, num_cached])
        message[HEADER_SIZE:HEADER_SIZE + len(tokens)] = torch.tensor(list(tokens), dtype=torch.long)
        if wait_s is None:
            dist.broadcast(message, src=0, group=self.control)
            return True
        work = dist.broadcast(message, src=0, group=self.control, async_op=True)
        deadline = time.monotonic() + wait_s
        while not work.is_completed() and time.monotonic() < deadline:
            time.sleep(0.01)
        return work.is_completed()

    def receive(self) -> tuple[Command, int, int, int, list[int]]:
        """A follower: wait for rank 0's next command."""
        message = torch.zeros(HEADER_SIZE + self.max_tokens, dtype=torch.long)
        dist.broadcast(message, src=0, group=self.control)
        command, start, count, num_cached = message[:HEADER_SIZE].tolist()
        tokens = message[HEADER_SIZE:HEADER_SIZE + count].tolist() if command == Command.FORWARD else []
        return Command(command), start, count, num_cached, tokens

    def gather(self, value) -> list:
        """Every rank's `value`, in rank order (on every rank)."""
        found = [None] * self.world_size
        dist.all_gather_object(found, value, group=self.control)
        return found

    def error_file(self, rank: int) -> Path | None:
        return self.rendezvous_dir / f"rank{rank}.error" if self.rendezvous_dir is not None else None

    def failure(self, error: BaseException) -> ModelLost:
        """Rank 0: what to tell the user when a collective failed: a follower's own error where it left one."""
        for rank, process in enumerate(self.followers, start=1):
            path = self.error_file(rank)
            process.join(1.0)
            if path is not None and path.exists():
                return ModelLost(f"row split: rank {rank} failed: {path.read_text().strip()}")
            if process.exitcode is not None:
                how = f"was killed by signal {-process.exitcode}" if process.exitcode < 0 else \
                    f"stopped (exit code {process.exitcode}; see its output above)"
                return ModelLost(f"row split: rank {rank} {how}, so generation cannot go on")
        reason = str(error).strip().splitlines()[0][:160] if str(error).strip() else type(error).__name__
        return ModelLost(f"row split: a rank stopped or timed out ({reason}); see the other ranks' output")

    def close(self, stop_wait_s: float = STOP_WAIT_S) -> None:
        """Rank 0 stops the followers (killing those not stopped within stop_wait_s; 0: at once, where a failed or
        interrupted forward may have left them inside an all-reduce, from which no STOP reaches them); every rank
        leaves the process groups."""
        deadline = time.monotonic() + stop_wait_s
        is_stopping = False
        if self.rank == 0 and self.control is not None and stop_wait_s > 0:
            try:
                is_stopping = self.send(Command.STOP, wait_s=stop_wait_s)
            except RuntimeError:
                pass  # a follower already gone: it is joined or killed below
        for process in self.followers:
            process.join(max(0.0, deadline - time.monotonic()) if is_stopping else 0.0)
            if process.is_alive():
                process.kill()
                process.join()
        self.followers = []
        if dist.is_initialized():
            dist.destroy_process_group()
        self.control = None
        if self.rendezvous_dir is not None:
            shutil.rmtree(self.rendezvous_dir, ignore_errors=True)
            self.rendezvous_dir = None


def spawn_followers(world_size: int, max_tokens: int, follower_main, args: tuple) -> tuple[Ranks, str]:
    """Rank 0: start ranks 1 .. world_size - 1 running follower_main(rank, world_size, init_method, rendezvous_dir,
    *args); returns rank 0's Ranks and the init method for its join."""
    import torch.multiprocessing as mp

    rendezvous_dir = Path(tempfile.mkdtemp(prefix="pocketspec-ranks-"))
    init_method = f"file://{rendezvous_dir / 'store'}"
    context = mp.get_context("spawn")
    followers = []
    # Started with Ctrl-C ignored, which the new interpreter inherits (run_follower ignores it again, for good):
    # a Ctrl-C while it imported torch (seconds) was a KeyboardInterrupt's traceback from the follower.
    is_main_thread = threading.current_thread() is threading.main_thread()  # where signal.signal may be called
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if is_main_thread else None
    try:
        for rank in range(1, world_size):
            process = context.Process(target=follower_main,
                                      args=(rank, world_size, init_method, str(rendezvous_dir), *args),
                                      daemon=True, name=f"pocketspec-rank{rank}")
            process.start()
            followers.append(process)
    finally:
        if is_main_thread:
            signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)
    return Ranks(0, world_size, max_tokens, followers=followers, rendezvous_dir=rendezvous_dir), init_method
