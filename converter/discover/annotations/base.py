"""What every annotation reader shares: the per-sample `Annotation`, its fingerprint,
the named errors, bounded reading of annotation files, and the canvas shapes are
painted on (the overlap rules).

A reader lists samples whose `SourceSample.annotation` is an `Annotation`: the
format's name, the annotation file, the sample's id in it and its own shapes in
canonical form (sorted-key JSON, with the class values and rules already resolved).
The canonical bytes are the sample's fingerprint: rewriting a COCO file to add
images leaves the other samples' bytes, and so their fingerprints, unchanged.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable, NamedTuple

import numpy as np
import xxhash

from converter.discover.files import files_for, read_head, relative
from readers.files import NotRegularFileError
from converter.options import Overlap
from converter.transform.decode import DecodeError
from readers.manifest import SourceFingerprint

#: Annotation files above this size are refused (a JSON file is parsed whole: about 10x
#: its size in memory). COCO train2017's instances file is 448 MB.
MAX_ANNOTATION_FILE_BYTES = 1 << 30
#: Coordinates beyond this many pixels from the image are refused (a damaged or hostile file).
MAX_COORDINATE = 1 << 20


class AnnotationFileError(ValueError):
    """An annotation file cannot be used: the file, the annotation, the reason, the fix (exit 65)."""

    exit_code = 65

    def __init__(self, path: str, reason: str, fix: str = "", where: str = "") -> None:
        at = f" ({where})" if where else ""
        super().__init__(f"{path}{at}: {reason}" + (f". {fix[:1].upper()}{fix[1:]}." if fix else ""))
        self.path, self.reason, self.fix, self.where = path, reason, fix, where


class Annotation(NamedTuple):
    """One sample's annotations: picklable, small, compared by its canonical bytes."""

    format: str  # the reader's name (`converter.discover.annotations.registry.READERS`)
    source: str  # the annotation file (or folder) it comes from
    ident: str  # the sample's id in it ("" for a file per image)
    payload: bytes  # canonical JSON: {"shapes": [...], "ignore": V, "overlap": ..., ...}

    @property
    def digest(self) -> str:
        return "xxh3_128:" + xxhash.xxh3_128_hexdigest(self.payload)

    @property
    def stat(self) -> tuple[int, int]:
        """(size, stamp) the planner compares like a file's (size, mtime_ns): equal iff the bytes are."""
        return len(self.payload), xxhash.xxh3_64_intdigest(self.payload) >> 1

    @property
    def where(self) -> str:
        return f"{self.source}#{self.ident}" if self.ident else self.source

    def fingerprint(self, base: str) -> SourceFingerprint:
        rel = relative(self.source, base)
        rel = self.source if rel.startswith("..") else rel
        size, stamp = self.stat
        return SourceFingerprint(f"{rel}#{self.ident}" if self.ident else rel, size, stamp, self.digest)


def canonical(doc: dict) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def annotation_state(annotation: Annotation, old: SourceFingerprint | None) -> tuple[str, SourceFingerprint | None]:
    """The planner's comparison of a sample's annotations with what was converted: 'same' or 'changed'."""
    if old is not None and old.digest == annotation.digest:
        return "same", old
    return "changed", None


def read_annotation_file(path: str) -> bytes:
    """The bytes of an annotation file, refused above `MAX_ANNOTATION_FILE_BYTES` (bounded memory)."""
    fs = files_for(path)
    try:
        size, _ = fs.stat(path)
    except NotRegularFileError as e:
        raise AnnotationFileError(path, "cannot read the annotation file: not a regular file (a folder, FIFO, socket "
                                  "or device)", "put the exported annotation file itself there") from e
    except OSError as e:
        raise AnnotationFileError(path, f"cannot read the annotation file: {e.strerror or e}",
                                  "check that it exists and is readable") from e
    if size > MAX_ANNOTATION_FILE_BYTES:
        raise AnnotationFileError(
            path, f"annotation file of {size:,} bytes, above the limit of {MAX_ANNOTATION_FILE_BYTES:,} bytes "
            "(it is parsed whole, about 10x its size in memory)", "split it into one file per split or per "
            "image range (COCO: one JSON per split)")
    try:
        return fs.read(path)[0]
    except OSError as e:
        raise AnnotationFileError(path, f"cannot read the annotation file: {e.strerror or e}",
                                  "check its permissions") from e


