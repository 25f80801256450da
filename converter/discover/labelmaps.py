"""Class tables of index masks and label maps: files people have, and the built-in ones.

* names file: one class name per line, line i = class id i (labelme's ``class_names.txt``,
  mmseg/DeepLab name lists);
* ``id,name`` CSV: class ids and names (ids need not be sorted; missing ids become
  ``class_<id>``);
* label map CSV: ``source_id,target_id`` (many-to-one) or ``source_id,name`` (the class
  ids are the names in order of first appearance); unlisted source ids go to the ignore
  index;
* built-in: the Pascal VOC classes and colour map, and the official Cityscapes table
  (34 label ids -> 19 train ids, the rest ignored; ``createTrainIdLabelImgs.py``).
"""

from __future__ import annotations

import csv
import io
import os

from converter.discover.files import read_bytes
from readers.files import NotRegularFileError
from readers.manifest import ClassInfo

VOC_CLASSES = ("background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair",
               "cow", "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa",
               "train", "tvmonitor")

#: Cityscapes labels (cityscapesScripts/helpers/labels.py): label id -> (name, train id or None).
CITYSCAPES_LABELS = (
    (0, "unlabeled", None), (1, "ego vehicle", None), (2, "rectification border", None), (3, "out of roi", None),
    (4, "static", None), (5, "dynamic", None), (6, "ground", None), (7, "road", 0), (8, "sidewalk", 1),
    (9, "parking", None), (10, "rail track", None), (11, "building", 2), (12, "wall", 3), (13, "fence", 4),
    (14, "guard rail", None), (15, "bridge", None), (16, "tunnel", None), (17, "pole", 5), (18, "polegroup", None),
    (19, "traffic light", 6), (20, "traffic sign", 7), (21, "vegetation", 8), (22, "terrain", 9), (23, "sky", 10),
    (24, "person", 11), (25, "rider", 12), (26, "car", 13), (27, "truck", 14), (28, "bus", 15),
    (29, "caravan", None), (30, "trailer", None), (31, "train", 16), (32, "motorcycle", 17), (33, "bicycle", 18),
)
#: Colours of the 19 Cityscapes train ids (the official visualisation colours).
CITYSCAPES_COLORS = ((128, 64, 128), (244, 35, 232), (70, 70, 70), (102, 102, 156), (190, 153, 153),
                     (153, 153, 153), (250, 170, 30), (220, 220, 0), (107, 142, 35), (152, 251, 152),
                     (70, 130, 180), (220, 20, 60), (255, 0, 0), (0, 0, 142), (0, 0, 70), (0, 60, 100),
                     (0, 80, 100), (0, 0, 230), (119, 11, 32))
BUILTIN_LABEL_MAPS = ("cityscapes",)


class LabelFileError(ValueError):
    """A names file, id,name CSV or label map is malformed."""


def voc_color(i: int) -> tuple[int, int, int]:
    """Colour of class i in the Pascal VOC colour map (bit-interleaved; also labelme's and imgviz's)."""
    r = g = b = 0
    c = i
    for j in range(8):
        r |= ((c >> 0) & 1) << (7 - j)
        g |= ((c >> 1) & 1) << (7 - j)
        b |= ((c >> 2) & 1) << (7 - j)
        c >>= 3
    return r, g, b


def voc_palette_bytes(n: int = 256) -> bytes:
    """R, G, B bytes of the first `n` VOC colours (a P image's palette)."""
    return bytes(v for i in range(n) for v in voc_color(i))


def index_classes(names: list[str]) -> tuple[ClassInfo, ...]:
    """Classes of an index table, coloured with the VOC colour map (so previews are never black)."""
    return tuple(ClassInfo(name, voc_color(i % 256) if i < 256 else voc_color(i % 255 + 1)) for i, name in enumerate(names))


def cityscapes_map() -> tuple[tuple[tuple[int, int], ...], tuple[ClassInfo, ...]]:
    """(label id -> train id pairs, the 19 train-id classes)."""
    pairs = tuple((lid, tid) for lid, _, tid in CITYSCAPES_LABELS if tid is not None)
    names = [name for _, name, tid in sorted((x for x in CITYSCAPES_LABELS if x[2] is not None), key=lambda x: x[2])]
    return pairs, tuple(ClassInfo(n, c) for n, c in zip(names, CITYSCAPES_COLORS))


