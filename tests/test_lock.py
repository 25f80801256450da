"""One run per output folder: flock, exit 75 naming the holder, no stale lock after kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from converter.run.lock import LOCK_NAME, EX_TEMPFAIL, OutputLock, WorkerGuard, wait_for_orphans
from tests._cron import ROOT, assert_whole, child_env, cli_command, convert_args, run_cli, source_keys, startup_seconds

HOLD = """
import os, sys, time
from converter.run.lock import OutputLock
lock = OutputLock(sys.argv[1]).__enter__()
if len(sys.argv) > 2:  # fork a child that outlives us, as multiprocessing's Manager does
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    print(child, flush=True)
print("locked", flush=True)
time.sleep(60)
"""


def _holder(out: Path, *extra: str) -> tuple[subprocess.Popen, int | None]:
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out), *extra], cwd=ROOT, env=child_env(),
                            stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline()) if extra else None
    assert proc.stdout.readline().strip() == "locked"
    return proc, child


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def test_second_run_exits_75_within_two_seconds_naming_the_running_process(camvid_src, tmp_path):
    out = tmp_path / "out"
    holder, _ = _holder(out)
    startup = startup_seconds()
    try:
        t0 = time.monotonic()
        second = subprocess.run(cli_command(convert_args(camvid_src.root, out)), cwd=ROOT, env=child_env(),
                                capture_output=True, text=True, timeout=30)
        elapsed = time.monotonic() - t0
    finally:
        _stop(holder)
    assert second.returncode == EX_TEMPFAIL == 75
    # "within a second or two" of starting Python (measured alongside: the machine is shared)
    assert elapsed < startup + 1.5, f"the second run took {elapsed:.1f} s to give up (startup {startup:.1f} s)"
    assert f"pid {holder.pid}" in second.stderr and "Another imgshard run" in second.stderr
    assert not (out / "imgshard.json").exists()


def test_a_killed_run_leaves_no_stale_lock(camvid_src, tmp_path):
    out = tmp_path / "out"
    holder, _ = _holder(out)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    assert (out / LOCK_NAME).exists()  # the file stays; the kernel lock went with the process
    assert run_cli(convert_args(camvid_src.root, out)) == 0
    assert_whole(out, source_keys(Path(camvid_src.root)))


def test_a_forked_child_of_a_killed_run_does_not_keep_the_lock(camvid_src, tmp_path):
    out = tmp_path / "out"
    holder, child = _holder(out, "fork")
    try:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        os.kill(child, 0)  # the child still lives ...
        assert run_cli(convert_args(camvid_src.root, out)) == 0  # ... and holds nothing
    finally:
        os.kill(child, signal.SIGKILL)


def test_lock_in_this_process_refuses_a_second_holder_with_locked_error(tmp_path):
    with OutputLock(str(tmp_path)):
        with pytest.raises(RuntimeError, match=f"pid {os.getpid()}") as info:
            OutputLock(str(tmp_path)).__enter__()
        assert info.value.exit_code == 75
    with OutputLock(str(tmp_path)):  # released on exit: can be taken again
        pass


def test_new_run_waits_for_a_worker_still_inside_a_task(tmp_path):
    code = ("import fcntl, os, sys, time\n"
            "fd = os.open(os.path.join(sys.argv[1], '.imgshard.workers.lock'), os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_SH)  # what WorkerGuard holds for a whole task\n"
            "print('in task', flush=True)\n"
            "time.sleep(1.5)\n")
    worker = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, env=child_env(),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline().strip() == "in task"
        t0 = time.monotonic()
        wait_for_orphans(str(tmp_path), timeout=30)
        waited = time.monotonic() - t0
    finally:
        _stop(worker)
    assert 0.5 < waited < 10


def test_worker_guard_refuses_work_for_a_run_that_is_not_its_parent(tmp_path):
    with pytest.raises(RuntimeError, match="is gone"):
        with WorkerGuard(str(tmp_path), owner_pid=1 if os.getppid() != 1 else 2):
            pass
    with WorkerGuard(str(tmp_path), owner_pid=os.getpid()) as guard:
        guard.check()
