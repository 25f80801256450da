"""Classification datasets in class folders (the Keras ``image_dataset_from_directory`` layout).

Supported layouts:

* split layout: ``SRC/{train,val,...}/<class>/*`` -- one folder per well-known split
  name, each holding one folder per class;
* flat layout: ``SRC/<class>/*`` -- no split level; every sample goes to ``train``,
  or, with ``val_fraction`` F, to ``val`` when the hash of its key falls below F (a
  sample's split depends on its key alone, so incremental runs keep assignments);
* explicit folder: ``--images DIR`` (no ``--masks``) with ``DIR/<class>/*``, all in
  ``--split``.

Class names are the class folder names sorted (Keras's convention), over all splits
together, so a class missing from one split does not shift the labels of the others.
Files below a class folder are found recursively (as Keras does); any extension that
Pillow opens is accepted, whatever its case. Like `converter.discover.layout`, this
module only lists files; problems are returned as `BadInput`s.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os

from converter.discover.content import ContentTie, find_by_content
from converter.discover.files import absolute, exists, file_names, is_dir, is_file, source_scope
from converter.discover.layout import (
    IMAGE_EXTENSIONS,
    LABELS_SUFFIX,
    WELL_KNOWN_SPLITS,
    BadInput,
    SourceLayoutError,
    is_utf8_name,
    shown_path,
    Discovery,
    SourceSample,
    stat_file,
    list_images,
)
from converter.discover.annotations.registry import detect_annotations
from converter.discover.layouts import mask_dirs_below
from converter.discover.layouts import subdirs as _subdirs
from converter.options import SourceSpec, Task
from readers.manifest import ClassInfo

log = logging.getLogger(__name__)

#: Split of the flat layout without --val-fraction, and of the samples hashed out of it.
FLAT_SPLIT = "train"
VAL_SPLIT = "val"

#: Top-level folder names that mean "this is a segmentation dataset" (mask folders).
_MASK_FOLDER_HINTS = ("mask", "label", "annot", "segment", "groundtruth", "ground_truth")
_MASK_FOLDER_NAMES = frozenset({"gt", "gts"})

#: Pillow formats registered with an extension but that cannot decode pixels without
#: extra software (stubs) or are not images: never treated as image files.
_NOT_IMAGE_EXTENSIONS = frozenset({".bufr", ".grib", ".h5", ".hdf", ".emf", ".wmf", ".eps", ".ps", ".mpeg", ".mpg"})


@functools.lru_cache(maxsize=1)
def image_extensions() -> frozenset[str]:
    """Lower-case extensions of every format Pillow can open (plus the usual ones)."""
    from PIL import Image

    Image.init()
    opened = {ext.lower() for ext, fmt in Image.registered_extensions().items() if fmt in Image.OPEN}
    return frozenset((opened | IMAGE_EXTENSIONS) - _NOT_IMAGE_EXTENSIONS)


def _is_image(name: str) -> bool:
    return not name.startswith(".") and os.path.splitext(name)[1].lower() in image_extensions()


def _direct_images(folder: str) -> list[str]:
    return [n for n in file_names(folder) if _is_image(n) and is_file(os.path.join(folder, n))]


def _walk_images(folder: str) -> list[str]:
    """Image files below `folder` with any extension Pillow opens (see `layout.list_images`)."""
    return list_images(folder, accept=_is_image)


def _looks_like_mask_folder(name: str) -> bool:
    low = name.lower()
    return low in _MASK_FOLDER_NAMES or any(h in low for h in _MASK_FOLDER_HINTS)


def classification_layout(root: str) -> str | None:
    """"split" or "flat" when `root` looks like a class-folder dataset, else None.

    Never when a folder at any depth looks like masks (``label``, ``masks``, ``ann_dir``,
    ``gtFine``, ``SegmentationClass``, ``*_labels``, ...; `layouts.mask_dirs_below`): an
    image folder next to a mask folder is segmentation, not two classes.
    """
    if not is_dir(root) or exists(os.path.join(root, "class_dict.csv")):
        return None
    if mask_dirs_below(root) or detect_annotations(root):  # images beside annotation files: never classes
        return None
    dirs = _subdirs(root)
    if not dirs or any(d.endswith(LABELS_SUFFIX) or _looks_like_mask_folder(d) for d in dirs):
        return None
    splits = [d for d in dirs if d in WELL_KNOWN_SPLITS]
    if splits:
        ok = any(_subdirs(os.path.join(root, s)) and not _direct_images(os.path.join(root, s)) for s in splits)
        classes = {c for s in splits for c in _subdirs(os.path.join(root, s))}
        return "split" if ok and len(classes) > 1 else None  # one class is never a classification dataset
    if sum(1 for d in dirs if _direct_images(os.path.join(root, d))) > 1:
        return "flat"
    return None


def detect_task(spec: SourceSpec) -> Task:
    """The task the sources look like: classification for class folders, else segmentation.

    Classification when: ``--images`` is given without ``--masks``; or SRC holds split
    folders (train, val, ...) that hold class folders, or holds class folders of
    images directly, with no mask folder (``*_labels``, ``masks``, ...) and no
    class_dict.csv. Everything else is segmentation (whose discovery then explains
    what it expected).
    """
    if spec.sources:
        return Task.SEGMENTATION
    if spec.images is not None:
        return Task.SEGMENTATION if spec.masks is not None else Task.CLASSIFICATION
    if spec.layout is not None:
        return Task.CLASSIFICATION if spec.layout == "classfolders" else Task.SEGMENTATION
    if spec.classes is not None:
        return Task.SEGMENTATION
    spec.use_storage()
    with source_scope():
        root = absolute(spec.root)  # type: ignore[arg-type]
        if not classification_layout(root):
            return Task.SEGMENTATION
        return Task.SEGMENTATION if _pairs_by_content(root) else Task.CLASSIFICATION


def _pairs_by_content(root: str) -> bool:
    """Whether image and mask folders pair by content (`converter.discover.content`), however named."""
    try:
        return find_by_content(root) is not None
    except ContentTie:
        return True  # segmentation: its discovery names the choices


def val_hash_fraction(key: str) -> float:
    """A number in [0, 1) that depends on `key` only (first 8 bytes of its sha256)."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / float(1 << 64)


