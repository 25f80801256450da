"""Stage 2: decide what this run writes, before any pixel is decoded.

Given the discovered sources and the published manifest (if any), the planner sorts
every sample into: unchanged (skip), new (convert into new shards), changed or
deleted (keep, replace or prune, by the run options), and turns the work into
`ShardTask`s: whole shards that a worker writes by itself.

Shard arithmetic:

* new samples are ordered by ``sha256(seed:key)``, a seeded shuffle that does not
  depend on which other samples exist, so sequential reads are well mixed and the
  same inputs always give the same order;
* the size of a sample in bytes is known up front (the output shape is fixed), so a
  run of N samples gets ``ceil(N * sample_bytes / shard_size)`` shards, and at least
  `MIN_SHARDS` of them while each stays above `MIN_SHARD_BYTES`, so every core has a
  shard to write even on small runs. Samples are spread evenly (sizes differ by at
  most one). None of this depends on the number of workers: the output is the same
  bytes whatever `--workers` is;
* shard names are ``{split}-{index:05d}{suffix}`` with an index that only grows: a
  shard name is never reused, so a reader of the previous manifest never sees a file
  change under it.
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from converter.discover.annotations.base import annotation_state
from converter.discover.files import files_for
from converter.discover.layout import SourceSample
from converter.options import OnChange, OutputOptions, RunOptions
from converter.plan.fingerprint import combine_stats, files_match
from converter.plan.fptable import FingerprintTable, key_hashes, shard_table, stat_hash
from converter.plan.fptable import build as build_table
from converter.transform.colormap import mask_dtype_for
from readers.formats import SUFFIXES
from readers.index import table_samples
from readers.manifest import Manifest, SampleEntry, SourceFingerprint
from readers.tasks import task_kind

log = logging.getLogger(__name__)

MIN_SHARDS = 8
MIN_SHARD_BYTES = 16 << 20


class PlanError(ValueError):
    """The run cannot go ahead as asked (options differ, a source changed with --on-change fail)."""


@dataclass(frozen=True)
class CopyRecord:
    """Keep an already converted record: copied from its old shard, not re-decoded."""

    shard: str
    index: int
    key: str
    entry: SampleEntry | None = None  # its sources' fingerprints when they changed (a refreshed mtime)


@dataclass(frozen=True)
class ReplaceRecord:
    """Re-convert a changed source (--on-change replace); keep `old` if the new source is bad."""

    sample: SourceSample
    old: CopyRecord

    @property
    def key(self) -> str:
        return self.sample.key


@dataclass(frozen=True)
class ShardTask:
    split: str
    file: str
    items: tuple  # SourceSample (convert), CopyRecord (copy from an old shard) or ReplaceRecord
    replaces: tuple[str, ...] = ()  # old shard files this one supersedes

    @property
    def num_samples(self) -> int:
        return len(self.items)


@dataclass
class Plan:
    tasks: list[ShardTask] = field(default_factory=list)
    drop_shards: set[str] = field(default_factory=set)  # old shard files no longer listed after publish
    #: shard file -> record index -> its entry with a new mtime only (the shard's index is rewritten)
    refreshed: dict[str, dict[int, SampleEntry]] = field(default_factory=dict)
    new: int = 0
    replaced: int = 0
    pruned: int = 0
    unchanged: int = 0
    changed_kept: list[str] = field(default_factory=list)
    deleted_kept: list[str] = field(default_factory=list)
    next_index: dict[str, int] = field(default_factory=dict)  # per split, after this run
    sources: dict | None = None  # the manifest's record of scope and spec after this run (`converter.plan.scope`)

    @property
    def nothing_to_do(self) -> bool:
        return not self.tasks and not self.drop_shards and not self.refreshed


def order_key(seed: int, key: str) -> str:
    return hashlib.sha256(f"{seed}:{key}".encode("utf-8")).hexdigest()


#: Planning estimate of raw bytes per stored byte for each image encoding (measured on
#: photos: JPEG q90 stores 8x to 12x less than raw, PNG 1.5x to 2x, WebP 10x to 13x), and
#: for PNG masks (class maps compress 20x to 100x). Encoded sizes are only known after
#: encoding; the plan must be fixed before, so --shard-size is met on average.
ENCODED_SIZE_RATIO = {"raw": 1, "png": 2, "jpeg": 8, "webp": 10}
PNG_MASK_SIZE_RATIO = 20


def sample_bytes(options: OutputOptions, num_classes: int) -> int:
    """Estimated stored bytes per sample (raw sizes divided by `ENCODED_SIZE_RATIO` when encoded)."""
    h, w = options.size
    kind = options.image_kind  # channels and dtype of the stored kind (uint8 RGB: 3 bytes per pixel)
    pixel = (kind.channels or 3) * (2 if kind.dtype == "uint16" else 1)  # type: ignore[union-attr]
    image = h * w * pixel // ENCODED_SIZE_RATIO[options.image_encoding.value]
    itemsize = mask_dtype_for(num_classes).itemsize
    if options.mask_codec == "png" and options.task.value == "segmentation":
        return image + h * w * itemsize // PNG_MASK_SIZE_RATIO
    return image + task_kind(options.task).target_bytes(
        h, w, num_classes, onehot=options.mask_encoding.value == "onehot", itemsize=itemsize)


def shard_counts(n: int, per_sample: int, shard_size: int) -> list[int]:
    """Split n samples into evenly sized shards (see module docstring)."""
    if n <= 0:
        return []
    total = n * per_sample
    k = max(1, math.ceil(total / shard_size))
    k = max(k, min(MIN_SHARDS, total // MIN_SHARD_BYTES))
    k = min(k, n)
    base, extra = divmod(n, k)
    return [base + (1 if i < extra else 0) for i in range(k)]


def shard_name(split: str, index: int, suffix: str, run_id: str | None = None) -> str:
    """``train-00003.tfrecord``; with a run id (outputs in a bucket) ``train-00003-r1a2b3c4d.tfrecord``."""
    return f"{split}-{index:05d}{'' if run_id is None else f'-r{run_id}'}{suffix}"


def _compare(path: str | None, stat: tuple[int, int] | None, fp: SourceFingerprint | None,
             bands: tuple[str, ...] = ()) -> tuple[str, SourceFingerprint | None]:
    """'same' (stat equal), 'touched' (content equal, new mtime), or 'changed'.

    `stat`: (size, mtime_ns) from discovery's stat of `path` (taken now when None); `bands`: the
    other band files of a band-folder sample (compared together: `combine_stats`, `files_match`)."""
    if path is None or fp is None:
        return ("same", fp) if path is None and fp is None else ("changed", None)
    if stat is None:
        try:
            stat = combine_stats([files_for(p).stat(p) for p in (path, *bands)])
        except OSError:
            return "changed", None
    size, mtime_ns = stat
    if size == fp.size and mtime_ns == fp.mtime_ns:
        return "same", fp
    if size == fp.size and files_match((path, *bands), fp.digest):
        return "touched", SourceFingerprint(fp.path, fp.size, mtime_ns, fp.digest)
    return "changed", None


#: Discovered samples looked up in the fingerprint table per batch.
LOOKUP_BATCH = 1 << 13


def _batches(samples: Iterable[SourceSample]) -> Iterator[list[SourceSample]]:
    batch: list[SourceSample] = []
    for s in samples:
        batch.append(s)
        if len(batch) == LOOKUP_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def _lookup_batches(samples: Iterable[SourceSample]) -> Iterator[tuple[list[bytes], np.ndarray, Any, Any]]:
    """(keys as UTF-8, (n, 4) stats, split(s), row -> `SourceSample`) per batch of discovered samples;
    straight from discovery's compact blocks when it has them (`SampleList`), no sample built per row."""
    blocks = getattr(samples, "blocks", None)
    if blocks is not None and all(b.stats is not None for b in blocks):
        for block in blocks:
            yield from block.lookup_batches(LOOKUP_BATCH)
        return
    for batch in _batches(samples):
        yield [s.key.encode("utf-8") for s in batch], _stats(batch), [s.split for s in batch], batch.__getitem__


