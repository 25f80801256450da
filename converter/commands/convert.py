"""`imgshard convert SRC OUT --size HxW`: the main job."""

from __future__ import annotations

import argparse
import sys
import threading
import time

from converter.commands import (
    add_source_arguments,
    add_task_arguments,
    label_options,
    progress_bar,
    resolve_task,
    source_spec,
)
from converter.commands.image_args import add_image_arguments, image_kind
from converter.options import (
    DEFAULT_MAX_PIXELS,
    LabelOptions,
    Fit,
    ImageEncoding,
    ImageFilter,
    MaskEncoding,
    OnChange,
    OutputOptions,
    RunOptions,
    UnknownColor,
    parse_bytes,
)
from readers.formats import FileFormat
from readers.storage.url import parse_storage_options
from readers.tasks import task_kind


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="convert sources into shards + manifest (incremental, cron-safe)",
                       description=__doc__)
    add_source_arguments(p)
    add_task_arguments(p)
    p.add_argument("out", nargs="?", help="output folder (created if missing)")
    p.add_argument("-o", "--out", dest="out_opt", help="output folder (alternative to the positional OUT)")
    p.add_argument("--size", required=True, help="output size HxW, e.g. 512x512")
    p.add_argument("--fit", choices=Fit.values(), default=Fit.STRETCH.value, help="how to fit the size (default: stretch)")
    p.add_argument("--image-filter", choices=ImageFilter.values(), default=ImageFilter.BILINEAR.value,
                   help="image resampling filter (Pillow; default: bilinear). Masks always use nearest.")
    p.add_argument("--format", choices=[f.value for f in FileFormat], default=FileFormat.TFRECORD.value)
    p.add_argument("--compression", choices=["none", "gzip", "deflate"], default=None,
                   help="tfrecord: none (default) or gzip; npz: deflate (default) or none")
    p.add_argument("--mask-encoding", choices=MaskEncoding.values(), default=MaskEncoding.CLASS_MAP.value,
                   help="class_map (1 byte/pixel, default) or onehot (uint8 planes)")
    p.add_argument("--image-encoding", choices=ImageEncoding.values(), default=ImageEncoding.RAW.value,
                   help="raw uint8 (default, fastest from RAM), png (lossless), jpeg or webp (lossy, several "
                        "times smaller); masks stay lossless (PNG next to encoded images). See docs/FORMATS.md")
    p.add_argument("--quality", type=int, default=None, metavar="Q",
                   help="JPEG/WebP quality 1..100 (default 90)")
    p.add_argument("--color-tolerance", type=int, default=0, metavar="N",
                   help="snap mask colours within N per channel to their class (default 0: exact)")
    p.add_argument("--unknown-color", choices=UnknownColor.values(), default=UnknownColor.FAIL.value,
                   help="fail (default) or ignore: map unknown colours to the ignore index")
    p.add_argument("--seed", type=int, default=0, help="seed of the shard shuffle (default 0)")
    p.add_argument("--shard-size", default="128MB", help="maximum uncompressed shard size (default 128MB)")
    p.add_argument("--workers", type=int, default=0, help="worker processes (default: all cores)")
    p.add_argument("--max-bad", type=int, default=0, metavar="N",
                   help="publish the good samples when at most N sources are bad (default 0)")
    p.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS, help="refuse larger images (decompression bombs)")
    p.add_argument("--on-change", choices=OnChange.values(), default=OnChange.KEEP.value,
                   help="a converted source changed: keep the old record (default), replace it, or fail")
    p.add_argument("--prune", action=argparse.BooleanOptionalAction, default=False,
                   help="drop records whose source was deleted")
    p.add_argument("--rebuild", action=argparse.BooleanOptionalAction, default=False,
                   help="convert everything again when the options differ from the dataset's")
    p.add_argument("--backend", choices=["local", "dask"], default="local", help="where workers run (default local)")
    p.add_argument("--scheduler", help="Dask scheduler address tcp://HOST:PORT (with --backend dask)")
    if "--storage-option" not in p._option_string_actions:  # one option for the sources' and OUT's URLs
        p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE", dest="storage_option",
                       help="fsspec option for s3:// and gs:// locations, repeatable (e.g. endpoint_url=http://host:9000, "
                            "profile=NAME, client_kwargs.region_name=eu-west-1); see docs/STORAGE.md")
    p.add_argument("--staging-dir", metavar="DIR",
                   help="OUT in a bucket: local folder for the run's staging files and the index cache "
                        "(default: the system's temporary folder)")
    p.add_argument("--lock-ttl", type=float, default=300.0, metavar="SECONDS",
                   help="OUT in a bucket: the lock object expires this long after its last renewal (default 300; "
                        "a killed run's lock is taken over after it)")
    add_image_arguments(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from converter.discover.files import source_scope

    with source_scope():  # sources in a bucket: one listing for the task detection and the run
        return _main(args)


def _main(args: argparse.Namespace) -> int:
    from converter.convert import convert

    if (args.images is not None or args.spec is not None) and args.out is None and args.out_opt is None:
        args.src, args.out = None, args.src  # `convert --images I --masks M OUT`, `--spec F OUT`: the one positional is OUT
    out = args.out_opt or args.out
    if out is None:
        raise ValueError("Give the output folder: imgshard convert SRC OUT --size HxW (or -o OUT).")
    compression = args.compression
    if compression == "gzip" and args.format == "npz":
        compression = "deflate"
    spec = source_spec(args)
    task = resolve_task(args, spec)
    options = OutputOptions(
        size=args.size, task=task, val_fraction=args.val_fraction, fit=args.fit, image_filter=args.image_filter, format=args.format, compression=compression,
        mask_encoding=args.mask_encoding, color_tolerance=args.color_tolerance, unknown_color=args.unknown_color,
        seed=args.seed, image_encoding=args.image_encoding, quality=args.quality,
        labels=label_options(args) if task_kind(task).dense else None, image_kind=image_kind(args),
        exif=args.exif,
    )
    run = RunOptions(
        workers=args.workers, shard_size_bytes=parse_bytes(args.shard_size), max_bad=args.max_bad,
        max_pixels=args.max_pixels, on_change=args.on_change, prune=args.prune, rebuild=args.rebuild,
        backend=args.backend, scheduler=args.scheduler,
        storage_options=parse_storage_options(args.storage_option), staging_dir=args.staging_dir,
        lock_ttl_seconds=args.lock_ttl,
    )
    if args.task is None and not args.quiet:
        print(f"imgshard convert: task {task.value} (detected from the sources; --task overrides)", file=sys.stderr)
    bar = None
    total = 0
    lock = threading.Lock()  # the run's thread and its progress thread both report

    def on_plan(plan) -> None:
        nonlocal total
        total = sum(t.num_samples for t in plan.tasks)

    def on_progress(n: int) -> None:
        nonlocal bar
        with lock:
            if bar is None:
                # made at the first sample, not with the plan: importing tqdm (20-40 ms) then
                # overlaps the workers' first samples instead of delaying their start
                bar = progress_bar(total, "sample", "convert")
            bar.update(n)

    t0 = time.perf_counter()
    try:
        # quiet: no progress callback, so no progress queue (a manager process) is started
        result = convert(spec, out, options, run, on_plan=on_plan, on_progress=None if args.quiet else on_progress)
    finally:
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - t0
    if not args.quiet:
        print(summary(result, seconds), file=sys.stderr)
    return 0


def summary(result, seconds: float) -> str:
    plan = result.plan
    lines = []
    if result.source:
        labels = LabelOptions.from_json(result.source["labels"]).summary()
        lines.append(f"Layout {result.source['layout']} ({result.source['why']}); masks: {labels}")
        if result.source.get("classes_from") and result.source["labels"].get("semantics") != "colour":
            lines.append(f"Classes from: {result.source['classes_from']}")
    if not result.written and not plan.drop_shards:
        lines.append(f"Nothing new: {plan.unchanged} sample(s) already converted in {result.out_dir}; no shard changed.")
        if plan.refreshed and result.published:
            touched = sum(len(rows) for rows in plan.refreshed.values())
            lines.append(f"(updated the modification times of {touched} unchanged source(s) in the index files)")
    else:
        n = result.samples_written
        rate = n / seconds if seconds > 0 else 0.0
        lines.append(
            f"Converted {plan.new} new, {plan.replaced} replaced, {plan.pruned} pruned sample(s): wrote "
            f"{n} record(s) in {len(result.written)} shard(s), {result.bytes_written / 1e6:.1f} MB, "
            f"in {seconds:.1f} s ({rate:.1f} samples/s) -> {result.out_dir}"
        )
    if result.bad:
        lines.append(f"{len(result.bad)} bad source file(s) skipped (within --max-bad); see {result.report_path}")
        for b in result.bad[:20]:
            lines.append(f"  {b}")
    if plan.changed_kept:
        lines.append(f"warning: {len(plan.changed_kept)} source(s) changed since conversion; kept the old records "
                     f"(--on-change replace re-converts them): {_some(plan.changed_kept)}")
    if plan.deleted_kept:
        lines.append(f"warning: {len(plan.deleted_kept)} source(s) deleted; kept their records (--prune drops them): "
                     f"{_some(plan.deleted_kept)}")
    return "\n".join(lines)


def _some(keys: list[str], limit: int = 5) -> str:
    return ", ".join(keys[:limit]) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")
