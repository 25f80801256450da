"""Shard encoders keyed by `FileFormat`."""

from __future__ import annotations

from converter.write.base import ShardEncoder
from readers.formats.npz.writer import NpzEncoder
from readers.formats.tfrecord.writer import TFRecordEncoder
from readers.formats import FileFormat

ENCODERS: dict[FileFormat, type[ShardEncoder]] = {
    FileFormat.TFRECORD: TFRecordEncoder,
    FileFormat.NPZ: NpzEncoder,
}


def encoder_for(fmt: "FileFormat | str") -> type[ShardEncoder]:
    fmt = FileFormat.parse(fmt)
    try:
        return ENCODERS[fmt]
    except KeyError:
        raise ValueError(f"No encoder for format. Expected one of {[f.value for f in ENCODERS]}. Received: {fmt.value!r}") from None
