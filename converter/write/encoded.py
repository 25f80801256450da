"""Encode a sample's arrays into the stored bytes of its image and mask, in the worker.

Runs after the transform (decode, fit, colour -> class) and before the shard encoder:
with ``--image-encoding png|jpeg|webp`` the image becomes PNG/JPEG/WebP bytes and the
mask a PNG class map (`readers.formats.encoding`); with ``raw`` the sample passes
through. Bytes already encoded (records copied out of an old shard of the same
dataset) pass through too, so a rewrite never re-encodes a JPEG (no generation loss).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from converter.options import OutputOptions
from readers.formats.encoder import SampleArrays
from readers.formats.encoding import encode_image, encode_mask


class SampleEncoding:
    """Callable: `SampleArrays` with arrays -> `SampleArrays` with the stored bytes."""

    def __init__(self, options: OutputOptions, ignore_index: int) -> None:
        self.codec = options.image_encoding.value
        self.quality = options.quality
        self.mask_codec = options.mask_codec
        self.ignore_index = ignore_index
        self.size = options.size

    @property
    def identity(self) -> bool:
        return self.codec == "raw" and self.mask_codec == "raw"

    def __call__(self, sample: SampleArrays) -> SampleArrays:
        if self.identity:
            return sample
        image, mask = sample.image, sample.mask
        if isinstance(image, np.ndarray):
            image = encode_image(image, self.codec, self.quality)
        if isinstance(mask, np.ndarray) and self.mask_codec == "png":
            mask = encode_mask(mask, self.ignore_index)
        return dataclasses.replace(sample, image=image, mask=mask, size=self.size)
