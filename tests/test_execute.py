"""Local workers: forked (the CLI), loky (a multi-threaded caller), failures of either kind.

The CLI runs single-threaded and forks its workers; a process with other threads (this
pytest process has TensorFlow's) gets loky's fresh interpreters instead. Both must
write the same bytes; a dead worker or a killed run must leave nothing half-done.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from converter.testing import synth
from converter.convert import convert
from converter.run.execute import local_start, run_local
from converter.run.fork import fork_is_safe
from converter.options import OutputOptions, RunOptions, SourceSpec, parse_bytes
from readers.manifest import MANIFEST_NAME
from tests._cron import ROOT, assert_whole, child_env, cli_command, convert_args, shard_hashes, source_keys


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    """48 pairs of 160x240: a 2-worker CLI run takes a second or two here."""
    root = tmp_path_factory.mktemp("execute")
    return synth.make_camvid(root / "src", splits={"train": 40, "val": 8}, size=[(160, 240), (120, 200)],
                             seed=21).root


def _args(src: Path, out: Path, workers: int = 2) -> list[str]:
    return convert_args(src, out, "--shard-size", "64KB", size="64x64", workers=workers)


def _report(out: Path) -> dict:
    reports = sorted((out / "reports").glob("convert-*.json"))
    return json.loads(reports[-1].read_text())


def test_the_cli_forks_its_workers_and_writes_the_same_bytes_as_loky_and_one_worker(sources, tmp_path):
    forked, loky, single = tmp_path / "forked", tmp_path / "loky", tmp_path / "single"
    done = subprocess.run(cli_command(_args(sources, forked)), cwd=ROOT, env=child_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    workers = _report(forked)["workers"]
    assert workers == {"backend": "local", "workers": 2, "start": "fork", "helped_samples": workers["helped_samples"]}
    assert 0 <= workers["helped_samples"] < 48  # samples converted by a worker with no shard left (test_steal.py)

    # this process runs TensorFlow's threads: the same conversion goes through loky
    options = OutputOptions(size=(64, 64))
    result = convert(SourceSpec(root=str(sources)), str(loky), options,
                     RunOptions(workers=2, shard_size_bytes=parse_bytes("64KB")))
    assert result.workers["start"] == "loky"
    convert(SourceSpec(root=str(sources)), str(single), options, RunOptions(workers=1, shard_size_bytes=parse_bytes("64KB")))

    assert len(shard_hashes(forked)) > 4
    assert shard_hashes(forked) == shard_hashes(loky) == shard_hashes(single)
    strip = lambda m: {k: v for k, v in json.loads(m.read_text()).items() if k != "history"}  # noqa: E731
    assert strip(forked / MANIFEST_NAME) == strip(loky / MANIFEST_NAME) == strip(single / MANIFEST_NAME)


def test_fork_is_used_only_from_a_single_threaded_process() -> None:
    assert local_start(1, 10) == "in-process" and local_start(4, 1) == "in-process"
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    try:
        assert not fork_is_safe()
        assert local_start(2, 10) == "loky"
    finally:
        stop.set()
        t.join()
    code = ("import os; os.environ['OPENBLAS_NUM_THREADS'] = '1'; import numpy, PIL.Image; "
            "from converter.run.fork import fork_is_safe; print(fork_is_safe())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == "True", out.stderr


def test_run_local_refuses_an_unknown_start_method(sources, tmp_path):
    with pytest.raises(ValueError, match=r"start must be one of \['in-process', 'fork', 'loky'\]. Received: 'spawn'"):
        list(run_local([object(), object()], None, 2, start="spawn"))  # type: ignore[list-item]


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cli_command(args), cwd=ROOT, env=child_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _writing(pid: int) -> bool:
    """True while process `pid` holds a temporary shard file open (it is inside a task)."""
    try:
        return any(".tmp-" in os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def _wait_for_workers(proc: subprocess.Popen, out: Path, n: int = 1) -> list[int]:
    """The forked workers of a 2-worker run (the run itself is the other worker), once one is inside a task."""
    deadline = time.monotonic() + 120
    while True:
        kids = _children(proc.pid)
        if len(kids) >= n and any(_writing(k) for k in kids):
            return sorted(kids, key=lambda k: not _writing(k))
        assert proc.poll() is None, f"the run ended before its workers were seen: {proc.stderr.read()}"
        assert time.monotonic() < deadline, "the workers never started a shard"
        time.sleep(0.002)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"  # a zombie has exited
    except OSError:
        return True


@pytest.mark.slow
def test_a_killed_forked_worker_ends_the_run_with_a_clear_error_and_publishes_nothing(sources, tmp_path):
    out = tmp_path / "out"
    proc = _start(_args(sources, out))
    try:
        victim = _wait_for_workers(proc, out)[0]
        os.kill(victim, signal.SIGKILL)
        rc = proc.wait(timeout=120)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert rc != 0
    assert f"worker process {victim} died (signal 9)" in err and "nothing was published" in err, err
    assert not (out / MANIFEST_NAME).exists()
    assert not [p.name for p in out.iterdir() if p.suffix == ".tfrecord"], "shards of a failed run were left"
    done = subprocess.run(cli_command(_args(sources, out)), cwd=ROOT, env=child_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert_whole(out, source_keys(sources))


@pytest.mark.slow
def test_forked_workers_die_with_a_killed_run(sources, tmp_path):
    out = tmp_path / "out"
    proc = _start(_args(sources, out))
    try:
        workers = _wait_for_workers(proc, out)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 10
        while not all(_gone(w) for w in workers):
            assert time.monotonic() < deadline, "forked workers outlived their killed run"
            time.sleep(0.02)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    done = subprocess.run(cli_command(_args(sources, out)), cwd=ROOT, env=child_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert_whole(out, source_keys(sources))


FORK_MAP_SCRIPT = r"""
import os, sys, time
os.environ["OPENBLAS_NUM_THREADS"] = "1"  # as the CLI does: NumPy then starts no thread pool
from converter.run.fork import fork_is_safe, fork_map
assert fork_is_safe(), "the child must be single-threaded"
base = 1000  # a closure: forked workers inherit it, nothing is pickled on the way in
seen = []
def square(x, progress):
    time.sleep(0.01)  # long enough for every worker to take items
    progress(1)
    return base + x * x, os.getpid()

