"""Pair images with masks by name: suffix patterns, mirrored sub-folders, other extensions.

An image ``<dir>/<base><image_suffix>.<ext>`` pairs with the mask
``<dir>/<base><mask_suffix>.<ext2>`` below the mask folder (``<dir>`` mirrored, e.g.
Cityscapes cities; any image extension on either side, e.g. ``.tif`` image, ``.gif``
mask). Without suffixes a mask is ``<stem>_L`` (CamVid) or ``<stem>``. When the names
differ by a constant token (``21_training`` / ``21_manual1``, ``ISIC_0000000`` /
``ISIC_0000000_segmentation``), `infer_suffixes` finds it. Files that are not images
(labelme's ``.npy`` next to its PNG masks, JSON polygons) are skipped.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

from converter.discover.files import exists, is_dir, read_bytes
from converter.discover.layout import MASK_SUFFIXES, BadInput, SourceLayoutError, list_images
from converter.discover.samplelist import SampleBlock

_SEPARATORS = "_-. "


@dataclass
class Pairing:
    """Samples and problems of one image folder / mask folder pair."""

    samples: SampleBlock  # the pairs, by relative names
    bad: list[BadInput] = field(default_factory=list)
    unpaired_images: int = 0  # images without a mask that are not an error (VOC: JPEGImages holds more)
    images_found: set[str] = field(default_factory=set)  # bases ('<dir>/<base>') that have an image


def name_stem(rel: str) -> str:
    """`os.path.splitext(rel)[0]` for a '/'-separated name, without its per-call overhead
    (discovery takes several stems per file of millions)."""
    i, j = rel.rfind("."), rel.rfind("/")
    if i > j + 1 and rel[j + 1] != ".":
        return rel[:i]
    return os.path.splitext(rel)[0]


def _split_name(rel: str, suffix: str | None, prefix: str = "") -> tuple[str, str] | None:
    """('<dir>/<base>', rel) with the suffix (and prefix) removed; None when the name lacks them."""
    stem = name_stem(rel)
    if prefix:
        base = _base_of(stem, suffix or "", prefix)
        return None if base is None else (base, rel)
    if suffix:
        if not stem.endswith(suffix):
            return None
        stem = stem[: -len(suffix)]
    return stem, rel


def _base_of(stem: str, suffix: str, prefix: str = "") -> str | None:
    """`stem` without its file-name `prefix` and `suffix`; None when it lacks them or nothing is left."""
    if prefix:
        d, sep, name = stem.rpartition("/")
        if not name.startswith(prefix) or len(name) <= len(prefix) + len(suffix or ""):
            return None
        stem = d + sep + name[len(prefix):]
    return stem[: len(stem) - len(suffix)] if suffix and stem.endswith(suffix) else (stem if not suffix else None)


def infer_suffixes(image_stems: list[str], mask_stems: list[str]) -> tuple[str, str] | None:
    """The (image suffix, mask suffix) that pairs most names, when names differ by a constant token.

    Looks at the names of both folders: for each image name, the mask names sharing its
    longest prefix (cut back to a separator) give a candidate pair of suffixes; the
    candidate that pairs the most images wins. None when plain names already pair.
    """
    images = [os.path.basename(s) for s in image_stems[:200]]
    masks = sorted(os.path.basename(s) for s in mask_stems)
    if not images or not masks:
        return None
    mask_set = set(masks)
    if sum(1 for s in images if s in mask_set or s + "_L" in mask_set) * 2 >= len(images):
        return None
    votes: Counter = Counter()
    import bisect

    for stem in images[:50]:
        i = bisect.bisect_left(masks, stem)
        for m in masks[max(0, i - 2): i + 2]:
            k = len(os.path.commonprefix([stem, m]))
            while k > 0 and stem[k - 1] not in _SEPARATORS and k < min(len(stem), len(m)):
                k -= 1
            while k > 0 and stem[k - 1] in _SEPARATORS:
                k -= 1
            if k == 0:
                continue
            votes[(stem[k:], m[k:])] += 1
    for (isuf, msuf), _ in votes.most_common(5):
        bases = {b for b in (_base_of(s, isuf) for s in images) if b is not None}
        mbases = {b for b in (_base_of(m, msuf) for m in masks) if b is not None}
        if bases and len(bases & mbases) * 2 >= len(images):
            return isuf, msuf
    return None


def check_masks_folder(masks_dir: str, images_dir: str, images: int) -> None:
    """A mask folder that is a file is one named error, not "image without mask" per image."""
    if exists(masks_dir) and not is_dir(masks_dir):
        raise SourceLayoutError(
            f"{masks_dir} is a file, not a folder of masks, so none of the {images} image(s) in {images_dir} "
            f"has a mask. Replace it with a folder holding the masks (<stem>_L.png or <stem>.png).")


def pair_by_name(images_dir: str, masks_dir: str, split: str, key_prefix: str, *,
                 image_suffix: str | None = None, mask_suffix: str | None = None,
                 only: set[str] | None = None, list_file: str | None = None,
                 masks_drive: bool = False, report_missing: bool = True,
                 listed: tuple[list[str], list[str]] | None = None,
                 image_prefix: str = "", mask_prefix: str = "") -> Pairing:
    """Pair every image below `images_dir` with its mask below `masks_dir` (see the module docstring).

    `only`: bases ('<dir>/<base>') to keep (a split list; a listed name without an image
    or a mask is a bad input naming `list_file`). `masks_drive`: images without a mask
    are not errors (counted in `unpaired_images`). `listed`: (images, masks) as `list_images`
    gives them, when the caller listed the folders already.
    """
    image_list, mask_list = listed if listed is not None else (list_images(images_dir), None)
    flat: list[str] = []  # image, mask, ... relative names of the pairs
    out = Pairing(SampleBlock(split, key_prefix, images_dir, masks_dir, []))
    images = {}
    for rel in image_list:
        split_ = _split_name(rel, image_suffix, image_prefix)
        if split_ is not None:
            images.setdefault(split_[0], split_[1])
    check_masks_folder(masks_dir, images_dir, len(images))
    masks: dict[str, str] = {}
    del image_list
    if mask_list is None:
        mask_list = list_images(masks_dir) if is_dir(masks_dir) else []
    for rel in mask_list:  # one pass: the first mask of a base, but "<stem>_L" (CamVid) wins over "<stem>"
        stem = name_stem(rel)
        if mask_suffix is not None or mask_prefix:
            base = _base_of(stem, mask_suffix or "", mask_prefix)
            if base is not None:
                masks.setdefault(base, rel)
            continue
        masks.setdefault(stem, rel)
        for suffix in MASK_SUFFIXES:
            if suffix and stem.endswith(suffix):
                masks[stem[: -len(suffix)]] = rel
    wanted = sorted(images) if only is None else sorted(only)
    for base in wanted:
        rel = images.get(base)
        if rel is None:
            if not report_missing:
                continue
            out.bad.append(BadInput(os.path.join(images_dir, base), f"listed in {list_file} but no image found",
                                    f"add the image to {images_dir} or remove the line", f"{key_prefix}{base}",
                                    "missing_image"))
            continue
        if only is not None:
            out.images_found.add(base)
        mrel = masks.get(base)
        if mrel is None:
            if masks_drive and only is None:
                out.unpaired_images += 1
                continue
            key, image_path = f"{key_prefix}{rel}", os.path.join(images_dir, rel)
            d, sep, name = base.rpartition("/")
            expect = f"{d}{sep}{mask_prefix}{name}{mask_suffix if mask_suffix is not None else '_L'}.png"
            out.bad.append(BadInput(image_path, "image without mask",
                                    f"expected {os.path.join(masks_dir, expect)}"
                                    + ("" if mask_suffix is not None else f" or {base}.png") + f" in {masks_dir}",
                                    key, "missing_mask"))
            continue
        flat += (rel, mrel)
    del mask_list, wanted
    out.samples = SampleBlock(split, key_prefix, images_dir, masks_dir, flat)
    del flat
    if only is None:
        reported: set[str] = set()
        for base in sorted(masks):
            rel = masks[base]
            if base in images or rel in reported or _mask_used(rel, masks, images, mask_suffix, mask_prefix):
                continue
            out.bad.append(BadInput(os.path.join(masks_dir, rel), "mask without image",
                                    f"add the image to {images_dir} or remove the mask", None, "missing_image"))
            reported.add(rel)
    return out


def _mask_used(rel: str, masks: dict[str, str], images: dict[str, str], mask_suffix: str | None,
               mask_prefix: str = "") -> bool:
    """Whether an image took the mask `rel`: one of the bases its name gives (the names
    `pair_by_name` files it under) has an image and maps to it. No set of the used masks."""
    stem = name_stem(rel)
    if mask_suffix is not None or mask_prefix:
        base = _base_of(stem, mask_suffix or "", mask_prefix)
        bases = [] if base is None else [base]
    else:
        bases = [stem] + [stem[: -len(s)] for s in MASK_SUFFIXES if s and stem.endswith(s)]
    return any(b in images and masks.get(b) == rel for b in bases)


def read_split_list(path: str) -> list[str]:
    """Names of a split list file: one per line (VOC ImageSets, mmseg splits/, train.txt);
    an extension or a second column (VOC's ``name 1``) is dropped."""
    try:
        lines = read_bytes(path).decode("utf-8-sig").splitlines()
    except FileNotFoundError:
        raise FileNotFoundError(f"--split-list: file not found: {path}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"--split-list {path} is not UTF-8 text ({e}). Save it as UTF-8.") from e
    names = []
    for line in lines:
        word = line.strip().split()[0] if line.strip() else ""
        if word and not word.startswith("#"):
            stem = os.path.splitext(word)[0] if os.path.splitext(word)[1].lower() in (
                ".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".gif") else word
            names.append(stem.replace(os.sep, "/"))
    return names
