"""`keras.utils.PyDataset` over shards, with random access (`Dataset.keras_dataset`).

Keras is imported only when the class is first needed: `ShardPyDataset` is built on
first attribute access of this module (so pickling for `use_multiprocessing=True`
finds it as `readers.pydataset.ShardPyDataset`).

Example (runnable with any converted dataset)::

    import readers
    ds = readers.open("out/")
    train = ds.keras_dataset("train", batch_size=8, seed=0, workers=2)
    x, y = train[0]          # NumPy: float32 (8, H, W, 3), float32 (8, H, W, C)
    model.fit(train, epochs=3)

Workers: Keras' own enqueuer is not used; the dataset computes batches ahead on its own
pool, threads or (``use_multiprocessing=True``) processes writing into shared memory
(`readers.batchfeed`), and Keras calls `__getitem__` in order on one thread.

Reading: each batch reads its records one by one through per-shard random-access
readers (`RandomAccessShard`): uncompressed TFRecord shards via an offset index built
from the record headers, stored NPZ shards via a memory map. Gzip TFRecord and deflated
NPZ shards cannot be read in pieces; they are decompressed whole on first use and
cached per worker process (about 1 GB, least recently used dropped).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from readers._lazy import LazyClass
from readers.augment import host_kernel_takes, repeat_ids
from readers.augment_host import augment_expand
from readers.formats.base import RandomAccessShard
from readers.formats.encoding import parallel_for
from readers.formats.blocks import reusable_block
from readers.formats.batching import expansion_is_identity
from readers.formats.expand import RecordExpander, expand_numpy
from readers.formats.pipeline import PipelineOptions
from readers.formats.spec import RecordSpec
from readers.order import replica_batch, replica_batch_count



class BatchReader:
    """What computes a `ShardPyDataset` batch: a pure function of (epoch, index). Without
    Keras, so a worker process of `readers.batchfeed.ProcessFeed` builds one from the
    dataset's pickled state (`worker_state`) without importing Keras or TensorFlow; the
    Keras class (`ShardPyDataset`) adds the `PyDataset` protocol on top."""

    def batch_at(self, epoch: int, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Batch `index` of `epoch`'s whole order (a pure function of the two)."""
        order = self._order_of(epoch)
        picked = _picked(order, self.options, index)
        if self.options.augment is None:
            return _standardized(self, *plain_batch(self, picked))
        images, targets = read_batch(self.readers, self._shard_of[picked], self._record_of[picked], self.spec)
        return _standardized(self, *augmented_batch(self, picked, images, targets, index, epoch, order))

    def _order_of(self, epoch: int) -> np.ndarray:
        """The order of `epoch` (the last two kept). Not `self._order`: that and `self.epoch`
        change one after the other while a feed thread may be computing a batch."""
        kept = self.__dict__.get("_orders") or {}
        order = kept.get(epoch)
        if order is None:
            order = epoch_order(self._seed, epoch, len(self._shard_of), self.options.shuffle,
                                self.options.repeat_factors)
            self._orders = {**dict(list(kept.items())[-1:]), epoch: order}  # one assignment: thread-safe
        return order

    def runs_tensorflow(self) -> bool:
        """Whether a batch runs TensorFlow ops (the augmentation's fallback, `augmented_batch`)."""
        return self.options.augment is not None and not host_kernel_takes(self.spec.channels, self.spec.image_dtype)

    def worker_state(self) -> bytes:
        """What a worker process rebuilds this reader from (`readers.batchfeed._start_worker`):
        the pickled (class, attributes); the class goes by reference, so the worker imports
        this module only when it unpickles it (no import cycle with `readers.batchfeed`)."""
        import pickle

        return pickle.dumps((BatchReader, self.__getstate__()))

    def close(self) -> None:
        """Stop the pool computing batches ahead and free its shared memory now (it also
        stops after `readers.batchfeed.IDLE_SECONDS` idle; a later read starts it again)."""
        if getattr(self, "_feed", None) is not None:
            self._feed.close()

    def keys_order(self) -> np.ndarray:
        """(shard position in this dataset, record index) of every sample in the current order."""
        return np.stack([self._shard_of[self._order], self._record_of[self._order]], axis=1)


