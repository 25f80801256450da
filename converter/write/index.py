"""Write a shard's index file (`readers.index`) as safely as the shard itself.

`converter.fsutil.write_atomic`: temporary name (``.tmp-<name>-<pid>-<random>``, so
two attempts at one task never share it), write, flush, fsync, rename. The folder fsync that makes the rename
durable is the publish's (`converter.publish.publish_manifest`), once per run. The
name holds the start of the content's digest, so an index never changes under a
name a manifest lists; an unlisted one is a leftover the next run sweeps.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from converter.fsutil import write_atomic
from readers.index import CLASSES_FIELD, encode_index, encode_table, index_ref, read_index, table_samples
from readers.manifest import IndexRef, SampleEntry, ShardEntry


def write_index(out_dir: str, shard_file: str, samples: Sequence[SampleEntry],
                classes: np.ndarray | None = None) -> IndexRef:
    """Write the index of `shard_file` (record i = samples[i]; `classes`: (n, K) bool
    class presence per record, for repeat-factor sampling); returns the manifest's reference."""
    ref, data = encode_index(shard_file, samples, classes)
    write_atomic(os.path.join(out_dir, ref.file), data, sync_dir=False)
    return ref


def write_refreshed_index(out_dir: str, shard: ShardEntry, rows: dict[int, SampleEntry]) -> IndexRef:
    """A new index for `shard` whose records `rows` have new fingerprints (touched sources),
    patched in the loaded table: no per-sample objects for the rest of the shard."""
    table = read_index(out_dir, shard)
    for i, entry in rows.items():
        for side, fp in (("image", entry.image), ("mask", entry.mask)):
            path, digest = (fp.path, fp.digest) if fp is not None else ("", "")
            if (table[f"{side}_path"][i].decode("utf-8"), table[f"{side}_digest"][i].decode("utf-8")) != (path, digest):
                samples = table_samples(table)  # a path or digest changed (never for a touched file): rebuild
                for j, e in rows.items():
                    samples[j] = e
                kept = table[CLASSES_FIELD] if CLASSES_FIELD in table.dtype.names else None
                return write_index(out_dir, shard.file, samples, kept)
            table[f"{side}_size"][i] = fp.size if fp is not None else -1
            table[f"{side}_mtime_ns"][i] = fp.mtime_ns if fp is not None else 0
    data = encode_table(table)
    ref = index_ref(shard.file, data)
    write_atomic(os.path.join(out_dir, ref.file), data, sync_dir=False)
    return ref


def source_bytes(samples: Sequence[SampleEntry]) -> int:
    return sum(s.image.size + (s.mask.size if s.mask else 0) for s in samples)
