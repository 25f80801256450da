"""Run a CLI command or a Python snippet against hostile input in a child process.

Hostile input must end in a named error: a non-zero exit, a message that names the file
and the reason, no Python traceback, no hang (a timeout) and bounded memory (an address
space limit, as `ulimit -v` sets it). Every hostile-input test goes through `run_hostile`
and `assert_named_error`, so the limits are the same everywhere.
"""

from __future__ import annotations

import resource
import subprocess
import sys
from typing import Sequence

from _cron import ROOT, child_env, cli_command

#: Address space a hostile-input child may use. TensorFlow alone maps about 3 GiB of
#: address space at import, so the limit for children that import it is larger.
MEMORY_LIMIT_BYTES = 2 * 1024**3
MEMORY_LIMIT_TF_BYTES = 8 * 1024**3
TIMEOUT_SECONDS = 90


def _limit(memory_bytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    return apply


def run_hostile(args: Sequence[str] | None = None, *, code: str | None = None,
                memory_bytes: int = MEMORY_LIMIT_BYTES, timeout: float = TIMEOUT_SECONDS,
                ) -> subprocess.CompletedProcess:
    """`imgshard ARGS...` (or `python -c CODE`) in a child with a timeout and a memory limit.

    A child that outlives `timeout` raises `subprocess.TimeoutExpired` (the test fails: a hang).
    """
    if (args is None) == (code is None):
        raise TypeError("run_hostile takes exactly one of args= or code=")
    command = cli_command(list(args)) if args is not None else [sys.executable, "-c", code]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=child_env(), preexec_fn=_limit(memory_bytes), stdin=subprocess.DEVNULL)


def assert_named_error(proc: subprocess.CompletedProcess, *needles: str,
                       codes: Sequence[int] | None = None) -> str:
    """The child failed cleanly: non-zero exit (one of `codes` if given), no traceback,
    no MemoryError, and every needle (file name, reason words) in its output. Returns the output."""
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, f"exit 0 on hostile input:\n{out[-3000:]}"
    if codes is not None:
        assert proc.returncode in codes, f"exit {proc.returncode}, expected one of {list(codes)}:\n{out[-3000:]}"
    assert "Traceback (most recent call last)" not in out, out[-4000:]
    assert "MemoryError" not in out, out[-3000:]
    for needle in needles:
        assert needle in out, f"{needle!r} not in the output:\n{out[-3000:]}"
    return out
