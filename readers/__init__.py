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

import importlib
from typing import Any

from readers import errors
from readers.errors import ShardError
from readers.manifest import Manifest, ManifestError

__all__ = ["Dataset", "Manifest", "ManifestError", "Record", "ResumableInput", "ShardError", "device", "errors",
           "mix", "open"]

# Imported on first use: the converter imports `readers.manifest` and `readers.formats`
# and should not pay for the reading engine (tens of ms per run).
_LAZY = {"Dataset": ("readers.dataset", "Dataset"), "open": ("readers.dataset", "open"),
         "Record": ("readers.formats.spec", "Record"), "device": ("readers.device", None),
         "ResumableInput": ("readers.resume", "ResumableInput"), "mix": ("readers.mix", "mix")}


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'readers' has no attribute {name!r}") from None
    value = importlib.import_module(module)
    if attr is not None:
        value = getattr(value, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
