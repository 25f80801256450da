"""Sample-level help for the last shards of a forked run, so no worker idles in the tail.

Shard tasks are whole shards (their contents are fixed by the plan, whatever the
number of workers), so a worker that finds no task left used to wait while the
others finished theirs: up to one shard's time (0.4 s of a 2 s 2-worker run here
when one worker fell behind). With `TailShare`, such a worker takes samples of a
shard still being written instead, from its end: it decodes, transforms and encodes
them and sends the result to the shard's writer (its owner), which takes samples
from the front and, once the two meet, writes the helpers' samples in order. The
shard is the same bytes whoever converted its samples.

Per task, two shared bounds: `front` (the owner's next sample) and `back` (samples
at and after it belong to helpers), moved under one lock. Only samples that are
converted (not records copied from an old shard) are taken, and only contiguously
from the end. Each worker has an inbox (a queue that only its owner reads); a
helper's payload is pickled before it is queued, so a payload that cannot be
pickled fails in the helper, which then sends the error instead.
"""

from __future__ import annotations

import pickle
import queue
from typing import Any, Callable, Sequence

_WAIT_SECONDS = 0.2


class _HelperFailed:
    """What a helper sends in place of a sample it failed to convert (the owner raises `error`)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class TailShare:
    """Shared state of the forked workers of one run; create it before they are forked.

    `convert(task_index, item_index)` -> a picklable payload for the owner;
    `stealable(task_index, item_index)` -> whether a helper may convert that item.
    """

    def __init__(self, sizes: Sequence[int], workers: int, convert: Callable[[int, int], Any],
                 stealable: Callable[[int, int], bool]) -> None:
        import multiprocessing as mp

        fork = mp.get_context("fork")
        self._bounds = fork.Array("q", [b for n in sizes for b in (0, n)])  # front, back per task (locked)
        self._active = fork.Array("q", [-1] * workers, lock=False)  # worker -> the task it writes (under _bounds' lock)
        self._inboxes = [fork.Queue() for _ in range(workers)]
        self._convert = convert
        self._stealable = stealable
        self._me = 0
        self._check: Callable[[], None] = lambda: None
        self._received: dict[tuple[int, int], Any] = {}
        self.helped = 0  # samples this process converted for other workers' shards

    # -- in every worker ------------------------------------------------------------
    def start(self, worker: int, check: Callable[[], None]) -> None:
        """Called in worker `worker` (0: the run itself) before its first task; `check()`
        raises (or exits) when the run cannot go on (a worker died)."""
        self._me, self._check = worker, check

    def for_task(self, task: int) -> TaskTail:
        return TaskTail(self, task)

    # -- the owner of a task -----------------------------------------------------------
    def begin(self, task: int) -> None:
        with self._bounds.get_lock():
            self._active[self._me] = task

    def mine(self, task: int, item: int) -> bool:
        """Claim `item` (the next from the front) for the owner; False: a helper has it."""
        with self._bounds.get_lock():
            front, back = self._bounds[2 * task], self._bounds[2 * task + 1]
            if item != front or front >= back:
                return False
            self._bounds[2 * task] = front + 1
            return True

    def stolen(self, task: int, item: int) -> Any:
        """The payload a helper sent for `item` of `task` (waits; raises a helper's error)."""
        inbox = self._inboxes[self._me]
        while (task, item) not in self._received:
            try:
                t, i, data = inbox.get(timeout=_WAIT_SECONDS)
            except queue.Empty:
                self._check()
                continue
            self._received[(t, i)] = data
        payload = pickle.loads(self._received.pop((task, item)))
        if isinstance(payload, _HelperFailed):
            raise payload.error
        return payload

    def end(self, task: int) -> None:
        """The owner is done with `task` (or failed): nothing of it is left to take."""
        with self._bounds.get_lock():
            self._bounds[2 * task] = self._bounds[2 * task + 1] = 0
            self._active[self._me] = -1

    # -- an idle worker ------------------------------------------------------------------
    def help(self) -> None:
        """Convert samples of the shards still being written until none is left to take."""
        from converter.run.fork import portable_error

        while (claim := self._claim_back()) is not None:
            task, item, owner = claim
            try:
                data = pickle.dumps(self._convert(task, item), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as e:  # noqa: BLE001 - the owner raises it in its task, which ends the run
                data = pickle.dumps(_HelperFailed(portable_error(e)))
                self._inboxes[owner].put((task, item, data))
                return
            self._inboxes[owner].put((task, item, data))
            self.helped += 1

    def _claim_back(self) -> tuple[int, int, int] | None:
        """(task, item, owner) of the last untaken sample of the task being written with the most
        left, or None."""
        with self._bounds.get_lock():
            best, left, owner = -1, 0, -1
            for worker, task in enumerate(self._active):
                if task < 0 or worker == self._me:
                    continue
                front, back = self._bounds[2 * task], self._bounds[2 * task + 1]
                if back - front > left and self._stealable(task, back - 1):
                    best, left, owner = task, back - front, worker
            if best < 0:
                return None
            item = self._bounds[2 * best + 1] - 1
            self._bounds[2 * best + 1] = item
            return best, item, owner

    def close(self, *, finished: bool) -> None:
        """Release the inboxes. After a failed run, payloads nobody will read must not hold up
        this process's exit (their owner may be dead)."""
        for inbox in self._inboxes:
            if not finished:
                inbox.cancel_join_thread()
            inbox.close()
            if finished:
                inbox.join_thread()


class TaskTail:
    """The owner's view of one task of a `TailShare` (what `run_shard_task` is given)."""

    def __init__(self, share: TailShare, task: int) -> None:
        self.share, self.task = share, task

    def begin(self) -> None:
        self.share.begin(self.task)

    def mine(self, item: int) -> bool:
        return self.share.mine(self.task, item)

    def stolen(self, item: int) -> Any:
        return self.share.stolen(self.task, item)

    def end(self) -> None:
        self.share.end(self.task)