def _stats(batch: list[SourceSample]) -> np.ndarray:
    """(n, 4) int64: image size, mtime, mask size, mtime (-1, 0 without a mask); stat where discovery did not."""
    no_mask = (-1, 0)
    rows = [(s.image_stat or _stat_or_missing(s.image, s.bands or ()))
            + (s.annotation.stat if s.annotation is not None else no_mask if s.mask is None
               else (s.mask_stat or _stat_or_missing(s.mask))) for s in batch]
    return np.array(rows, np.int64).reshape(len(batch), 4)


def _stat_or_missing(path: str, bands: tuple[str, ...] = ()) -> tuple[int, int]:
    try:
        return combine_stats([files_for(p).stat(p) for p in (path, *bands)])
    except OSError:
        return (-2, 0)  # never equal to a converted file's size: compared exactly later


@dataclass
class _Sorting:
    """What the lookup found, shard by shard (only the samples that need more than a count)."""

    new_by_split: dict[str, list[SourceSample]] = field(default_factory=dict)
    suspects: dict[int, list[tuple[int, SourceSample]]] = field(default_factory=dict)  # shard id -> (record, sample)


def _sort_samples(samples: Iterable[SourceSample], table: FingerprintTable, plan: Plan) -> tuple[_Sorting, np.ndarray]:
    """Look every discovered sample up; returns the sorting and which table rows were seen."""
    sorting = _Sorting()
    seen = np.zeros(len(table), bool)
    split_ids: dict[str, int] = {}
    shard_split = np.array([split_ids.setdefault(split, len(split_ids)) for split, _ in table.shards] or [0], np.int32)
    for keys, stats, splits, sample_at in _lookup_batches(samples):
        pos, found = table.lookup(key_hashes(keys))
        if not len(table):
            for i in range(len(keys)):
                sample = sample_at(i)
                sorting.new_by_split.setdefault(sample.split, []).append(sample)
            continue
        ids = (split_ids.get(splits, -1) if isinstance(splits, str)
               else np.array([split_ids.get(s, -1) for s in splits]))
        moved = found & (shard_split[table.shard[pos]] != ids)
        if moved.any():
            i = int(np.flatnonzero(moved)[0])
            _moved(sample_at(i), table.shards[table.shard[pos[i]]][0])
        same = found & (table.stat_hash[pos] == stat_hash(stats[:, 0], stats[:, 1], stats[:, 2], stats[:, 3]))
        seen[pos[found]] = True
        for i in np.flatnonzero(~same):
            sample = sample_at(int(i))
            if not found[i]:
                sorting.new_by_split.setdefault(sample.split, []).append(sample)
                continue
            sid = int(table.shard[pos[i]])
            sorting.suspects.setdefault(sid, []).append((int(table.record[pos[i]]), sample))
        plan.unchanged += int(same.sum())
    return sorting, seen


