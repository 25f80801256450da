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
import os
from dataclasses import dataclass, field

from converter.discover.layout import SourceSample
from converter.plan.fingerprint import content_matches
from converter.options import OnChange, OutputOptions, RunOptions
from converter.transform.colormap import mask_dtype_for
from readers.formats import SUFFIXES
from readers.manifest import Manifest, SampleEntry, ShardEntry, SourceFingerprint
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
    refreshed: dict[str, SampleEntry] = field(default_factory=dict)  # key -> entry with a new mtime only
    new: int = 0
    replaced: int = 0
    pruned: int = 0
    unchanged: int = 0
    changed_kept: list[str] = field(default_factory=list)
    deleted_kept: list[str] = field(default_factory=list)
    next_index: dict[str, int] = field(default_factory=dict)  # per split, after this run

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
    image = h * w * 3 // ENCODED_SIZE_RATIO[options.image_encoding.value]
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


def shard_name(split: str, index: int, suffix: str) -> str:
    return f"{split}-{index:05d}{suffix}"


def _compare(path: str | None, fp: SourceFingerprint | None) -> tuple[str, SourceFingerprint | None]:
    """'same' (stat equal), 'touched' (content equal, new mtime), or 'changed'."""
    if path is None or fp is None:
        return ("same", fp) if path is None and fp is None else ("changed", None)
    try:
        st = os.stat(path)
    except OSError:
        return "changed", None
    if st.st_size == fp.size and st.st_mtime_ns == fp.mtime_ns:
        return "same", fp
    if st.st_size == fp.size and content_matches(path, fp.digest):
        return "touched", SourceFingerprint(fp.path, fp.size, st.st_mtime_ns, fp.digest)
    return "changed", None


def _diff_sources(samples, located: dict[str, tuple[str, ShardEntry, int]], run: RunOptions, plan: Plan
                  ) -> tuple[dict[str, list[SourceSample]], dict[str, dict[int, SourceSample]], set[str]]:
    """Compare the sources with the records they became: (new samples per split, changed
    sources to re-convert per shard file and record index, every key seen). Counts go to `plan`."""
    new_by_split: dict[str, list[SourceSample]] = {}
    replace_in: dict[str, dict[int, SourceSample]] = {}  # shard file -> record index -> new source
    seen: set[str] = set()
    for sample in samples:
        seen.add(sample.key)
        where = located.get(sample.key)
        if where is None:
            new_by_split.setdefault(sample.split, []).append(sample)
            continue
        split, shard, idx = where
        if split != sample.split:
            raise PlanError(
                f"{sample.key} is in split {split!r} of the dataset but now sits in {sample.split!r}; "
                "moving samples between splits needs --rebuild."
            )
        old = shard.samples[idx]
        img_state, img_fp = _compare(sample.image, old.image)
        mask_state, mask_fp = _compare(sample.mask, old.mask)
        if "changed" in (img_state, mask_state):
            if run.on_change is OnChange.FAIL:
                raise PlanError(
                    f"{sample.image}: source changed since it was converted (key {sample.key}); "
                    "--on-change fail stops here. Use --on-change replace to re-convert it, or keep (default)."
                )
            if run.on_change is OnChange.REPLACE:
                replace_in.setdefault(shard.file, {})[idx] = sample
                plan.replaced += 1
            else:
                plan.changed_kept.append(sample.key)
            continue
        if "touched" in (img_state, mask_state):
            plan.refreshed[sample.key] = SampleEntry(old.key, img_fp, mask_fp, old.label)  # type: ignore[arg-type]
        plan.unchanged += 1
    return new_by_split, replace_in, seen


def _plan_rewrites(manifest: Manifest, replace_in: dict[str, dict[int, SourceSample]],
                   prune_in: dict[str, set[int]], next_index: dict[str, int], suffix: str, plan: Plan) -> None:
    """Rewrites: one new shard per affected old shard, same record order."""
    for split, shard in manifest.iter_shards():
        repl = replace_in.get(shard.file, {})
        pruned = prune_in.get(shard.file, set())
        if not repl and not pruned:
            continue
        plan.drop_shards.add(shard.file)
        items = []
        for i, s in enumerate(shard.samples):
            if i in pruned:
                continue
            copy = CopyRecord(shard.file, i, s.key)
            items.append(ReplaceRecord(repl[i], copy) if i in repl else copy)
        if items:
            name = shard_name(split, next_index.get(split, 0), suffix)
            next_index[split] = next_index.get(split, 0) + 1
            plan.tasks.append(ShardTask(split, name, tuple(items), (shard.file,)))


def make_plan(samples: list[SourceSample] | tuple[SourceSample, ...], manifest: Manifest | None,
              options: OutputOptions, run: RunOptions, num_classes: int,
              next_index: dict[str, int] | None = None) -> Plan:
    """Plan the shards of this run. `manifest` is the published one (None: first run or --rebuild)."""
    plan = Plan()
    suffix = SUFFIXES[options.format]
    per_sample = sample_bytes(options, num_classes)
    next_index = dict(next_index or {})
    if manifest is not None:
        for split, entry in manifest.splits.items():
            next_index[split] = max(next_index.get(split, 0), entry.next_shard_index)

    # Where every converted key lives now.
    located: dict[str, tuple[str, ShardEntry, int]] = {}
    if manifest is not None:
        for split, shard in manifest.iter_shards():
            for i, s in enumerate(shard.samples):
                located[s.key] = (split, shard, i)

    new_by_split, replace_in, seen = _diff_sources(samples, located, run, plan)

    prune_in: dict[str, set[int]] = {}
    for key, (split, shard, idx) in sorted(located.items()):
        if key in seen:
            continue
        if run.prune:
            prune_in.setdefault(shard.file, set()).add(idx)
            plan.pruned += 1
        else:
            plan.deleted_kept.append(key)

    if manifest is not None:
        _plan_rewrites(manifest, replace_in, prune_in, next_index, suffix, plan)

    for split in sorted(new_by_split):
        batch = sorted(new_by_split[split], key=lambda s: order_key(options.seed, s.key))
        plan.new += len(batch)
        start = 0
        for count in shard_counts(len(batch), per_sample, run.shard_size_bytes):
            name = shard_name(split, next_index.get(split, 0), suffix)
            next_index[split] = next_index.get(split, 0) + 1
            plan.tasks.append(ShardTask(split, name, tuple(batch[start:start + count])))
            start += count
    plan.next_index = next_index
    return plan
