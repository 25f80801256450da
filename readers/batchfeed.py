"""Batches computed ahead for `Dataset.keras_dataset`, in a pool that lives across epochs.

Keras' own feeder for a `PyDataset` with workers (`OrderedEnqueuer`) builds a new thread
or process pool every epoch and, when the epoch ends, waits 0.1 s for a queue it has
already emptied: with short epochs that fixed cost, not the reading, sets the speed
(measured in `imgshard bench`, pipeline 10, and docs/PERFORMANCE.md). So the dataset
feeds itself: Keras sees one worker and calls `__getitem__(i)` in order, and batch i is
already being computed, with the next ones, on the dataset's own pool:

- `ThreadFeed` (``use_multiprocessing=False``): threads. The reading and the expansion
  run in C and release the GIL, so threads scale to the cores without copying batches.
- `ProcessFeed` (``use_multiprocessing=True``): worker processes that write each batch
  into a shared-memory slot of the parent (`readers.formats.blocks.output_arena`): no
  pickling of the arrays. A slot is reused once nobody holds its arrays any more
  (reference-counted, as `readers.formats.blocks` does).

A batch is a pure function of (epoch, index) (`ShardPyDataset.batch_at`), so batches
computed ahead are the batches a synchronous read gives, whatever the pool. Any access
out of order (random access, a new epoch) drops what was computed ahead.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable

import numpy as np

Batch = tuple[np.ndarray, np.ndarray]


class _Feed:
    """Computes (epoch, index) batches ahead of an in-order reader (see the module doc)."""

    def __init__(self, workers: int, ahead: int):
        self.workers = max(1, int(workers))
        self.ahead = max(1, int(ahead))
        self._pending: dict[tuple[int, int], Future] = {}
        self._lock = threading.Lock()

    def _submit(self, epoch: int, index: int) -> Future:  # pragma: no cover - abstract
        raise NotImplementedError

    def _result(self, future: Future) -> Batch:
        return future.result()

    def get(self, epoch: int, index: int, end: int) -> Batch:
        """Batch `index` of `epoch` (indices below `end` exist); starts the next ones."""
        with self._lock:
            future = self._pending.pop((epoch, index), None)
            if future is None:  # out of order: what was computed ahead is not needed
                self._drop()
                future = self._submit(epoch, index)
            last = max((i for e, i in self._pending if e == epoch), default=index)
            for i in range(last + 1, min(end, index + 1 + self.ahead)):
                self._pending[(epoch, i)] = self._submit(epoch, i)
        return self._result(future)

    def _drop(self) -> None:
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()

    def close(self) -> None:
        with self._lock:
            self._drop()


class ThreadFeed(_Feed):
    """`workers` threads calling `compute(epoch, index)`."""

    def __init__(self, compute: Callable[[int, int], Batch], workers: int, ahead: int):
        super().__init__(workers, ahead)
        self._compute = compute
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="imgshard-feed")
        weakref.finalize(self, self._pool.shutdown, wait=False, cancel_futures=True)

    def _submit(self, epoch: int, index: int) -> Future:
        return self._pool.submit(self._compute, epoch, index)

    def close(self) -> None:
        super().close()
        self._pool.shutdown(wait=False, cancel_futures=True)


class FeedWorkerError(RuntimeError):
    """A `keras_dataset` worker process died (killed, out of memory) while computing a batch."""


class _Slot:
    """One shared-memory block the workers write batches into (see the module doc)."""

    def __init__(self, size: int):
        from multiprocessing import shared_memory

        self.shm = shared_memory.SharedMemory(create=True, size=size)
        self.raw = np.frombuffer(self.shm.buf, np.uint8)  # the arrays handed out are views of it
        self.size = size
        self.busy = False  # a worker writes into it, or its batch is not handed out yet

    def held(self) -> bool:
        """Whether arrays handed out from this slot are still alive somewhere."""
        return sys.getrefcount(self.raw) > 2  # the attribute, the call

    def release(self) -> None:
        raw, self.raw = self.raw, None
        del raw
        try:
            self.shm.close()
        except BufferError:  # arrays still alive: the mapping stays until they die
            pass
        try:
            self.shm.unlink()
        except FileNotFoundError:
            pass


def _context() -> Any:
    """Fork where there is one (as Keras' own enqueuer does: no re-import of the user's
    script, which spawn and forkserver run again in each worker), else spawn. A forked
    worker rebuilds the dataset's batch reader from its pickled state (`_start_worker`):
    fresh files, connections and locks, none shared with the parent's threads; the readers'
    module-level locks are renewed at fork (`os.register_at_fork`). The batches it
    computes never run TensorFlow (not fork-safe): `keras_dataset` feeds those on threads."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


