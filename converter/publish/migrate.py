"""Migrate a dataset of manifest version 1 or 2 to version 3, in place and atomically.

Versions 1 and 2 list every sample inline in ``imgshard.json``; version 3 keeps that
per-sample data in one index file per shard (`readers.index`). The first run of this
imgshard on an old dataset (`convert` or `compact`, holding the output lock) calls
`migrate`:

1. each shard's index file is written from the old manifest's samples (temporary name,
   fsync, rename; `converter.write.index`): unlisted files until step 2;
2. the version-3 manifest is published like any other (folder fsync, temporary file,
   fsync, rename over ``imgshard.json``, folder fsync).

Before step 1, each shard's records are read and their keys compared with the old
manifest's inline samples, as version-2 readers did on every read: a damaged inline key
(one flipped bit) would otherwise become the index file's truth, and the next run would
convert that source again as new (a duplicated record). A disagreement stops the
migration with `MigrationError`, naming the shard, the record and both keys; nothing is
written.

A kill before the rename in step 2 leaves the version-2 dataset as it was (plus
unlisted index files the next run sweeps, before migrating again); a kill after it
leaves the version-3 dataset. Shard files are not touched: their bytes and digests
(sha256 for version 1) stay. Readers of the old manifest are not disturbed.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from converter import __version__
from converter.publish.manifest import publish_manifest, utc_now
from converter.write.index import source_bytes, write_index
from readers.manifest import HISTORY_LIMIT, MANIFEST_VERSION, Manifest, ShardEntry, SplitEntry

log = logging.getLogger(__name__)


class MigrationError(ValueError):
    """An old manifest's inline samples disagree with its shards' records: nothing was migrated."""


def check_inline_samples(out_dir: str, manifest: Manifest, shard: ShardEntry, *, shown: str | None = None) -> None:
    """`MigrationError` unless the records of `shard` (a file in `out_dir`) carry exactly the keys
    its inline samples list, in order. `shown`: the shard's name in the error (default: its path;
    a bucket's object URL where the file is a downloaded copy)."""
    from readers.formats.registry import get_adapter
    from readers.formats.spec import RecordSpec, ShardRef

    path = os.path.join(out_dir, shard.file)
    listed = [s.key for s in shard.samples]
    stored = [r.key for r in get_adapter(manifest.format).iter_stored(ShardRef(path, shard, 0),
                                                                      RecordSpec.from_manifest(manifest))]
    if stored == listed:
        return
    at = next((i for i, (a, b) in enumerate(zip(stored, listed)) if a != b), min(len(stored), len(listed)))
    what = (f"record {at} has key {stored[at]!r}, the manifest lists {listed[at]!r}" if at < min(len(stored), len(listed))
            else f"it holds {len(stored)} records, the manifest lists {len(listed)} samples")
    raise MigrationError(
        f"{shown or path}: {what}, so the version-{manifest.version} manifest cannot be migrated to version "
        f"{MANIFEST_VERSION} (its inline samples are damaged). Nothing was written. Restore imgshard.json from a "
        "backup, or re-convert with `imgshard convert SRC OUT --rebuild`."
    )


def migrated(out_dir: str, manifest: Manifest, *, check_records: bool = True) -> Manifest:
    """The version-3 manifest of `manifest`, its index files written into `out_dir` (not published).
    `MigrationError` (nothing written) when an inline sample disagrees with its shard's records
    (`check_records`: False where the shard files are not in `out_dir`, a bucket's staging folder:
    `BucketOutput` checks them itself, one downloaded shard at a time)."""
    for _, shard in manifest.iter_shards():
        if shard.index is None and check_records:
            check_inline_samples(out_dir, manifest, shard)
    splits = {}
    for name, entry in manifest.splits.items():
        shards = []
        for shard in entry.shards:
            if shard.index is None:
                shard = dataclasses.replace(shard, index=write_index(out_dir, shard.file, shard.samples),
                                            source_bytes=source_bytes(shard.samples), samples=())
            shards.append(shard)
        splits[name] = SplitEntry(tuple(shards), entry.next_shard_index)
    line = {"time": utc_now(), "migrated_from": manifest.version, "migrated_to": MANIFEST_VERSION,
            "added": 0, "replaced": 0, "pruned": 0, "samples": sum(e.num_samples for e in splits.values()),
            "tool_version": __version__}
    history = (tuple(manifest.history) + (line,))[-HISTORY_LIMIT:]
    return manifest.replace(splits=splits, history=history, version=MANIFEST_VERSION)


def migrate(out_dir: str, manifest: Manifest) -> Manifest:
    """Write the index files and publish the version-3 manifest (see the module docstring)."""
    new = migrated(out_dir, manifest)
    publish_manifest(out_dir, new)
    log.info("migrated %s from manifest version %s to %s (%d shards)", out_dir, manifest.version,
             MANIFEST_VERSION, sum(len(e.shards) for e in new.splits.values()))
    return new
