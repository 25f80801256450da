"""The worker processes of `readers.batchfeed.ProcessFeed`: a small pool whose end, and
whose workers' deaths, never hang the training process.

Why not `concurrent.futures.ProcessPoolExecutor`: the interpreter's exit joins that pool's
manager thread, and the thread can wait forever. All workers answer through one pipe whose
write end the parent itself holds, so a worker killed while writing its answer leaves a
half message and no end of file: the thread blocks in `recv` and the process never exits
(seen in CI: every test passed, then the run hung). Python 3.11's exit hook can also race
the thread's own close of its wake-up pipe (EBADF at exit; CPython gh-105829).

Here each worker has its own socket pair, whose far end only that worker holds: its death
is an end of file (or its exit code, polled), never a wait. Results are collected by one
daemon thread; the workers are daemon processes (ended by `multiprocessing` at exit), and
nothing is joined at exit.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable

#: How often the collector looks at the workers' exit codes (a death whose sentinel pipe
#: another forked process keeps open is seen this way).
POLL_SECONDS = 0.5


class WorkerDied(RuntimeError):
    """A worker process of a `ProcessPool` ended while the pool was in use."""


class _Worker:
    def __init__(self, process: Any, conn: Any):
        self.process, self.conn = process, conn
        self.future: Future | None = None  # the task it computes
        self.stopping = False


class ProcessPool:
    """`workers` processes of `context`, each running `initializer(*initargs)` once, then
    `function(*args)` for each `submit(*args)`. After a worker dies, every pending and later
    task fails with `WorkerDied`; the other workers are ended."""

    def __init__(self, workers: int, context: Any, function: Callable, initializer: Callable, initargs: tuple):
        self._lock = threading.Lock()
        self._queue: deque[tuple[Future, tuple]] = deque()  # not yet sent to a worker
        self._workers: list[_Worker] = []
        self.broken: WorkerDied | None = None
        self._closed = False
        import multiprocessing

        daemon = not multiprocessing.current_process().daemon  # a daemon process cannot have daemon children
        for _ in range(max(1, int(workers))):
            here, there = context.Pipe(duplex=True)
            process = context.Process(target=_serve, args=(there, function, initializer, initargs),
                                      name="imgshard-feed-worker", daemon=daemon)
            process.start()
            there.close()  # only the worker holds its end: its death is an end of file here
            self._workers.append(_Worker(process, here))
        self._idle = list(self._workers)
        threading.Thread(target=self._collect, name="imgshard-feed-results", daemon=True).start()

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    def submit(self, *args: Any) -> Future:
        future: Future = Future()
        with self._lock:
            if self.broken is not None:
                raise self.broken
            if self._closed:
                raise RuntimeError("ProcessPool: submit after shutdown")
            self._queue.append((future, args))
            self._dispatch()
        return future

    def _dispatch(self) -> None:
        """Send queued tasks to idle workers (under the lock)."""
        while self._idle and self._queue:
            future, args = self._queue.popleft()
            if not future.set_running_or_notify_cancel():  # cancelled while queued
                continue
            worker = self._idle.pop()
            worker.future = future
            try:
                worker.conn.send(args)
            except OSError:  # died: the collector names it
                pass

    def shutdown(self) -> None:
        """Cancel the queued tasks; the workers end after the task they compute."""
        with self._lock:
            self._closed = True
            while self._queue:
                self._queue.popleft()[0].cancel()
            for worker in self._workers:
                worker.stopping = True
                try:
                    worker.conn.send(None)
                except OSError:
                    pass

    def _collect(self) -> None:
        """The results thread: hands out answers, and notices ended workers."""
        from multiprocessing.connection import wait

        live = {w.conn: w for w in self._workers}
        while live:
            sentinels = {w.process.sentinel: w for w in live.values()}
            ready = wait(list(live) + list(sentinels), timeout=POLL_SECONDS)
            for worker in {live.get(r) or sentinels[r] for r in ready} | _exited(live.values()):
                if not self._answer(worker):
                    del live[worker.conn]
                    self._ended(worker)
            if self.broken is not None:
                break
        for worker in self._workers:
            worker.conn.close()
            worker.process.join(1)  # reaped (those a death ended were killed)

    def _answer(self, worker: _Worker) -> bool:
        """Take `worker`'s answer, if it sent one; False when it has ended."""
        if worker.process.exitcode is None or worker.conn.poll():
            try:
                status, value = worker.conn.recv()
            except (EOFError, OSError):
                return False
            with self._lock:
                future, worker.future = worker.future, None
                self._idle.append(worker)
                self._dispatch()
            if future is not None:
                (future.set_result if status == "ok" else future.set_exception)(value)
            return True
        return False

    def _ended(self, worker: _Worker) -> None:
        worker.process.join(1)
        if worker.stopping and worker.future is None:
            return
        code = worker.process.exitcode
        error = WorkerDied(f"worker process {worker.process.pid} ended (exit code {code})")
        with self._lock:
            self.broken = error
            failed = [w.future for w in self._workers if w.future is not None]
            failed += [f for f, _ in self._queue]
            self._queue.clear()
            for w in self._workers:
                w.future = None
                if w.process.exitcode is None:
                    w.process.kill()
        for future in failed:
            if future.running() or future.set_running_or_notify_cancel():  # False: cancelled while queued
                future.set_exception(error)


def _exited(workers: Any) -> set:
    """Workers whose process has ended (their sentinel may be held open by another fork)."""
    return {w for w in workers if w.process.exitcode is not None}


def _serve(conn: Any, function: Callable, initializer: Callable, initargs: tuple) -> None:
    """A worker's loop: one task at a time until the pool says stop (None) or goes."""
    initializer(*initargs)
    while True:
        try:
            args = conn.recv()
        except (EOFError, OSError):
            return
        if args is None:
            return
        try:
            answer = ("ok", function(*args))
        except BaseException as e:  # the error goes to the caller, as the pool's own
            answer = ("error", e)
        try:
            conn.send(answer)
        except Exception as e:  # an answer that does not pickle
            conn.send(("error", RuntimeError(f"{type(e).__name__}: {e} (sending {answer[0]!r} back)")))


__all__ = ["POLL_SECONDS", "ProcessPool", "WorkerDied"]