def head_bytes(path: str, size: int) -> bytes:
    """The first `size` bytes of a file (detection peeks; b"" when unreadable). An object: one
    ranged GET (`converter.discover.files.read_head`), never the whole object."""
    try:
        return read_head(path, size)
    except OSError:
        return b""


def load_json(path: str, data: bytes | None = None) -> Any:
    """A parsed JSON annotation file; invalid JSON (or NaN / Infinity) is a named error."""
    data = read_annotation_file(path) if data is None else data

    def refuse(value: str) -> float:
        raise ValueError(f"{value} is not a number JSON allows")

    try:
        return json.loads(data.decode("utf-8-sig"), parse_constant=refuse)
    except UnicodeDecodeError as e:
        raise AnnotationFileError(path, f"not UTF-8 text ({e})", "save it as UTF-8 JSON") from e
    except ValueError as e:
        raise AnnotationFileError(path, f"invalid JSON: {e}", "re-export it from the annotation tool") from e


def coordinates(values: Any, path: str, where: str, limit: float = MAX_COORDINATE) -> list[float]:
    """Finite numbers within +-`limit` (a flat list), else a named error (NaN fails every comparison)."""
    try:
        out = [float(v) for v in values]
    except (TypeError, ValueError) as e:
        raise AnnotationFileError(path, f"coordinates are not numbers: {str(values)[:80]}",
                                  "fix or remove the annotation", where) from e
    if not all(-limit <= v <= limit for v in out):
        bad = next(v for v in out if not -limit <= v <= limit)
        raise AnnotationFileError(path, f"coordinate {bad} is not finite or beyond {limit:g} pixels",
                                  "fix or remove the annotation", where)
    return out


def outside_ok(xy: list[float], size: tuple[int, int]) -> bool:
    """Whether flat x, y coordinates stay within a (height, width) image (its border included)."""
    h, w = size
    return min(xy[0::2]) >= 0 and max(xy[0::2]) <= w and min(xy[1::2]) >= 0 and max(xy[1::2]) <= h


def ignore_value(num_classes: int) -> int:
    """The value annotations paint for "ignore": 255 below 256 classes, else 65535 (the ignore index)."""
    return 255 if num_classes <= 255 else 65535


class Canvas:
    """A class map at the source image's size, painted shape by shape under an `Overlap` rule.

    `overlap` counts pixels painted again with another value (what scan reports)."""

    def __init__(self, height: int, width: int, rule: Overlap, ignore: int) -> None:
        self.values = np.zeros((height, width), np.uint8 if ignore <= 255 else np.uint16)
        self.painted = np.zeros((height, width), bool)
        self.rule, self.ignore = rule, ignore
        self.overlap = 0

    def paint(self, mask: np.ndarray, value: int) -> None:
        clash = mask & self.painted & (self.values != value)
        if clash.any():
            self.overlap += int(np.count_nonzero(clash))
            if self.rule is Overlap.FIRST:
                mask = mask & ~self.painted
            elif self.rule is Overlap.IGNORE:
                self.values[clash] = self.ignore
                mask = mask & ~clash
        self.values[mask] = value
        self.painted |= mask


def paint_all(height: int, width: int, doc: dict, shapes: Iterable[tuple[np.ndarray, int]]) -> Canvas:
    """A `Canvas` with every (bool mask, value) painted in order."""
    canvas = Canvas(height, width, Overlap.parse(doc.get("overlap", "tool")), int(doc["ignore"]))
    for mask, value in shapes:
        canvas.paint(mask, value)
    return canvas


def check_size(doc: dict, height: int, width: int, where: str) -> None:
    """A `DecodeError` when the annotation declares another image size than the image has."""
    size = doc.get("size")
    if size is not None and (int(size[0]), int(size[1])) != (height, width):
        raise DecodeError(where, "size_mismatch", f"the annotation is for a {size[1]}x{size[0]} image but the image "
                          f"is {width}x{height}", "re-export the annotations for these images")


Rasterizer = Callable[[dict, int, int, str], Iterable[tuple[np.ndarray, int]]]

__all__ = ["MAX_ANNOTATION_FILE_BYTES", "Annotation", "AnnotationFileError", "Canvas", "annotation_state", "head_bytes",
           "canonical", "check_size", "coordinates", "ignore_value", "load_json", "outside_ok", "paint_all",
           "read_annotation_file"]
