"""EXIF orientation for segmentation: decided from evidence, never silently.

A phone stores a portrait photo as landscape pixels with an EXIF Orientation tag (6: turn
90 degrees clockwise to view it). Whether its mask was drawn on the picture as a viewer
shows it (apply the tag to the image) or on the stored pixels (ignore the tag) decides
whether image and mask line up. Sizes are the evidence (`--exif auto`, the default):

* the mask matches the *displayed* size and not the stored one: the tag is applied;
* the mask matches the stored size and not the displayed one: the tag is ignored;
* both match (a square image turned 90 degrees, or a tag that only flips or turns 180
  degrees): the sizes cannot tell, so the sample is a bad input of kind ``exif_ambiguous``
  until ``--exif apply`` or ``--exif ignore`` says which (`scan` lists it the same way);
* neither matches: ``size_mismatch``, naming the orientation too.

``--exif apply`` / ``--exif ignore`` decide for every sample (a mask of the other size is a
``size_mismatch``). The choice is an output option, recorded in the manifest's options
(``exif``; absent means ``auto``). Classification always applies the tag (photos, no mask).
"""

from __future__ import annotations

import io

import numpy as np

from converter.options import ExifMode
from converter.transform.decode import DecodeError, SourceFile

_ORIENTATION_TAG = 0x0112
#: Orientations that swap width and height (transpose, 90 and 270 degree turns).
_SWAPS = frozenset({5, 6, 7, 8})
_NAMES = {2: "mirrored", 3: "turned 180 degrees", 4: "flipped upside down", 5: "mirrored and turned 90 degrees",
          6: "turned 90 degrees clockwise", 7: "mirrored and turned 90 degrees", 8: "turned 90 degrees anticlockwise"}


def orientation_of(src: SourceFile) -> int:
    """The EXIF Orientation tag (1-8) of an image file; 1 where there is none or it cannot be read
    (only the header is parsed: nothing is decoded)."""
    data = src.data
    if data.startswith(b"\x89PNG") and b"eXIf" not in data:
        return 1  # the common case for PNG sources: no Pillow at all
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            value = im.getexif().get(_ORIENTATION_TAG, 1)
    except Exception:  # noqa: BLE001 - a damaged header is the decoder's to name; no tag here
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def orient(image: np.ndarray, orientation: int) -> np.ndarray:
    """`image` (H, W[, C]) as a viewer shows it under EXIF `orientation` (Pillow's `exif_transpose`)."""
    ops = {
        2: lambda a: a[:, ::-1],
        3: lambda a: a[::-1, ::-1],
        4: lambda a: a[::-1],
        5: lambda a: a.swapaxes(0, 1),
        6: lambda a: np.rot90(a, -1),
        7: lambda a: a.swapaxes(0, 1)[::-1, ::-1],
        8: lambda a: np.rot90(a, 1),
    }
    op = ops.get(orientation)
    return image if op is None else np.ascontiguousarray(op(image))


def apply_orientation(mode: ExifMode, orientation: int, stored_hw: tuple[int, int], mask_hw: tuple[int, int],
                      image_path: str, mask_path: str) -> bool:
    """Whether to apply `orientation` to the image whose mask is `mask_hw` (see the module
    docstring). Raises `DecodeError` (``exif_ambiguous`` or ``size_mismatch``) naming the files."""
    shown_hw = stored_hw[::-1] if orientation in _SWAPS else stored_hw
    if orientation == 1 or mode is ExifMode.IGNORE:
        apply = False
    elif mode is ExifMode.APPLY:
        apply = True
    elif mask_hw == shown_hw and mask_hw != stored_hw:
        apply = True
    elif mask_hw == stored_hw and mask_hw != shown_hw:
        apply = False
    elif mask_hw == stored_hw:
        raise DecodeError(
            image_path, "exif_ambiguous",
            f"its EXIF orientation is {orientation} ({_NAMES[orientation]}) and its mask {mask_path} fits the image "
            "both as stored and as shown, so the sizes cannot tell which the mask was drawn on",
            "look at the pair, then pass --exif apply (drawn on the image as viewers show it) or --exif ignore "
            "(drawn on the stored pixels)",
        )
    else:
        apply = False
    target = shown_hw if apply else stored_hw
    if mask_hw != target:
        note = (f"; the image's EXIF orientation is {orientation} ({_NAMES[orientation]}), shown as "
                f"{shown_hw[1]}x{shown_hw[0]}, --exif {mode.value}" if orientation != 1 else "")
        raise DecodeError(mask_path, "size_mismatch",
                          f"mask is {mask_hw[1]}x{mask_hw[0]} but its image {image_path} is "
                          f"{stored_hw[1]}x{stored_hw[0]}{note}", "masks must have the same size as their images")
    return apply
