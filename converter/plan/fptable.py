"""The planner's compact view of a published dataset: key -> (stat fingerprint, location).

An incremental run must tell, for every discovered source, whether the dataset has
its key and whether the file looks the same as when it was converted. Per sample this
table holds 32 bytes in four NumPy arrays, sorted by key hash (320 MB for 10 million
samples, against about 1 KB per sample for a Python dict of dataclasses):

* ``key_hash`` (``S16``): xxh3-128 of the key's UTF-8 bytes (a collision between two
  keys has a chance of about 2**-128 per pair, the same bet as the content digests);
* ``stat_hash`` (``uint64``): a mix of the image's and mask's (size, mtime_ns); equal
  means "same as converted", different sends the sample to the exact comparison (with
  its shard's index file, and the content digest when only the mtime moved);
* ``shard`` / ``record`` (``int32``): where its record is.

It is built shard by shard from the index files (`readers.index`), one at a time, so
the per-sample data of the whole dataset is never in memory at once (measured: 34 MB
at the peak for 200,000 samples in 4 shards, most of it one shard's index being read). Discovered
samples are looked up in batches (`lookup`), vectorised with `numpy.searchsorted`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import xxhash

from readers.index import read_index
from readers.manifest import ShardEntry

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise on uint64 (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def stat_hash(image_size: np.ndarray, image_mtime: np.ndarray, mask_size: np.ndarray,
              mask_mtime: np.ndarray) -> np.ndarray:
    """uint64 per sample from its sources' stats (mask size -1 and mtime 0 when there is none)."""
    with np.errstate(over="ignore"):
        h = _mix(np.asarray(image_size, np.int64).view(np.uint64))
        for v in (image_mtime, mask_size, mask_mtime):
            h = _mix(h ^ np.asarray(v, np.int64).view(np.uint64))
    return h


def key_hashes(keys: Sequence[bytes]) -> np.ndarray:
    digest = xxhash.xxh3_128_digest
    return np.array([digest(k) for k in keys], dtype="S16")


@dataclass
class FingerprintTable:
    shards: list[tuple[str, ShardEntry]]  # (split, entry) by shard id
    key_hash: np.ndarray
    stat_hash: np.ndarray
    shard: np.ndarray
    record: np.ndarray

    def __len__(self) -> int:
        return len(self.key_hash)

    def lookup(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row of each hash in the table, whether it is there)."""
        if not len(self.key_hash):
            return np.zeros(len(hashes), np.int64), np.zeros(len(hashes), bool)
        pos = np.searchsorted(self.key_hash, hashes)
        pos = np.minimum(pos, len(self.key_hash) - 1)
        return pos, self.key_hash[pos] == hashes


def shard_table(root: str | None, entry: ShardEntry) -> np.ndarray:
    """The index rows of one shard: its index file (version 3) or its inline samples."""
    from readers.index import build_table

    if entry.index is None:
        return build_table(entry.samples)
    return read_index(root, entry)  # type: ignore[arg-type]


def build(listed: Iterable[tuple[str, ShardEntry]], root: str | None) -> FingerprintTable:
    """The table of every sample of the (split, shard) pairs `listed` (`Manifest.iter_shards()`),
    their index files read one shard at a time into preallocated arrays (the record counts
    are in the manifest), then sorted: at most about 56 bytes per sample at the peak."""
    shards = list(listed)
    n = sum(entry.records for _, entry in shards)
    kh, sh = np.empty(n, "S16"), np.empty(n, np.uint64)
    shard, record = np.empty(n, np.int32), np.empty(n, np.int32)
    at = 0
    for sid, (_, entry) in enumerate(shards):
        t = shard_table(root, entry)
        if len(t) != entry.records:
            raise ValueError(f"{entry.file}: its index lists {len(t)} records, the manifest {entry.records}; "
                             "the dataset is damaged. Run `imgshard verify OUT`, then re-convert with --rebuild.")
        end = at + len(t)
        kh[at:end] = key_hashes(t["key"].tolist())
        sh[at:end] = stat_hash(t["image_size"], t["image_mtime_ns"], t["mask_size"], t["mask_mtime_ns"])
        shard[at:end] = sid
        record[at:end] = np.arange(len(t), dtype=np.int32)
        at = end
        del t
    order = np.argsort(kh, kind="stable")
    kh = kh[order]
    sh = sh[order]
    shard = shard[order]
    record = record[order]
    del order
    table = FingerprintTable(shards, kh, sh, shard, record)
    dup = np.flatnonzero(table.key_hash[1:] == table.key_hash[:-1])
    if len(dup):
        a, b = shards[table.shard[dup[0]]][1].file, shards[table.shard[dup[0] + 1]][1].file
        raise ValueError(f"The dataset lists a key twice (records in {a} and {b}); it is damaged. "
                         "Run `imgshard verify OUT` to see the damage, then re-convert with --rebuild.")
    return table


__all__ = ["FingerprintTable", "build", "key_hashes", "shard_table", "stat_hash"]
