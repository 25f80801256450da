"""Find image/mask pairs and their splits in the source folders.

Supported layouts:

* CamVid / Semantic-Segmentation-Suite: ``SRC/{split}/`` images, ``SRC/{split}_labels/``
  masks named ``<stem>_L.png`` or ``<stem>.png``, ``SRC/class_dict.csv``.
* Explicit folders: ``--images DIR --masks DIR [--split NAME] --classes CSV``.

Discovery only lists files; it never decodes. Problems found here (an image without
a mask, a mask without an image, an empty file) are returned as `BadInput`s so that
every problem of a run is collected and reported together.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from typing import Callable

from converter.options import SourceSpec

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = frozenset(
    {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm", ".pnm", ".jfif"}
)
MASK_SUFFIXES = ("_L", "")  # CamVid writes <stem>_L.png; many datasets use <stem>.png
LABELS_SUFFIX = "_labels"
WELL_KNOWN_SPLITS = ("train", "val", "valid", "validation", "test")


@dataclass(frozen=True)
class SourceSample:
    """One sample to convert: its key (stable identity), split and files."""

    split: str
    key: str
    image: str  # absolute path
    mask: str | None = None  # absolute path; None for classification
    label: int | None = None  # classification only


@dataclass(frozen=True)
class BadInput:
    """A source problem: the file, the reason, and how to fix it."""

    path: str
    reason: str
    fix: str = ""
    key: str | None = None
    kind: str = "other"

    def to_json(self) -> dict:
        return {"path": self.path, "kind": self.kind, "reason": self.reason, "fix": self.fix, "key": self.key}

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}" + (f" ({self.fix})" if self.fix else "")


class SourceLayoutError(ValueError):
    """The source folders are laid out wrongly (a mask folder that is a file); exit 65."""

    exit_code = 65


@dataclass(frozen=True)
class Discovery:
    samples: tuple[SourceSample, ...]
    bad: tuple[BadInput, ...]
    splits: tuple[str, ...]
    classes_csv: str | None


def _is_image_name(name: str) -> bool:
    return not name.startswith(".") and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def list_images(folder: str, accept: Callable[[str], bool] = _is_image_name) -> list[str]:
    """Image files below `folder`, relative, '/'-separated, sorted (recursive, hidden skipped).

    `accept(name)` decides which file names count as images (default: known extensions).
    """
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        rel_dir = os.path.relpath(dirpath, folder)
        for name in filenames:
            if accept(name):
                rel = name if rel_dir == "." else os.path.join(rel_dir, name)
                out.append(rel.replace(os.sep, "/"))
            elif not name.startswith("."):
                log.info("skipping %s: not an image file extension", os.path.join(dirpath, name))
    out.sort()
    return out


def _mask_index(masks_dir: str) -> dict[str, str]:
    """Map '<rel dir>/<stem>' -> mask relative path."""
    return {os.path.splitext(rel)[0]: rel for rel in list_images(masks_dir)} if os.path.isdir(masks_dir) else {}


def pair_folder(images_dir: str, masks_dir: str, split: str, key_prefix: str) -> tuple[list[SourceSample], list[BadInput]]:
    """Pair every image in `images_dir` with its mask in `masks_dir`."""
    images = list_images(images_dir)
    _check_masks_folder(masks_dir, images_dir, len(images))
    masks = _mask_index(masks_dir)
    used: set[str] = set()
    samples: list[SourceSample] = []
    bad: list[BadInput] = []
    for rel in images:
        stem = os.path.splitext(rel)[0]
        key = f"{key_prefix}{rel}"
        image_path = os.path.join(images_dir, rel)
        found = None
        for suffix in MASK_SUFFIXES:
            if stem + suffix in masks:
                found = stem + suffix
                break
        if found is None:
            expect = os.path.join(masks_dir, stem + "_L.png")
            bad.append(BadInput(image_path, "image without mask",
                                f"expected {expect} or {stem}.png in {masks_dir}", key, "missing_mask"))
            continue
        used.add(found)
        samples.append(SourceSample(split, key, image_path, os.path.join(masks_dir, masks[found])))
    for stem, rel in sorted(masks.items()):
        if stem in used:
            continue
        bad.append(BadInput(os.path.join(masks_dir, rel), "mask without image",
                            f"add the image to {images_dir} or remove the mask", None, "missing_image"))
    return samples, bad


def _check_masks_folder(masks_dir: str, images_dir: str, images: int) -> None:
    """A mask folder that is a file is one named error, not "image without mask" per image."""
    if os.path.lexists(masks_dir) and not os.path.isdir(masks_dir):
        raise SourceLayoutError(
            f"{masks_dir} is a file, not a folder of masks, so none of the {images} image(s) in {images_dir} "
            f"has a mask. Replace it with a folder holding the masks (<stem>_L.png or <stem>.png).")


def discover_camvid(root: str) -> tuple[list[str], list[SourceSample], list[BadInput]]:
    if not os.path.isdir(root):
        raise FileNotFoundError(f"Source folder not found: {root}. Pass the folder that holds train/, train_labels/ ...")
    entries = sorted(e for e in os.listdir(root) if os.path.isdir(os.path.join(root, e)) and not e.startswith("."))
    splits = [
        e for e in entries
        if not e.endswith(LABELS_SUFFIX) and (e + LABELS_SUFFIX in entries or e in WELL_KNOWN_SPLITS)
    ]
    if not splits:
        raise FileNotFoundError(
            f"No split folders found in {root}. Expected the CamVid layout: {root}/train/ with images and "
            f"{root}/train_labels/ with masks (val and test are optional). Found folders: {entries}. "
            "For other layouts pass --images DIR --masks DIR --classes CSV."
        )
    samples: list[SourceSample] = []
    bad: list[BadInput] = []
    for split in splits:
        s, b = pair_folder(os.path.join(root, split), os.path.join(root, split + LABELS_SUFFIX), split, f"{split}/")
        samples += s
        bad += b
    return splits, samples, bad


def discover(spec: SourceSpec) -> Discovery:
    """List samples and source problems for a `SourceSpec`."""
    if spec.root is not None:
        root = os.path.abspath(spec.root)
        splits, samples, bad = discover_camvid(root)
        csv_path = spec.classes or os.path.join(root, "class_dict.csv")
    else:
        images = os.path.abspath(spec.images)  # type: ignore[arg-type]
        if not os.path.isdir(images):
            raise FileNotFoundError(f"--images folder not found: {images}")
        if spec.masks is None:
            raise ValueError("--images needs --masks DIR for segmentation.")
        masks = os.path.abspath(spec.masks)
        if not os.path.isdir(masks):
            raise FileNotFoundError(f"--masks folder not found: {masks}")
        samples, bad = pair_folder(images, masks, spec.split, f"{spec.split}/")
        splits = [spec.split]
        csv_path = spec.classes
        if csv_path is None:
            raise ValueError("--images/--masks needs --classes CSV (a class_dict.csv with name,r,g,b).")
    kept = []
    for s in samples:
        problems = [p for p in (file_problem(s.image, s.key),
                                file_problem(s.mask, s.key) if s.mask is not None else None) if p is not None]
        if problems:
            bad.extend(problems)  # image and mask both listed when both are bad
        else:
            kept.append(s)
    return Discovery(tuple(kept), tuple(bad), tuple(splits), csv_path)


def file_problem(path: str, key: str) -> BadInput | None:
    """A problem that `stat` alone shows (zero bytes, dangling link, not a regular file), or None."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return BadInput(path, "unreadable: the file (or the target of its symbolic link) does not exist",
                        "fix or remove the broken link", key, "unreadable")
    except OSError as e:
        return BadInput(path, f"unreadable: {e.strerror or e}", "check the file's permissions", key, "unreadable")
    if not stat.S_ISREG(st.st_mode):
        return BadInput(path, "unreadable: not a regular file (a FIFO, socket or device)",
                        "replace it with a real image file", key, "unreadable")
    if st.st_size == 0:
        return BadInput(path, "zero-byte file", "re-copy the file from its origin", key, "empty_file")
    return None
