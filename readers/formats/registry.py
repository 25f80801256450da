"""The one registry of shard formats: per `FileFormat`, its reader adapter and its shard
encoder, both from the format's own folder (`readers/formats/<format>/`). The converter,
the readers and `imgshard verify` all look formats up here.

Adding a format means adding one folder (a `FileAdapter` in `reader.py`, a
`ShardEncoder` in `writer.py`) and one line in each dict below. Nothing here imports
TensorFlow: the converter's workers use `encoder_for`.
"""

from __future__ import annotations

from readers.formats import FileFormat
from readers.formats.base import FileAdapter
from readers.formats.encoder import ShardEncoder
from readers.formats.npz.reader import ADAPTER as NPZ_ADAPTER
from readers.formats.npz.writer import NpzEncoder
from readers.formats.tfrecord.reader import ADAPTER as TFRECORD_ADAPTER
from readers.formats.tfrecord.writer import TFRecordEncoder

ADAPTERS: dict[FileFormat, FileAdapter] = {
    FileFormat.TFRECORD: TFRECORD_ADAPTER,
    FileFormat.NPZ: NPZ_ADAPTER,
}

ENCODERS: dict[FileFormat, type[ShardEncoder]] = {
    FileFormat.TFRECORD: TFRecordEncoder,
    FileFormat.NPZ: NpzEncoder,
}


def _registered(file_format: "str | FileFormat", table: dict, what: str) -> FileFormat:
    try:
        fmt = FileFormat.parse(file_format)
    except ValueError:
        fmt = None
    if fmt is None or fmt not in table:
        raise ValueError(f"Unknown shard format{what}. Expected one of {[f.value for f in table]}. "
                         f"Received: {file_format!r}")
    return fmt


def get_adapter(file_format: "str | FileFormat") -> FileAdapter:
    """The adapter for `file_format`; an unknown format raises ValueError listing the valid ones."""
    return ADAPTERS[_registered(file_format, ADAPTERS, "")]


def encoder_for(file_format: "str | FileFormat") -> type[ShardEncoder]:
    """The shard encoder class for `file_format`; an unknown format raises ValueError."""
    return ENCODERS[_registered(file_format, ENCODERS, " (no encoder)")]


__all__ = ["ADAPTERS", "ENCODERS", "encoder_for", "get_adapter"]
