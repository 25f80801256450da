"""Reusable 64-byte aligned output blocks for the batches handed to `tf.data`.

A batch's arrays are megabytes (a float32 + one-hot batch of 8 at 512x512: ~70 MB).
Fresh memory is new pages: the page faults and the kernel's zeroing of them cost about as
much as filling them. So a block is reused once nobody holds it any more: TensorFlow takes
an aligned, C-contiguous array without a copy and drops its reference when the tensor
dies, and then the pool's reference is the only one left. Up to `POOL_BLOCKS` free blocks
are kept per size (the batches a pipeline may hold in flight in the documented memory
model: cut ahead, in tf.data's prefetch buffer and at the consumer), besides those held
now: blocks held elsewhere (another reader's batches computed ahead, say a validation
`keras_dataset` of the same shape) do not use up the pool, whose free blocks would
otherwise all come fresh (measured: rotate=10 float32 + one-hot 2.1 -> 3.3 CPU-ms per
sample beside a threaded keras_dataset of the same batch shape).

A fork (keras_dataset's worker processes, Keras' own process pool every epoch, any
`multiprocessing` use) would leave every page shared copy-on-write with the child, and
the next rewrite of a pooled block would copy each page first. So while the process
forks, the free blocks are marked wipe-on-fork (`_allocator.wipe_on_fork`): the child
gets zero pages there (it cannot hold them: nobody does), the parent keeps them private.
Blocks held at that moment are shared as usual (a child may read a batch it inherited).
The pool's lock is held across the fork, so no block changes hands meanwhile.

Used by the generator pipeline (`readers.formats.batching`) and the host augmentation
(`readers.augment_host`). NumPy and the standard library only.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import numpy as np

from readers.formats._allocator import wipe_on_fork
from readers.formats.encoding import DECODE_THREADS

#: Output blocks kept per size for reuse: 2 x cores + 2 (with 4 on 2 cores, 8% of the
#: compact batches came fresh once batches were cut ahead; with 6, under 1%).
POOL_BLOCKS = 2 * DECODE_THREADS + 2
_pool: dict[int, list[np.ndarray]] = {}
_pool_lock = threading.RLock()  # re-entrant: a signal handler that forks while this thread holds it


def _refcounts(blocks: list[np.ndarray]) -> list[int]:
    """`sys.getrefcount` of each block as this function sees it (see `_FREE_REFS`)."""
    return [sys.getrefcount(raw) for raw in blocks]


#: What `_refcounts` reads for a block only its pool list holds, measured once on a probe
#: (the count of references a loop and a call add differs between Python versions).
_FREE_REFS = _refcounts([np.empty(1, np.uint8)])[0]


def _free(blocks: list[np.ndarray]) -> list[bool]:
    """Whether nobody but the pool holds each block (under the pool lock)."""
    return [n <= _FREE_REFS for n in _refcounts(blocks)]


def reusable_block(shape: tuple[int, ...], dtype: Any, alignment: int = 64, *,
                   zeroed: bool = True) -> tuple[np.ndarray, bool]:
    """(array on an `alignment`-byte boundary, whether it is all zeros) for one output batch:
    a pooled block nobody holds any more, else a fresh one (see the module doc), zeroed
    (calloc) unless `zeroed` is False (for callers that write every value: no memset of
    recycled heap memory)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize + alignment
    arena = getattr(_arena, "current", None)
    if arena is not None:
        carved = arena.carve(shape, dtype, alignment, zeroed)
        if carved is not None:
            return carved, zeroed
    with _pool_lock:
        blocks = _pool.setdefault(nbytes, [])
        raw = next((r for r, free in zip(blocks, _free(blocks)) if free), None)
        fresh = raw is None
        if fresh:
            raw = np.zeros(nbytes, np.uint8) if zeroed else np.empty(nbytes, np.uint8)
            blocks.append(raw)
        if len(blocks) > POOL_BLOCKS:
            _trim(blocks)
        start = (-raw.ctypes.data) % alignment
        view = raw[start:start + nbytes - alignment].view(dtype).reshape(shape)
    return view, fresh and zeroed


def _trim(blocks: list[np.ndarray]) -> None:
    """Keep every held block and at most `POOL_BLOCKS` free ones (under the pool lock)."""
    kept, free = [], 0
    for raw, unheld in zip(blocks, _free(blocks)):
        if unheld:
            free += 1
            if free > POOL_BLOCKS:
                continue
        kept.append(raw)
    blocks[:] = kept


class Arena:
    """Consecutive aligned blocks carved from one buffer (a shared-memory slot of
    `readers.batchfeed.ProcessFeed`); `used` bytes so far. `carve` gives None when the
    rest of the buffer is too small (the caller then allocates as usual)."""

    def __init__(self, buffer: Any):
        self.raw = np.frombuffer(buffer, np.uint8)
        self.used = 0

    def carve(self, shape: tuple[int, ...], dtype: np.dtype, alignment: int, zeroed: bool) -> np.ndarray | None:
        start = self.used + (-(self.raw.ctypes.data + self.used)) % alignment
        size = int(np.prod(shape)) * dtype.itemsize
        if start + size > len(self.raw):
            return None
        self.used = start + size
        view = self.raw[start:start + size]
        if zeroed:
            view[:] = 0
        return view.view(dtype).reshape(shape)

    def offset_of(self, array: np.ndarray) -> int | None:
        """Where `array` lies in the buffer (None: elsewhere or not contiguous)."""
        if not array.flags.c_contiguous:
            return None
        offset = array.ctypes.data - self.raw.ctypes.data
        return offset if 0 <= offset and offset + array.nbytes <= len(self.raw) else None


_arena = threading.local()


class output_arena:
    """``with output_arena(buffer) as arena:`` makes `reusable_block` on this thread carve
    its blocks from `buffer` (see `Arena`)."""

    def __init__(self, buffer: Any):
        self.arena = Arena(buffer)

    def __enter__(self) -> Arena:
        self._outer = getattr(_arena, "current", None)
        _arena.current = self.arena
        return self.arena

    def __exit__(self, *exc: Any) -> None:
        _arena.current = self._outer


#: Per fork in progress (a signal handler may fork inside a fork's hooks), the blocks
#: marked wipe-on-fork; each is recorded before it is marked, so none stays marked.
_marks: list[list[np.ndarray]] = []


def _before_fork() -> None:
    """Free blocks wipe-on-fork while this process forks (see the module doc); the pool
    lock stays held until `_after_fork_parent` / `_after_fork_child`, which CPython calls
    even when this hook fails."""
    _pool_lock.acquire()
    marked: list[np.ndarray] = []
    _marks.append(marked)
    for blocks in _pool.values():
        for raw, free in zip(blocks, _free(blocks)):
            if free:
                marked.append(raw)
                wipe_on_fork(raw.ctypes.data, raw.nbytes, True)


def _unmark() -> None:
    """Take back the marks of the fork that just happened (whatever madvise returned)."""
    for raw in _marks.pop() if _marks else ():
        wipe_on_fork(raw.ctypes.data, raw.nbytes, False)


def _after_fork_parent() -> None:
    try:
        _unmark()  # later forks share a block again once it is held
    finally:
        _pool_lock.release()


def _after_fork_child() -> None:
    """The child inherits the marks (the kernel copies them): taken back, or its own
    forks would give their children zeros in blocks it holds; and a fresh lock (the
    parent's is held by the forking thread)."""
    global _pool_lock
    try:
        _unmark()
    finally:
        _marks.clear()
        _pool_lock = threading.RLock()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork_child)


__all__ = ["POOL_BLOCKS", "Arena", "output_arena", "reusable_block"]
