"""One module per CLI subcommand: `register(subparsers)` adds it, `main(args)` runs it.

This module holds what the commands share: the source, label and task arguments, and
the progress bar."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from converter.commands.storage_args import add_storage_option_argument, storage_options
from converter.discover.classfolders import detect_task
from converter.options import (LAYOUT_NAMES, AnnotationOptions, LabelOptions, MaskSemantics, Overlap, RleOrder,
                              SourceSpec, SplitSource, Task)


def progress_bar(total: int, unit: str, desc: str):
    """A tqdm bar on stderr, without tqdm's monitor thread (workers are forked from a single-threaded run)."""
    from tqdm import tqdm

    tqdm.monitor_interval = 0
    return tqdm(total=total, unit=unit, desc=desc, file=sys.stderr, dynamic_ncols=True)


def add_source_arguments(p: argparse.ArgumentParser) -> None:
    """Source selection shared by `convert`, `scan` and `preview`."""
    p.add_argument("src", nargs="?", help="source folder (CamVid layout: train/, train_labels/, class_dict.csv)")
    p.add_argument("--images", action=Repeated, help="explicit images folder (instead of SRC); repeat "
                   "--images/--masks/--split for several splits in one run")
    p.add_argument("--masks", action=Repeated, help="explicit masks folder (with --images)")
    p.add_argument("--split", action=Repeated, default="train",
                   help="split name for --images/--masks (default: train)")
    p.add_argument("--spec", metavar="FILE", default=None,
                   help="a source spec (JSON, or TOML) written by `imgshard scan SRC --write-spec FILE`: exactly "
                        "these folder pairs, splits and mask meaning (docs/LAYOUTS.md)")
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
    add_storage_option_argument(p)
    add_label_arguments(p)
    add_annotation_arguments(p)


def add_annotation_arguments(p: argparse.ArgumentParser) -> None:
    """How annotation files (COCO, YOLO, LabelMe, CVAT, RLE CSV) become class maps (docs/LAYOUTS.md)."""
    # defaults None: a flag given is told from one left out (a spec's recorded option it contradicts refuses)
    p.add_argument("--overlap", choices=Overlap.values(), default=None,
                   help="where shapes overlap: tool (the producing tool's order, later on top; CVAT by z_order; "
                        "default), first (the first shape keeps its pixels) or ignore (pixels of two classes -> "
                        "ignore)")
    p.add_argument("--keep-crowd", action=argparse.BooleanOptionalAction, default=None,
                   help="COCO iscrowd regions keep their class (default: the ignore index)")
    p.add_argument("--rle-order", choices=RleOrder.values(), default=None,
                   help="RLE CSV runs go down the columns (Kaggle, default) or along the rows (Carvana); scan "
                        "tells which from the shapes they draw")
    p.add_argument("--rle-class", default=None, metavar="NAME",
                   help="RLE CSV without a ClassId column: the class name of its runs (default: foreground)")


