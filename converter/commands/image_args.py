"""The image-kind flags `convert` and `scan` share: `--image-mode`, `--alpha`,
`--accept-reduction` and `--bands` (`converter.imagekind`)."""

from __future__ import annotations

import argparse

from converter.imagekind import AlphaMode, ImageKind, ImageMode


def add_image_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("image kind (docs/IMAGES.md)")
    g.add_argument("--image-mode", choices=ImageMode.values(), default=ImageMode.AUTO.value,
                   help="auto (default: 16-bit and multi-band images stored as they are, 8-bit as RGB), rgb "
                        "(8-bit RGB), grey (one channel) or keep (dtype and channels as in the files)")
    g.add_argument("--alpha", choices=AlphaMode.values(), default=AlphaMode.DROP.value,
                   help="RGBA images: drop the alpha channel (default) or keep it as a fourth channel")
    g.add_argument("--accept-reduction", action=argparse.BooleanOptionalAction, default=False,
                   help="accept a conversion that loses precision or channels (16 -> 8 bit, bands dropped); "
                        "without it convert refuses such images by name. The manifest records it.")
    g.add_argument("--bands", default=None, metavar="A,B,...",
                   help="band folders, in channel order (one single-band file per band, paired by stem)")


def image_kind(args: argparse.Namespace) -> ImageKind:
    bands = tuple(b.strip() for b in args.bands.split(",")) if getattr(args, "bands", None) else ()
    return ImageKind(mode=args.image_mode, alpha=args.alpha, accept_reduction=bool(args.accept_reduction),
                     bands=bands)


__all__ = ["add_image_arguments", "image_kind"]