def _moved(sample: SourceSample, split: str) -> None:
    raise PlanError(
        f"{sample.key} is in split {split!r} of the dataset but now sits in {sample.split!r}; "
        "moving samples between splits needs --rebuild."
    )


def _judge_suspects(sorting: _Sorting, table: FingerprintTable, root: str | None, run: RunOptions,
                    plan: Plan, replace_in: dict[str, dict[int, SourceSample]]) -> None:
    """Samples whose stats differ: exact comparison against their shard's index, one shard at a time."""
    for sid in sorted(sorting.suspects):
        split, shard = table.shards[sid]
        suspects = sorting.suspects[sid]
        rows = table_samples(shard_table(root, shard)[np.array([r for r, _ in suspects], np.int64)])  # these only
        for (record, sample), old in zip(suspects, rows):
            img_state, img_fp = _compare(sample.image, sample.image_stat, old.image, sample.bands or ())
            mask_state, mask_fp = (_compare(sample.mask, sample.mask_stat, old.mask) if sample.annotation is None
                                   else annotation_state(sample.annotation, old.mask))
            if "changed" in (img_state, mask_state):
                if run.on_change is OnChange.FAIL:
                    raise PlanError(
                        f"{sample.image}: source changed since it was converted (key {sample.key}); "
                        "--on-change fail stops here. Use --on-change replace to re-convert it, or keep (default)."
                    )
                if run.on_change is OnChange.REPLACE:
                    replace_in.setdefault(shard.file, {})[record] = sample
                    plan.replaced += 1
                else:
                    plan.changed_kept.append(sample.key)
                continue
            if "touched" in (img_state, mask_state):
                entry = SampleEntry(old.key, img_fp, mask_fp, old.label)  # type: ignore[arg-type]
                plan.refreshed.setdefault(shard.file, {})[record] = entry
            plan.unchanged += 1


