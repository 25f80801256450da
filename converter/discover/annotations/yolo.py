"""YOLO segmentation labels (Ultralytics, Roboflow "YOLOv8"): ``cls x1 y1 x2 y2 ...`` per line,
normalised polygon coordinates, one ``.txt`` per image.

Found by content: a ``labels`` folder (``{split}/labels/``, ``labels/{split}/`` or ``labels/``)
whose lines have an odd count of numbers (the class, then x y pairs). The image of
``.../labels/<name>.txt`` is ``.../images/<name>.<ext>``; an image without a label file
has no objects. Class k becomes class k + 1 (0 = background), named from ``data.yaml``
(``names:`` a list or a dict) or ``classes.txt``. The detection-box form (every line
``cls cx cy w h``) is refused by name. Rasterized as Ultralytics' ``polygon2mask`` does
(points scaled to pixels, truncated to int32, ``cv2.fillPoly``); file order, later on top.
"""

from __future__ import annotations

import os

import numpy as np

from converter.discover.annotations.base import AnnotationFileError, coordinates, read_annotation_file
from converter.discover.annotations.listing import (AnnotationSet, Reader, images_by_stem, make_sample,
                                                    split_folders)
from converter.discover.files import file_names, is_dir, is_file, join, subfolders
from converter.discover.names_files import NamesFileError, read_names
from converter.discover.layout import BadInput
from converter.options import AnnotationOptions
from converter.transform.decode import DecodeError

#: Label files read to decide the form (segmentation polygons or detection boxes).
_PEEK_FILES = 20


def label_folders(root: str) -> list[tuple[str, str, str]]:
    """(split, images folder, labels folder) of the YOLO layouts in `root`."""
    out = []
    for split in split_folders(root):  # Roboflow: {split}/images + {split}/labels
        base = join(root, split)
        if is_dir(join(base, "labels")) and is_dir(join(base, "images")):
            out.append((split, join(base, "images"), join(base, "labels")))
    if is_dir(join(root, "labels")) and is_dir(join(root, "images")):  # Ultralytics: labels/{split}
        splits = [s for s in subfolders(join(root, "labels")) if is_dir(join(root, "images", s))]
        out += [(s, join(root, "images", s), join(root, "labels", s)) for s in splits] or [
            ("train", join(root, "images"), join(root, "labels"))]
    return out


def _lines(path: str) -> list[list[str]]:
    try:
        text = read_annotation_file(path).decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise AnnotationFileError(path, f"not UTF-8 text ({e})", "re-export the labels") from e
    return [line.split() for line in text.splitlines() if line.strip()]


def _label_files(labels: str) -> list[str]:
    return sorted(n for n in file_names(labels) if n.endswith(".txt") and n != "classes.txt")


def _form(folders: list[tuple[str, str, str]]) -> str | None:
    """'seg', 'boxes' or None from the first label files: odd counts of numbers, more than 5 is a polygon."""
    seen = 0
    boxes = False
    for _, _, labels in folders:
        for name in _label_files(labels)[:_PEEK_FILES]:
            for parts in _lines(join(labels, name)):
                if len(parts) % 2 == 0:
                    return None
                if len(parts) > 5:
                    return "seg"
                boxes = boxes or len(parts) == 5
                seen += 1
    return "boxes" if boxes and seen else None


def class_names(root: str) -> list[str] | None:
    """Names from ``data.yaml`` (a list, or a dict of index -> name) or ``classes.txt`` at the top
    or one folder up (`converter.discover.names_files`); None when absent."""
    for folder in (root, os.path.dirname(root.rstrip("/"))):
        for name in ("data.yaml", "data.yml", "dataset.yaml", "classes.txt"):
            if is_file(join(folder, name)):
                try:
                    return list(read_names(join(folder, name)).names)
                except NamesFileError as e:
                    raise AnnotationFileError(join(folder, name), str(e), "fix the names file") from e
    return None


