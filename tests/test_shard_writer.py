"""The one shard writer: its digest is computed while writing, or by reading back when needed."""

from __future__ import annotations

import xxhash
from pathlib import Path

import numpy as np
import pytest

from converter.testing import synth
from converter.write.base import ShardWriter
from readers.formats.encoder import SampleArrays
from readers.formats.npz.writer import NpzEncoder
from readers.formats.tfrecord.writer import TFRecordEncoder


def _samples(n: int) -> list[SampleArrays]:
    rng = np.random.default_rng(4)
    return [SampleArrays(f"train/{i}.png", synth.textured_image(24, 32, rng),
                         rng.integers(0, 5, (24, 32), dtype=np.uint8), None) for i in range(n)]


@pytest.mark.parametrize("encoder,compression,hashed_while_writing", [
    (TFRecordEncoder, "none", True),
    (TFRecordEncoder, "gzip", True),
    (NpzEncoder, "none", False),  # zipfile seeks back to patch each member's header
    (NpzEncoder, "deflate", False),
])
def test_shard_digest_is_the_file_xxh3_whether_hashed_while_writing_or_read_back(
        tmp_path: Path, encoder, compression, hashed_while_writing) -> None:
    name = "train-00000" + encoder.suffix
    with ShardWriter(str(tmp_path), name, encoder, compression=compression, capacity=5) as w:
        for s in _samples(5):
            w.add(s)
    data = (tmp_path / name).read_bytes()
    assert w.result is not None and w.result.records == 5 and w.result.bytes == len(data)
    assert w.result.digest == "xxh3_128:" + xxhash.xxh3_128_hexdigest(data)
    assert (w._hashing.digest(len(data)) is not None) == hashed_while_writing
