"""Pipeline 10: `keras_dataset` fed the way Keras feeds a `PyDataset` (issue 30).

`PyDatasetThreads` iterates a `keras.utils.PyDataset` as Keras' ordered enqueuer does
with ``use_multiprocessing=False``: `workers` threads call `__getitem__`, batches come
back in order with at most `max_queue_size` in flight, `on_epoch_end` after each epoch
(public API only; Keras' enqueuer is private). Rows: `keras_dataset` compact and
float32 + one-hot, and an in-memory `PyDataset` that returns one ready batch (the
ceiling of this feeder on this machine: all of its time is the feeding itself).
"""

from __future__ import annotations

import os
from multiprocessing.pool import ThreadPool
from typing import Any, Iterator

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


def ready_batches(x: np.ndarray, y: np.ndarray, batches: int) -> Any:
    """A `keras.utils.PyDataset` returning (x, y) for each of `batches` indices."""
    import keras

    class Ready(keras.utils.PyDataset):
        def __len__(self) -> int:
            return batches

        def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
            return x, y

    return Ready()


def keras_pipelines(opts: Any, ds: Any, split: str, shape: Any, io_of: Any) -> list:
    """Rows 10: keras_dataset compact / float32 through `PyDatasetThreads`, and its ceiling."""
    workers = os.cpu_count() or 1
    bs = opts.batch_size
    compact = ds.keras_dataset(split, bs, seed=opts.seed, one_hot=False, normalize=False)
    floats = ds.keras_dataset(split, bs, seed=opts.seed)
    x, y = floats[0]
    ceiling = ready_batches(x.copy(), y.copy(), len(floats))
    feed = f"{workers} threads, in order"
    return [
        (io_of("p10_keras_compact", f"10. keras_dataset, compact ({feed})", "compact"),
         forever(PyDatasetThreads(compact, workers).epoch)),
        (io_of("p10_keras_float32", f"10. keras_dataset, float32 + one-hot ({feed})", "float32"),
         forever(PyDatasetThreads(floats, workers).epoch)),
        (io_of("p10_pydataset_ceiling", "10. in-memory PyDataset, ready float32 batches (ceiling)",
               "float32"), forever(PyDatasetThreads(ceiling, workers).epoch)),
    ]


__all__ = ["PyDatasetThreads", "keras_pipelines", "ready_batches"]
