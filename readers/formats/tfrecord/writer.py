"""TFRecord shard encoder: one `tf.train.Example` per sample, written without TensorFlow.

The bytes equal what `tf.io.TFRecordWriter` writes for
``tf.train.Example(...).SerializeToString(deterministic=True)`` (tests prove it), so a
worker never pays TensorFlow's import time and memory.
"""

from __future__ import annotations

from typing import IO

import numpy as np

from readers.formats.encoder import SampleArrays, ShardEncoder
from readers.formats import (
    FEATURE_HEIGHT,
    FEATURE_IMAGE,
    FEATURE_KEY,
    FEATURE_LABEL,
    FEATURE_MASK,
    FEATURE_WIDTH,
    SUFFIXES,
    FileFormat,
)
from readers.formats.tfrecord.wire import TFRecordWriter, encode_example


def _little_endian(image):
    """Stored bytes are little-endian (uint16 images); encoded bytes pass through."""
    if isinstance(image, np.ndarray) and image.dtype.byteorder == ">":
        return np.ascontiguousarray(image.astype(image.dtype.newbyteorder("<")))
    return image


class TFRecordEncoder(ShardEncoder):
    suffix = SUFFIXES[FileFormat.TFRECORD]

    def __init__(self, fileobj: IO[bytes], *, compression: str, capacity: int) -> None:
        super().__init__(fileobj, compression=compression, capacity=capacity)
        self._writer = TFRecordWriter(fileobj, compression)

    def add(self, sample: SampleArrays) -> None:
        h, w = sample.size if sample.size is not None else sample.image.shape[:2]  # type: ignore[union-attr]
        features = {
            FEATURE_IMAGE: memoryview(_little_endian(sample.image)).cast("B"),
            FEATURE_HEIGHT: int(h),
            FEATURE_WIDTH: int(w),
            FEATURE_KEY: sample.key,
        }
        if sample.mask is not None:
            features[FEATURE_MASK] = memoryview(sample.mask).cast("B")
        if sample.label is not None:
            features[FEATURE_LABEL] = int(sample.label)
        self._writer.write(encode_example(features))

    def finish(self) -> None:
        self._writer.close()
