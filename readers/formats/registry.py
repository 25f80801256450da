"""The reader adapter of each `FileFormat`, in one plain dict.

Adding a format means adding one adapter module (a `FileAdapter` subclass) and one line
here.
"""

from __future__ import annotations

from readers.formats import FileFormat
from readers.formats.base import FileAdapter
from readers.formats.npz.reader import ADAPTER as NPZ_ADAPTER
from readers.formats.tfrecord.reader import ADAPTER as TFRECORD_ADAPTER

ADAPTERS: dict[FileFormat, FileAdapter] = {
    FileFormat.TFRECORD: TFRECORD_ADAPTER,
    FileFormat.NPZ: NPZ_ADAPTER,
}


def get_adapter(file_format: "str | FileFormat") -> FileAdapter:
    """The adapter for `file_format`; an unknown format raises ValueError listing the valid ones."""
    try:
        fmt = FileFormat.parse(file_format)
    except ValueError:
        fmt = None
    if fmt is None or fmt not in ADAPTERS:
        raise ValueError(
            f"Unknown shard format. Expected one of {[f.value for f in ADAPTERS]}. Received: {file_format!r}"
        )
    return ADAPTERS[fmt]


__all__ = ["ADAPTERS", "get_adapter"]
