"""Local workers started with fork(): they begin converting within milliseconds.

A worker started by loky (or any spawn method) is a fresh interpreter that imports
NumPy, Pillow and the converter before its first sample: 0.6 s per worker here, a
fifth of a 150-pair run on two cores. A forked worker inherits the run's imported
modules, tuned allocator and colour table (shared copy-on-write), so it starts at
once. `execute.run_local` uses this pool where fork is safe: on Linux, from a process
with a single thread (forking a process that runs other threads, such as
TensorFlow's, can deadlock the child), and falls back to loky elsewhere.

This process is one of the workers (it forks one fewer); all inherit the task list, a
shared counter hands out the next task to whichever worker is free, and results and
progress counts come back on queues. With a `TailShare` (`converter.run.steal`), a
worker that finds no task left helps convert the samples of those still running. A
worker that dies, or a task that raises, ends the run: the other workers are killed
before the error reaches the caller, so none of them can rename a shard into the
folder afterwards. Workers also die with the run (PR_SET_PDEATHSIG) when it is killed.
"""

from __future__ import annotations

import ctypes
import logging
import os
import pickle
import queue
import signal
import sys
import threading
from typing import TYPE_CHECKING, Callable, Iterator, Sequence, TypeVar

from converter.run.steal import portable_error

if TYPE_CHECKING:  # pragma: no cover
    from converter.run.steal import TailShare

log = logging.getLogger(__name__)
ProgressFn = Callable[[int], None]
T = TypeVar("T")
R = TypeVar("R")
_PR_SET_PDEATHSIG = 1
_POLL_SECONDS = 0.2


class WorkerDiedError(RuntimeError):
    """A worker process ended without reporting its task (killed, out of memory, crashed)."""


#: Threads a fork may leave behind: they only serve the object store of a run into a bucket
#: (fsspec's event loop and its resolver threads, the lock object's heartbeat), which forked
#: workers never use (the run itself uploads their shards), so no lock such a thread holds is
#: ever needed in a child; fsspec also resets its loop in a forked child.
FORK_TOLERATED_THREADS = ("fsspecIO", "asyncio_", "imgshard-lock-heartbeat")


def fork_is_safe() -> bool:
    """True on Linux when this process runs one thread (counted by the kernel, C++ threads included)
    besides `FORK_TOLERATED_THREADS`."""
    import multiprocessing as mp  # here and in fork_map: a one-worker run never imports it (7 ms)

    if not sys.platform.startswith("linux") or "fork" not in mp.get_all_start_methods():
        return False
    try:
        tasks = set(os.listdir("/proc/self/task"))
    except OSError:
        return False
    if len(tasks) == 1:
        return True
    tolerated = {str(t.native_id) for t in threading.enumerate() if t.name.startswith(FORK_TOLERATED_THREADS)}
    return len(tasks - tolerated) == 1


def _exit_if_orphaned(parent_pid: int) -> None:
    if os.getppid() != parent_pid:
        os._exit(3)


def _die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this worker when the run dies; exit if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError) as e:  # no prctl: the WorkerGuard still stops orphans from writing
        log.debug("prctl(PR_SET_PDEATHSIG) unavailable (%s); relying on the worker guard", e)
    _exit_if_orphaned(parent_pid)


def _take(next_item) -> int:
    """The index of the next item to work on (the items were inherited: only the index is shared)."""
    with next_item.get_lock():
        index = next_item.value
        next_item.value += 1
    return index


def _worker(fn: Callable, items: Sequence, next_item, done, progress_q, parent_pid: int, worker: int,
            tail: TailShare | None) -> None:
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the run, which stops the workers
    progress = progress_q.put if progress_q is not None else None
    if tail is not None:
        tail.start(worker, lambda: _exit_if_orphaned(parent_pid))
    while True:
        index = _take(next_item)
        if index >= len(items):
            if tail is not None:
                tail.help()  # no task left: convert samples of the shards still being written
            break
        try:
            done.put((fn(items[index], progress), None))
        except BaseException as e:  # noqa: BLE001 - every failure goes back to the run, which raises it
            done.put((None, portable_error(e)))
            break
    done.close()
    done.join_thread()


#: Put on a progress queue once every sender has finished: the thread that drains it
#: stops at once instead of at its next poll (a wait of up to `_POLL_SECONDS` that every
#: run paid after its last sample, measured at 0.19 s of a 2.3 s 2-worker run).
PROGRESS_END = None


