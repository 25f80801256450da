"""`imgshard convert SRC OUT --size HxW`: the main job."""

from __future__ import annotations

import argparse
import sys
import time

from converter.commands import progress_bar
from converter.options import (
    DEFAULT_MAX_PIXELS,
    LAYOUT_NAMES,
    LabelOptions,
    MaskSemantics,
    Fit,
    ImageFilter,
    MaskEncoding,
    OnChange,
    OutputOptions,
    RunOptions,
    SourceSpec,
    Task,
    UnknownColor,
    parse_bytes,
)
from converter.discover.classfolders import detect_task
from readers.formats import FileFormat


def add_source_arguments(p: argparse.ArgumentParser) -> None:
    """Source selection shared by `convert`, `scan` and `preview`."""
    p.add_argument("src", nargs="?", help="source folder (CamVid layout: train/, train_labels/, class_dict.csv)")
    p.add_argument("--images", help="explicit images folder (instead of SRC)")
    p.add_argument("--masks", help="explicit masks folder (with --images)")
    p.add_argument("--split", default="train", help="split name for --images/--masks (default: train)")
    p.add_argument("--classes", help="class table: class_dict.csv (name,r,g,b; colour masks), or for index masks a "
                   "names file (line i = class i) or an id,name CSV (default: SRC/class_dict.csv, or the layout's)")
    p.add_argument("--layout", choices=LAYOUT_NAMES, default=None,
                   help="force the source layout (default: detected; docs/LAYOUTS.md)")
    p.add_argument("--image-suffix", default=None, metavar="S",
                   help="image names are <stem>S.<ext> (e.g. _leftImg8bit); default: found from the names")
    p.add_argument("--mask-suffix", default=None, metavar="S",
                   help="mask names are <stem>S.<ext> (e.g. _gtFine_labelIds, _segmentation); default: found")
    p.add_argument("--split-list", action="append", default=[], metavar="NAME=FILE",
                   help="split NAME holds the names listed in FILE, one per line (repeatable; VOC's "
                        "ImageSets/Segmentation lists are found automatically)")
    add_label_arguments(p)


def add_label_arguments(p: argparse.ArgumentParser) -> None:
    """How mask pixels become classes (segmentation), shared by convert, scan and preview."""
    p.add_argument("--mask-semantics", choices=MaskSemantics.values(), default=None,
                   help="colour (class_dict.csv colours), index (pixel value = class id) or binary (0 / 255 or "
                        "0 / 1); default: the layout's, else colour with a class_dict.csv and index without")
    p.add_argument("--ignore-index", action="append", type=int, default=None, metavar="V",
                   help="mask value V goes to the ignore index (repeatable; e.g. VOC's 255 border)")
    p.add_argument("--reduce-zero-label", action=argparse.BooleanOptionalAction, default=None,
                   help="value 0 -> ignore, v -> v-1 (ADE20K, LoveDA); default: the layout's (ade: on)")
    p.add_argument("--label-map", default=None, metavar="FILE",
                   help="CSV source_id,target_id or source_id,name (unlisted ids -> ignore), or 'cityscapes' "
                        "(label ids -> 19 train ids; chosen automatically for Cityscapes)")
    p.add_argument("--num-classes", type=int, default=None, metavar="K",
                   help="index masks without a class table: classes class_0..class_{K-1}")
    p.add_argument("--binary-threshold", type=int, default=128, metavar="T",
                   help="binary masks with levels above 1 (JPEG): v >= T is foreground (default 128)")


def label_options(args: argparse.Namespace) -> LabelOptions:
    return LabelOptions(semantics=args.mask_semantics, ignore_values=tuple(args.ignore_index) if args.ignore_index
                        is not None else None, reduce_zero_label=args.reduce_zero_label,
                        label_map_file=args.label_map, num_classes=args.num_classes,
                        binary_threshold=args.binary_threshold)


def _split_lists(values: list[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for v in values:
        name, sep, path = v.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--split-list must look like NAME=FILE, e.g. val=splits/val.txt. Received: {v!r}")
        out.append((name, path))
    return tuple(out)


def add_task_arguments(p: argparse.ArgumentParser) -> None:
    """Task selection (segmentation or class folders), for commands that read SRC like `convert`."""
    p.add_argument("--task", choices=Task.values(), default=None,
                   help="segmentation (image + mask folders) or classification (class folders, Keras layout "
                        "SRC/{train,val}/<class>/* or flat SRC/<class>/*); default: detected from SRC")
    p.add_argument("--val-fraction", type=float, default=None, metavar="F",
                   help="classification, flat layout SRC/<class>/*: put a stable share F of the samples "
                        "(chosen by hashing their keys) in split 'val'; the rest go to 'train'")


def resolve_task(args: argparse.Namespace, spec: SourceSpec) -> Task:
    """--task as given, else detected from the sources (--val-fraction implies classification)."""
    if args.task is not None:
        return Task.parse(args.task, "--task")
    if getattr(args, "layout", None) == "classfolders":
        return Task.CLASSIFICATION
    if getattr(args, "val_fraction", None) is not None:
        return Task.CLASSIFICATION
    return detect_task(spec)


def source_spec(args: argparse.Namespace, split: str | None = None) -> SourceSpec:
    return SourceSpec(root=args.src, images=args.images, masks=args.masks, split=split or args.split,
                      classes=args.classes,
                      layout=getattr(args, "layout", None), image_suffix=getattr(args, "image_suffix", None),
                      mask_suffix=getattr(args, "mask_suffix", None),
                      split_lists=_split_lists(getattr(args, "split_list", [])))


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
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from converter.convert import convert

    if args.images is not None and args.out is None and args.out_opt is None:
        args.src, args.out = None, args.src  # `convert --images I --masks M OUT`: the one positional is OUT
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
        seed=args.seed, labels=label_options(args) if task is Task.SEGMENTATION else None,
    )
    run = RunOptions(
        workers=args.workers, shard_size_bytes=parse_bytes(args.shard_size), max_bad=args.max_bad,
        max_pixels=args.max_pixels, on_change=args.on_change, prune=args.prune, rebuild=args.rebuild,
        backend=args.backend, scheduler=args.scheduler,
    )
    if args.task is None and not args.quiet:
        print(f"imgshard convert: task {task.value} (detected from the sources; --task overrides)", file=sys.stderr)
    bar = None

    def on_plan(plan) -> None:
        nonlocal bar
        total = sum(t.num_samples for t in plan.tasks)
        if not args.quiet and total:
            bar = progress_bar(total, "sample", "convert")

    def on_progress(n: int) -> None:
        if bar is not None:
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
    if not result.written and not plan.drop_shards:
        lines.append(f"Nothing new: {plan.unchanged} sample(s) already converted in {result.out_dir}; no shard changed.")
        if plan.refreshed and result.published:
            lines.append(f"(updated the modification times of {len(plan.refreshed)} unchanged source(s) in the manifest)")
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
