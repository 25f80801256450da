"""readers.procpool: the worker processes of keras_dataset(use_multiprocessing=True).

What matters beyond the answers: a worker's death, at any moment (even half-way through
sending its answer), is a named error for every pending and later task, never a hang, and
a process that used a pool, broken or not, exits at once and quietly."""

from __future__ import annotations

import multiprocessing
import os
import platform
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from readers.procpool import ProcessPool, WorkerDied

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORK = multiprocessing.get_context("fork")
_state: dict = {}


def _init(offset: int) -> None:
    _state["offset"] = offset


def _work(kind: str, n: int):
    if kind == "array":
        return np.random.default_rng(n).integers(0, 65536, (n % 7 + 3, 5), dtype=np.uint16) + _state["offset"]
    if kind == "fail":
        raise ValueError(f"bad task {n}")
    if kind == "die":
        time.sleep(n / 1000)  # after the test has queued its other tasks
        os._exit(3)
    if kind == "die-sending":  # killed half-way through writing its (large) answer
        answer = np.ones(n, np.uint8)
        threading.Thread(target=_kill_when_written, daemon=True).start()
        return answer
    if kind == "sleep":
        time.sleep(n / 1000)
        return n
    if kind == "unpicklable":
        return threading.Lock()
    raise AssertionError(kind)


# write, sendto and sendmsg: the system calls a worker may be in while it sends its answer
SENDING = {"x86_64": {"1", "44", "46"}, "aarch64": {"64", "206", "211"}}.get(platform.machine(), set())


def _kill_when_written() -> None:
    """SIGKILL this process once its main thread has been sending for a while: half-way
    through sending a large answer (the parent reads as it comes)."""
    main = f"/proc/self/task/{os.getpid()}/syscall"
    while True:
        with open(main) as f:
            if f.read().split()[0] in SENDING:
                break
        time.sleep(0.0005)
    time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGKILL)


def _expected(n: int, offset: int) -> np.ndarray:
    return np.random.default_rng(n).integers(0, 65536, (n % 7 + 3, 5), dtype=np.uint16) + offset


@pytest.fixture
def pool():
    made = ProcessPool(2, FORK, _work, _init, (11,))
    yield made
    made.shutdown()


def test_answers_are_the_function_values(pool):
    ns = [int(n) for n in np.random.default_rng(4).permutation(40)]
    futures = [pool.submit("array", n) for n in ns]
    for n, future in zip(ns, futures):
        np.testing.assert_array_equal(future.result(timeout=60), _expected(n, 11))
    assert len(set(pool.pids)) == 2


def test_errors_reach_the_caller_and_the_pool_goes_on(pool):
    with pytest.raises(ValueError, match="bad task 5"):
        pool.submit("fail", 5).result(timeout=60)
    with pytest.raises(RuntimeError, match="TypeError.*sending 'ok'"):
        pool.submit("unpicklable", 0).result(timeout=60)
    np.testing.assert_array_equal(pool.submit("array", 8).result(timeout=60), _expected(8, 11))


@pytest.mark.skipif(not SENDING, reason="system call numbers known for x86_64 and aarch64")
@pytest.mark.parametrize("kind, n", [("die", 300), ("die-sending", 200_000_000)], ids=["exit", "killed-mid-answer"])
def test_a_dead_worker_fails_pending_and_later_tasks(pool, kind, n):
    started = time.monotonic()
    dying = pool.submit(kind, n)
    slow = [pool.submit("sleep", 3000) for _ in range(3)]  # on the other worker, and queued
    with pytest.raises(WorkerDied, match="worker process .* ended"):
        dying.result(timeout=60)
    for future in slow:
        with pytest.raises(WorkerDied):
            future.result(timeout=60)
    assert time.monotonic() - started < 30
    with pytest.raises(WorkerDied):
        pool.submit("array", 1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pool.pids):
        time.sleep(0.1)
    assert not any(_alive(p) for p in pool.pids)  # the others were ended too


def test_shutdown_finishes_running_tasks_and_cancels_queued(pool):
    running = [pool.submit("sleep", 300) for _ in range(2)]
    queued = [pool.submit("sleep", 300) for _ in range(3)]
    time.sleep(0.1)
    pids = pool.pids
    pool.shutdown()
    assert [f.result(timeout=60) for f in running] == [300, 300]
    assert all(f.cancelled() for f in queued)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


@pytest.mark.parametrize("ending", ["used", "broken", "broken-mid-answer", "busy"])
def test_the_process_exits_at_once_and_quietly(ending):
    """The CI hang: a process whose worker died exited only when the CI's time ran out."""
    code = textwrap.dedent(f"""
        import multiprocessing, sys
        sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_procpool import _init, _work
        from readers.procpool import ProcessPool, WorkerDied
        pools = [ProcessPool(2, multiprocessing.get_context("fork"), _work, _init, (0,)) for _ in range(3)]
        print(int(pools[0].submit("array", 4).result().sum()))
        ending = {ending!r}
        if ending.startswith("broken"):
            try:
                pools[1].submit(*(("die", 0) if ending == "broken" else ("die-sending", 200_000_000))).result()
            except WorkerDied:
                print("named")
        if ending == "busy":
            pools[2].submit("sleep", 600_000)
    """)
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert int(run.stdout.split()[0]) == int(_expected(4, 0).sum())
    assert ("named" in run.stdout) == ending.startswith("broken")
    assert time.monotonic() - started < 60
    assert run.stderr == "", run.stderr[-2000:]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _refuse_to_load(path: str, why: str):
    raise TypeError(f"cannot rebuild {path}: {why}")


