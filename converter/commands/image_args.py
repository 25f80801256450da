"""The image-kind flags `convert` and `scan` share: `--image-mode`, `--alpha`,
`--accept-reduction`, `--bands` (`converter.imagekind`) and `--exif` (`converter.transform.exif`)."""

from __future__ import annotations

import argparse
import os

from converter.imagekind import AlphaMode, ImageKind, ImageMode
from converter.options import ExifMode, SourceSpec, SplitSource


def add_image_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("image kind (docs/IMAGES.md)")
    g.add_argument("--image-mode", choices=ImageMode.values(), default=ImageMode.AUTO.value,
                   help="auto (default: 16-bit and multi-band images stored as they are, 8-bit grey as one "
                        "channel, other 8-bit as RGB), rgb "
                        "(8-bit RGB), grey (one channel) or keep (dtype and channels as in the files)")
    g.add_argument("--alpha", choices=AlphaMode.values(), default=AlphaMode.DROP.value,
                   help="RGBA images: drop the alpha channel (default) or keep it as a fourth channel")
    g.add_argument("--accept-reduction", action=argparse.BooleanOptionalAction, default=False,
                   help="accept a conversion that loses precision or channels (16 -> 8 bit, bands dropped); "
                        "without it convert refuses such images by name. The manifest records it.")
    g.add_argument("--bands", default=None, metavar="A,B,...",
                   help="band folders in channel order, relative to SRC (one single-band file per band, matched "
                        "by name tokens: red_patch_7 ~ green_patch_7); with --masks")
    g.add_argument("--exif", choices=ExifMode.values(), default=ExifMode.AUTO.value,
                   help="segmentation: EXIF orientation of images; auto (default) applies it where the mask fits "
                        "the image as shown and not as stored, and refuses a pair the sizes cannot decide "
                        "(exif_ambiguous); apply or ignore decides for every image")


def image_kind(args: argparse.Namespace) -> ImageKind:
    return ImageKind(mode=args.image_mode, alpha=args.alpha, accept_reduction=bool(args.accept_reduction))


def band_source(args: argparse.Namespace, split: str, storage_options) -> SourceSpec:
    """`--bands A,B,... --masks M`: one folder pair whose images are the band folders."""
    folders = [b.strip() for b in args.bands.split(",") if b.strip()]
    if getattr(args, "masks", None) is None or len(folders) < 2 or args.images is not None:
        raise ValueError("--bands takes two or more band folders (relative to SRC) and --masks, without --images. "
                         f"Received: --bands {args.bands!r}, --masks {getattr(args, 'masks', None)!r}, "
                         f"--images {args.images!r}")
    root = args.src or "."
    paths = tuple(f if os.path.isabs(f) or "://" in f else os.path.join(root, f) for f in folders)
    masks = args.masks if os.path.isabs(args.masks) or "://" in args.masks else os.path.join(root, args.masks)
    if not os.path.exists(masks) and os.path.exists(args.masks):
        masks = args.masks
    return SourceSpec(root=root, sources=(SplitSource(split, paths[0], masks, bands=paths),), classes=args.classes,
                      storage_options=storage_options)


__all__ = ["add_image_arguments", "band_source", "image_kind"]
