"""`imgshard preview PATH -o preview.png`: a contact sheet of samples.

PATH is a converted dataset (a folder with imgshard.json) or raw sources (CamVid
layout, or --images/--masks/--classes; or class folders, detected as convert detects
them, --task/--val-fraction as for convert). On raw sources, mask colours that match no
class are drawn as a magenta/black checkerboard; class folders give a grid of images
with their class names.

--split S picks the split to show (a dataset: default train; raw sources: default
every split; with --images/--masks it names the split as for convert).
"""

from __future__ import annotations

import argparse
import sys

from converter.commands import (
    add_source_arguments,
    add_task_arguments,
    label_options,
    resolve_task,
    source_spec,
)
from converter.commands.storage_args import add_storage_option_argument, storage_options
from converter.options import DEFAULT_MAX_PIXELS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("preview", help="contact sheet PNG: image | mask | overlay per sample, with a legend",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_source_arguments(p)
    add_task_arguments(p)
    p.set_defaults(split=None)
    p.add_argument("-o", "--output", required=True, help="PNG file to write")
    p.add_argument("-n", type=int, default=8, help="number of samples (default 8)")
    p.add_argument("--seed", type=int, default=0, help="which samples (default 0)")
    p.add_argument("--key", action="append", default=[], metavar="KEY",
                   help="show this sample (repeatable; e.g. train/0001TP_006690.png); overrides -n")
    p.add_argument("--color-tolerance", type=int, default=0, metavar="N",
                   help="raw sources: snap colours within N of a class, as convert would (default 0)")
    p.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS, help="raw sources: as convert")
    p.add_argument("--augment", metavar="SPEC",
                   help="a converted dataset: show the samples augmented, as tf_dataset(augment=..., seed=--seed) "
                        "gives them; SPEC is field=value,... of readers.augment.Augment, e.g. "
                        "hflip=0.5,scale=0.5:2.0,crop=512x512,brightness=0.2 (docs/AUGMENT.md)")
    p.add_argument("--epoch", type=int, default=0, help="with --augment: the training epoch to show (default 0)")
    p.add_argument("--display-bands", metavar="B[,G,R]", default=None,
                   help="a converted dataset of 16-bit or multi-band images: the bands to draw, 1-based (one for "
                        "grey, three for RGB, e.g. 3,2,1; default the first three); 16-bit values are stretched")
    add_storage_option_argument(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from converter.inspect.display import parse_bands
    from converter.inspect.preview import PreviewOptions, is_dataset, preview_dataset, preview_sources

    augment = None
    if args.augment is not None:
        from readers.augment import parse_augment

        augment = parse_augment(args.augment)
    options = PreviewOptions(split=args.split, n=args.n, seed=args.seed, keys=tuple(args.key),
                             color_tolerance=args.color_tolerance, augment=augment, epoch=args.epoch,
                             display_bands=parse_bands(args.display_bands))
    if args.src is not None and args.images is None and is_dataset(args.src, storage_options(args)):
        sheet = preview_dataset(args.src, args.output, options, storage_options(args))
        what = "dataset"
    elif augment is not None:
        raise ValueError(f"--augment previews a converted dataset (a folder with imgshard.json). "
                         f"Received: {args.src or args.images} (raw sources); convert it first.")
    else:
        spec = source_spec(args, split=args.split or "train")
        if args.images is not None and args.split is not None:
            options = PreviewOptions(split=None, n=args.n, seed=args.seed, keys=tuple(args.key),
                                     color_tolerance=args.color_tolerance)
        sheet = preview_sources(spec, args.output, options, max_pixels=args.max_pixels,
                                task=resolve_task(args, spec), val_fraction=args.val_fraction,
                                labels=label_options(args))
        what = "raw sources"
    w, h = sheet.size
    print(f"Wrote {args.output} ({w}x{h} px, {len(sheet.boxes)} sample(s) from the {what}).", file=sys.stderr)
    return 0