def read_text(path: str, what: str, error: type[ValueError] = LabelFileError) -> str:
    """The UTF-8 text of the small file `path` (a label map, class table or names file), or
    `error` naming `what`, the file and the fix (FileNotFoundError when it is missing)."""
    try:
        raw = read_bytes(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} not found: {path}") from None
    except NotRegularFileError as e:
        raise error(f"{what} {path}: {e}. Give a regular text file.") from e
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise error(f"{path} is not UTF-8 text ({e}). Save it as UTF-8.") from e


def _rows(path: str, what: str) -> list[tuple[int, list[str]]]:
    text = read_text(path, what)
    rows = [(i + 1, [c.strip() for c in r]) for i, r in enumerate(csv.reader(io.StringIO(text), skipinitialspace=True))]
    return [(n, r) for n, r in rows if any(r) and not r[0].startswith("#")]


def is_colour_table(path: str) -> bool:
    """True when `path` is a class_dict.csv (a header with name, r, g, b columns)."""
    try:
        rows = _rows(path, "class table")
    except (FileNotFoundError, LabelFileError):
        return False
    return bool(rows) and {"name", "r", "g", "b"} <= {h.lower() for h in rows[0][1]}


def is_id_name_csv(path: str) -> bool:
    """True when `path` is an ``id,name`` CSV (a header with id and name columns)."""
    try:
        rows = _rows(path, "class table")
    except (FileNotFoundError, LabelFileError):
        return False
    return bool(rows) and {"id", "name"} <= {h.lower() for h in rows[0][1]}


def _int(value: str, path: str, lineno: int, column: str) -> int:
    try:
        v = int(value)
    except ValueError:
        raise LabelFileError(f"{path}, line {lineno}: {column} must be an integer. Received: {value!r}") from None
    if v < 0:
        raise LabelFileError(f"{path}, line {lineno}: {column} must be >= 0. Received: {v}")
    return v


def load_index_names(path: str | os.PathLike) -> list[str]:
    """Class names of an index table: a names file (line i = id i) or an ``id,name`` CSV."""
    path = os.fspath(path)
    rows = _rows(path, "class table")
    if not rows:
        raise LabelFileError(f"{path} is empty. Expected one class name per line, or an id,name CSV.")
    header = [h.lower() for h in rows[0][1]]
    if "id" in header and "name" in header:
        i_id, i_name = header.index("id"), header.index("name")
        by_id: dict[int, str] = {}
        for lineno, row in rows[1:]:
            if len(row) <= max(i_id, i_name):
                raise LabelFileError(f"{path}, line {lineno}: expected the columns id,name. Received: {row!r}")
            cid = _int(row[i_id], path, lineno, "id")
            if cid in by_id:
                raise LabelFileError(f"{path}, line {lineno}: id {cid} is listed twice.")
            by_id[cid] = row[i_name] or f"class_{cid}"
        if not by_id:
            raise LabelFileError(f"{path} has a header but no classes.")
        return [by_id.get(i, f"class_{i}") for i in range(max(by_id) + 1)]
    text = read_text(path, "class table")
    names = [line.strip() for line in text.splitlines()]
    while names and not names[-1]:
        names.pop()
    if any(not n for n in names):
        raise LabelFileError(f"{path}, line {names.index('') + 1}: empty class name (line i is class id i).")
    return names


def load_label_map(path: str | os.PathLike) -> tuple[tuple[tuple[int, int], ...], list[str] | None]:
    """(source id -> class id pairs, class names or None) of a label map CSV.

    ``source_id,target_id``: ids as given (names come from elsewhere); ``source_id,name``:
    class ids in order of first appearance of each name. A header line is optional.
    """
    path = os.fspath(path)
    rows = _rows(path, "label map")
    if rows and not rows[0][1][0].lstrip("-").isdigit():
        rows = rows[1:]  # header
    if not rows:
        raise LabelFileError(f"{path} lists no mapping. Expected lines 'source_id,target_id' or 'source_id,name'.")
    pairs: list[tuple[int, int]] = []
    names: list[str] = []
    by_name = all(len(r) >= 2 and not r[1].lstrip("-").isdigit() for _, r in rows)
    seen: set[int] = set()
    for lineno, row in rows:
        if len(row) < 2:
            raise LabelFileError(f"{path}, line {lineno}: expected 'source_id,target'. Received: {','.join(row)!r}")
        src = _int(row[0], path, lineno, "source_id")
        if src in seen:
            raise LabelFileError(f"{path}, line {lineno}: source id {src} is mapped twice.")
        seen.add(src)
        if by_name:
            if row[1] not in names:
                names.append(row[1])
            pairs.append((src, names.index(row[1])))
        else:
            pairs.append((src, _int(row[1], path, lineno, "target_id")))
    return tuple(pairs), (names if by_name else None)
