"""The generator pipeline shared by NPZ and mapped TFRecord shards.

Whole shards are loaded by a few threads (`LOADER_THREADS`, `SHARDS_AHEAD` shards
ahead; the loaders do their heavy work -- inflating, CRC checks, page-cache copies --
without the GIL), a generator cuts compact batches (uint8 images, class maps or labels)
from them, `tf.data.Dataset.from_generator` hands those over without a copy (the
batches are 64-byte aligned), and a parallel map casts / one-hot encodes them.

Order: shuffle=False gives shard order and record order, as `Dataset.records()`.
shuffle=True shuffles the shard order every epoch (with the seed) and permutes records
across a window of at least `options.buffer_records()` records (a block shuffle whose
memory is bounded like a shuffle buffer); the seed makes it reproducible and every
epoch reshuffles.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np

from readers.formats.base import PipelineOptions, RecordSpec, ShardRef, make_expand_tf, y_signature

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

#: Threads loading shards ahead of the `tf.data` pipeline.
LOADER_THREADS = min(4, max(2, os.cpu_count() or 2))
#: Shards loaded ahead of the one being batched (each held in memory whole).
SHARDS_AHEAD = LOADER_THREADS


@dataclass(frozen=True)
class ShardArrays:
    """The records of one shard: arrays (N, ...) or sequences of per-record arrays."""

    images: Any
    targets: Any  # masks or labels
    keys: Any = None

    @property
    def nbytes(self) -> int:
        def size(x: Any) -> int:
            return int(x.nbytes) if isinstance(x, np.ndarray) else sum(int(np.asarray(a).nbytes) for a in x)

        return size(self.images) + size(self.targets)


LoadFn = Callable[[ShardRef, RecordSpec], ShardArrays]


def generator_dataset(shards: Sequence[ShardRef], spec: RecordSpec, options: PipelineOptions,
                      load: LoadFn) -> "tf.data.Dataset":
    """One epoch of expanded (x, y) batches from shards read by `load`."""
    import tensorflow as tf

    image_spec = tf.TensorSpec((None, *spec.image_shape), tf.uint8)
    y_shape, y_dtype = y_signature(spec)
    if options.drop_remainder:
        image_spec = tf.TensorSpec((options.batch_size, *spec.image_shape), tf.uint8)
        y_shape = (options.batch_size, *y_shape[1:])
    generator = BatchGenerator(list(shards), spec, options, load)
    ds = tf.data.Dataset.from_generator(
        generator, output_signature=(image_spec, tf.TensorSpec(y_shape, tf.dtypes.as_dtype(y_dtype)))
    )

    expand = make_expand_tf(spec, one_hot=options.one_hot, normalize=options.normalize)
    return ds.map(expand, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


class BatchGenerator:
    """Callable that `from_generator` calls once per epoch; yields compact batches."""

    def __init__(self, shards: list[ShardRef], spec: RecordSpec, options: PipelineOptions, load: LoadFn):
        self.shards = shards
        self.load = load
        self.spec = spec
        self.options = options
        self.rng = np.random.default_rng(options.seed)  # advances every epoch: reshuffles
        self.window = options.buffer_records(shards)

    def _loaded(self, order: list[int]) -> Iterator[ShardArrays]:
        """Shards in `order`, loaded `SHARDS_AHEAD` ahead by a thread pool."""
        pool = concurrent.futures.ThreadPoolExecutor(LOADER_THREADS, thread_name_prefix="imgshard-load")
        pending: collections.deque = collections.deque()
        try:
            todo = iter(order)
            for i in todo:
                pending.append(pool.submit(self.load, self.shards[i], self.spec))
                if len(pending) > SHARDS_AHEAD:
                    break
            while pending:
                data = pending.popleft().result()
                nxt = next(todo, None)
                if nxt is not None:
                    pending.append(pool.submit(self.load, self.shards[nxt], self.spec))
                yield data
        finally:
            for fut in pending:
                fut.cancel()
            pool.shutdown(wait=False, cancel_futures=True)

    def __call__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        order = list(range(len(self.shards)))
        if self.options.shuffle and self.options.record_shard is None:
            self.rng.shuffle(order)
        pieces = self._pieces(order)
        if self.options.shuffle:
            yield from self._shuffled(pieces)
        else:
            yield from self._sequential(pieces)

    def _pieces(self, order: list[int]) -> Iterator[tuple[ShardArrays, np.ndarray]]:
        """(shard arrays, indices of the records this pipeline keeps) per shard."""
        offset = 0
        for data in self._loaded(order):
            n = len(data.images)
            idx = np.arange(n)
            if self.options.record_shard is not None:
                num, index = self.options.record_shard
                idx = idx[(idx + offset) % num == index]
            offset += n
            yield data, idx

    def _emit(self, parts: list[tuple[ShardArrays, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
        """Gather a batch from (shard, record indices) pieces; a contiguous run is a view."""
        if len(parts) == 1 and isinstance(parts[0][0].images, np.ndarray):
            data, idx = parts[0]
            if idx.size and int(idx[-1]) - int(idx[0]) + 1 == idx.size:
                sl = slice(int(idx[0]), int(idx[-1]) + 1)
                return data.images[sl], data.targets[sl]
        return self._gather([(d, int(i)) for d, ids in parts for i in ids])

    def _sequential(self, pieces: Iterator[tuple[ShardArrays, np.ndarray]]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        bs = self.options.batch_size
        parts: list[tuple[ShardArrays, np.ndarray]] = []
        have = 0
        for data, idx in pieces:
            pos = 0
            while pos < idx.size:
                take = min(bs - have, idx.size - pos)
                parts.append((data, idx[pos:pos + take]))
                have += take
                pos += take
                if have == bs:
                    yield self._emit(parts)
                    parts, have = [], 0
        if have and not self.options.drop_remainder:
            yield self._emit(parts)

    def _shuffled(self, pieces: Iterator[tuple[ShardArrays, np.ndarray]]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        bs = self.options.batch_size
        window: list[tuple[ShardArrays, int]] = []  # leftover samples of the previous window first

        def flush(final: bool) -> Iterator[tuple[np.ndarray, np.ndarray]]:
            nonlocal window
            samples, window = window, []
            perm = self.rng.permutation(len(samples))
            full = len(samples) // bs * bs
            for start in range(0, full, bs):
                yield self._gather([samples[j] for j in perm[start:start + bs]])
            window = [samples[j] for j in perm[full:]]
            if final and window and not self.options.drop_remainder:
                yield self._gather(window)

        for data, idx in pieces:
            window.extend((data, int(i)) for i in idx)
            if len(window) >= self.window:
                yield from flush(final=False)
        yield from flush(final=True)

    def _gather(self, samples: list[tuple[ShardArrays, int]]) -> tuple[np.ndarray, np.ndarray]:
        first = samples[0][0]
        image, target = np.asarray(first.images[0]), np.asarray(first.targets[0])
        images = aligned_empty((len(samples), *image.shape), image.dtype)
        targets = aligned_empty((len(samples), *target.shape), target.dtype)
        for j, (data, i) in enumerate(samples):
            images[j] = data.images[i]
            targets[j] = data.targets[i]
        return images, targets


def aligned_empty(shape: tuple[int, ...], dtype: Any, alignment: int = 64) -> np.ndarray:
    """`np.empty` whose data starts on an `alignment`-byte boundary: TensorFlow then wraps
    the array handed over by `from_generator` without copying it (it copies arrays that
    are not aligned for Eigen)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + alignment, np.uint8)
    start = (-raw.ctypes.data) % alignment
    return raw[start:start + nbytes].view(dtype).reshape(shape)



__all__ = ["LOADER_THREADS", "SHARDS_AHEAD", "BatchGenerator", "ShardArrays", "aligned_empty", "generator_dataset"]
