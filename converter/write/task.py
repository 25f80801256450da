"""Run one planned shard in a worker process: transform its samples, write the shard.

Only small metadata goes back to the parent (`ShardResult`): counts, sizes, hashes,
fingerprints, and the bad inputs met. Pixel arrays never cross a process boundary.
The worker keeps one `SampleTransformer` per option set (the colour lookup table is
built once per process, not once per shard).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from converter.discover.layout import BadInput, SourceSample
from converter.options import OutputOptions
from converter.plan import CopyRecord, ShardTask
from converter.transform.decode import DecodeError
from converter.transform.sample import SampleTransformer, UnknownColorError
from converter.write.base import SampleArrays, ShardWriter
from converter.write.registry import encoder_for
from readers.manifest import ClassInfo, Manifest, SampleEntry, ShardEntry


@dataclass(frozen=True)
class WorkerContext:
    """Everything a worker needs besides the task; small and picklable."""

    out_dir: str
    options: OutputOptions
    classes: tuple[ClassInfo, ...]
    source_base: str
    max_pixels: int
    old_manifest_path: str | None = None  # for CopyRecord items (rewrites)


@dataclass
class ShardResult:
    split: str
    entry: ShardEntry | None  # None when every sample of the shard was bad
    replaces: tuple[str, ...]
    bad: list[BadInput] = field(default_factory=list)
    unknown_colors: dict[tuple[int, int, int], list[int]] = field(default_factory=dict)  # colour -> [pixels, files]
    seconds: float = 0.0


_TRANSFORMERS: dict[Any, SampleTransformer] = {}
_OLD: dict[str, Any] = {}


def _transformer(ctx: WorkerContext) -> SampleTransformer:
    key = (ctx.options, ctx.classes, ctx.source_base, ctx.max_pixels)
    t = _TRANSFORMERS.get(key)
    if t is None:
        _TRANSFORMERS.clear()
        t = _TRANSFORMERS[key] = SampleTransformer(ctx.options, ctx.classes, ctx.source_base, ctx.max_pixels)
    return t


def _old_records(ctx: WorkerContext, shard_file: str) -> dict[int, Any]:
    """Records of an old shard, by index (read once per task)."""
    from readers.formats.base import RecordSpec, ShardRef
    from readers.formats.registry import get_adapter

    manifest = Manifest.load(ctx.old_manifest_path)  # type: ignore[arg-type]
    spec = RecordSpec.from_manifest(manifest)
    entry = next(s for _, s in manifest.iter_shards() if s.file == shard_file)
    ref = ShardRef(os.path.join(ctx.out_dir, shard_file), entry, 0)
    return dict(enumerate(get_adapter(manifest.format).iter_shard(ref, spec))), entry


def _note_bad(result: ShardResult, e: DecodeError, key: str) -> None:
    result.bad.append(BadInput(e.path, e.reason, e.fix, key, e.kind))
    if isinstance(e, UnknownColorError):
        for color, n in e.unknown.counts.items():
            agg = result.unknown_colors.setdefault(color, [0, 0])
            agg[0] += n
            agg[1] += 1


class _EmptyShard(Exception):
    """Every sample of a shard was bad: leaving the `with` block discards the file."""


def run_shard_task(task: ShardTask, ctx: WorkerContext, progress: Callable[[int], None] | None = None) -> ShardResult:
    """Write `task.file` in `ctx.out_dir`. Bad samples are skipped and reported in the result."""
    t0 = time.perf_counter()
    transform = _transformer(ctx)
    class_pixels = np.zeros(len(ctx.classes), dtype=np.int64)
    class_images = np.zeros(len(ctx.classes), dtype=np.int64)
    ignore_pixels = 0
    entries: list[SampleEntry] = []
    result = ShardResult(task.split, None, task.replaces)
    copies: dict[str, tuple[dict[int, Any], ShardEntry]] = {}
    encoder = encoder_for(ctx.options.format)
    try:
        with ShardWriter(ctx.out_dir, task.file, encoder, compression=ctx.options.compression,  # type: ignore[arg-type]
                         capacity=task.num_samples) as writer:
            for item in task.items:
                if isinstance(item, CopyRecord):
                    if item.shard not in copies:
                        copies[item.shard] = _old_records(ctx, item.shard)
                    records, old_entry = copies[item.shard]
                    rec = records[item.index]
                    writer.add(SampleArrays(rec.key, rec.image, rec.mask, rec.label))
                    entries.append(old_entry.samples[item.index])
                    counts, ignored = transform.count_classes(rec.mask, rec.label)
                else:
                    try:
                        out = transform(item)
                    except DecodeError as e:
                        _note_bad(result, e, item.key)
                        counts = None
                    else:
                        writer.add(SampleArrays(out.entry.key, out.image, out.mask, out.label))
                        entries.append(out.entry)
                        counts, ignored = out.class_pixels, out.ignore_pixels
                if counts is not None:
                    class_pixels += counts
                    class_images += counts > 0
                    ignore_pixels += ignored
                if progress is not None:
                    progress(1)
            if not entries:
                raise _EmptyShard()
    except _EmptyShard:
        result.seconds = time.perf_counter() - t0
        return result
    written = writer.result
    result.entry = ShardEntry(
        file=written.file, records=written.records, bytes=written.bytes, sha256=written.sha256,
        class_pixels=tuple(int(c) for c in class_pixels), ignore_pixels=ignore_pixels, samples=tuple(entries),
        class_images=tuple(int(c) for c in class_images),
    )
    result.seconds = time.perf_counter() - t0
    return result
