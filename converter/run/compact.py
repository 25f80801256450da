"""`imgshard compact OUT`: re-pack the small shards that nightly runs leave into full ones.

Every incremental run puts its new samples into new shards sized by that night's
volume, so a split collects many small shards. Compaction groups a split's small
shards (in shard order) into shards of about `target_shard_size` bytes (uncompressed,
as `--shard-size`) and writes each group as one new shard by copying the records
(the records are read and re-encoded; no source is read, nothing is decoded again), with
its index file. The new manifest lists the new shards instead of the old ones and is
published like any run's (temporary file, fsync, rename); only then are the old shards
and their index files deleted.

Safety is the convert run's: the output lock, the orphan wait and the sweep of an
earlier crash's leftovers first; new shards get names never used before
(`next_shard_index` only grows); a kill at any moment leaves the previous manifest
(with its shards) or the new one; every key stays exactly once because the records of
the old shards are copied whole and the old shards leave the manifest in the same
rename. A version-1/2 dataset is migrated first.

Shards are "small" when their uncompressed size is under half the target. Groups of
one shard are left alone (nothing to gain).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable

from converter import __version__
from converter.convert import OutputWriteError, check_shards_present, cleanup_quietly
from converter.fsutil import remove_files
from converter.options import DEFAULT_MAX_PIXELS, DEFAULT_SHARD_SIZE_BYTES, OutputOptions
from converter.plan.names import refuse_taken_names
from converter.plan.shards import CopyRecord, ShardTask, sample_bytes, shard_name
from converter.publish.manifest import publish_manifest, sweep_leftovers, utc_now
from converter.publish.migrate import migrate
from converter.publish.tfds import sync_tfds_metadata
from converter.run.execute import local_start, run_tasks
from converter.run.lock import OutputLock, wait_for_orphans
from converter.run.task import ShardResult, WorkerContext
from readers.formats import SUFFIXES, FileFormat
from readers.index import shard_keys
from readers.manifest import HISTORY_LIMIT, MANIFEST_NAME, Manifest, ShardEntry, SplitEntry

log = logging.getLogger(__name__)

#: A shard under this share of the target size is worth merging.
SMALL_FRACTION = 0.5


@dataclass
class CompactResult:
    out_dir: str
    manifest: Manifest | None
    tasks: list[ShardTask] = field(default_factory=list)
    written: list[ShardEntry] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def published(self) -> bool:
        return bool(self.written)


def plan_groups(shards: tuple[ShardEntry, ...], per_sample: int, target: int) -> list[list[ShardEntry]]:
    """Runs of consecutive small shards packed greedily up to `target` bytes; only groups of 2 or more."""
    groups: list[list[ShardEntry]] = []
    current: list[ShardEntry] = []
    size = 0
    for shard in sorted(shards, key=lambda s: s.file):
        nbytes = shard.records * per_sample
        if nbytes >= target * SMALL_FRACTION or (current and size + nbytes > target):
            if len(current) > 1:
                groups.append(current)
            current, size = [], 0
            if nbytes >= target * SMALL_FRACTION:
                continue
        current.append(shard)
        size += nbytes
    if len(current) > 1:
        groups.append(current)
    return groups


def plan_compaction(out_dir: str, manifest: Manifest, options: OutputOptions,
                    target: int) -> tuple[list[ShardTask], dict[str, int]]:
    """The shard tasks that merge each split's small shards, and each split's next shard index."""
    per_sample = sample_bytes(options, manifest.num_classes)
    suffix = SUFFIXES[FileFormat.parse(manifest.format)]
    tasks, next_index = [], {name: e.next_shard_index for name, e in manifest.splits.items()}
    for split in sorted(manifest.splits):
        for group in plan_groups(manifest.splits[split].shards, per_sample, target):
            items = tuple(CopyRecord(s.file, i, key) for s in group for i, key in enumerate(shard_keys(out_dir, s)))
            tasks.append(ShardTask(split, shard_name(split, next_index[split], suffix), items,
                                   tuple(s.file for s in group)))
            next_index[split] += 1
    return tasks, next_index


def compact(out_dir: str, target_shard_size: int = DEFAULT_SHARD_SIZE_BYTES, *, workers: int = 0,
            on_progress: Callable[[int], None] | None = None) -> CompactResult:
    """Compact the dataset in `out_dir` (see the module docstring). Returns what was done."""
    if not isinstance(target_shard_size, int) or target_shard_size < 1:
        raise ValueError(f"--target-shard-size must be a positive size. Received: {target_shard_size!r}")
    t0 = time.perf_counter()
    out_dir = os.path.abspath(out_dir)
    if not os.path.exists(os.path.join(out_dir, MANIFEST_NAME)):
        raise FileNotFoundError(f"No imgshard dataset at {out_dir}: {MANIFEST_NAME} not found. "
                                "Pass the folder `imgshard convert` wrote.")
    with OutputLock(out_dir):
        result = _compact_locked(out_dir, target_shard_size, workers or (os.cpu_count() or 1), on_progress)
    result.seconds = time.perf_counter() - t0
    return result


def _compact_locked(out_dir: str, target: int, workers: int, on_progress) -> CompactResult:
    old = Manifest.load(out_dir)
    sync_tfds_metadata(out_dir, old)
    wait_for_orphans(out_dir)
    sweep_leftovers(out_dir, old)
    check_shards_present(out_dir, old)
    if not old.indexed:
        old = migrate(out_dir, old)
    options = OutputOptions.from_json(old.options)
    tasks, next_index = plan_compaction(out_dir, old, options, target)
    refuse_taken_names(out_dir, old, [t.file for t in tasks])  # a merged shard never takes a merged one's name
    result = CompactResult(out_dir, old, tasks)
    if not tasks:
        return result
    ctx = WorkerContext(out_dir, options, old.classes, out_dir, DEFAULT_MAX_PIXELS,
                        os.path.join(out_dir, MANIFEST_NAME), owner_pid=os.getpid())
    results: list[ShardResult] = []
    try:
        results = list(run_tasks(tasks, ctx, workers=workers, on_progress=on_progress,
                                 start=local_start(workers, len(tasks))))
    except BaseException as e:
        cleanup_quietly(out_dir, [t.file for t in tasks], old)
        if isinstance(e, OSError):
            raise OutputWriteError(e.errno, f"Writing shards to {out_dir} failed: {e.strerror or e}. Nothing was "
                                   "published; the previous dataset is intact.") from e
        raise
    bad = [b for r in results for b in r.bad]
    if bad or any(r.entry is None or r.entry.records != len(t.items) for r, t in zip(_by_task(results, tasks), tasks)):
        cleanup_quietly(out_dir, [t.file for t in tasks], old)
        raise ValueError(f"Compacting {out_dir} could not copy every record ({bad[:3]}); nothing was published. "
                         "Run `imgshard verify OUT --deep`.")
    manifest = _assemble(old, results, tasks, next_index)
    try:
        sync_tfds_metadata(out_dir, manifest)
        publish_manifest(out_dir, manifest)
    except OSError as e:
        sync_tfds_metadata(out_dir, old)
        cleanup_quietly(out_dir, [t.file for t in tasks], old)
        raise OutputWriteError(e.errno or errno.EIO, f"Publishing {MANIFEST_NAME} in {out_dir} failed: "
                               f"{e.strerror or e}. The previous dataset is intact.") from e
    dropped = sorted(f for t in tasks for f in t.replaces)
    dropped_set = set(dropped)
    stale = sorted(s.index.file for _, s in old.iter_shards() if s.file in dropped_set and s.index is not None)
    remove_files(out_dir, dropped + stale)
    result.manifest, result.dropped = manifest, dropped
    result.written = sorted((r.entry for r in results if r.entry is not None), key=lambda e: e.file)
    return result


def _by_task(results: list[ShardResult], tasks: list[ShardTask]) -> list[ShardResult]:
    """Results in the order of `tasks` (workers finish in any order)."""
    by_file = {r.entry.file: r for r in results if r.entry is not None}
    missing = ShardResult("", None, ())
    return [by_file.get(t.file, missing) for t in tasks]


def _assemble(old: Manifest, results: list[ShardResult], tasks: list[ShardTask],
              next_index: dict[str, int]) -> Manifest:
    replaced = {f for t in tasks for f in t.replaces}
    written = {t.split: [] for t in tasks}  # type: dict[str, list[ShardEntry]]
    split_of = {t.file: t.split for t in tasks}
    for r in results:
        written[split_of[r.entry.file]].append(r.entry)  # type: ignore[union-attr]
    splits = {}
    for name, entry in old.splits.items():
        kept = [s for s in entry.shards if s.file not in replaced] + written.get(name, [])
        splits[name] = SplitEntry(tuple(sorted(kept, key=lambda s: s.file)), next_index[name])
    samples = sum(e.num_samples for e in splits.values())
    line = {"time": utc_now(), "added": 0, "replaced": 0, "pruned": 0, "samples": samples,
            "compacted": len(replaced), "into": len(results), "tool_version": __version__}
    return old.replace(splits=splits, history=(tuple(old.history) + (line,))[-HISTORY_LIMIT:])


__all__ = ["CompactResult", "compact", "plan_compaction", "plan_groups"]
