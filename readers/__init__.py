"""imgshard readers: feed converted shards to Keras / tf.data (or NumPy) training.

Importing this package needs only NumPy: TensorFlow and Keras are imported inside the
functions that build pipelines, and `readers.open(...).records(...)` never imports them.

    import readers
    ds = readers.open("out/")                      # checks every shard's size
    ds.splits                                      # {"train": 1200, "val": 300}
    for record in ds.records("val"):               # NumPy Records, no TensorFlow
        ...
    train = ds.tf_dataset("train", batch_size=16, seed=0)   # (x, y) for model.fit
    model.fit(train, epochs=10)

Compact mode (uint8 through the pipeline, expanded on the accelerator): see
`readers.device`.
"""

from __future__ import annotations

from readers import device, errors
from readers.dataset import Dataset, open
from readers.errors import ShardError
from readers.formats.base import Record
from readers.manifest import Manifest, ManifestError

__all__ = ["Dataset", "Manifest", "ManifestError", "Record", "ShardError", "device", "errors", "open"]