def _build_class() -> type:
    import keras

    class ShardPyDataset(keras.utils.PyDataset, BatchReader):
        """Batches of (x, y) NumPy arrays read by index from shards.

        Args: readers (one random-access reader per shard), counts (records per shard),
        spec (the record layout), options (`PipelineOptions`); workers,
        use_multiprocessing, max_queue_size: as `keras.utils.PyDataset`.
        """

        def __init__(self, readers: Sequence[RandomAccessShard], counts: Sequence[int], spec: RecordSpec,
                     options: PipelineOptions, *, workers: int = 1, use_multiprocessing: bool = False,
                     max_queue_size: int = 10, ids: np.ndarray | None = None):
            # Keras' enqueuer is not used: the dataset computes batches ahead on its own pool
            # (`readers.batchfeed`), and Keras calls `__getitem__` in order on one thread.
            super().__init__(workers=1, use_multiprocessing=False, max_queue_size=max_queue_size)
            self.feed_workers = max(1, int(workers))
            self.feed_processes = bool(use_multiprocessing)
            self._feed = None
            if len(readers) != len(counts):
                raise ValueError(f"readers and counts must have the same length. Received: {len(readers)} "
                                 f"readers and {len(counts)} counts")
            self.readers = list(readers)
            self.spec = spec
            self.options = options
            counts = np.asarray(counts, np.int64)
            self._shard_of = np.repeat(np.arange(len(counts)), counts)
            self._record_of = (np.concatenate([np.arange(c) for c in counts]) if len(counts)
                               else np.zeros(0, np.int64))
            self._seed = options.effective_seed()
            self._ids = ids
            self._augment = None
            self.epoch = int(options.epoch)
            self._order = self._epoch_order()
            self._skip = 0  # batches of this epoch done before a restart (`start_resumed_epoch`)

        def _epoch_order(self) -> np.ndarray:
            return epoch_order(self._seed, self.epoch, len(self._shard_of), self.options.shuffle,
                               self.options.repeat_factors)

        @property
        def num_samples(self) -> int:
            return int(len(self._order))

        def __len__(self) -> int:
            return batches_per_epoch(self.num_samples, self.options) - self._skip

        start_resumed_epoch = _start_resumed_epoch

        def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
            if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
                raise TypeError(f"index must be an int. Received: {type(index).__name__}")
            n = len(self)
            if index < 0:
                index += n
            if not 0 <= index < n:
                raise IndexError(f"batch index must be in [0, {n}). Received: {index}")
            if self.feed_workers > 1 or self.feed_processes:
                return _fed(self).get(self.epoch, index + self._skip, n + self._skip)
            return self.batch_at(self.epoch, index + self._skip)

        def __getstate__(self) -> dict:
            state = dict(self.__dict__)
            state["_augment"] = None  # a tf.function; rebuilt on first use in a worker
            state["_feed"] = None  # its pool belongs to this process
            for key in ("_expander", "_orders", "_occurrences", "_occurrences_of"):
                state.pop(key, None)
            return state

        def on_epoch_end(self) -> None:
            self.epoch += 1
            self._skip = 0
            self._order = self._epoch_order()
            self._ends = getattr(self, "_ends", 0) + 1

        on_epoch_begin = _on_epoch_begin

    return ShardPyDataset


def batches_per_epoch(samples: int, options: PipelineOptions) -> int:
    """Batches of one epoch (of this replica's share with `options.replicas`, `readers.order`)."""
    if options.replicas is not None:
        return replica_batch_count(samples, options.batch_size, *options.replicas, drop_remainder=False)
    return math.ceil(samples / options.batch_size)


def _picked(order: np.ndarray, options: PipelineOptions, index: int) -> np.ndarray:
    """Positions in `order` of batch `index`'s samples."""
    bs = options.batch_size
    if options.replicas is not None:
        return replica_batch(order, bs, *options.replicas, index)
    return order[index * bs:(index + 1) * bs]


def _occurrences(seq: Any, order: np.ndarray) -> np.ndarray:
    """`readers.order.occurrences` of `order` (the last one kept on `seq`)."""
    from readers.order import occurrences

    kept = getattr(seq, "_occurrences_of", None)
    if kept is None or kept[0] is not order:
        kept = seq._occurrences_of = (order, occurrences(order))
    return kept[1]


