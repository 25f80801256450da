"""Pipeline 10: `keras_dataset` fed by Keras' own `PyDataset` adapter (issue 30).

`keras_epochs` iterates a `keras.utils.PyDataset` through the adapter `model.fit` builds
for it (`PyDatasetAdapter`: `on_epoch_begin`, the batches of `get_numpy_iterator`,
`on_epoch_end`), so the rows include Keras' own machinery: with workers, its
`OrderedEnqueuer`, a new thread or process pool every epoch and a 0.1 s wait when the
epoch ends. (The adapter is Keras-internal; where it moved, `PyDatasetThreads` stands in:
threads calling `__getitem__` in order, as the enqueuer does.)

Rows: `keras_dataset` compact and float32 + one-hot with 2 threads, and with 2 processes
(``use_multiprocessing=True``); the ceiling of Keras' machinery on this machine: an
in-memory `PyDataset` returning one ready float32 batch, with 2 threads and with 2
processes (all of its time is the feeding itself).
"""

from __future__ import annotations

import os
from multiprocessing.pool import ThreadPool
from typing import Any, Callable, Iterator

import numpy as np

from converter.bench.rounds import forever


class PyDatasetThreads:
    """Epochs of a PyDataset through `workers` threads, in order (see the module doc)."""

    def __init__(self, py_dataset: Any, workers: int, max_queue_size: int = 10):
        self.py_dataset = py_dataset
        self.workers = max(1, int(workers))
        self.ahead = max(1, int(max_queue_size))
        self._pool: ThreadPool | None = None

    def epoch(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        ds = self.py_dataset
        if self._pool is None:
            self._pool = ThreadPool(self.workers)
        pending = []
        for index in range(len(ds)):
            pending.append(self._pool.apply_async(ds.__getitem__, (index,)))
            if len(pending) >= self.ahead:
                yield pending.pop(0).get()
        for job in pending:
            yield job.get()
        ds.on_epoch_end()


def keras_epochs(py_dataset: Any) -> Callable[[], Iterator[Any]]:
    """A maker of one epoch's batches through Keras' `PyDatasetAdapter` (see the module doc)."""
    try:
        from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter
    except ImportError:  # pragma: no cover - Keras moved its adapter
        return PyDatasetThreads(py_dataset, py_dataset.workers).epoch
    adapter = PyDatasetAdapter(py_dataset)

    def epoch() -> Iterator[Any]:
        adapter.on_epoch_begin()
        try:
            yield from adapter.get_numpy_iterator()
        finally:
            adapter.on_epoch_end()

    return epoch


def ready_batches(x: np.ndarray, y: np.ndarray, batches: int, **kwargs: Any) -> Any:
    """A `keras.utils.PyDataset` returning (x, y) for each of `batches` indices (`kwargs`:
    workers, use_multiprocessing, max_queue_size)."""
    import keras

    class Ready(keras.utils.PyDataset):
        def __len__(self) -> int:
            return batches

        def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
            return x, y

    return Ready(**kwargs)


def keras_pipelines(opts: Any, ds: Any, split: str, shape: Any, io_of: Any) -> list:
    """Rows 10 (see the module doc)."""
    workers = os.cpu_count() or 1
    bs = opts.batch_size
    out = []
    for processes in (False, True):
        how = f"{workers} {'processes' if processes else 'threads'}"
        suffix = "_mp" if processes else ""
        note = "per CPU-s: parent only, not its workers" if processes else ""
        kw = dict(seed=opts.seed, workers=workers, use_multiprocessing=processes)
        compact = ds.keras_dataset(split, bs, one_hot=False, normalize=False, **kw)
        floats = ds.keras_dataset(split, bs, **kw)
        x, y = floats[0]
        ceiling = ready_batches(x.copy(), y.copy(), len(floats), workers=workers, use_multiprocessing=processes)
        out += [
            (io_of(f"p10_keras_compact{suffix}", f"10. keras_dataset, compact ({how})", "compact", note),
             forever(keras_epochs(compact))),
            (io_of(f"p10_keras_float32{suffix}", f"10. keras_dataset, float32 + one-hot ({how})", "float32", note),
             forever(keras_epochs(floats))),
            (io_of(f"p10_pydataset_ceiling{suffix}",
                   f"10. in-memory PyDataset, ready float32 batches ({how}; Keras' ceiling)", "float32", note),
             forever(keras_epochs(ceiling))),
        ]
    return out


__all__ = ["PyDatasetThreads", "keras_epochs", "keras_pipelines", "ready_batches"]
