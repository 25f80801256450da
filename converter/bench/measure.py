"""Timing and memory helpers: medians of repeats, child processes with their peak RSS.

Peak memory of a command is read two ways, without psutil:

* ``max_process_rss``: the largest peak RSS of any one process of the tree: the
  kernel's high-water mark ``VmHWM`` of each process, read from ``/proc`` while it runs
  (``ru_maxrss`` is no use here: after fork + exec it still counts the parent's pages);
* ``peak_tree_rss``: the largest sum of the RSS of the child and all its descendants,
  sampled from ``/proc`` every `SAMPLE_SECONDS` (the memory the whole run held at once);
  processes that join the tree are found within `RESCAN_SECONDS`.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

SAMPLE_SECONDS = 0.05
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
RESCAN_SECONDS = 0.25  # how often the sampler looks for new processes in the tree
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass
class Timing:
    """Rates (samples/s) of the repeats of one measurement."""

    rates: list[float] = field(default_factory=list)

    def add(self, samples: int, seconds: float) -> None:
        self.rates.append(samples / seconds if seconds > 0 else float("inf"))

    @property
    def median(self) -> float:
        return statistics.median(self.rates) if self.rates else float("nan")

    @property
    def spread(self) -> tuple[float, float]:
        return (min(self.rates), max(self.rates)) if self.rates else (float("nan"), float("nan"))


def cpu_seconds() -> float:
    """User + system CPU of this process, all threads. Worker processes are not counted:
    their CPU is only reported when they are reaped, at an unpredictable moment."""
    import resource

    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


def timed_epochs(run_epoch: Callable[[], int], min_seconds: float) -> tuple[int, float, float]:
    """Run whole epochs (each returns its sample count) until `min_seconds` have
    passed; returns (samples, wall seconds, CPU seconds)."""
    samples = 0
    c0, t0 = cpu_seconds(), time.perf_counter()
    while True:
        samples += run_epoch()
        elapsed = time.perf_counter() - t0
        if elapsed >= min_seconds:
            return samples, elapsed, cpu_seconds() - c0


def _proc_stats() -> dict[int, list[bytes]]:
    """The fields after the command name of every process's ``/proc/PID/stat``, by pid."""
    stats: dict[int, list[bytes]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        stats[int(name)] = stat[stat.rindex(b")") + 2:].split()
    return stats


def _children(stats: dict[int, list[bytes]] | None = None) -> dict[int, list[int]]:
    """A parent -> children map of the processes in `stats` (default: scan /proc now)."""
    kids: dict[int, list[int]] = {}
    for pid, fields in (_proc_stats() if stats is None else stats).items():
        kids.setdefault(int(fields[1]), []).append(pid)
    return kids


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def descendant_cpu() -> dict[int, float]:
    """User + system CPU seconds of each live descendant of this process (worker pools; not
    in `cpu_seconds`), by pid, from one scan of ``/proc``; empty without it."""
    if not os.path.isdir("/proc"):
        return {}
    stats = _proc_stats()
    kids, out = _children(stats), {}
    todo = list(kids.get(os.getpid(), ()))
    while todo:
        p = todo.pop()
        out[p] = (int(stats[p][11]) + int(stats[p][12])) / _TICKS
        todo.extend(kids.get(p, ()))
    return out


def _status_kb(pid: int | str, field_name: bytes) -> int:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(field_name):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def high_water_rss(pid: int | str = "self") -> int:
    """Peak resident bytes of one process since its exec (``VmHWM``)."""
    return _status_kb(pid, b"VmHWM:")


def current_rss(pid: int | str = "self") -> int:
    """Resident bytes of one process now (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return 0


def tree_rss(pid: int, hwm: dict[int, int] | None = None, kids: dict[int, list[int]] | None = None) -> int:
    """Resident bytes of `pid` and all its descendants now (0 if it is gone); fills
    `hwm` with each process' high-water mark. `kids`: a parent -> children map from
    `_children()` to reuse (default: scan /proc now)."""
    kids = _children() if kids is None else kids
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += current_rss(p)
        if hwm is not None:
            hwm[p] = max(hwm.get(p, 0), high_water_rss(p))
        todo.extend(kids.get(p, ()))
    return total


@dataclass(frozen=True)
class ProcessRun:
    seconds: float
    cpu_seconds: float  # user + system of the child and every descendant it reaped
    returncode: int
    max_process_rss: int  # bytes
    peak_tree_rss: int  # bytes
    stdout: str
    stderr: str


def run_process(argv: Sequence[str], *, env: dict | None = None, cwd: str | None = None,
                sample_memory: bool = True, timeout: float | None = None) -> ProcessRun:
    """Run `argv`, timing it and tracking its memory (see the module docstring)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd)
    peak = [0]
    hwm: dict[int, int] = {}
    done = threading.Event()

    def sample() -> None:
        # Finding the tree means reading every process's /proc/PID/stat (2 ms of CPU on
        # this VM): done every RESCAN_SECONDS; the samples between read only the known
        # tree. Scanning at every sample took 4% of a core, which a run that keeps both
        # cores busy paid in wall time (2 workers measured 2.6% slower than unsampled).
        kids: dict[int, list[int]] = {}
        rescan = 0.0
        while not done.is_set():
            now = time.monotonic()
            if now >= rescan:
                kids, rescan = _children(), now + RESCAN_SECONDS
            peak[0] = max(peak[0], tree_rss(proc.pid, hwm, kids))
            done.wait(SAMPLE_SECONDS)

    sampler = threading.Thread(target=sample, daemon=True) if sample_memory and os.path.isdir("/proc") else None
    if sampler is not None:
        sampler.start()
    out: list[bytes] = [b"", b""]

    def drain(i: int, stream) -> None:
        out[i] = stream.read()

    drains = [threading.Thread(target=drain, args=(i, s), daemon=True) for i, s in enumerate((proc.stdout, proc.stderr))]
    for d in drains:
        d.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0) if timeout is None else _wait4_timeout(proc, timeout)
    finally:
        done.set()
    seconds = time.perf_counter() - t0
    for d in drains:
        d.join()
    if sampler is not None:
        sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return ProcessRun(seconds, usage.ru_utime + usage.ru_stime, proc.returncode, max(hwm.values(), default=0), peak[0],
                      out[0].decode("utf-8", "replace"), out[1].decode("utf-8", "replace"))


def _wait4_timeout(proc: subprocess.Popen, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            return pid, status, usage
        if time.monotonic() > deadline:
            proc.kill()
            return os.wait4(proc.pid, 0)
        time.sleep(0.02)


def python_argv(*args: str) -> list[str]:
    """argv running this interpreter (so a child imports the same code)."""
    return [sys.executable, *args]


def compile_bytecode() -> bool:
    """Compile the project's modules to ``__pycache__``, as ``pip install`` does for a regular install.

    Child processes then load bytecode instead of compiling about 40 modules from
    source on every start (about 45 ms of CPU here), which an editable install under
    ``PYTHONDONTWRITEBYTECODE=1`` would otherwise do. Returns whether every module
    compiled (False where the checkout is read-only: the run is then measured as it is).
    """
    import compileall

    return all(compileall.compile_dir(os.path.join(_ROOT, pkg), quiet=2) for pkg in ("converter", "readers"))


def child_env() -> dict:
    """Environment for child processes: quiet TensorFlow, this checkout first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = _ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env