def _fed(seq: Any) -> Any:
    """`seq`'s feed (`readers.batchfeed`), started on first use in this process."""
    if seq._feed is None:
        from readers import batchfeed

        ahead = min(int(seq.max_queue_size), 2 * seq.feed_workers)
        if seq.feed_processes and seq.runs_tensorflow():
            import warnings

            warnings.warn("keras_dataset(use_multiprocessing=True): this augmentation runs as TensorFlow ops (the C "
                          "kernel is not built, or does not take these images), which are not fork-safe; the batches "
                          "are computed on threads instead (TensorFlow's ops release the GIL)", stacklevel=3)
            seq.feed_processes = False
        if seq.feed_processes:
            seq._feed = batchfeed.ProcessFeed(seq, seq.feed_workers, ahead)
        else:
            seq._feed = batchfeed.ThreadFeed(seq.batch_at, seq.feed_workers, ahead)
    return seq._feed


def _on_epoch_begin(seq: Any) -> None:
    """Keras' `fit` (and `evaluate`) end an epoch of their input before the first one
    begins (`EpochIterator.reset`): that end, the only one before the first begin, is
    undone, so the first epoch trained is `options.epoch`, as with `tf_dataset`."""
    if not getattr(seq, "_begun", False) and getattr(seq, "_ends", 0) == 1:
        seq.epoch -= 1
        seq._order = seq._epoch_order()
    seq._begun = True


def _start_resumed_epoch(seq: Any) -> None:
    """Back to epoch `options.epoch` (Keras' `fit` ends an epoch of its input before the
    first one begins), where batch i is batch `options.start_step + i` until the epoch
    ends (`readers.ResumableInput` calls this when training begins)."""
    seq.epoch = int(seq.options.epoch)
    seq._order = seq._epoch_order()
    seq._skip = int(seq.options.start_step)
    seq._begun = True  # the epoch is set: nothing for `on_epoch_begin` to undo