def assign_split(key: str, val_fraction: float | None) -> str:
    """`VAL_SPLIT` for a stable `val_fraction` share of keys, else `FLAT_SPLIT`."""
    if val_fraction is not None and val_hash_fraction(key) < val_fraction:
        return VAL_SPLIT
    return FLAT_SPLIT


def _class_samples(class_root: str, classes: list[str], key_prefix: str, split_of, bad: list[BadInput]) -> list[SourceSample]:
    """Samples of the class folders of `class_root` (labels from `classes`)."""
    label_of = {name: i for i, name in enumerate(classes)}
    samples: list[SourceSample] = []
    for stray in _direct_images(class_root):
        path = os.path.join(class_root, stray)
        bad.append(BadInput(path, "image outside a class folder",
                            f"move it into {class_root}/<class name>/ or remove it", None, "no_class"))
    for name in _subdirs(class_root):
        folder = os.path.join(class_root, name)
        for rel in _walk_images(folder):
            key = f"{key_prefix}{name}/{rel}"
            samples.append(SourceSample(split_of(key), key, os.path.join(folder, rel), None, label_of[name]))
    return samples


def _finish(samples: list[SourceSample], bad: list[BadInput], splits: list[str]) -> Discovery:
    # zero bytes, dangling links, link loops, FIFOs: listed as bad inputs, never opened;
    # the one stat per source is kept for incremental runs
    kept = []
    for s in samples:
        image_stat, problem = stat_file(s.image, s.key)
        if problem is not None:
            bad.append(problem)
        else:
            kept.append(s._replace(image_stat=image_stat))
    return Discovery(tuple(kept), tuple(bad), tuple(splits), None)