out = sorted(fork_map(square, list(range(40)), 3, on_progress=seen.append))
assert [v for v, _ in out] == [base + x * x for x in range(40)], out
assert len({pid for _, pid in out} - {os.getpid()}) >= 2, "the work must be spread over worker processes"
assert sum(seen) == 40, seen

class Odd(Exception):
    def __init__(self, a, b):  # not re-creatable from its args: a worker sends it back as text
        super().__init__(f"{a}/{b}")

def boom(x, progress):
    time.sleep(0.01)
    if x == 7:
        raise KeyError(f"item {x}")
    if x == 9:
        raise Odd(1, 2)
    return x

# whichever process meets the bad item first (this one or a forked worker), the run raises
for bad, want in ((list(range(8)), (KeyError,)), ([9] * 6, (Odd, RuntimeError))):
    try:
        list(fork_map(boom, bad, 2))
    except want as e:
        print(type(e).__name__ if not isinstance(e, Odd) else "RuntimeError", str(e).splitlines()[0])
    else:
        sys.exit(f"no {want} for {bad}")
from converter.run.fork import portable_error as _portable
sent = _portable(Odd(1, 2))
assert isinstance(sent, RuntimeError) and "a worker failed with Odd: 1/2" in str(sent), sent
print("ok")
"""


def test_fork_map_spreads_a_closure_over_workers_and_returns_results_progress_and_errors(tmp_path):
    done = subprocess.run([sys.executable, "-c", FORK_MAP_SCRIPT], cwd=ROOT, env=child_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    assert lines[0] == "KeyError 'item 7'" and lines[1].startswith("RuntimeError") and "1/2" in lines[1]
    assert lines[2] == "ok"


def test_cli_scan_with_forked_workers_reports_what_an_in_process_scan_reports(sources, tmp_path):
    from converter.inspect.scan import ScanOptions, scan

    done = subprocess.run(cli_command(["scan", str(sources), "--json", "--workers", "2"]), cwd=ROOT,
                          env=child_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    forked = json.loads(done.stdout)
    here = scan(SourceSpec(root=str(sources)), ScanOptions(workers=1)).to_json()
    assert forked == here


PROMPT_END_SCRIPT = r"""
import time
from converter.run import fork
from converter.run.fork import fork_map

fork._POLL_SECONDS = 30.0  # a drainer that waited for its next poll would hold the run for 5 s (its join timeout)
seen = []
def work(x, progress):
    time.sleep(0.02)
    progress(1)
    return x

t0 = time.perf_counter()
out = sorted(fork_map(work, list(range(6)), 2, on_progress=seen.append))
print(round(time.perf_counter() - t0, 3), sum(seen), out == list(range(6)))
"""


def test_fork_map_ends_its_progress_thread_without_waiting_for_a_poll():
    done = subprocess.run([sys.executable, "-c", PROMPT_END_SCRIPT], cwd=ROOT, env=child_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seconds, counts, same = done.stdout.split()
    assert counts == "6" and same == "True", done.stdout  # every count passed on before the thread ended
    assert float(seconds) < 4.0, f"fork_map took {seconds} s: its progress thread waited for a poll"


def test_drain_progress_passes_every_count_then_stops_at_the_end_marker():
    import queue as queue_mod

    from converter.run.fork import PROGRESS_END, drain_progress

    q: queue_mod.Queue = queue_mod.Queue()
    for n in (3, 1, 2):
        q.put(n)
    q.put(PROGRESS_END)
    q.put(99)  # after the end marker: not passed on
    seen: list[int] = []
    thread = threading.Thread(target=drain_progress, args=(q, seen.append, threading.Event()))
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive(), "the drainer did not stop at PROGRESS_END"
    assert seen == [3, 1, 2]
