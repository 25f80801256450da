"""Interleaved rounds of the reader pipelines (issue 19): the method behind every reader row.

A *round* times every pipeline once, one after the other (round-robin), so that a
burst of load from elsewhere on a shared machine hits them all alike. The first round
of each pipeline is a warm-up (functions traced, thread pools started, the page cache
filled): it is timed, recorded apart and dropped. The row's figure is the median of
the other rounds, shown with their min-max.

Within a round a pipeline gets a fresh iterator (the one of the round before is
dropped first, so nothing of it keeps working in the background while the next
pipeline is timed). The first `SETTLE_BATCHES` batches are taken untimed (start-up:
the shuffle buffer's fill, the first shard); then batches are taken until at least
`min_seconds` have passed (and at least `MIN_TIMED_BATCHES`). Pipelines that repeat
(`.repeat()` / `repeat=True`, as the `Dataset.save`/`load` baseline of issue 19 is
written) simply go on across epoch boundaries; a round is never cut to whole epochs.

Between rounds the process waits until it and its worker processes are quiet
(`wait_quiet`): a pipeline closed mid-stream can leave work behind (Keras' process
pool finishing and sending its queued 67 MB batches, which this process unpickles;
tasks a thread pool had already started), and that CPU was charged to whichever row
came next. In the eleventh session's run, the rotate=10 float32 row, right after Keras'
process-pool ceiling, measured 4.35 CPU-ms per sample (248-486 samples/s) against
2.4 alone. A row is charged for its own start-up, never for its predecessor's tail.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from converter.bench.measure import cpu_seconds, descendant_cpu

#: Batches taken untimed at the start of every round (start-up, shuffle buffer fill).
SETTLE_BATCHES = 1
#: Batches every timed round takes at least, however short `min_seconds` is.
MIN_TIMED_BATCHES = 2
#: `wait_quiet`: quiet means at most QUIET_CORES cores of CPU (this process and its
#: descendants) over a QUIET_WINDOW-second window; give up after QUIET_MAX_SECONDS.
QUIET_CORES = 0.15
QUIET_WINDOW = 0.2
QUIET_MAX_SECONDS = 15.0

Batch = Any  # (x, y): NumPy arrays or tf.Tensors; x has the batch dimension first
Transform = Callable[[Any, Any], tuple[Any, Any]]


def tf_iterator(ds: Any, transform: Transform | None = None) -> Callable[[], Iterator[Batch]]:
    """A maker of fresh iterators over a (repeating) `tf.data.Dataset`; `transform`
    runs on every batch inside the timing (e.g. `expand_batch`)."""
    if transform is None:
        return lambda: iter(ds)
    return lambda: (transform(x, y) for x, y in ds)


def forever(epoch: Callable[[], Iterable[Batch]]) -> Callable[[], Iterator[Batch]]:
    """A maker of iterators chaining epochs without end (for Python epoch loops); closing
    one closes the epoch it is in (and any worker pool that epoch holds)."""

    def make() -> Iterator[Batch]:
        while True:
            yield from epoch()

    return make


@dataclass(frozen=True)
class Round:
    samples: int
    seconds: float
    cpu_seconds: float
    batches: int


def timed_round(make_iter: Callable[[], Iterator[Batch]], min_seconds: float) -> Round:
    """One round of one pipeline (see the module docstring); closes the iterator."""
    it = make_iter()
    try:
        for _ in range(SETTLE_BATCHES):
            next(it)
        samples = batches = 0
        c0, t0 = cpu_seconds(), time.perf_counter()
        while True:
            x, _y = next(it)
            samples += int(x.shape[0])
            batches += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= min_seconds and batches >= MIN_TIMED_BATCHES:
                return Round(samples, elapsed, cpu_seconds() - c0, batches)
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()  # a generator: ends its epoch loop (and any worker pool it holds)
        del it  # a tf.data iterator: deleted now, its background work cancelled


def wait_quiet(max_seconds: float = QUIET_MAX_SECONDS) -> tuple[float, bool]:
    """Wait until this process and its worker processes use at most `QUIET_CORES` cores
    over a `QUIET_WINDOW` (see the module docstring); returns (seconds waited, quiet).

    Busy is this process' CPU between two looks at ``/proc`` (the looks themselves left
    out) plus, per descendant, what it used since the last look (all of it for one that
    appeared; nothing for one that ended, so an ending worker hides no busy one)."""
    t0 = time.perf_counter()
    kids = descendant_cpu()
    mine = cpu_seconds()
    while True:
        time.sleep(QUIET_WINDOW)
        busy = cpu_seconds() - mine
        now_kids = descendant_cpu()
        mine = cpu_seconds()
        busy += sum(max(0.0, cpu - kids.get(pid, 0.0)) for pid, cpu in now_kids.items())
        kids, now = now_kids, time.perf_counter()
        if busy <= QUIET_CORES * QUIET_WINDOW:
            return now - t0, True
        if now - t0 >= max_seconds:
            return now - t0, False


def run_rounds(pipelines: list[tuple[Any, Callable[[], Iterator[Batch]]]], rounds: int, min_seconds: float,
               say: Callable[[str], None]) -> None:
    """`rounds` interleaved rounds over (row, make_iter) pipelines; round 1 is each row's warm-up.

    Every row gets `row.record(samples, seconds, cpu, warmup=...)` once per round.
    """
    if rounds < 2:
        raise ValueError(f"rounds must be at least 2 (the first is a warm-up and is dropped). Received: {rounds}")
    for r in range(rounds):
        warmup = r == 0
        say(f"readers, round {r + 1}/{rounds}" + (" (warm-up, dropped)" if warmup else ""))
        for row, make_iter in pipelines:
            waited, quiet = wait_quiet()
            if not quiet:
                say(f"  {row.key}: still busy after {waited:.0f} s of waiting for the last round's work to end; "
                    "timing anyway")
            got = timed_round(make_iter, min_seconds)
            row.record(got.samples, got.seconds, got.cpu_seconds, warmup=warmup)
            say(f"  {row.key}: {got.samples / got.seconds:.1f} samples/s ({got.batches} batches)")


__all__ = ["MIN_TIMED_BATCHES", "QUIET_CORES", "QUIET_MAX_SECONDS", "QUIET_WINDOW", "SETTLE_BATCHES", "Round",
           "forever", "run_rounds", "tf_iterator", "timed_round", "wait_quiet"]
