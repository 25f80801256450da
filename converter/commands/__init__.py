"""One module per CLI subcommand: `register(subparsers)` adds it, `main(args)` runs it.

This module holds what the commands share: the source and task arguments, and the
progress bar."""

from __future__ import annotations

import argparse
import sys

from converter.discover.classfolders import detect_task
from converter.options import SourceSpec, Task


def progress_bar(total: int, unit: str, desc: str):
    """A tqdm bar on stderr, without tqdm's monitor thread (workers are forked from a single-threaded run)."""
    from tqdm import tqdm

    tqdm.monitor_interval = 0
    return tqdm(total=total, unit=unit, desc=desc, file=sys.stderr, dynamic_ncols=True)


def add_source_arguments(p: argparse.ArgumentParser) -> None:
    """Source selection shared by `convert`, `scan` and `preview`."""
    p.add_argument("src", nargs="?", help="source folder (CamVid layout: train/, train_labels/, class_dict.csv)")
    p.add_argument("--images", help="explicit images folder (instead of SRC)")
    p.add_argument("--masks", help="explicit masks folder (with --images)")
    p.add_argument("--split", default="train", help="split name for --images/--masks (default: train)")
    p.add_argument("--classes", help="class table CSV (default: SRC/class_dict.csv)")


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
    if getattr(args, "val_fraction", None) is not None:
        return Task.CLASSIFICATION
    return detect_task(spec)


def source_spec(args: argparse.Namespace) -> SourceSpec:
    return SourceSpec(root=args.src, images=args.images, masks=args.masks, split=args.split, classes=args.classes)
