"""The writer side every format shares: what an encoder receives (`SampleArrays`) and
the encoder base (`ShardEncoder`). Encoders only turn samples into bytes; the one shard
writer (`converter.write.base.ShardWriter`) owns temporary names, fsync, rename and
checksums. NumPy only: the converter's workers import this, never TensorFlow.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import IO

import numpy as np


@dataclass(frozen=True)
class SampleArrays:
    """What an encoder receives for one sample (arrays, or the stored bytes when the
    dataset's images are encoded: see `converter.write.encoded`)."""

    key: str
    image: np.ndarray | bytes  # (H, W, 3) uint8, or PNG/JPEG/WebP bytes
    mask: np.ndarray | bytes | None  # class map or one-hot planes, or PNG bytes
    label: int | None
    size: tuple[int, int] | None = None  # (height, width) of an encoded image; None: image.shape


class ShardEncoder(abc.ABC):
    """Turns samples into one shard's bytes. Subclasses: one per format."""

    suffix: str = ""

    def __init__(self, fileobj: IO[bytes], *, compression: str, capacity: int) -> None:
        self.fileobj = fileobj
        self.compression = compression
        self.capacity = capacity  # planned number of samples (an upper bound)

    @abc.abstractmethod
    def add(self, sample: SampleArrays) -> None:
        """Encode one sample."""

    @abc.abstractmethod
    def finish(self) -> None:
        """Write whatever is buffered; do not close `fileobj`."""


__all__ = ["SampleArrays", "ShardEncoder"]
