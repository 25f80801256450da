"""readers.formats.blocks: output blocks reused once nobody holds them; blocks held
elsewhere (another reader's batches) never use up the pool's reuse."""

from __future__ import annotations

import ctypes
import gc
import mmap
import sys
import threading

import numpy as np
import pytest

from readers.formats import blocks
from readers.formats.blocks import POOL_BLOCKS, reusable_block


def _pooled(shape, dtype) -> list:
    return blocks._pool[int(np.prod(shape)) * np.dtype(dtype).itemsize + 64]


def test_a_block_released_is_reused_even_when_more_than_the_pool_are_held():
    rng = np.random.default_rng(7)
    shape = (int(rng.integers(2, 9)), int(rng.integers(50, 300)), 17)  # a size no other test uses
    held = [reusable_block(shape, np.float32)[0] for _ in range(POOL_BLOCKS + 3)]  # another reader's
    for block in held:
        block[...] = rng.random(shape, dtype=np.float32)
    mine, _ = reusable_block(shape, np.float32)
    address = mine.ctypes.data
    del mine
    again, zeros = reusable_block(shape, np.float32)
    assert again.ctypes.data == address and not zeros  # reused, not fresh
    assert all(b.ctypes.data != address for b in held)
    expected = [b.copy() for b in held]
    again[...] = -1  # writing the reused block leaves every held block as it was
    for b, e in zip(held, expected):
        np.testing.assert_array_equal(b, e)
    del again, held, b, block
    gc.collect()
    taken, _ = reusable_block(shape, np.float32)
    assert len(_pooled(shape, np.float32)) == POOL_BLOCKS + 1  # the one taken, and at most the pool's free ones


def test_a_fresh_block_is_zeroed_and_aligned():
    shape = (3, 101, 7)
    block, zeros = reusable_block(shape, np.uint16, zeroed=True)
    assert block.ctypes.data % 64 == 0 and block.shape == shape and block.dtype == np.uint16
    if zeros:
        assert not block.any()


def _in_child(fn, timeout: float = 60.0) -> object:
    """fn() in a forked child; its (picklable) result, or the child's exception re-raised;
    a child that has not answered within `timeout` seconds is killed and the test fails."""
    import os
    import pickle
    import select
    import signal
    import time

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            try:
                out = ("ok", fn())
            except BaseException as e:  # noqa: BLE001 - sent back to the test
                out = ("error", repr(e))
            with os.fdopen(w, "wb") as f:
                pickle.dump(out, f)
        finally:
            os._exit(0)
    os.close(w)
    data, deadline = b"", time.monotonic() + timeout
    try:
        while True:
            ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise AssertionError(f"the forked child gave no answer within {timeout} s")
            chunk = os.read(r, 1 << 20)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(r)
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    kind, value = pickle.loads(data)
    assert kind == "ok", value
    return value


def _wipe_supported() -> bool:
    from readers.formats._allocator import wipe_on_fork

    probe = np.zeros(4 * mmap.PAGESIZE, np.uint8)
    done = wipe_on_fork(probe.ctypes.data, probe.nbytes, True)
    wipe_on_fork(probe.ctypes.data, probe.nbytes, False)
    return done


def _free_block(shape, rng):
    """A pooled block written with random values and then released: (its address, content)."""
    free, _ = reusable_block(shape, np.float32)
    free[...] = rng.random(shape, dtype=np.float32) + 1
    address, content = free.ctypes.data, free.copy()
    del free
    gc.collect()
    return address, content


