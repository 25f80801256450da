"""A shard task on a worker that shares no filesystem with the driver (Dask, bucket output).

The worker makes its own scratch folder, downloads what a rewrite copies records from
(the published manifest, the old shards and their index files), runs the same
`run_shard_task` as every backend (the same bytes), puts the shard and its index file
into the bucket with one request each, and removes the scratch folder. Only the small
`ShardResult` goes back; the driver publishes the manifest once every task succeeded.

Shard names carry the run id, so a retried attempt of a task writes the same name with
the same bytes, and a late attempt of an earlier (failed) run can never overwrite a
shard a manifest lists.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Callable

from converter.bucket.output import copy_sources, download_missing, shard_files
from converter.plan.shards import ShardTask
from converter.run.task import ShardResult, WorkerContext, run_shard_task
from readers.manifest import MANIFEST_NAME, Manifest
from readers.storage import ObjectStore


@dataclass(frozen=True)
class BucketTarget:
    """Where a worker puts its shards (picklable: the store is rebuilt from its URL and options)."""

    store: ObjectStore
    scratch_dir: str | None = None  # None: the worker's temporary folder


def _fetch_copy_sources(store: ObjectStore, task: ShardTask, scratch: str) -> str | None:
    """The old manifest and the shards (with index files) `task` copies from; returns the manifest path."""
    names = copy_sources([task])
    if not names:
        return None
    path = os.path.join(scratch, MANIFEST_NAME)
    store.download(MANIFEST_NAME, path)
    listed = {s.file: s for _, s in Manifest.load(path).iter_shards()}
    download_missing(store, [f for name in names for f in (shard_files(listed[name]) if name in listed else [name])],
                     scratch)
    return path


def run_bucket_task(task: ShardTask, ctx: WorkerContext, target: BucketTarget,
                    progress: Callable[[int], None] | None = None) -> ShardResult:
    """Write `task`'s shard in a scratch folder and upload it with its index file (see the module docstring)."""
    scratch = tempfile.mkdtemp(prefix="imgshard-task-", dir=target.scratch_dir)
    try:
        manifest_path = _fetch_copy_sources(target.store, task, scratch)
        local = dataclasses.replace(ctx, out_dir=scratch, old_manifest_path=manifest_path)
        result = run_shard_task(task, local, progress)
        if result.entry is not None:
            for name in shard_files(result.entry):
                target.store.put_file(name, os.path.join(scratch, name))
        return result
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