class ProcessFeed(_Feed):
    """`workers` processes running `seq.batch_at(epoch, index)` into shared-memory slots;
    at most `ahead` + 4 slots (a batch beyond that comes back pickled)."""

    def __init__(self, seq: Any, workers: int, ahead: int):
        from concurrent.futures import ProcessPoolExecutor

        from multiprocessing import resource_tracker

        super().__init__(workers, ahead)
        resource_tracker.ensure_running()  # before the workers start: they share it (`_attach`)
        self._pool = ProcessPoolExecutor(self.workers, mp_context=_context(), initializer=_start_worker,
                                         initargs=(seq.worker_state(), os.getpid()))
        self._slots: list[_Slot] = []
        self._slot_size = 0  # learnt from the first batch
        self._max_slots = self.ahead + 4
        weakref.finalize(self, _shut, self._pool, self._slots)

    def _free_slot(self) -> _Slot | None:
        if not self._slot_size:
            return None
        for slot in list(self._slots):
            if not slot.busy and not slot.held():
                if slot.size >= self._slot_size:
                    return slot
                self._slots.remove(slot)  # too small for these batches
                slot.release()
        if len(self._slots) >= self._max_slots:
            return None
        slot = _Slot(self._slot_size)
        self._slots.append(slot)
        return slot

    def _submit(self, epoch: int, index: int) -> Future:
        slot = self._free_slot()
        name = None
        if slot is not None:
            slot.busy, name = True, slot.shm.name
        try:
            future = self._pool.submit(_worker_batch, epoch, index, name)
        except BrokenProcessPool as e:
            if slot is not None:
                slot.busy = False
            raise _died() from e
        future.slot = slot  # type: ignore[attr-defined]
        return future

    def _drop(self) -> None:
        for future in self._pending.values():
            slot = future.slot
            if slot is not None:  # free once the worker is done with it (now, if it never started)
                future.add_done_callback(lambda _f, slot=slot: setattr(slot, "busy", False))
        super()._drop()

    def _result(self, future: Future) -> Batch:
        parts, need = self._wait(future)
        slot = future.slot
        arrays = []
        for part in parts:
            if part[0] == "array":
                arrays.append(part[1])
            else:
                _, offset, shape, dtype = part
                dtype = np.dtype(dtype)
                size = int(np.prod(shape)) * dtype.itemsize
                arrays.append(slot.raw[offset:offset + size].view(dtype).reshape(shape))
        if slot is not None:
            slot.busy = False  # the arrays now hold it (`_Slot.held`)
        with self._lock:
            self._slot_size = max(self._slot_size, need)
        return arrays[0], arrays[1]

    def _wait(self, future: Future) -> Any:
        """The future's result; a named error as soon as any worker has died (the executor's
        own check misses deaths whose pipes another forked process keeps open)."""
        from concurrent.futures import TimeoutError as Pending

        while True:
            try:
                return future.result(timeout=0.5)
            except BrokenProcessPool as e:
                raise _died() from e
            except Pending:
                processes = list((getattr(self._pool, "_processes", None) or {}).values())
                if any(p.exitcode is not None for p in processes):
                    raise _died() from None

    def close(self) -> None:
        super().close()
        _shut(self._pool, self._slots)


def _died() -> FeedWorkerError:
    return FeedWorkerError(
        "keras_dataset: a worker process died while computing a batch (killed, or out of memory). Fix: give the "
        "processes more memory, or use use_multiprocessing=False (threads read as fast: the reading releases the "
        "GIL)")


def _shut(pool: Any, slots: list) -> None:
    pool.shutdown(wait=False, cancel_futures=True)
    for slot in slots:
        slot.release()
    slots.clear()


_worker: dict[str, Any] = {}


def _start_worker(state: bytes, parent: int) -> None:
    from readers.pydataset import BatchReader

    _worker["seq"], _worker["slots"] = BatchReader.from_state(state), {}

    def watch() -> None:  # a parent killed with SIGKILL leaves no one to stop this process
        while _alive(parent):
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="imgshard-feed-parent-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet reaped, does not). Not
    `os.getppid()`: a forkserver child's parent is the server, which lives on with it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: a signal 0 finds the process (a zombie counts as alive)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _attach(name: str) -> Any:
    """The parent's slot `name`, mapped once per worker. The workers share the parent's
    resource tracker (fork and spawn both pass it on): the parent's unlink is the only one."""
    from multiprocessing import shared_memory

    shm = _worker["slots"].get(name)
    if shm is None:
        shm = _worker["slots"][name] = shared_memory.SharedMemory(name=name)
    return shm


def _worker_batch(epoch: int, index: int, name: str | None) -> tuple[list, int]:
    """(parts, bytes a slot needs): each of x, y as ("slot", offset, shape, dtype) in slot
    `name`, or ("array", array) when it does not fit (or there is no slot yet)."""
    from readers.formats.blocks import output_arena

    seq = _worker["seq"]
    if name is None:
        arrays = [np.ascontiguousarray(a) for a in seq.batch_at(epoch, index)]
        return [("array", a) for a in arrays], _need(arrays)
    with output_arena(_attach(name).buf) as arena:
        arrays = [np.ascontiguousarray(a) for a in seq.batch_at(epoch, index)]
        parts = []
        for a in arrays:
            offset = arena.offset_of(a)
            if offset is None:  # made outside the slot: copy it in, if there is room
                room = arena.carve(a.shape, a.dtype, 64, False)
                if room is None:
                    parts.append(("array", a))
                    continue
                room[...] = a
                offset = arena.offset_of(room)
            parts.append(("slot", offset, a.shape, a.dtype.str))
    return parts, _need(arrays)


def _need(arrays: list) -> int:
    return sum(a.nbytes + 64 for a in arrays) + 64


__all__ = ["FeedWorkerError", "ProcessFeed", "ThreadFeed"]
