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