def _check_classes(classes: list[str], where: str) -> tuple[ClassInfo, ...]:
    if not classes:
        raise FileNotFoundError(
            f"No class folders found in {where}. Expected the Keras layout {where}/<class name>/<images> "
            "(one folder per class)."
        )
    if len(classes) > 65534:
        raise ValueError(f"{where} has {len(classes)} class folders; at most 65534 classes are supported.")
    odd = [shown_path(name) for name in classes if not is_utf8_name(name)]
    if odd:  # a class name is stored in the manifest: it must be text
        raise SourceLayoutError(
            f"{shown_path(where)}: class folder name(s) {', '.join(odd[:5])} are not valid UTF-8 (odd bytes shown as "
            "\\xNN), and a class folder's name is its class name in the dataset. Rename them to UTF-8 (for example "
            f"`convmv -f latin1 -t utf8 --notest -r FOLDER`). Received: {len(odd)} folder(s)"
        )
    return tuple(ClassInfo(name, None) for name in classes)


def discover_classification(spec: SourceSpec, val_fraction: float | None = None) -> tuple[Discovery, tuple[ClassInfo, ...]]:
    """List the samples (with labels) and the classes of a class-folder dataset (a bucket's: one listing)."""
    spec.use_storage()
    with source_scope():
        return _discover_classification(spec, val_fraction)


def _discover_classification(spec: SourceSpec, val_fraction: float | None) -> tuple[Discovery, tuple[ClassInfo, ...]]:
    bad: list[BadInput] = []
    if spec.classes is not None:
        raise ValueError("--classes (a class_dict.csv) is for segmentation; classification takes its classes from "
                         f"the class folder names. Received: --classes {spec.classes!r}")
    if spec.images is not None:
        if spec.masks is not None:
            raise ValueError(f"--task classification reads class folders; --masks does not apply. "
                             f"Received: --masks {spec.masks!r}")
        if val_fraction is not None:
            raise ValueError("--val-fraction needs the flat layout given as SRC (SRC/<class>/*), not --images. "
                             f"Received: --images {spec.images!r} --val-fraction {val_fraction}")
        folder = absolute(spec.images)
        if not is_dir(folder):
            raise FileNotFoundError(f"--images folder not found: {folder}")
        names = _subdirs(folder)
        classes = _check_classes(names, folder)
        samples = _class_samples(folder, names, f"{spec.split}/", lambda _key: spec.split, bad)
        _warn_empty(classes, samples)
        return _finish(samples, bad, [spec.split]), classes

    root = absolute(spec.root)  # type: ignore[arg-type]
    if not is_dir(root):
        raise FileNotFoundError(f"Source folder not found: {root}. Pass the folder that holds the class folders.")
    dirs = _subdirs(root)
    split_dirs = [d for d in dirs if d in WELL_KNOWN_SPLITS]
    if any(_subdirs(os.path.join(root, d)) for d in split_dirs):
        others = [d for d in dirs if d not in split_dirs]
        if others:
            raise ValueError(
                f"{root} holds split folders {split_dirs} and also folders {others}, which are not split names "
                f"({', '.join(WELL_KNOWN_SPLITS)}). Move the class folders into a split folder "
                f"({root}/train/<class>/), or remove the extra folders."
            )
        if val_fraction is not None:
            raise ValueError(
                f"--val-fraction applies to the flat layout SRC/<class>/*, but {root} already has split folders "
                f"{split_dirs}. Received: --val-fraction {val_fraction}"
            )
        names = sorted({c for s in split_dirs for c in _subdirs(os.path.join(root, s))})
        classes = _check_classes(names, root)
        samples: list[SourceSample] = []
        for split in split_dirs:
            samples += _class_samples(os.path.join(root, split), names, f"{split}/", lambda _key, s=split: s, bad)
        _warn_empty(classes, samples)
        return _finish(samples, bad, split_dirs), classes

    classes = _check_classes(dirs, root)
    samples = _class_samples(root, dirs, "", lambda key: assign_split(key, val_fraction), bad)
    _warn_empty(classes, samples)
    splits = [FLAT_SPLIT] + ([VAL_SPLIT] if val_fraction is not None else [])
    return _finish(samples, bad, splits), classes


def _warn_empty(classes: tuple[ClassInfo, ...], samples: list[SourceSample]) -> None:
    seen = {s.label for s in samples}
    for i, c in enumerate(classes):
        if i not in seen:
            log.warning("class folder %r holds no image; it is still class %d (Keras counts it too)", c.name, i)
