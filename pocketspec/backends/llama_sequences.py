"""Several sequences of one llama.cpp context, each a backend of its own, decoded together.

Each request a server runs has its own speculative engine on its own thread, with a
LlamaSequence of the shared target context (and one of the shared draft context). An
engine calls forward() as it would on a one-sequence backend; DecodeRounds holds the call
until every thread generating now is waiting in a forward, then runs all of them: one
llama_decode per model, carrying every sequence's pending token and draft rows (more than
one only past n_batch tokens or the context's logits rows). So N requests step in the time
of about one wide forward, and each sequence rolls back on its own (llama_memory_seq_rm).

A thread that is not joined (building an engine, probing costs) runs its forward alone,
as soon as no round is running. llama.cpp's context is not thread-safe: every call into it,
rollbacks included, holds the rounds' lock.

Every decode runs on one thread of the rounds' own, whichever engine's thread completed the
round. llama.cpp's CPU kernels run on an OpenMP team of the calling thread, so decodes called
from several threads keep several teams, whose idle workers spin for the same cores: on the
2-core CPU (qwen 1.5B, two requests) a one-token round took 42-44 ms from the engines' threads
and 31-34 ms from one thread, a two-sequence round 63-64 against 53-58 ms.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from pocketspec.backends.llama_context import LlamaModelContext, SequenceForward, decode_groups
from pocketspec.backends.llama_cpp_backend import LlamaSequence


@dataclass(frozen=True)
class RoundTiming:
    """The llama_decode that carried a forward: its tokens, every sequence's together, and its seconds."""

    width: int
    seconds: float


class _Waiting:
    """A forward waiting for its round."""

    def __init__(self, native: LlamaModelContext, forward: SequenceForward):
        self.native = native
        self.forward = forward
        self.logits: np.ndarray | None = None
        self.timing: RoundTiming | None = None
        self.error: BaseException | None = None
        self.is_done = False


class DecodeRounds:
    def __init__(self):
        self._condition = threading.Condition()
        self._members: set[int] = set()  # thread idents of the generations running now
        self._waiting: list[_Waiting] = []
        self._decoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pocketspec-decode")
        self.num_rounds = 0
        self.num_forwards = 0

    def join(self) -> None:
        """The calling thread generates from now on: rounds wait for its forwards."""
        with self._condition:
            self._members.add(threading.get_ident())

    def leave(self) -> None:
        """The calling thread is done: rounds no longer wait for it (run the one it held up, if any)."""
        with self._condition:
            self._members.discard(threading.get_ident())
            self._run_if_all_waiting()

    @contextmanager
    def exclusive(self):
        """Hold off every round (for a rollback or a shift)."""
        with self._condition:
            yield

    def forward(self, native: LlamaModelContext, forward: SequenceForward) -> tuple[np.ndarray, RoundTiming]:
        """The forward's logits rows (a copy) once its round has run, and that round's decode."""
        waiting = _Waiting(native, forward)
        with self._condition:
            if threading.get_ident() in self._members:
                self._waiting.append(waiting)
                self._run_if_all_waiting()
            else:  # alone: at once, since no round runs while the lock is held
                self._run([waiting])
            while not waiting.is_done:
                self._condition.wait()
        if waiting.error is not None:
            raise waiting.error
        return waiting.logits, waiting.timing

    def _run_if_all_waiting(self) -> None:
        waiting_threads = len(self._waiting)
        if waiting_threads and waiting_threads >= len(self._members):
            taken, self._waiting = self._waiting, []
            self._run(taken)
            self._condition.notify_all()

    def close(self) -> None:
        """Stop the decoding thread (after the round it runs, if any)."""
        self._decoder.shutdown(wait=True)

    def _run(self, taken: list[_Waiting]) -> None:
        """Decode the forwards on the decoding thread while the caller holds the lock."""
        self._decoder.submit(self._decode, taken).result()

    def _decode(self, taken: list[_Waiting]) -> None:
        """One llama_decode per context and per n_batch of tokens."""
        for native in {id(waiting.native): waiting.native for waiting in taken}.values():
            for group in _groups([waiting for waiting in taken if waiting.native is native], native):
                started = time.perf_counter()
                try:
                    results = native.decode([waiting.forward for waiting in group], copy=True)
                except BaseException as error:  # every forward of the group fails the same way
                    results = [error] * len(group)
                timing = RoundTiming(sum(len(waiting.forward.tokens) for waiting in group),
                                     time.perf_counter() - started)
                for waiting, result in zip(group, results):
                    if isinstance(result, BaseException):
                        waiting.error = result
                    else:
                        waiting.logits, waiting.timing = result, timing
                    waiting.is_done = True
                self.num_rounds += 1
                self.num_forwards += len(group)


def _groups(taken: list[_Waiting], native: LlamaModelContext) -> list[list[_Waiting]]:
    """The forwards in decode order, in groups that fit one llama_decode."""
    return [[taken[index] for index in group]
            for group in decode_groups([waiting.forward for waiting in taken], native.n_batch, native.max_outputs)]


class SharedContexts:
    """Opens backends as sequences of shared contexts: the k-th backend opened on a model file with
    the same settings is sequence k of that context of num_sequences (built on first use). Pass open_backend as
    the loader's opener once per engine; close() closes the contexts after every engine is closed."""

    def __init__(self, num_sequences: int):
        self.num_sequences = num_sequences
        self.rounds = DecodeRounds()
        self._natives: dict[tuple, LlamaModelContext] = {}
        self._num_opened: dict[tuple, int] = {}

    def open_backend(self, model_path, settings) -> LlamaSequence:
        key = (str(model_path), settings)  # a model drafting for itself is a context of its own
        native = self._natives.get(key)
        if native is None:
            native = self._natives[key] = LlamaModelContext(model_path, settings, self.num_sequences)
            self._num_opened[key] = 0
        sequence_id = self._num_opened[key]
        if sequence_id >= self.num_sequences:
            raise ValueError(f"{model_path}'s context has only {self.num_sequences} sequences")
        self._num_opened[key] += 1
        return LlamaSequence(native, sequence_id, self.rounds)

    def close(self) -> None:
        self.rounds.close()
        for native in self._natives.values():
            native.close()
        self._natives.clear()
