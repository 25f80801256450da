"""readers.formats.blocks: output blocks reused once nobody holds them; blocks held
elsewhere (another reader's batches) never use up the pool's reuse."""

from __future__ import annotations

import gc

import numpy as np

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


def _in_child(fn) -> object:
    """fn() in a forked child; its (picklable) result, or the child's exception re-raised."""
    import os
    import pickle

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
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    kind, value = pickle.loads(data)
    assert kind == "ok", value
    return value


def test_a_fork_shares_held_blocks_and_keeps_free_ones_private():
    """A fork marks the free blocks wipe-on-fork (no copy-on-write for the parent's next
    rewrite): the child sees zeros there, the parent its own content; a held block (a batch
    the user keeps) is inherited intact; after the fork a freed block is shared again."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return
    rng = np.random.default_rng(11)
    shape = (int(rng.integers(2, 5)), int(rng.integers(300, 700)), 13)  # whole pages inside
    held, _ = reusable_block(shape, np.float32)
    held[...] = rng.random(shape, dtype=np.float32)
    free, _ = reusable_block(shape, np.float32)
    free[...] = rng.random(shape, dtype=np.float32) + 1
    address, content = free.ctypes.data, free.copy()
    page = 4096
    start = -(-address // page) * page  # the whole pages inside the block
    pages = (address + free.nbytes) // page - start // page
    assert pages >= 4
    del free
    gc.collect()

    def child_view():
        inside = np.ctypeslib.as_array((ctypes.c_uint8 * (pages * page)).from_address(start))
        return held.copy(), inside.copy()

    child_held, child_free = _in_child(child_view)
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
    # and a child can take blocks of its own (its pool lock is a fresh one)
    got = _in_child(lambda: float(reusable_block(shape, np.float32)[0].size))
    assert got == float(np.prod(shape))