def _deleted(table: FingerprintTable, seen: np.ndarray, root: str | None, run: RunOptions,
             plan: Plan, scope_splits: set[str] | None = None) -> dict[str, set[int]]:
    """Records whose source is gone: pruned (shard file -> record indices) or kept (warned).
    `scope_splits`: the splits the run looked at (None: all); records of other splits are not judged."""
    prune_in: dict[str, set[int]] = {}
    gone = np.flatnonzero(~seen)
    if scope_splits is not None and len(gone):
        inside = np.array([split in scope_splits for split, _ in table.shards] or [False], bool)
        gone = gone[inside[table.shard[gone]]]
    deleted: list[str] = []
    by_shard: dict[int, list[int]] = {}
    for row in gone:
        by_shard.setdefault(int(table.shard[row]), []).append(int(table.record[row]))
    for sid, records in sorted(by_shard.items()):
        shard = table.shards[sid][1]
        if run.prune:
            prune_in[shard.file] = set(records)
            plan.pruned += len(records)
        else:
            keys = shard_table(root, shard)["key"]
            deleted += [keys[r].decode("utf-8") for r in records]
    plan.deleted_kept = sorted(deleted)
    return prune_in


def make_plan(samples: Iterable[SourceSample], manifest: Manifest | None, options: OutputOptions,
              run: RunOptions, num_classes: int, next_index: dict[str, int] | None = None, *,
              root: str | None = None, run_id: str | None = None, scope_splits: set[str] | None = None) -> Plan:
    """Plan the shards of this run. `manifest` is the published one (None: first run or --rebuild);
    `root` is its folder (for the index files of a version-3 manifest); `run_id` goes into the
    new shards' names (`shard_name`; outputs in a bucket). `samples` may be a
    stream: it is consumed once, and only new or changed samples are kept."""
    plan = Plan()
    suffix = SUFFIXES[options.format]
    per_sample = sample_bytes(options, num_classes)
    next_index = dict(next_index or {})
    if manifest is not None:
        for split, entry in manifest.splits.items():
            next_index[split] = max(next_index.get(split, 0), entry.next_shard_index)
    try:
        table = build_table(manifest.iter_shards() if manifest is not None else (), root)
    except ValueError as e:
        raise PlanError(str(e)) from e
    sorting, seen = _sort_samples(samples, table, plan)
    replace_in: dict[str, dict[int, SourceSample]] = {}  # shard file -> record index -> new source
    _judge_suspects(sorting, table, root, run, plan, replace_in)
    prune_in = _deleted(table, seen, root, run, plan, scope_splits)
    del seen

    # Rewrites: one new shard per affected old shard, same record order.
    for split, shard in table.shards:
        repl = replace_in.get(shard.file, {})
        pruned = prune_in.get(shard.file, set())
        if not repl and not pruned:
            continue
        plan.drop_shards.add(shard.file)
        touched = plan.refreshed.pop(shard.file, {})  # the rewrite carries their new mtimes
        items = []
        for i, key in enumerate(k.decode("utf-8") for k in shard_table(root, shard)["key"].tolist()):
            if i in pruned:
                continue
            copy = CopyRecord(shard.file, i, key, touched.get(i))
            items.append(ReplaceRecord(repl[i], copy) if i in repl else copy)
        if items:
            name = shard_name(split, next_index.get(split, 0), suffix, run_id)
            next_index[split] = next_index.get(split, 0) + 1
            plan.tasks.append(ShardTask(split, name, tuple(items), (shard.file,)))

    for split in sorted(sorting.new_by_split):
        batch = sorted(sorting.new_by_split[split], key=lambda s: order_key(options.seed, s.key))
        plan.new += len(batch)
        start = 0
        for count in shard_counts(len(batch), per_sample, run.shard_size_bytes):
            name = shard_name(split, next_index.get(split, 0), suffix, run_id)
            next_index[split] = next_index.get(split, 0) + 1
            plan.tasks.append(ShardTask(split, name, tuple(batch[start:start + count])))
            start += count
    plan.next_index = next_index
    return plan


def refuse_damaged(where: str, manifest: Manifest, size_of: Callable[[str], int | None]) -> None:
    """`PlanError` unless every shard `manifest` lists has its size (`size_of(name)`: None when missing)."""
    damaged = []
    for _, shard in manifest.iter_shards():
        size = size_of(shard.file)
        if size is None:
            damaged.append(f"{shard.file}: missing")
        elif size != shard.bytes:
            damaged.append(f"{shard.file}: {size} bytes, the manifest says {shard.bytes}")
    if damaged:
        raise PlanError(
            f"The dataset in {where} is damaged, so this run will not add to it:\n  " + "\n  ".join(damaged[:20])
            + ("\n  ..." if len(damaged) > 20 else "")
            + "\nRun `imgshard verify OUT` for details, and re-run with --rebuild to convert everything again."
        )