def _whole_pages(address: int, nbytes: int) -> tuple[int, int]:
    page = mmap.PAGESIZE
    start = -(-address // page) * page
    return start, (address + nbytes) // page * page - start


def _read(start: int, size: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(start)).copy()


def test_a_fork_shares_held_blocks_and_keeps_free_ones_private():
    """A fork marks the free blocks wipe-on-fork (no copy-on-write for the parent's next
    rewrite): the child sees zeros there, the parent its own content; a held block (a batch
    the user keeps) is inherited intact; after the fork a freed block is shared again."""
    if not sys.platform.startswith("linux") or not _wipe_supported():
        pytest.skip("MADV_WIPEONFORK needs Linux >= 4.14")
    rng = np.random.default_rng(11)
    shape = (int(rng.integers(2, 5)), int(rng.integers(300, 700)), 13)  # whole pages inside
    held, _ = reusable_block(shape, np.float32)
    held[...] = rng.random(shape, dtype=np.float32)
    address, content = _free_block(shape, rng)
    start, size = _whole_pages(address, int(np.prod(shape)) * 4)
    assert size >= 4 * mmap.PAGESIZE

    child_held, child_free = _in_child(lambda: (held.copy(), _read(start, size)))
    np.testing.assert_array_equal(child_held, held)  # a held batch: inherited as it is
    assert not child_free.any()  # the free block's whole pages: zero pages in the child, never shared
    # ... while the parent's copy is intact, and reusing it works (the pool lock released)
    again, zeros = reusable_block(shape, np.float32)
    assert again.ctypes.data == address and not zeros
    np.testing.assert_array_equal(again, content)
    # held now: the next fork shares it (the wipe-on-fork mark was taken back after the fork)
    again[...] = 7.0
    child_again = _in_child(lambda: again.copy())
    np.testing.assert_array_equal(child_again, np.full(shape, 7.0, np.float32))


def test_a_forked_child_takes_back_the_marks_it_inherited_and_has_a_lock_of_its_own():
    """The kernel copies wipe-on-fork marks into the child: the child takes them back, so a
    block it fills and holds reaches its own children intact; and its pool lock is not the
    one the parent's forking thread held (another thread of the child can take a block)."""
    if not sys.platform.startswith("linux") or not _wipe_supported():
        pytest.skip("MADV_WIPEONFORK needs Linux >= 4.14")
    rng = np.random.default_rng(12)
    shape = (int(rng.integers(2, 5)), int(rng.integers(300, 700)), 11)
    address, _ = _free_block(shape, rng)

    def child():
        block, _ = reusable_block(shape, np.float32)  # the block the parent marked at the fork
        assert block.ctypes.data == address
        block[...] = 5.0
        grandchild = _in_child(lambda: block.copy())
        taken = []
        t = threading.Thread(target=lambda: taken.append(reusable_block((3, 5), np.uint8)[0].shape))
        t.start()
        t.join(20)
        return bool((grandchild == 5.0).all()), taken

    intact, taken = _in_child(child)
    assert intact  # not zeros: the child took back the mark it inherited
    assert taken == [(3, 5)]  # a second thread of the child took a block: the lock is the child's own


def test_an_interrupted_fork_hook_leaves_no_block_marked(monkeypatch):
    """A before-fork hook that fails half-way (an error after marking some blocks) still
    has every mark taken back by the after-fork hook, and the lock released once."""
    if not sys.platform.startswith("linux") or not _wipe_supported():
        pytest.skip("MADV_WIPEONFORK needs Linux >= 4.14")
    rng = np.random.default_rng(13)
    shape = (int(rng.integers(2, 5)), int(rng.integers(300, 700)), 7)
    addresses = [_free_block(shape, rng)[0]]
    from readers.formats import _allocator

    real, calls = _allocator.wipe_on_fork, []

    def failing(address, nbytes, wipe):
        calls.append(wipe)
        done = real(address, nbytes, wipe)
        if wipe and len(calls) == 1:
            raise MemoryError("hook interrupted")  # after the first block was marked
        return done

    monkeypatch.setattr(blocks, "wipe_on_fork", failing)
    with pytest.raises(MemoryError):
        blocks._before_fork()
    blocks._after_fork_parent()
    monkeypatch.setattr(blocks, "wipe_on_fork", real)
    assert calls[0] is True and False in calls  # marked, then taken back
    held, _ = reusable_block(shape, np.float32)  # the lock is free again
    assert held.ctypes.data in addresses
    held[...] = 3.0
    np.testing.assert_array_equal(_in_child(lambda: held.copy()), np.full(shape, 3.0, np.float32))