class Yolo(Reader):
    name = "yolo"
    title = "YOLO segmentation (Ultralytics)"

    def detect(self, root: str) -> str | None:
        folders = label_folders(root)
        if not folders:
            return None
        form = _form(folders)
        if form == "boxes":
            raise AnnotationFileError(
                folders[0][2], "YOLO detection labels (every line is `class cx cy w h`, a box), not segmentation "
                "polygons", "export the dataset as YOLO segmentation (Roboflow: YOLOv8 segmentation; Ultralytics: "
                "`cls x1 y1 x2 y2 ...` lines)")
        if form is None:
            return None
        return "YOLO segmentation labels " + ", ".join(os.path.relpath(f[2], root) + "/" for f in folders)

    def read(self, root: str, options: AnnotationOptions) -> AnnotationSet:
        folders = label_folders(root)
        names = class_names(root)
        out = AnnotationSet([], [], (), self.detect(root) or "")
        found_max = -1
        rows = []
        for split, images, labels in folders:
            if split not in out.splits:
                out.splits.append(split)
            imgs = images_by_stem(images)
            label_names = set(_label_files(labels))
            for stem, rel in sorted(imgs.items(), key=lambda kv: kv[1]):
                path = join(labels, stem + ".txt")
                polys = self._polygons(path, out) if stem + ".txt" in label_names or is_file(path) else []
                label_names.discard(stem + ".txt")
                found_max = max([found_max] + [c for c, _ in polys])
                rows.append((split, rel, join(images, rel), path, polys))
            out.bad += [BadInput(join(labels, n), "label file without image", f"add its image to {images}",
                                 None, "missing_image") for n in sorted(label_names) if "/" not in n]
        if names is None:
            names = [f"class_{k}" for k in range(found_max + 1)]
            out.notes.append("no data.yaml or classes.txt: classes named class_0..")
        elif found_max >= len(names):
            raise AnnotationFileError(next(p for *_, p, polys in rows if any(c >= len(names) for c, _ in polys)),
                                      f"class {found_max} but data.yaml names {len(names)} classes",
                                      "fix the label or add the class to names:")
        out.class_names = ("background",) + tuple(names)
        for split, rel, image, path, polys in rows:
            for c, _ in polys:
                out.shapes[out.class_names[c + 1]] += 1
            doc = {"ignore": out.ignore, "overlap": options.overlap.value,
                   "shapes": [{"v": c + 1, "xy": xy} for c, xy in polys]}
            out.samples.append(make_sample(split, f"{split}/{rel}", image, self.name, path, "", doc))
        return out

    @staticmethod
    def _polygons(path: str, out: AnnotationSet) -> list[tuple[int, list[float]]]:
        polys = []
        for n, parts in enumerate(_lines(path), 1):
            where = f"line {n}"
            try:
                c = int(parts[0])
            except ValueError as e:
                raise AnnotationFileError(path, f"class {parts[0]!r} is not an integer", "fix the line", where) from e
            if c < 0:
                raise AnnotationFileError(path, f"class {c} is negative", "fix the line", where)
            xy = coordinates(parts[1:], path, where, 1e3)
            if len(xy) % 2:
                raise AnnotationFileError(path, f"{len(xy)} coordinates, not x y pairs", "fix the line", where)
            if len(xy) < 6:
                out.problems["polygons with fewer than 3 points (dropped; a box line?)"] += 1
                continue
            if min(xy) < 0 or max(xy) > 1:
                out.problems["polygons reaching outside the image (clipped)"] += 1
            polys.append((c, xy))
        return polys

    def shapes(self, doc: dict, height: int, width: int, where: str):
        try:
            import cv2
        except ImportError as e:
            raise DecodeError(where, "missing_dependency", "YOLO polygons are rasterized with OpenCV, as Ultralytics "
                              "does, and it is not installed", "pip install 'imgshard[yolo]'") from e
        for s in doc["shapes"]:
            pts = np.asarray(s["xy"], np.float64).reshape(-1, 2) * (width, height)
            mask = np.zeros((height, width), np.uint8)
            cv2.fillPoly(mask, [np.asarray(pts, dtype=np.int32)], color=1)
            yield mask.astype(bool), int(s["v"])


__all__ = ["Yolo", "class_names", "label_folders"]
