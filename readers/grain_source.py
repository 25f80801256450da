"""Grain: a `RandomAccessDataSource` over a split (`Dataset.grain_source`) and the batch map
that augments and expands like `tf_dataset` (`Dataset.grain_batch_map`).

Grain's data-source protocol needs only `__len__` and `__getitem__`; nothing here imports
Grain. Recipe (Keras 3 on JAX; docs/READERS.md, "Grain")::

    import grain, readers
    ds = readers.open("out/")
    src = ds.grain_source("train")               # items: {"image", "mask" | "label", "key"}
    steps = len(src) // 8
    pipeline = (grain.MapDataset.source(src)
                .shuffle(seed=0)                 # reshuffled every epoch by repeat()
                .batch(8, drop_remainder=True)
                .repeat(epochs)
                .map_with_index(ds.grain_batch_map(augment=aug, seed=0, batches_per_epoch=steps)))
    model.fit(pipeline, epochs=epochs, steps_per_epoch=steps)

The batch map draws each sample's augmentation from (seed, epoch, key), as `tf_dataset`
and `keras_dataset` do (epoch = batch index // `batches_per_epoch`), so a sample gets
the same pixels from all three readers in the same epoch.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from readers.formats.base import RandomAccessShard
from readers.formats.expand import expand_numpy
from readers.formats.pipeline import PipelineOptions
from readers.formats.spec import RecordSpec


class GrainSource:
    """Records of one split by global index, for `grain.MapDataset.source` (or
    `grain.DataLoader(data_source=...)`): item i is record i of `Dataset.records(split)`
    as a dict of the stored arrays (`image`: uint8 (H, W, C); `mask`: the class map or
    one-hot planes as stored, or `label`: int64) and its `key`. Picklable (for Grain's
    worker processes): a pickled source reopens its local dataset by path."""

    def __init__(self, readers: Sequence[RandomAccessShard], counts: Sequence[int], keys: Sequence[str],
                 spec: RecordSpec, reopen: tuple[Any, tuple[Any, ...]] | None = None):
        self._readers = list(readers)
        self._starts = np.concatenate([[0], np.cumsum(np.asarray(counts, np.int64))]).astype(np.int64)
        self._keys = list(keys)
        if len(self._keys) != int(self._starts[-1]):
            raise ValueError(f"keys must list every record ({int(self._starts[-1])}). Received: {len(self._keys)} keys")
        self._target = "mask" if spec.segmentation else "label"
        self._reopen = reopen

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, index: int) -> dict[str, Any]:
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"index must be an int. Received: {type(index).__name__}")
        n = len(self)
        i = int(index) + n if index < 0 else int(index)
        if not 0 <= i < n:
            raise IndexError(f"index must be in [0, {n}). Received: {index}")
        shard = int(np.searchsorted(self._starts, i, side="right")) - 1
        image, target = self._readers[shard].read(i - int(self._starts[shard]))
        if self._target == "label":
            target = np.int64(target)
        return {"image": image, self._target: target, "key": self._keys[i]}

    def __repr__(self) -> str:
        return f"readers.GrainSource({len(self)} records, {len(self._readers)} shards)"

    def __reduce__(self) -> tuple[Any, ...]:
        if self._reopen is None:
            raise TypeError("This GrainSource reads a bucket dataset and cannot be pickled for worker processes; "
                            "use a local copy (or worker_count=0). Received: a remote dataset")
        return self._reopen


def make_source(dataset: Any, split: str, num_shards: int, shard_index: int, reopen: Any) -> GrainSource:
    """`Dataset.grain_source`; `reopen(path, split, num_shards, shard_index)` rebuilds it (unpickling)."""
    from readers.index import ref_keys

    shards = dataset.shards(split, num_shards=num_shards, shard_index=shard_index)
    keys: list[str] = []
    for shard in shards:
        listed = ref_keys(shard)
        keys += listed if len(listed) == shard.records else [f"{shard.entry.file}#{i}" for i in range(shard.records)]
    readers = [dataset._adapter.random_access(s, dataset._spec) for s in shards]
    local = os.path.isdir(dataset.path)
    again = (reopen, (dataset.path, split, num_shards, shard_index)) if local else None
    return GrainSource(readers, [s.records for s in shards], keys, dataset._spec, again)


class GrainBatchMap:
    """(batch index, batch dict from `GrainSource` items) -> (x, y) as `tf_dataset` gives
    them: augmented with the draws of (seed, epoch, key) when `augment` is set (epoch =
    `epoch + index // batches_per_epoch`), then expanded (float32 / 255, one-hot). For
    `MapDataset.map_with_index` after `.batch(...)`; a plain `map` also works (epoch fixed)."""

    def __init__(self, spec: RecordSpec, options: PipelineOptions, batches_per_epoch: int | None):
        if batches_per_epoch is not None and (isinstance(batches_per_epoch, bool)
                                              or not isinstance(batches_per_epoch, (int, np.integer))
                                              or batches_per_epoch < 1):
            raise ValueError("batches_per_epoch must be a positive integer or None. "
                             f"Received: batches_per_epoch={batches_per_epoch!r}")
        if options.augment is not None and options.seed is None:
            raise ValueError("seed must be an int when augment is set (every Grain worker must draw the same "
                             "parameters). Received: seed=None")
        self.spec, self.options, self.batches_per_epoch = spec, options, batches_per_epoch
        self._augment_fn: Any = None

    def __call__(self, index_or_batch: Any, batch: Any = None) -> tuple[np.ndarray, np.ndarray]:
        index, batch = (0, index_or_batch) if batch is None else (int(index_or_batch), batch)
        target = "mask" if self.spec.segmentation else "label"
        images, targets = np.asarray(batch["image"]), np.asarray(batch[target])
        opts = self.options
        if opts.augment is None:
            return expand_numpy(images, targets, self.spec, one_hot=opts.one_hot, normalize=opts.normalize)
        epoch = opts.epoch + (index // self.batches_per_epoch if self.batches_per_epoch else 0)
        return self._augmented(epoch, [str(k) for k in np.asarray(batch["key"]).reshape(-1)], images, targets)

    def _augmented(self, epoch: int, keys: list[str], images: np.ndarray,
                   targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        from readers.augment import draw_params, key_ids
        from readers.augment_host import augment_expand, fast_augment_available

        opts, spec, ids = self.options, self.spec, key_ids(keys)
        if fast_augment_available():
            params = draw_params(opts.augment, spec.height, spec.width, int(opts.seed), epoch, ids)
            return augment_expand(opts.augment, spec, images, targets, params, normalize=opts.normalize,
                                  one_hot=opts.one_hot)
        from readers.pydataset import augment_fn, augment_numpy

        if self._augment_fn is None:
            self._augment_fn = augment_fn(spec, opts)
        images, targets = augment_numpy(self._augment_fn, spec, opts, int(opts.seed), epoch, ids, images, targets)
        return expand_numpy(images, targets, spec, one_hot=opts.one_hot, normalize=False)

    def __getstate__(self) -> dict:
        return dict(self.__dict__, _augment_fn=None)


__all__ = ["GrainBatchMap", "GrainSource", "make_source"]