class Repeated(argparse.Action):
    """A flag that may be repeated: the last value in `dest` (as a plain flag), all of them in `dest_all`."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, self.dest + "_all", [*(getattr(namespace, self.dest + "_all", None) or []), values])


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
    given = LabelOptions(semantics=args.mask_semantics, ignore_values=tuple(args.ignore_index) if args.ignore_index
                         is not None else None, reduce_zero_label=args.reduce_zero_label,
                         label_map_file=args.label_map, num_classes=args.num_classes,
                         binary_threshold=args.binary_threshold)
    if getattr(args, "spec", None) is None:
        return given
    from converter.discover.spec_file import load_spec, merge_labels

    return merge_labels(given, load_spec(args.spec).labels)


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
    if getattr(args, "spec", None) is not None:
        return _from_spec_file(args)
    if len(getattr(args, "images_all", None) or []) > 1:
        return _repeated_pairs(args)
    if getattr(args, "bands", None):
        from converter.commands.image_args import band_source

        return band_source(args, split or args.split, storage_options(args))
    return SourceSpec(root=args.src, images=args.images, masks=args.masks, split=split or args.split,
                      classes=args.classes,
                      layout=getattr(args, "layout", None), image_suffix=getattr(args, "image_suffix", None),
                      mask_suffix=getattr(args, "mask_suffix", None),
                      split_lists=_split_lists(getattr(args, "split_list", [])),
                      storage_options=storage_options(args), annotations=annotation_options(args))


_ANNOTATION_FLAGS = {"overlap": "--overlap", "keep_crowd": "--keep-crowd", "rle_class": "--rle-class",
                     "rle_order": "--rle-order"}


def _annotation_flags(args: argparse.Namespace) -> dict:
    """The annotation options given as flags (left-out flags are None)."""
    return {k: getattr(args, k) for k in _ANNOTATION_FLAGS if getattr(args, k, None) is not None}


def annotation_options(args: argparse.Namespace) -> AnnotationOptions:
    return AnnotationOptions(**_annotation_flags(args))


def _from_spec_file(args: argparse.Namespace) -> SourceSpec:
    from converter.discover.spec_file import load_spec

    given = [flag for flag, value in (("SRC", args.src), ("--images", args.images), ("--masks", args.masks),
                                      ("--layout", getattr(args, "layout", None))) if value is not None]
    if given:
        raise ValueError(f"--spec {args.spec} names the sources; drop {', '.join(given)}. "
                         f"Received: --spec with {', '.join(given)}")
    loaded = load_spec(args.spec, storage_options(args))
    source = loaded.source
    return dataclasses.replace(source, annotations=_merged_annotation_options(source.annotations, args, args.spec,
                                                                              _recorded(loaded)))


def _recorded(loaded) -> frozenset:
    """The annotation options the spec file writes down (its ``annotation_options`` keys)."""
    import json

    options = json.loads(loaded.text).get("annotation_options") or {}
    return frozenset(options) if isinstance(options, dict) else frozenset()


def _shown(value):
    return getattr(value, "value", value)


def _flag_text(key: str, value) -> str:
    """How the flag was written: ``--keep-crowd`` / ``--no-keep-crowd``, ``--overlap first``."""
    if key == "keep_crowd":
        return "--keep-crowd" if value else "--no-keep-crowd"
    return f"{_ANNOTATION_FLAGS[key]} {_shown(value)}"


def _merged_annotation_options(from_spec: AnnotationOptions, args: argparse.Namespace, path: str = "",
                               recorded: frozenset = frozenset()) -> AnnotationOptions:
    """The spec's annotation options (`annotation_options`) with the flags given: a flag may add an option
    the spec leaves out, never contradict one it records (a named error: drop the flag or edit the spec)."""
    given = _annotation_flags(args)
    parsed = AnnotationOptions(**given)
    for key in sorted(given):
        mine, theirs = getattr(parsed, key), getattr(from_spec, key)
        if key in recorded and mine != theirs:
            flag = _flag_text(key, mine)
            raise ValueError(f"{flag} contradicts --spec {path}, whose annotation_options record {key}: "
                             f"{_shown(theirs)!r}. Drop the flag to follow the spec, or change annotation_options "
                             f"in {path} (or rescan: imgshard scan SRC --write-spec FILE {flag}). Received: {flag}")
    return dataclasses.replace(from_spec, **{k: getattr(parsed, k) for k in given})


def _repeated_pairs(args: argparse.Namespace) -> SourceSpec:
    """Repeated --images/--masks/--split: one folder pair per --images, in order."""
    images, masks = args.images_all, getattr(args, "masks_all", None) or []
    splits = getattr(args, "split_all", None) or []
    if not (len(images) == len(masks) == len(splits)):
        raise ValueError("Repeat --images, --masks and --split together, one of each per folder pair. Received: "
                         f"{len(images)} --images, {len(masks)} --masks, {len(splits)} --split")
    pairs = tuple(SplitSource(sp, i, m, image_suffix=getattr(args, "image_suffix", None),
                              mask_suffix=getattr(args, "mask_suffix", None)) for i, m, sp in zip(images, masks, splits))
    return SourceSpec(root=args.src, sources=pairs, classes=args.classes,
                      split_lists=_split_lists(getattr(args, "split_list", [])), storage_options=storage_options(args),
                      annotations=annotation_options(args))