class _Unloadable:
    """Pickles in the worker, does not unpickle in the parent (as an exception class with a
    two-argument __init__ does, unless a library such as tblib has taught pickle otherwise:
    a test that imports dask installs tblib's reducers for every exception class then known)."""

    def __reduce__(self):
        return _refuse_to_load, ("a.jpg", "truncated")


def _answer_or_unloadable(kind: str, n: int):
    if kind == "two-arg":
        return _Unloadable()
    return _work(kind, n)


def test_an_answer_that_does_not_unpickle_is_that_tasks_error():
    pool = ProcessPool(2, FORK, _answer_or_unloadable, _init, (5,))
    try:
        with pytest.raises(RuntimeError, match="answer could not be read: TypeError"):
            pool.submit("two-arg", 0).result(timeout=60)
        np.testing.assert_array_equal(pool.submit("array", 3).result(timeout=60), _expected(3, 5))
        with pytest.raises(Exception, match="pickle|lock"):  # arguments that do not pickle: the caller's error
            pool.submit("array", threading.Lock())
        np.testing.assert_array_equal(pool.submit("array", 6).result(timeout=60), _expected(6, 5))
    finally:
        pool.shutdown()


class _ForkBesideEachStart:
    """The fork context, where another process is forked right after each worker starts (as
    another thread's fork could): it inherits the worker's end of its socket."""

    def __init__(self):
        self.bystanders: list = []

    def get_start_method(self) -> str:
        return "fork"

    def Process(self, *args, **kwargs):
        process = FORK.Process(*args, **kwargs)
        start = process.start

        def start_and_fork():
            start()
            bystander = FORK.Process(target=time.sleep, args=(120,), daemon=True)
            bystander.start()
            self.bystanders.append(bystander)

        process.start = start_and_fork
        return process


@pytest.mark.skipif(not SENDING, reason="system call numbers known for x86_64 and aarch64")
def test_a_death_mid_answer_is_named_when_another_process_holds_the_socket():
    context = _ForkBesideEachStart()
    pool = ProcessPool(2, context, _work, _init, (0,))
    try:
        with pytest.raises(WorkerDied):
            pool.submit("die-sending", 200_000_000).result(timeout=60)
    finally:
        pool.shutdown()
        for bystander in context.bystanders:
            bystander.kill()
            bystander.join()


class _FailingSecondStart:
    def __init__(self):
        self.started: list = []

    def get_start_method(self) -> str:
        return "fork"

    def Process(self, *args, **kwargs):
        if len(self.started) == 1:
            raise OSError(11, "Resource temporarily unavailable (fork)")
        process = FORK.Process(*args, **kwargs)
        start = process.start

        def start_and_note():
            start()
            self.started.append(process.pid)

        process.start = start_and_note
        return process


def _open_fds_once_other_pools_are_done() -> int:
    deadline = time.monotonic() + 20  # earlier tests' pools close their sockets as their workers end
    while time.monotonic() < deadline and any(t.name == "imgshard-feed-results" for t in threading.enumerate()):
        time.sleep(0.05)
    return _descriptors()


def _descriptors() -> set[str]:
    """What this process's descriptors point at (socket:[inode], pipe:[inode], paths)."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return out


def test_a_pool_that_cannot_start_all_its_workers_leaves_none_behind():
    fds = _open_fds_once_other_pools_are_done()
    context = _FailingSecondStart()
    with pytest.raises(OSError, match="fork"):
        ProcessPool(2, context, _work, _init, (0,))
    assert context.started and not any(_alive(p) for p in context.started)
    assert not _descriptors() - fds  # no socket or pipe of the started worker left open


def test_workers_end_with_a_killed_parent_and_ignore_ctrl_c(pool):
    os.kill(pool.pids[0], signal.SIGINT)  # Ctrl-C reaches the whole process group: the parent decides
    time.sleep(0.3)
    assert all(pool.submit("sleep", 1).result(timeout=60) == 1 for _ in range(4))
    code = textwrap.dedent(f"""
        import multiprocessing, os, signal, sys
        sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_procpool import _init, _work
        from readers.procpool import ProcessPool
        pools = [ProcessPool(2, multiprocessing.get_context("fork"), _work, _init, (0,)) for _ in range(2)]
        print(" ".join(str(p) for pool in pools for p in pool.pids), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    run = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, timeout=120)
    pids = [int(p) for p in run.stdout.split()]
    assert run.returncode == -9 and len(pids) == 4
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)  # no other worker holds a parent's socket end