def plain_batch(seq: Any, picked: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A `ShardPyDataset` batch without augmentation. Float / one-hot output is written
    straight from each record into the batch (`RecordExpander`, in C: one pass per output,
    no compact batch); compact output, encoded and bucket shards read a compact batch."""
    spec, opts = seq.spec, seq.options
    shards, records = seq._shard_of[picked], seq._record_of[picked]
    readers = seq.readers
    if (spec.encoded or expansion_is_identity(spec, one_hot=opts.one_hot, normalize=opts.normalize)
            or any(readers[int(i)].ranged for i in np.unique(shards))):
        images, targets = read_batch(readers, shards, records, spec)
        return expand_numpy(images, targets, spec, one_hot=opts.one_hot, normalize=opts.normalize)
    expander = seq.__dict__.get("_expander")
    if expander is None:
        expander = seq._expander = RecordExpander(spec, one_hot=opts.one_hot, normalize=opts.normalize)
    (x_shape, x_dtype), (y_shape, y_dtype) = expander.layout(len(picked))
    # Pooled blocks, reused once nobody holds them (refcount-checked, `readers.formats.blocks`):
    # fresh 70 MB float batches cost more in page faults than the expansion that fills them.
    (x, _), (y, _) = reusable_block(x_shape, x_dtype, zeroed=False), reusable_block(y_shape, y_dtype, zeroed=False)
    for j in range(len(picked)):
        image, target = readers[int(shards[j])].read(int(records[j]))
        expander.fill(x, y, j, image, target)
    return x, y


def read_batch(readers: Sequence[RandomAccessShard], shards: np.ndarray, records: np.ndarray,
               spec: RecordSpec) -> tuple[np.ndarray, np.ndarray]:
    """The compact (images, targets) of the records (shards[j], records[j])."""
    images = np.empty((len(shards), *spec.image_shape), spec.image_np_dtype.newbyteorder("="))
    if spec.segmentation:
        targets = np.empty((len(shards), *spec.mask_shape), spec.mask_np_dtype.newbyteorder("="))
    else:
        targets = np.empty((len(shards),), np.int64)

    def fill(j: int) -> None:
        images[j], targets[j] = readers[int(shards[j])].read(int(records[j]))

    if spec.encoded:  # decode the batch on the decoder threads (Pillow releases the GIL)
        parallel_for(len(shards), fill)
    elif any(readers[int(s)].ranged for s in np.unique(shards)):  # bucket reads: wait on GETs concurrently
        from readers.sources import parallel_io

        parallel_io(len(shards), fill)
    else:
        for j in range(len(shards)):
            fill(j)
    return images, targets


def epoch_order(seed: int, epoch: int, n: int, shuffle: bool, factors: np.ndarray | None = None) -> np.ndarray:
    """The sample order of `epoch`: a pure function of (seed, epoch); with repeat
    `factors`, each sample as often as `readers.sampling.epoch_counts` draws it."""
    if factors is not None:
        from readers.sampling import epoch_counts

        base = np.repeat(np.arange(n), epoch_counts(factors, seed, epoch))
        return np.random.default_rng([seed, epoch]).permutation(base) if shuffle else base
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng([seed, epoch]).permutation(n)


def augmented_batch(seq: Any, picked: np.ndarray, images: np.ndarray, targets: np.ndarray,
                    batch: int | None = None, epoch: int | None = None,
                    order: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A `ShardPyDataset` batch augmented with the draws of (seed, epoch, sample ids), then
    expanded: in C (`readers.augment_host`) when built, else through `tf_dataset`'s
    TensorFlow function (cached on `seq`). `epoch`, `order`: of the batch (default: `seq`'s
    current ones)."""
    epoch = seq.epoch if epoch is None else epoch
    repeats = None  # `batch` of a repeat-factor order: a repeated sample's copies get their own draws
    if batch is not None and seq.options.repeat_factors is not None:
        repeats = _picked(_occurrences(seq, seq._order if order is None else order), seq.options, batch)
    ids = repeat_ids(seq._ids[picked] if seq._ids is not None else picked.astype(np.uint64), repeats)
    opts = seq.options
    if host_kernel_takes(seq.spec.channels, seq.spec.image_dtype):
        from readers.augment import draw_params

        params = draw_params(opts.augment, seq.spec.height, seq.spec.width, seq._seed, epoch, ids)
        return augment_expand(opts.augment, seq.spec, images, targets, params, normalize=opts.normalize,
                              one_hot=opts.one_hot)
    if seq._augment is None:
        seq._augment = augment_fn(seq.spec, opts)
    images, targets = augment_numpy(seq._augment, seq.spec, opts, seq._seed, epoch, ids, images, targets)
    return expand_numpy(images, targets, seq.spec, one_hot=opts.one_hot, normalize=False)


def augment_fn(spec: RecordSpec, options: PipelineOptions) -> Any:
    """`tf_dataset`'s augmentation batch function, without the expansion."""
    from readers.augment import make_augment_tf

    return make_augment_tf(options.augment, ignore_index=spec.ignore_index, segmentation=spec.segmentation,
                           normalize=options.normalize, channels=spec.channels, image_dtype=spec.image_dtype)


def augment_numpy(fn: Any, spec: RecordSpec, options: PipelineOptions, seed: int, epoch: int, ids: np.ndarray,
                  images: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A NumPy batch through `fn` (from `augment_fn`) with the draws of (seed, epoch, ids)."""
    from readers.augment import draw_params

    params = draw_params(options.augment, spec.height, spec.width, seed, epoch, ids)
    x, y = fn(images, targets, params)
    return x.numpy(), y.numpy()


_LAZY = LazyClass(__name__, "ShardPyDataset", _build_class)
__getattr__ = _LAZY.module_getattr()


def _standardized(seq: Any, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """normalize="stats": x standardised per band by `seq.band_stats` (a `readers.bandnorm.BandStats`,
    set by `Dataset.keras_dataset`; None: x as it is)."""
    stats = getattr(seq, "band_stats", None)
    return (x, y) if stats is None else (stats.numpy(x), y)


def make_pydataset(readers: Sequence[RandomAccessShard], counts: Sequence[int], spec: RecordSpec,
                   options: PipelineOptions, **kwargs: Any) -> Any:
    """Build a `ShardPyDataset` (imports Keras)."""
    return _LAZY.get()(readers, counts, spec, options, **kwargs)


__all__ = ["make_pydataset"]