def drain_progress(progress_q, on_progress: ProgressFn, stop: threading.Event) -> None:
    """Pass the counts workers put on `progress_q` to `on_progress` until `PROGRESS_END`
    arrives, or until `stop` is set (then what is left).

    Runs in a thread of the run; serves forked workers' queues and loky's manager queue.
    """
    while True:
        try:
            n = progress_q.get(timeout=_POLL_SECONDS) if not stop.is_set() else progress_q.get_nowait()
        except queue.Empty:
            if stop.is_set():
                return
            continue
        except (EOFError, OSError) as e:  # the progress channel closed: only the bar stops
            log.debug("progress queue closed (%s); the progress bar stops here", e)
            return
        if n is PROGRESS_END:
            return
        on_progress(n)


def stop_drainer(drainer: threading.Thread | None, stop: threading.Event, progress_q, *, senders_done: bool) -> None:
    """End the `drain_progress` thread, having passed on every count.

    `senders_done`: every worker has exited (or returned), so all their counts are on
    the queue ahead of `PROGRESS_END`, which ends the thread without waiting for a poll.
    Otherwise (a failed run, whose killed workers may hold the queue's lock) only `stop`.
    """
    if drainer is None:
        return
    if senders_done:
        progress_q.put(PROGRESS_END)
    stop.set()
    drainer.join(timeout=5)


def fork_map(fn: Callable[[T, ProgressFn | None], R], items: Sequence[T], workers: int,
             on_progress: ProgressFn | None = None, *, tail: TailShare | None = None) -> Iterator[R]:
    """`fn(item, progress)` for every item on `workers` processes; results as they finish.

    This process is one of the workers: it forks `workers - 1` others (one fewer
    process to start and to fault its memory in) and, between its own items, passes on
    the results the others sent. `fn` and `items` are inherited, never pickled (a
    closure is fine); results are pickled back. `progress(n)`, called in a worker,
    reaches `on_progress(n)` in this process (None when `on_progress` is None). `tail`
    (made before this call): a worker with no item left helps the others finish theirs.
    """
    import multiprocessing as mp

    fork = mp.get_context("fork")
    next_item, done = fork.Value("q", 0), fork.Queue()
    progress_q = fork.Queue() if on_progress is not None else None
    n = min(workers, len(items))
    procs = [fork.Process(target=_worker, args=(fn, items, next_item, done, progress_q, os.getpid(), i + 1, tail),
                          name=f"imgshard-worker-{i}", daemon=True) for i in range(n - 1)]
    for p in procs:
        p.start()
    stop = threading.Event()
    drainer = None
    if progress_q is not None:
        drainer = threading.Thread(target=drain_progress, args=(progress_q, on_progress, stop), daemon=True,
                                   name="imgshard-progress")
        drainer.start()
    finished = False
    if tail is not None:
        tail.start(0, lambda: _raise_if_dead(procs))
    try:
        received = 0
        while (index := _take(next_item)) < len(items):  # this process's own share
            yield fn(items[index], on_progress)
            received += 1
            while (ready := _ready_result(done)) is not _NOTHING:
                received += 1
                yield ready  # type: ignore[misc]
        if tail is not None:
            tail.help()
        while received < len(items):
            result = _next_result(done, procs)
            received += 1
            yield result
        finished = True
    finally:
        if not finished:
            for p in procs:
                if p.is_alive():
                    p.kill()  # no worker may rename a shard once the run has given up
        for p in procs:
            p.join(timeout=None if finished else 10)
        stop_drainer(drainer, stop, progress_q, senders_done=finished)
        if tail is not None:
            tail.close(finished=finished)
        for q in (done, progress_q):
            if q is not None:
                q.close()
                q.join_thread()


_NOTHING = object()


def _ready_result(done) -> object:
    """A result a worker has already sent (raising its error, if it sent one), else _NOTHING."""
    try:
        message = done.get_nowait()
    except queue.Empty:
        return _NOTHING
    return _result_of(message)


def _result_of(message: tuple[object, BaseException | None]) -> object:
    """A worker's (result, error) message: the result, or its error raised here."""
    result, error = message
    if error is not None:
        raise error
    return result


def _next_result(done, procs: list) -> object:
    """The next result a worker sends (raising its error), waiting; raises if a worker died instead."""
    while True:
        try:
            return _result_of(done.get(timeout=_POLL_SECONDS))
        except queue.Empty:
            _raise_if_dead(procs)


def _raise_if_dead(procs: list) -> None:
    """Raise WorkerDiedError if a worker process ended with an error."""
    dead = [p for p in procs if p.exitcode not in (None, 0)]
    if dead:
        p = dead[0]
        how = f"signal {-p.exitcode}" if p.exitcode < 0 else f"exit code {p.exitcode}"
        raise WorkerDiedError(
            f"worker process {p.pid} died ({how}) while converting; nothing was published and the "
            "previous dataset is intact. If it ran out of memory, use fewer --workers; then re-run."
        ) from None
