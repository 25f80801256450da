"""Run one planned shard in a worker process: transform its samples, write the shard.

Only small metadata goes back to the parent (`ShardResult`): counts, sizes, hashes,
fingerprints, and the bad inputs met. Pixel arrays never cross a process boundary.
The worker keeps one `SampleTransformer` per option set (the colour lookup table is
built once per process, not once per shard).

A task of a local run holds `converter.run.lock.WorkerGuard` from start to rename: a
worker whose run was killed (SIGKILL leaves loky workers alive) writes nothing and
exits instead of renaming shards under the next run's feet.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from converter.discover.layout import BadInput, SourceSample
from converter.run.lock import OrphanedWorker, WorkerGuard
from converter.options import OutputOptions
from converter.plan.shards import CopyRecord, ReplaceRecord, ShardTask
from converter.publish.band_stats import BandSums
from converter.transform.decode import DecodeError
from converter.transform.sample import SampleTransformer, UnknownColorError
from converter.plan.fingerprint import algorithm_of, content_matches, digest_file
from converter.transform.colormap import ignore_index_for
from converter.write.base import ShardWriter
from converter.write.encoded import SampleEncoding
from converter.write.index import source_bytes, write_index
from readers.formats._allocator import tune_allocator
from readers.formats.encoder import SampleArrays
from readers.formats.registry import encoder_for
from readers.index import shard_samples
from readers.manifest import ClassInfo, Manifest, SampleEntry, ShardEntry, SourceFingerprint

if TYPE_CHECKING:  # pragma: no cover
    from converter.run.steal import TailShare, TaskTail


@dataclass(frozen=True)
class WorkerContext:
    """Everything a worker needs besides the task; small and picklable."""

    out_dir: str
    options: OutputOptions
    classes: tuple[ClassInfo, ...]
    source_base: str
    max_pixels: int
    old_manifest_path: str | None = None  # for CopyRecord items (rewrites)
    owner_pid: int | None = None  # the local run that started the workers; None: no orphan guard (Dask)
    source_options: tuple = ()  # storage options of sources in a bucket (`SourceSpec.storage_options`)


@dataclass
class ShardResult:
    split: str
    entry: ShardEntry | None  # None when every sample of the shard was bad
    replaces: tuple[str, ...]
    bad: list[BadInput] = field(default_factory=list)
    unknown_colors: dict[tuple[int, int, int], list[int]] = field(default_factory=dict)  # colour -> [pixels, files]
    seconds: float = 0.0
    added: int = 0  # records of new samples written
    replaced: int = 0  # re-converted records whose source content changed
    helped: int = 0  # samples of this shard that other workers converted (`converter.run.steal`)


_TRANSFORMERS: dict[Any, SampleTransformer] = {}


def _transformer(ctx: WorkerContext) -> SampleTransformer:
    key = (ctx.options, ctx.classes, ctx.source_base, ctx.max_pixels, ctx.source_options)
    t = _TRANSFORMERS.get(key)
    if t is None:
        tune_allocator()  # once per process: per-sample arrays reuse warm pages instead of faulting
        _TRANSFORMERS.clear()
        t = _TRANSFORMERS[key] = SampleTransformer(ctx.options, ctx.classes, ctx.source_base, ctx.max_pixels,
                                                          ctx.source_options)
    return t


def warm_up(ctx: WorkerContext) -> None:
    """Build this process's transformer and colour table now (before forking workers).

    Forked workers then share the colour table copy-on-write (they only read it); it
    costs next to nothing to build (see `ColorMap.inverted_lut`).
    """
    transform = _transformer(ctx)
    if transform.semantics is not None:
        transform.semantics.warm_up()


def _old_layout(ctx: WorkerContext) -> tuple[Any, Any]:
    """The old manifest and its record layout (read once per task)."""
    from readers.formats.spec import RecordSpec

    manifest = Manifest.load(ctx.old_manifest_path)  # type: ignore[arg-type]
    return manifest, RecordSpec.from_manifest(manifest)


def _old_records(ctx: WorkerContext, layout: tuple[Any, Any],
                 shard_file: str) -> tuple[dict[int, Any], list[SampleEntry], Any]:
    """Records of an old shard as stored (encoded bytes stay encoded), by index (read once
    per task), its samples from its index file, and its record layout."""
    from readers.formats.spec import ShardRef
    from readers.formats.registry import get_adapter

    manifest, spec = layout
    entry = _old_entry(manifest, shard_file)
    path = os.path.join(ctx.out_dir, shard_file)
    digest = digest_file(path, algorithm_of(entry.digest))
    if digest != entry.digest:
        raise ValueError(
            f"{path}: cannot copy records out of it, its digest differs from the manifest's (the shard is damaged). "
            "Run `imgshard verify OUT` to see the damage, then re-convert with --rebuild."
        )
    ref = ShardRef(path, entry, 0)
    return (dict(enumerate(get_adapter(manifest.format).iter_stored(ref, spec))), shard_samples(ctx.out_dir, entry),
            spec)


def _old_entry(manifest: Manifest, shard_file: str) -> ShardEntry:
    return next(s for _, s in manifest.iter_shards() if s.file == shard_file)


def _old_samples(ctx: WorkerContext, copies: dict, shard_file: str) -> list[SampleEntry]:
    """The samples of an old shard, from its index file alone (a replaced record needs its old
    entry, not the shard's records: those are read and hashed only when records are copied)."""
    if shard_file in copies:
        return copies[shard_file][1]
    key = ("samples", shard_file)
    if key not in copies:
        if None not in copies:
            copies[None] = _old_layout(ctx)
        copies[key] = shard_samples(ctx.out_dir, _old_entry(copies[None][0], shard_file))
    return copies[key]


def _stored_mask(rec: Any, spec: Any) -> Any:
    """A copied record's mask as an array (decoded when stored as PNG), for the class counts."""
    if isinstance(rec.mask, (bytes, bytearray, memoryview)):
        from readers.formats.encoding import decode_mask

        return decode_mask(rec.mask, spec)
    return rec.mask


def _copy_record(ctx: WorkerContext, copies: dict, copy: CopyRecord, transform: SampleTransformer,
                 encode: SampleEncoding) -> tuple[Any, SampleEntry, np.ndarray, int, Any]:
    """(the re-encoded record, its sample entry, class counts, ignored pixels, its stored image) of a copy."""
    records, old_samples, old_spec = _copy_source(ctx, copies, copy.shard)
    rec = records[copy.index]
    where = f"{os.path.join(ctx.out_dir, copy.shard)}: record {copy.index}"
    if rec.key != copy.key:
        raise ValueError(f"{where} has key {rec.key!r}, the manifest says {copy.key!r}. Run `imgshard verify` and "
                         "re-convert with --rebuild.")
    encoded, counts, ignored = _copied(transform, encode, rec, old_spec, where)
    return encoded, copy.entry or old_samples[copy.index], counts, ignored, rec.image


def _copied(transform: SampleTransformer, encode: SampleEncoding, rec: Any, spec: Any,
            where: str) -> tuple[Any, np.ndarray, int]:
    """A copied record re-encoded, and its class counts; a mask that cannot be read or holds a value
    that is neither a class nor the ignore index is a `ValueError` naming the shard and record (`where`)."""
    try:
        mask = _stored_mask(rec, spec)
        if mask is not None and mask.ndim == 2 and mask.size:
            ignore = transform.semantics.ignore_index if transform.semantics is not None else -1
            if int(mask.max()) >= transform.num_classes:  # only then: a second pass finds the odd values
                odd = mask[(mask >= transform.num_classes) & (mask != ignore)]
                if odd.size:
                    raise ValueError(f"mask value {int(odd[0])} ({odd.size} pixels) is neither a class "
                                     f"(0-{transform.num_classes - 1}) nor the ignore index {ignore}")
        counts, ignored = transform.count_classes(mask, rec.label)
        return encode(SampleArrays(rec.key, rec.image, rec.mask, rec.label)), counts, ignored
    except (ValueError, TypeError, OSError, KeyError) as e:
        raise ValueError(f"{where} (key {rec.key!r}): its mask cannot be copied: {e}. Nothing was published; "
                         "run `imgshard verify OUT --deep`, and re-convert with --rebuild if it is damaged.") from e


def content_changed(new: SampleEntry, old: SampleEntry, source_base: str) -> bool:
    """Whether a re-converted sample's sources differ in content from the old record's."""
    def same_file(a: SourceFingerprint | None, b: SourceFingerprint | None) -> bool:
        if a is None or b is None:
            return a is b
        if a.algorithm == b.algorithm:
            return a.digest == b.digest
        # an old manifest's digest (sha256, version 1): hash the file as it was just read
        path = a.path if os.path.isabs(a.path) else os.path.join(source_base, a.path)
        return a.size == b.size and content_matches(path, b.digest)

    return not (new.label == old.label and same_file(new.image, old.image) and same_file(new.mask, old.mask))


@dataclass
class Converted:
    """One source sample converted for its shard writer (`record` None: it was bad).

    Picklable: a worker that helps with another's shard (`converter.run.steal`) sends it
    to the shard's writer."""

    record: SampleArrays | None = None
    entry: SampleEntry | None = None
    class_pixels: np.ndarray | None = None
    ignore_pixels: int = 0
    bad: list[BadInput] = field(default_factory=list)
    unknown_colors: dict[tuple[int, int, int], list[int]] = field(default_factory=dict)


def convert_sample(transform: SampleTransformer, encode: SampleEncoding, sample: SourceSample) -> Converted:
    """Decode, transform and encode one sample; a bad one lists every bad file it has."""
    try:
        out = transform(sample)
    except DecodeError as e:
        bad = Converted()
        _note_bad(bad, e, sample.key)
        if sample.mask is not None and e.path == sample.image:  # its mask may be bad too
            mask_error = _mask_problem(transform, sample)
            if mask_error is not None:
                _note_bad(bad, mask_error, sample.key)
        return bad
    return Converted(encode(SampleArrays(out.entry.key, out.image, out.mask, out.label)), out.entry,
                     out.class_pixels, out.ignore_pixels)


def _sample_encoding(ctx: WorkerContext) -> SampleEncoding:
    return SampleEncoding(ctx.options, ignore_index_for(len(ctx.classes)))


def tail_share(tasks: Sequence[ShardTask], ctx: WorkerContext, workers: int) -> TailShare:
    """The `TailShare` of forked workers running `tasks`: a helper converts the items that are
    converted (not copied) with this run's transformer and encoding."""
    from converter.run.steal import TailShare

    def convert(task: int, item: int) -> Converted:
        return convert_sample(_transformer(ctx), _sample_encoding(ctx), _sample_of(tasks[task].items[item]))

    return TailShare([t.num_samples for t in tasks], workers, convert,
                     lambda task, item: not isinstance(tasks[task].items[item], CopyRecord))


def _sample_of(item: SourceSample | ReplaceRecord) -> SourceSample:
    return item.sample if isinstance(item, ReplaceRecord) else item


def _merge_bad(result: ShardResult, converted: Converted) -> None:
    result.bad += converted.bad
    for color, (pixels, files) in converted.unknown_colors.items():
        agg = result.unknown_colors.setdefault(color, [0, 0])
        agg[0] += pixels
        agg[1] += files


def _note_bad(result: ShardResult | Converted, e: DecodeError, key: str) -> None:
    result.bad.append(BadInput(e.path, e.reason, e.fix, key, e.kind))
    if isinstance(e, UnknownColorError):
        for color, n in e.unknown.counts.items():
            agg = result.unknown_colors.setdefault(color, [0, 0])
            agg[0] += n
            agg[1] += 1


def _mask_problem(transform: SampleTransformer, sample: SourceSample) -> DecodeError | None:
    """The mask's own problem, when its image already failed (so every bad file is listed)."""
    from converter.transform.decode import decode_mask, read_source
    from converter.transform.sample import relative_key_path

    try:
        mask = decode_mask(read_source(sample.mask, relative_key_path(sample.mask, transform.base), sample.mask_stat),
                           transform.max_pixels, wide=transform.wide_masks)
        if transform.semantics is not None:
            transform.mask_classes(mask, sample.mask)
    except DecodeError as e:
        return e
    return None


def _copy_source(ctx: WorkerContext, copies: dict, shard_file: str) -> tuple[dict[int, Any], list[SampleEntry], Any]:
    if shard_file not in copies:
        if None not in copies:  # the old manifest, parsed once per task however many shards it copies from
            copies[None] = _old_layout(ctx)
        copies[shard_file] = _old_records(ctx, copies[None], shard_file)
    return copies[shard_file]


class _EmptyShard(Exception):
    """Every sample of a shard was bad: leaving the `with` block discards the file."""


def run_shard_task(task: ShardTask, ctx: WorkerContext, progress: Callable[[int], None] | None = None,
                   tail: TaskTail | None = None) -> ShardResult:
    """Write `task.file` in `ctx.out_dir`. Bad samples are skipped and reported in the result.

    A `ReplaceRecord` whose new source is bad is reported and its old record is kept,
    so a bad replacement never loses a sample. `tail`: other workers may convert some
    of its samples (`converter.run.steal`); they are written in the same order.
    """
    try:
        with WorkerGuard(ctx.out_dir, ctx.owner_pid) as guard:
            if tail is None:
                return _run_guarded(task, ctx, progress, guard, None)
            tail.begin()
            try:
                return _run_guarded(task, ctx, progress, guard, tail)
            finally:
                tail.end()
    except OrphanedWorker:
        if ctx.owner_pid is not None and ctx.owner_pid != os.getpid():
            os._exit(3)  # our run was killed: nobody waits for this result
        raise


def _run_guarded(task: ShardTask, ctx: WorkerContext, progress: Callable[[int], None] | None,
                 guard: WorkerGuard, tail: TaskTail | None) -> ShardResult:
    t0 = time.perf_counter()
    transform = _transformer(ctx)
    class_pixels = np.zeros(len(ctx.classes), dtype=np.int64)
    class_images = np.zeros(len(ctx.classes), dtype=np.int64)
    sums = BandSums(not ctx.options.image_kind.legacy)  # images beyond 8-bit RGB: per-band sums
    ignore_pixels = 0
    entries: list[SampleEntry] = []
    presence: list[np.ndarray] = []  # classes present, per record (the index's `classes` field)
    result = ShardResult(task.split, None, task.replaces)
    # shard file -> (records, samples, spec); ("samples", file) -> samples; None -> the old layout
    copies: dict[Any, Any] = {}
    encoder = encoder_for(ctx.options.format)
    encode = _sample_encoding(ctx)
    try:
        with ShardWriter(ctx.out_dir, task.file, encoder, compression=ctx.options.compression,  # type: ignore[arg-type]
                         capacity=task.num_samples) as writer:
            for i, item in enumerate(task.items):
                copy = item if isinstance(item, CopyRecord) else None
                counts = None
                if copy is not None and tail is not None:
                    tail.take(i)
                if not isinstance(item, CopyRecord):
                    sample = _sample_of(item)
                    if tail is None:
                        out = convert_sample(transform, encode, sample)
                    else:
                        out, helped = tail.converted(i, lambda j: convert_sample(transform, encode,
                                                                                 _sample_of(task.items[j])))
                        result.helped += helped
                    _merge_bad(result, out)
                    if out.record is None:
                        if isinstance(item, ReplaceRecord):
                            copy = item.old  # keep the old record: nothing is lost
                    else:
                        writer.add(out.record)
                        sums.add(out.record.image)
                        entries.append(out.entry)  # type: ignore[arg-type]
                        counts, ignored = out.class_pixels, out.ignore_pixels
                        if isinstance(item, ReplaceRecord):
                            old_samples = _old_samples(ctx, copies, item.old.shard)
                            result.replaced += content_changed(out.entry, old_samples[item.old.index],  # type: ignore
                                                                ctx.source_base)
                        else:
                            result.added += 1
                if copy is not None:
                    encoded, entry, counts, ignored, stored = _copy_record(ctx, copies, copy, transform, encode)
                    writer.add(encoded)
                    entries.append(entry)
                    sums.add(stored)
                if counts is not None:
                    presence.append(np.asarray(counts) > 0)
                    class_pixels += counts
                    class_images += counts > 0
                    ignore_pixels += ignored
                if progress is not None:
                    progress(1)
            if not entries:
                raise _EmptyShard()
            guard.check()  # is our run still alive? (before both renames)
            index = write_index(ctx.out_dir, task.file, entries,  # unlisted until the manifest names it
                                np.stack(presence) if len(presence) == len(entries) else None)
            guard.check()  # last moment before the shard's rename
    except _EmptyShard:
        result.seconds = time.perf_counter() - t0
        return result
    written = writer.result
    result.entry = ShardEntry(
        file=written.file, records=written.records, bytes=written.bytes, digest=written.digest,
        class_pixels=tuple(int(c) for c in class_pixels), ignore_pixels=ignore_pixels,
        class_images=tuple(int(c) for c in class_images), index=index, source_bytes=source_bytes(entries),
        band_sums=sums.total(),
    )
    result.seconds = time.perf_counter() - t0
    return result
