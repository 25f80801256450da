"""The worker processes of `readers.batchfeed.ProcessFeed`: a small pool whose end, and
whose workers' deaths, never hang the training process.

Why not `concurrent.futures.ProcessPoolExecutor`: the interpreter's exit joins that pool's
manager thread, and the thread can wait forever. All workers answer through one pipe whose
write end the parent itself holds, so a worker killed while writing its answer leaves a
half message and no end of file: the thread blocks in `recv` and the process never exits
(seen in CI: every test passed, then the run hung). Python 3.11's exit hook can also race
the thread's own close of its wake-up pipe (EBADF at exit; CPython gh-105829).

Here each worker has its own socket pair. The parent never waits on a worker's socket: it
reads what has arrived (non-blocking) into that worker's buffer, and a worker whose process
has ended (end of file, sentinel, or exit code, polled) is dead, even when a half answer is
left and another fork still holds the socket's far end. One daemon thread collects; any
error in it fails every task by name (`WorkerDied`), never leaves one pending. The workers
are daemon processes (ended by `multiprocessing` at exit); nothing is joined at exit.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import struct
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable

#: How often the collector looks at the workers' exit codes (a death whose sentinel pipe
#: another forked process keeps open is seen this way).
POLL_SECONDS = 0.5

_HEADER = struct.Struct("!Q")  # the length of each pickled message
_CHUNK = 1 << 20

#: The parent-side socket of every live worker of this process: a forked worker closes
#: them all, so that it holds no other worker's socket open (nor its own parent end).
_parent_ends: set[int] = set()
_ends_lock = threading.Lock()


class WorkerDied(RuntimeError):
    """A worker process of a `ProcessPool` ended while the pool was in use."""


class _Worker:
    def __init__(self, process: Any, sock: socket.socket):
        self.process, self.sock = process, sock
        self.inbox = bytearray()  # what has arrived of its answer
        self.future: Future | None = None  # the task it computes
        self.stopping = False


class ProcessPool:
    """`workers` processes of `context`, each running `initializer(*initargs)` once, then
    `function(*args)` for each `submit(*args)`. After a worker dies, every pending and later
    task fails with `WorkerDied`; the other workers are ended."""

    def __init__(self, workers: int, context: Any, function: Callable, initializer: Callable, initargs: tuple):
        self._lock = threading.Lock()
        self._queue: deque[tuple[Future, bytes]] = deque()  # not yet sent to a worker
        self._workers: list[_Worker] = []
        self.broken: WorkerDied | None = None
        self._closed = False  # shutdown() was called
        self._finished = False  # the collector is done: the sockets are closed
        fork = context.get_start_method() == "fork"
        try:
            for _ in range(max(1, int(workers))):
                self._workers.append(_start(context, fork, function, initializer, initargs))
        except BaseException:
            _end(self._workers)
            raise
        self._idle = list(self._workers)
        self._collector = threading.Thread(target=self._collect, name="imgshard-feed-results", daemon=True)
        self._collector.start()

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    def alive(self) -> bool:
        """Whether the pool can still answer (not broken, its results thread running)."""
        return self.broken is None and self._collector.is_alive()

    def submit(self, *args: Any) -> Future:
        message = _frame(args)  # a task that does not pickle fails here, in the caller
        future: Future = Future()
        with self._lock:
            if self.broken is not None:
                raise self.broken
            if self._closed:
                raise RuntimeError("ProcessPool: submit after shutdown")
            self._queue.append((future, message))
            self._dispatch()
        return future

    def _dispatch(self) -> None:
        """Send queued tasks to idle workers (under the lock)."""
        while self._idle and self._queue:
            future, message = self._queue.popleft()
            if not future.set_running_or_notify_cancel():  # cancelled while queued
                continue
            worker = self._idle.pop()
            worker.future = future
            try:
                worker.sock.sendall(message)
            except OSError:  # it died: the collector names it
                pass

    def shutdown(self) -> None:
        """Cancel the queued tasks; the workers end after the task they compute."""
        with self._lock:
            self._closed = True
            while self._queue:
                self._queue.popleft()[0].cancel()
            if self._finished:
                return
            for worker in self._workers:
                worker.stopping = True
                try:
                    worker.sock.sendall(_frame(None))
                except OSError:
                    pass

    def _collect(self) -> None:
        """The results thread: hands out answers and notices ended workers; any error of
        its own breaks the pool (every task fails by name) rather than leave one waiting."""
        try:
            self._collect_until_done()
        except BaseException as e:  # noqa: BLE001 - nothing may be left pending
            self._break(WorkerDied(f"the pool's results thread failed: {type(e).__name__}: {e}"))
        finally:
            with self._lock:
                self._finished = True
                for worker in self._workers:
                    _close(worker.sock)
            for worker in self._workers:
                worker.process.join(1)  # reaped (those a death ended were killed)

    def _collect_until_done(self) -> None:
        from multiprocessing.connection import wait

        live = {w.sock: w for w in self._workers}
        polled = time.monotonic()
        while live and self.broken is None:
            sentinels = {w.process.sentinel: w for w in live.values()}
            ready = {live.get(r) or sentinels[r] for r in wait(list(live) + list(sentinels), timeout=POLL_SECONDS)}
            if time.monotonic() - polled >= POLL_SECONDS:  # exit codes: not on every answer
                ready |= _exited(live.values())
                polled = time.monotonic()
            for worker in ready:
                if not self._read(worker):
                    del live[worker.sock]
                    self._ended(worker)

    def _read(self, worker: _Worker) -> bool:
        """Take what `worker` has sent (never waiting for more); False once it has ended."""
        while True:
            try:
                chunk = worker.sock.recv(_CHUNK)
            except (BlockingIOError, InterruptedError):
                return worker.process.exitcode is None  # nothing more now; ended if its process has
            except OSError:
                return False
            if not chunk:
                return False
            worker.inbox += chunk
            while len(worker.inbox) >= _HEADER.size:
                size = _HEADER.size + _HEADER.unpack_from(worker.inbox)[0]
                if len(worker.inbox) < size:
                    break
                answer = _unpickle(worker.inbox[_HEADER.size:size])  # a copy: no view may outlive the resize
                del worker.inbox[:size]
                self._answer(worker, answer)

    def _answer(self, worker: _Worker, answer: tuple) -> None:
        with self._lock:
            future, worker.future = worker.future, None
            self._idle.append(worker)
        if future is not None:
            status, value = answer
            if status == "ok":
                future.set_result(value)
            else:
                future.set_exception(value)
        with self._lock:
            self._dispatch()

    def _ended(self, worker: _Worker) -> None:
        worker.process.join(1)
        if not (worker.stopping and worker.future is None):
            self._break(WorkerDied(f"worker process {worker.process.pid} ended (exit code {worker.process.exitcode})"))

    def _break(self, error: WorkerDied) -> None:
        """Fail every running and queued task with `error`, and end the other workers."""
        with self._lock:
            if self.broken is None:
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
                future.set_exception(self.broken)


def _start(context: Any, fork: bool, function: Callable, initializer: Callable, initargs: tuple) -> _Worker:
    here, there = socket.socketpair()
    try:
        process = context.Process(target=_serve, args=(there, fork, function, initializer, initargs),
                                  name="imgshard-feed-worker", daemon=True)
        with _ends_lock:  # no fork of ours between these lines inherits `there`
            _parent_ends.add(here.fileno())  # the worker closes it (and every other worker's)
            process.start()
        _close(there)  # only the worker holds its end
    except BaseException:
        _close(here)
        _close(there)
        raise
    here.setblocking(False)
    return _Worker(process, here)


def _end(workers: list[_Worker]) -> None:
    """Kill and reap `workers` (a pool that could not start them all)."""
    for worker in workers:
        worker.process.kill()
        worker.process.join(1)
        _close(worker.sock)
        try:
            worker.process.close()  # its sentinel pipes
        except ValueError:  # still running after the kill (cannot be here for long)
            pass


def _close(sock: socket.socket) -> None:
    with _ends_lock:
        if sock.fileno() >= 0:
            _parent_ends.discard(sock.fileno())
            sock.close()


def _exited(workers: Any) -> set:
    """Workers whose process has ended (their sentinel may be held open by another fork)."""
    return {w for w in workers if w.process.exitcode is not None}


def _unpickle(body: Any) -> tuple:
    """A worker's (status, value); one that does not unpickle here is that task's error."""
    try:
        return pickle.loads(body)
    except Exception as e:
        return "error", RuntimeError(f"a worker's answer could not be read: {type(e).__name__}: {e}")


def _frame(value: Any) -> bytes:
    body = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


def _receive(sock: socket.socket) -> Any:
    """One message (blocking); EOFError at the end of the stream."""
    header = _exactly(sock, _HEADER.size)
    return pickle.loads(_exactly(sock, _HEADER.unpack(header)[0]))


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray(size)
    view, got = memoryview(data), 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise EOFError
        got += n
    return bytes(data)


def _serve(sock: socket.socket, forked: bool, function: Callable, initializer: Callable, initargs: tuple) -> None:
    """A worker's loop: one task at a time until the pool says stop (None) or goes. Ctrl-C
    reaches the whole process group: the training process decides, not its workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if forked:  # inherited: every worker's parent end, this one's included
        for fd in list(_parent_ends):
            try:
                os.close(fd)
            except OSError:
                pass
        _parent_ends.clear()
    failed = None
    try:
        initializer(*initargs)
    except Exception as e:  # every task answers with it (not a silent death)
        failed = RuntimeError(f"the worker's set-up failed: {type(e).__name__}: {e}")
    while True:
        try:
            args = _receive(sock)
        except (EOFError, OSError):
            return
        if args is None:
            return
        try:
            sock.sendall(_compute(function, args, failed))
        except OSError:  # the pool is gone
            return


def _compute(function: Callable, args: tuple, failed: Exception | None) -> bytes:
    """The framed answer to one task: its result, its error, or the set-up error `failed`."""
    try:
        if failed is not None:
            raise failed
        answer = ("ok", function(*args))
    except BaseException as e:  # the error goes to the caller, as the pool's own
        answer = ("error", e)
    try:
        return _frame(answer)
    except Exception as e:  # an answer that does not pickle
        return _frame(("error", RuntimeError(f"{type(e).__name__}: {e} (sending {answer[0]!r} back)")))


__all__ = ["POLL_SECONDS", "ProcessPool", "WorkerDied"]
