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
from stat import S_ISREG
from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple

from converter.options import SourceSpec

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = frozenset(
    {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm", ".pnm", ".jfif"}
)
MASK_SUFFIXES = ("_L", "")  # CamVid writes <stem>_L.png; many datasets use <stem>.png
LABELS_SUFFIX = "_labels"
WELL_KNOWN_SPLITS = ("train", "val", "valid", "validation", "test")


class SourceSample(NamedTuple):
    """One sample to convert: its key (stable identity), split and files.

    A NamedTuple, not a frozen dataclass: discovery makes one per source pair on every
    run (millions on large datasets), and a tuple is built 5x faster."""

    split: str
    key: str
    image: str  # absolute path
    mask: str | None = None  # absolute path; None for classification
    label: int | None = None  # classification only
    image_stat: tuple[int, int] | None = None  # (size, mtime_ns) from discovery's one stat; None: not taken
    mask_stat: tuple[int, int] | None = None


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


def _scan_dir(path: str, dirs: list[str]) -> Iterator[os.DirEntry]:
    """Yield the image files of one folder as `os.scandir` lists them (nothing kept: a folder of
    millions of files is never held in memory), hidden names skipped, no stat (scandir knows
    the entry types); sub-folders are appended to `dirs`. A folder that cannot be listed is empty."""
    try:
        it = os.scandir(path)
    except OSError:
        return
    with it:
        for e in it:
            name = e.name
            if name[0] == ".":
                continue
            dot = name.rfind(".")  # as os.path.splitext (a leading dot was skipped above)
            if dot > 0 and name[dot:].lower() in IMAGE_EXTENSIONS and not e.is_dir():
                yield e
            elif e.is_dir():
                if not e.is_symlink():  # as os.walk: a linked folder is not descended into
                    dirs.append(name)
            else:
                log.info("skipping %s: not an image file extension", e.path)


def _list_dir(path: str) -> tuple[list[os.DirEntry], list[str]]:
    """(image files, sorted sub-folders) of one folder."""
    dirs: list[str] = []
    files = list(_scan_dir(path, dirs))
    dirs.sort()
    return files, dirs


def _stat_problem(path: str, key: str | None) -> BadInput | None:
    """What `stat` shows is wrong with a source file (missing, not a regular file, empty), or None."""
    try:
        st = os.stat(path)  # follows a symbolic link, as opening the file will
    except FileNotFoundError:
        return BadInput(path, "unreadable: the file (or the target of its symbolic link) does not exist",
                        "fix or remove the broken link", key, "unreadable")
    except OSError as e:
        return BadInput(path, f"unreadable: {e.strerror or e}", "check the file's permissions", key, "unreadable")
    if not S_ISREG(st.st_mode):
        return BadInput(path, "unreadable: not a regular file (a FIFO, socket or device)",
                        "replace it with a real image file", key, "unreadable")
    if st.st_size == 0:
        return BadInput(path, "zero-byte file", "re-copy the file from its origin", key, "empty_file")
    return None


def _masks_without_images(masks_dir: str, images_dir: str, bad: list[BadInput]) -> None:
    """Every image file below `masks_dir` (a mask folder with no image folder) is a stray mask."""
    files, dirs = _list_dir(masks_dir)
    for e in files:
        bad.append(BadInput(e.path, "mask without image",
                            f"add the image to {images_dir} or remove the mask", None, "missing_image"))
    for d in dirs:
        _masks_without_images(os.path.join(masks_dir, d), os.path.join(images_dir, d), bad)


def _mask_names(msk_dir: str, dirs: list[str]) -> dict[str, str]:
    """Mask stem -> file name in one folder (names only: about 200 bytes per mask)."""
    return {e.name[:e.name.rfind(".")]: e.name for e in _scan_dir(msk_dir, dirs)}


def iter_pairs(images_dir: str, masks_dir: str, split: str, key_prefix: str, bad: list[BadInput],
               rel: str = "") -> Iterator[SourceSample]:
    """Stream the image/mask pairs below `images_dir`, one folder at a time, with one `stat` per
    file; problems are appended to `bad`. Memory: the mask names of one folder, nothing per image."""
    img_dir = os.path.join(images_dir, rel) if rel else images_dir
    msk_dir = os.path.join(masks_dir, rel) if rel else masks_dir
    image_dirs: list[str] = []
    mask_dirs: list[str] = []
    masks = _mask_names(msk_dir, mask_dirs)
    claimed: dict[str, str] = {}  # masks whose image was seen move here (two images may share one)
    prefix = f"{key_prefix}{rel}/" if rel else key_prefix
    for e in _scan_dir(img_dir, image_dirs):
        name = e.name
        stem = name[:name.rfind(".")]
        mask_name = None
        for found in (stem + "_L", stem):  # MASK_SUFFIXES
            mask_name = masks.pop(found, None) or claimed.get(found)
            if mask_name is not None:
                claimed[found] = mask_name
                break
        if mask_name is None:
            expect = os.path.join(msk_dir, stem + "_L.png")
            bad.append(BadInput(e.path, "image without mask", f"expected {expect} or {stem}.png in {msk_dir}",
                                prefix + name, "missing_mask"))
            continue
        key = prefix + name
        mask_path = msk_dir + os.sep + mask_name
        try:  # the common case, inline (millions of times per run): two regular, non-empty files
            st, mst = e.stat(), os.stat(mask_path)  # one stat each (follows links, as opening will)
            if st.st_size and mst.st_size and S_ISREG(st.st_mode) and S_ISREG(mst.st_mode):
                yield SourceSample(split, key, e.path, mask_path, None, (st.st_size, st.st_mtime_ns),
                                   (mst.st_size, mst.st_mtime_ns))
                continue
        except OSError:
            pass
        p1, p2 = _stat_problem(e.path, key), _stat_problem(mask_path, key)
        bad.extend(p for p in (p1, p2) if p is not None)  # image and mask both listed when both are bad
    for stem in sorted(masks):  # never claimed
        bad.append(BadInput(os.path.join(msk_dir, masks[stem]), "mask without image",
                            f"add the image to {img_dir} or remove the mask", None, "missing_image"))
    del masks, claimed
    for d in sorted(set(image_dirs) | set(mask_dirs)):
        sub = f"{rel}/{d}" if rel else d
        if d in image_dirs:
            yield from iter_pairs(images_dir, masks_dir, split, key_prefix, bad, sub)
        else:
            _masks_without_images(os.path.join(msk_dir, d), os.path.join(img_dir, d), bad)


def pair_folder(images_dir: str, masks_dir: str, split: str, key_prefix: str) -> tuple[list[SourceSample], list[BadInput]]:
    """Pair every image in `images_dir` with its mask in `masks_dir` (sorted by key)."""
    bad: list[BadInput] = []
    samples = sorted(iter_pairs(images_dir, masks_dir, split, key_prefix, bad), key=lambda s: s.key)
    return samples, bad


def camvid_splits(root: str) -> list[str]:
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
    return splits


@dataclass
class DiscoveryStream:
    """`discover_stream`'s result: `samples` is consumed once; `bad` fills as it is."""

    samples: Iterator[SourceSample]
    bad: list[BadInput]
    splits: tuple[str, ...]
    classes_csv: str | None


def discover_stream(spec: SourceSpec) -> DiscoveryStream:
    """Stream the samples of a `SourceSpec` (segmentation layouts): a folder at a time,
    one `stat` per file, nothing kept (incremental runs over millions of sources)."""
    bad: list[BadInput] = []
    if spec.root is not None:
        root = os.path.abspath(spec.root)
        splits = camvid_splits(root)
        csv_path = spec.classes or os.path.join(root, "class_dict.csv")
        folders = [(os.path.join(root, s), os.path.join(root, s + LABELS_SUFFIX), s) for s in splits]
    else:
        images = os.path.abspath(spec.images)  # type: ignore[arg-type]
        if not os.path.isdir(images):
            raise FileNotFoundError(f"--images folder not found: {images}")
        if spec.masks is None:
            raise ValueError("--images needs --masks DIR for segmentation.")
        masks = os.path.abspath(spec.masks)
        if not os.path.isdir(masks):
            raise FileNotFoundError(f"--masks folder not found: {masks}")
        splits = [spec.split]
        csv_path = spec.classes
        if csv_path is None:
            raise ValueError("--images/--masks needs --classes CSV (a class_dict.csv with name,r,g,b).")
        folders = [(images, masks, spec.split)]
    stream = (s for img, msk, split in folders for s in iter_pairs(img, msk, split, f"{split}/", bad))
    return DiscoveryStream(stream, bad, tuple(splits), csv_path)


def discover(spec: SourceSpec) -> Discovery:
    """List samples (per split, sorted by key) and source problems for a `SourceSpec`."""
    found = discover_stream(spec)
    order = {s: i for i, s in enumerate(found.splits)}
    samples = sorted(found.samples, key=lambda s: (order[s.split], s.key))
    return Discovery(tuple(samples), tuple(found.bad), found.splits, found.classes_csv)
