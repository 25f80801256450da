"""`readers.mix([ds_a, ds_b], weights=[0.7, 0.3])`: one stream drawn from several datasets
with the same classes and record layout, in given proportions.

Each epoch draws as many samples as the datasets hold together (N = sum of their sizes);
a sample of dataset d gets the weight ``w_d * N / n_d`` and the draws are made by the
repeat-factor machinery (`readers.sampling.epoch_counts`: systematic sampling, a fixed
epoch length), so dataset d supplies ``w_d`` of every epoch (to within a sample), small
datasets repeating and large ones subsampled. The stream is a pure function of
`(seed, epoch, step)` like every imgshard stream: `epoch`, `start_step` and
`readers.ResumableInput` resume it. Example::

    mixed = readers.mix([readers.open("cityscapes/"), readers.open("synthetic/")], weights=[0.7, 0.3])
    model.fit(mixed.tf_dataset("train", 8, seed=0), epochs=10)
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from readers.augment import check_augment, check_start_step, dataset_ids, sample_ids
from readers.formats.pipeline import PipelineOptions
from readers.sampling import epoch_length


def mix(datasets: Sequence[Any], weights: Sequence[float]) -> "MixedDataset":
    """Mix `datasets` (`readers.Dataset`s of one format, task, record layout and class
    list) in proportions `weights` (positive; normalised to sum 1)."""
    return MixedDataset(datasets, weights)


def _mixed_ids(groups: list, augment: Any) -> np.ndarray | None:
    """The augmentation draw id of every record of the mix, or None without `augment`: each key's
    id, with the dataset index mixed in for datasets after the first (`readers.augment.dataset_ids`),
    so datasets sharing keys do not share flips, crops and colours."""
    if augment is None:
        return None
    return np.concatenate([dataset_ids(sample_ids(refs), d) for d, refs in enumerate(groups)])


class MixedDataset:
    """Several datasets read as one, in fixed proportions (see `mix`)."""

    def __init__(self, datasets: Sequence[Any], weights: Sequence[float]):
        datasets, weights = list(datasets), list(weights)
        if len(datasets) < 1 or len(datasets) != len(weights):
            raise ValueError("datasets and weights must be non-empty lists of the same length. "
                             f"Received: {len(datasets)} datasets, {len(weights)} weights")
        if any(isinstance(w, bool) or not isinstance(w, (int, float, np.number)) or not w > 0 or math.isinf(w)
               for w in weights):
            raise ValueError(f"weights must be positive numbers. Received: weights={weights!r}")
        first = datasets[0]
        for i, ds in enumerate(datasets[1:], 1):
            if ds.pipeline_parts()[1] != first.pipeline_parts()[1] or ds.classes != first.classes:
                raise ValueError(f"datasets[{i}] ({ds.path}) must have the same format, task, image shape, "
                                 f"class list and mask layout as datasets[0] ({first.path}). Received: {ds!r}")
        self.datasets = datasets
        self.weights = np.asarray(weights, np.float64) / float(np.sum(weights))

    def _parts(self, split: str) -> tuple[Any, Any, list, np.ndarray]:
        """(adapter, spec, each dataset's shards in order, one draw weight per record)."""
        adapter, spec = self.datasets[0].pipeline_parts()
        groups = [ds.shards(split) for ds in self.datasets]
        sizes = [sum(r.records for r in refs) for refs in groups]
        if not all(sizes):
            raise ValueError(f"every dataset must hold samples in split {split!r}. Received: sizes {sizes}")
        total = sum(sizes)
        factors = np.concatenate([np.full(n, w * total / n) for n, w in zip(sizes, self.weights)])
        return adapter, spec, groups, factors

    def tf_dataset(self, split: str, batch_size: int, *, seed: int | None = None, one_hot: bool = True,
                   normalize: bool = True, drop_remainder: bool = False, shuffle_buffer: int | None = None,
                   augment: Any = None, epoch: int = 0, start_step: int = 0, repeat: bool = False,
                   resume: Any = None) -> Any:
        """The mixed stream as `Dataset.tf_dataset` gives one dataset's (same arguments)."""
        from readers.dataset import finish_pipeline, resumed_options

        adapter, spec, groups, factors = self._parts(split)
        shards = [ref for refs in groups for ref in refs]
        options = PipelineOptions(batch_size, seed=seed, one_hot=bool(one_hot), normalize=bool(normalize),
                                  drop_remainder=bool(drop_remainder), shuffle_buffer=shuffle_buffer,
                                  augment=check_augment(augment), epoch=epoch, start_step=start_step,
                                  repeat_factors=factors)
        draws = epoch_length(factors)
        batches = draws // options.batch_size if options.drop_remainder else math.ceil(draws / options.batch_size)
        check_start_step(options.start_step, batches)
        options = resumed_options(resume, options, batches, shards)
        ids = _mixed_ids(groups, options.augment)
        ds = adapter.tf_dataset(shards, spec, options, ids)
        return finish_pipeline(ds, options, batches, repeat=repeat, distributed=False, resumed=resume is not None)

    def keras_dataset(self, split: str, batch_size: int, *, seed: int | None = None, one_hot: bool = True,
                      normalize: bool = True, workers: int = 1, use_multiprocessing: bool = False,
                      max_queue_size: int = 10, augment: Any = None, epoch: int = 0, resume: Any = None) -> Any:
        """The mixed stream as `Dataset.keras_dataset` gives one dataset's (same arguments)."""
        from readers.dataset import resumed_options
        from readers.pydataset import batches_per_epoch, make_pydataset

        adapter, spec, groups, factors = self._parts(split)
        shards = [ref for refs in groups for ref in refs]
        options = PipelineOptions(batch_size, seed=seed, one_hot=bool(one_hot), normalize=bool(normalize),
                                  augment=check_augment(augment), epoch=epoch, repeat_factors=factors)
        options = resumed_options(resume, options, batches_per_epoch(epoch_length(factors), options),
                                  shards)
        ids = _mixed_ids(groups, options.augment)
        seq = make_pydataset([adapter.random_access(s, spec) for s in shards], [s.records for s in shards], spec,
                             options, workers=workers, use_multiprocessing=use_multiprocessing,
                             max_queue_size=max_queue_size, ids=ids)
        if resume is not None:
            resume.attach(seq)
        return seq


__all__ = ["MixedDataset", "mix"]
