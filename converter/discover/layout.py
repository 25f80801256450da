"""Find image/mask pairs and their splits in the source folders.

The layouts themselves (CamVid, VOC, Cityscapes, ADE/mmseg, U-Net, explicit folders)
live in `converter.discover.layouts`, which detects them in one place; pairing by
name in `converter.discover.pairing`. This module holds the shared records.

Discovery only lists files; it never decodes. Problems found here (an image without
a mask, a mask without an image, an empty file) are returned as `BadInput`s so that
every problem of a run is collected and reported together.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

from converter.discover.files import files_for, join, relative
from readers.files import NotRegularFileError


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
    mask_stat: tuple[int, int] | None = None  # annotations: (canonical bytes, digest stamp)
    annotation: Any = None  # `converter.discover.annotations.Annotation`: the sample's own shapes (no mask file)
    bands: tuple[str, ...] | None = None  # band folders: the other bands' files (`image` is the first band)


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
class LayoutDefaults:
    """What a layout's masks mean unless options say otherwise (`converter.discover.layouts`)."""

    semantics: Any = None  # MaskSemantics; None: colour with a colour table, else index
    ignore_values: tuple[int, ...] = ()
    reduce_zero_label: bool = False
    label_map: str | None = None  # a built-in map name ("cityscapes")
    class_names: tuple[str, ...] | None = None  # built-in names (VOC)
    names_file: str | None = None  # a names file found in the folder (labelme class_names.txt)
    classes_from: str = ""  # where the classes come from, for people (`converter.discover.evidence`)
    two_level: bool = False  # the masks sampled hold two levels (scan decides binary from all of them)


@dataclass(frozen=True)
class Discovery:
    samples: Sequence[SourceSample]  # a tuple, or a compact `converter.discover.samplelist.SampleList`
    bad: tuple[BadInput, ...]
    splits: tuple[str, ...]
    classes_csv: str | None
    layout: str = "camvid"  # the layout's name (`converter.discover.layouts.LAYOUTS`)
    why: str = ""  # the evidence for it
    defaults: LayoutDefaults = LayoutDefaults()
    suffixes: tuple[str, str] | None = None  # (image, mask) name suffixes found from the names
    unpaired_images: int = 0  # images with no mask that are not errors (VOC's JPEGImages)
    #: (split, images folder, masks folder) of every folder pair listed (`converter.plan.scope`)
    scope: tuple[tuple[str, str, str], ...] = ()
    #: every folder pair as a source spec names it (`converter.options.SplitSource`; `scan --write-spec`)
    sources: tuple = ()


def _is_image_name(name: str) -> bool:
    return not name.startswith(".") and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def list_images(folder: str, accept: Callable[[str], bool] = _is_image_name) -> list[str]:
    """Image files below `folder`, relative, '/'-separated, sorted (recursive, hidden skipped).

    `accept(name)` decides which file names count as images (default: known extensions).
    Local folders are walked, object-store prefixes answered from their one listing
    (`converter.discover.files`).
    """
    out: list[str] = []
    fs = files_for(folder)
    for dirpath, filenames in fs.walk(folder):
        rel_dir = relative(dirpath, folder)
        for name in filenames:
            if accept(name):
                out.append(name if rel_dir == "." or not rel_dir else f"{rel_dir}/{name}")
            elif not name.startswith("."):
                log.info("skipping %s: not an image file extension", join(dirpath, name))
    out.sort()
    return out


def is_utf8_name(path: str) -> bool:
    """Whether `path` is valid UTF-8 (a name that is not comes from `os` with surrogate escapes)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown_path(path: str) -> str:
    """`path` printable whatever its bytes: bytes that are not UTF-8 shown as ``\\xNN``."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def stat_file(path: str, key: str, fs: Any = None) -> tuple[tuple[int, int] | None, BadInput | None]:
    """((size, mtime_ns), None) of a usable source file, or (None, the problem `stat` shows:
    zero bytes, dangling link, not a regular file). On an object store: (size, version
    stamp) from the listing (`converter.discover.files`; `fs`: `files_for(path)` when the
    caller asked it once for a whole folder)."""
    if not is_utf8_name(path):
        return None, BadInput(shown_path(path), "the file name is not valid UTF-8 (its odd bytes are shown as \\xNN), "
                              "so it cannot be a sample key", "rename the file to UTF-8 (for example with "
                              "`convmv -f latin1 -t utf8 --notest FILE`)", shown_path(key), "bad_name")
    try:
        size, stamp = (fs or files_for(path)).stat(path)
    except NotRegularFileError:
        return None, BadInput(path, "unreadable: not a regular file (a FIFO, socket or device)",
                              "replace it with a real image file", key, "unreadable")
    except FileNotFoundError:
        return None, BadInput(path, "unreadable: the file (or the target of its symbolic link) does not exist",
                              "fix or remove the broken link", key, "unreadable")
    except OSError as e:
        return None, BadInput(path, f"unreadable: {e.strerror or e}", "check the file's permissions", key,
                              "unreadable")
    if size == 0:
        return None, BadInput(path, "zero-byte file", "re-copy the file from its origin", key, "empty_file")
    return (size, stamp), None
