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

A batch is a pure function of (epoch, index) (`BatchReader.batch_at`), so batches
computed ahead are the batches a synchronous read gives, whatever the pool. Batches are
computed ahead only while they are asked for in order; what a jump skips over is dropped,
and out-of-order requests (``model.fit(shuffle=True)``, Keras' default, permutes them)
get one batch each and a warning. A pool idle for `IDLE_SECONDS` is shut down with its
slots (TensorFlow keeps a dataset given to `fit` alive after it returns) and started
again on the next request; `close()` does it at once.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import numpy as np

from readers.procpool import ProcessPool, WorkerDied

Batch = tuple[np.ndarray, np.ndarray]


#: A feed's pool (threads or processes, and shared-memory slots) is shut down after this
#: many seconds without a request, and started again on the next one.
IDLE_SECONDS = 20.0

#: Out-of-order requests in one epoch before `_Feed` warns (once per feed).
MISSES_BEFORE_WARNING = 3


class _Feed:
    """Computes (epoch, index) batches ahead of an in-order reader (see the module doc).
    Subclasses make the pool (`_start`), submit to it (`_submit`) and stop it (`_stop`)."""

    def __init__(self, workers: int, ahead: int):
        self.workers = max(1, int(workers))
        self.ahead = max(1, int(ahead))
        self._pending: dict[tuple[int, int], Future] = {}
        self._lock = threading.Lock()
        self._last: tuple[int, int] | None = None  # the last request
        self._misses = 0  # out-of-order requests this epoch
        self._warned = False
        self._waiting = 0  # requests waiting on their batch (never suspended under them)
        self.used = time.monotonic()
        _watch_idle(self)

    def _submit(self, epoch: int, index: int) -> Future:  # pragma: no cover - abstract
        raise NotImplementedError

    def _stop(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _result(self, future: Future) -> Batch:
        return future.result()

    def get(self, epoch: int, index: int, end: int) -> Batch:
        """Batch `index` of `epoch` (indices below `end` exist); starts the next ones while
        the requests come in order."""
        with self._lock:
            self.used = time.monotonic()
            future = self._pending.pop((epoch, index), None)
            self._drop(lambda key: key[0] != epoch or key[1] < index)  # another epoch, or skipped over
            in_order = future is not None or index == 0 or self._last == (epoch, index - 1)
            if self._last is None or self._last[0] != epoch:
                self._misses = 0
            self._last = (epoch, index)
            if future is None:
                future = self._submit(epoch, index)
            if in_order:
                last = max((i for _, i in self._pending), default=index)
                for i in range(last + 1, min(end, index + 1 + self.ahead)):
                    self._pending[(epoch, i)] = self._submit(epoch, i)
            else:
                self._missed()
            self._waiting += 1
        try:
            return self._result(future)
        finally:
            with self._lock:
                self._waiting -= 1

    def _missed(self) -> None:
        self._misses += 1
        if self._misses >= MISSES_BEFORE_WARNING and not self._warned:
            import warnings

            self._warned = True
            warnings.warn("keras_dataset: batches are asked for out of order (model.fit(shuffle=True), Keras' "
                          "default, permutes them), so none can be computed ahead. The dataset already shuffles "
                          "itself per (seed, epoch): pass shuffle=False to model.fit", stacklevel=4)

    def _drop(self, which: Callable[[tuple[int, int]], bool] = lambda key: True) -> None:
        for key in [k for k in self._pending if which(k)]:
            self._dropped(self._pending.pop(key))

    def _dropped(self, future: Future) -> None:
        future.cancel()

    def suspend_if_idle(self, now: float) -> None:
        """Stop the pool (and free the slots) after `IDLE_SECONDS` without a request."""
        if now - self.used < IDLE_SECONDS or not self._lock.acquire(blocking=False):
            return
        try:
            if now - self.used >= IDLE_SECONDS and not self._waiting:
                self._drop()
                self._stop()
        finally:
            self._lock.release()

    def close(self) -> None:
        """Stop the pool and free the slots now (a later request starts them again)."""
        with self._lock:
            self._drop()
            self._stop()


_feeds: "weakref.WeakSet[_Feed]" = weakref.WeakSet()
_reaper: list[threading.Thread] = []


def _watch_idle(feed: _Feed) -> None:
    """Register `feed` with the one thread that suspends idle feeds (started on first use)."""
    _feeds.add(feed)
    if not _reaper or not _reaper[0].is_alive():
        thread = threading.Thread(target=_reap, name="imgshard-feed-idle", daemon=True)
        _reaper[:] = [thread]
        thread.start()


def _reap() -> None:
    while True:
        time.sleep(min(2.0, IDLE_SECONDS / 4))
        now = time.monotonic()
        for feed in list(_feeds):
            feed.suspend_if_idle(now)


class ThreadFeed(_Feed):
    """`workers` threads calling `compute(epoch, index)`."""

    def __init__(self, compute: Callable[[int, int], Batch], workers: int, ahead: int):
        super().__init__(workers, ahead)
        self._compute = compute
        self._pools: list[ThreadPoolExecutor] = []  # the running pool, if any
        weakref.finalize(self, _shut_threads, self._pools)

    def _submit(self, epoch: int, index: int) -> Future:
        if not self._pools:
            self._pools.append(ThreadPoolExecutor(self.workers, thread_name_prefix="imgshard-feed"))
        return self._pools[0].submit(self._compute, epoch, index)

    def _stop(self) -> None:
        _shut_threads(self._pools)


def _shut_threads(pools: list) -> None:
    for pool in pools:
        pool.shutdown(wait=False, cancel_futures=True)
    pools.clear()


class FeedWorkerError(RuntimeError):
    """A `keras_dataset` worker process died (killed, out of memory) while computing a batch."""


class _NoRoom(OSError):
    """The shared-memory file system cannot hold another slot."""


class _Slot:
    """One shared-memory block the workers write batches into (see the module doc). Its
    pages are reserved at once (`posix_fallocate`): a full /dev/shm is `_NoRoom` here, not
    a SIGBUS in the worker that writes the batch."""

    def __init__(self, size: int):
        from multiprocessing import shared_memory

        self.shm = shared_memory.SharedMemory(create=True, size=size)
        if hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(self.shm._fd, 0, size)  # type: ignore[attr-defined]
            except OSError as e:
                self.shm.close()
                self.shm.unlink()
                raise _NoRoom(e.errno, f"{e.strerror} (a {size / 1e6:.0f} MB batch slot)") from e
        self.raw = np.frombuffer(self.shm.buf, np.uint8)  # the arrays handed out are views of it
        self.size = size
        self.busy = False  # a worker writes into it, or its batch is not handed out yet

    def held(self) -> bool:
        """Whether arrays handed out from this slot are still alive somewhere."""
        return sys.getrefcount(self.raw) > 2  # the attribute, the call

    def release(self) -> None:
        """Unlink the slot; its mapping goes when the last array handed out from it dies."""
        self.raw = None
        shm = self.shm
        try:
            shm.close()
        except BufferError:  # arrays still alive own the mapping now; SharedMemory must not close it again
            shm._buf = shm._mmap = None  # type: ignore[attr-defined]
            if getattr(shm, "_fd", -1) >= 0:
                os.close(shm._fd)  # type: ignore[attr-defined]
                shm._fd = -1  # type: ignore[attr-defined]
        try:
            shm.unlink()
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


class _Processes:
    """A `ProcessFeed`'s pool and slots (what its finalizer frees)."""

    def __init__(self) -> None:
        self.pool: Any = None
        self.slots: list[_Slot] = []

    def shut(self) -> None:
        """Stop the pool (its workers end after the batch they compute) and release the slots."""
        try:
            if self.pool is not None:
                self.pool, pool = None, self.pool
                pool.shutdown()
        finally:
            for slot in self.slots:
                slot.release()
            self.slots.clear()


class ProcessFeed(_Feed):
    """`workers` processes running `BatchReader.batch_at(epoch, index)` into shared-memory
    slots; at most `ahead` + 4 slots (a batch beyond that comes back pickled)."""

    def __init__(self, seq: Any, workers: int, ahead: int):
        super().__init__(workers, ahead)
        self._state = seq.worker_state()
        self._own = _Processes()
        self._slot_size = 0  # learnt from the first batch
        self._max_slots = self.ahead + 4
        self._broken: FeedWorkerError | None = None  # a worker died: this feed is done
        weakref.finalize(self, self._own.shut)

    def _start(self) -> Any:
        from multiprocessing import resource_tracker

        if self._own.pool is None:
            resource_tracker.ensure_running()  # before the workers start: they share it
            self._own.pool = ProcessPool(self.workers, _context(), _worker_batch, _start_worker,
                                         (self._state, os.getpid()))
        return self._own.pool

    def _stop(self) -> None:
        self._own.shut()

    def _free_slot(self) -> _Slot | None:
        if not self._slot_size:
            return None
        slots = self._own.slots
        for slot in list(slots):
            if not slot.busy and not slot.held():
                if slot.size >= self._slot_size:
                    return slot
                slots.remove(slot)  # too small for these batches
                slot.release()
        if len(slots) >= self._max_slots:
            return None
        try:
            slot = _Slot(self._slot_size)
        except _NoRoom as e:
            self._max_slots = len(slots)  # no more: the rest come back pickled
            import warnings

            warnings.warn(f"keras_dataset(use_multiprocessing=True): the shared-memory file system (/dev/shm) has no "
                          f"room for another batch slot: {e.strerror}. Batches come back pickled (slower). Fix: a "
                          "larger /dev/shm (docker run --shm-size=2g), or use_multiprocessing=False", stacklevel=5)
            return None
        slots.append(slot)
        return slot

    def _submit(self, epoch: int, index: int) -> Future:
        if self._broken is not None:
            raise FeedWorkerError(*self._broken.args)
        pool = self._start()
        slot = self._free_slot()
        name = None
        if slot is not None:
            slot.busy, name = True, slot.shm.name
        try:
            future = pool.submit(epoch, index, name)
        except BaseException as e:
            if slot is not None:
                slot.busy = False
            if isinstance(e, WorkerDied):
                raise self._died() from e
            raise
        future.slot = slot  # type: ignore[attr-defined]
        return future

    def _dropped(self, future: Future) -> None:
        slot = future.slot  # type: ignore[attr-defined]
        if slot is not None:  # free once the worker is done with it (now, if it never started)
            future.add_done_callback(lambda _f, slot=slot: setattr(slot, "busy", False))
        future.cancel()

    def _result(self, future: Future) -> Batch:
        slot = future.slot  # type: ignore[attr-defined]
        try:
            parts, need = self._wait(future)
        except BaseException:
            if slot is not None:
                slot.busy = False
            raise
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
        """The future's result; a dead worker (`readers.procpool.WorkerDied`) is `FeedWorkerError`,
        and so is a pool that can no longer answer (checked twice a second: never a hang)."""
        from concurrent.futures import TimeoutError as Pending

        pool = self._own.pool
        while True:
            try:
                return future.result(timeout=0.5)
            except WorkerDied as e:
                raise self._died() from e
            except Pending:
                if pool is not None and not pool.alive() and not future.done():
                    raise self._died() from pool.broken

    def _died(self) -> FeedWorkerError:
        """The error for a dead worker, raised again by every later request: the pool is
        not restarted (whatever killed one worker would likely kill the next; the user
        chooses: more memory, or threads)."""
        if self._broken is None:
            self._broken = FeedWorkerError(
                "keras_dataset: a worker process died while computing a batch (killed, or out of memory). Fix: give "
                "the processes more memory, or use use_multiprocessing=False (threads read as fast: the reading "
                "releases the GIL); then make a new keras_dataset")
        return self._broken


_worker: dict[str, Any] = {}


def _start_worker(state: bytes, parent: int) -> None:
    """`state`: pickled (class, attributes) of the dataset's batch reader (`worker_state`)."""
    import pickle

    cls, attributes = pickle.loads(state)
    reader = cls.__new__(cls)
    reader.__dict__.update(attributes)
    _worker["seq"], _worker["slots"] = reader, {}
    threading.Thread(target=_exit_with, args=(parent,), name="imgshard-feed-parent-watch", daemon=True).start()


def _exit_with(parent: int) -> None:
    """End this worker when process `parent` ends, even by SIGKILL (no one else would)."""
    if os.path.exists(f"/proc/{parent}/stat"):  # Linux: a zombie (dead, not yet reaped) counts as gone
        while _running(parent):
            time.sleep(0.5)
    else:  # elsewhere: the end of the parent's sentinel pipe
        from multiprocessing.connection import wait

        process = multiprocessing.parent_process()
        if process is None:
            return
        wait([process.sentinel])
    os._exit(0)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _attach(name: str) -> Any:
    """The parent's slot `name`, mapped once per worker, not registered with the resource
    tracker: the parent owns it and its unlink is the only one."""
    from multiprocessing import resource_tracker, shared_memory

    shm = _worker["slots"].get(name)
    if shm is None:
        try:
            shm = shared_memory.SharedMemory(name=name, track=False)  # type: ignore[call-arg]  # Python >= 3.13
        except TypeError:
            register = resource_tracker.register
            resource_tracker.register = lambda *args, **kwargs: None  # this process runs one task at a time
            try:
                shm = shared_memory.SharedMemory(name=name)
            finally:
                resource_tracker.register = register
        _worker["slots"][name] = shm
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


__all__ = ["IDLE_SECONDS", "FeedWorkerError", "ProcessFeed", "ThreadFeed"]
