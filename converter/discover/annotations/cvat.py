"""CVAT for images 1.1 XML (``annotations.xml``): ``<polygon>``, ``<box>``, ``<ellipse>`` and ``<mask>`` per ``<image>``.

Found by content: an ``.xml`` at the top whose root is ``<annotations>`` with ``<image>``
elements. Images are below ``images/`` (or ``images/<subset>/``, or beside the XML);
the split is the image's ``subset`` (``default``: train). Classes: background + the
``<meta>`` labels in order (else the labels found, sorted).

Drawn as CVAT's own "Segmentation mask 1.1" export draws them (``cvat/apps/dataset_manager/
formats/mask.py`` ``_export``: ``GetCVATDataExtractor``, then ``RotatedBoxesToPolygons``,
datumaro's ``polygons_to_masks``, ``boxes_to_masks``, ``merge_instance_segments`` and the
``voc_segmentation`` export's ``CompiledMask.from_instance_masks``), read from the XML as
CVAT's importer reads it (``formats/cvat.py`` ``load_anno``):

* ``<polygon>``: pycocotools ``frPyObjects`` + ``decode``; ``<box>``: its 4 corners the same
  way, or, with a ``rotation`` (degrees), the corners turned about the centre
  (``RotatedBoxesToPolygons``), which then come after the other shapes;
* ``<ellipse cx cy rx ry rotation>``: ``cv2.ellipse`` filled, centre and axes rounded
  (``transformations.EllipsesToMasks``; needs ``opencv-python``);
* ``<mask rle left top width height>``: run lengths alternating from background, row by
  row over a box ``width`` wide from ``left, top`` (``transformations.CVATRleToCOCORle``);
* shapes sharing a ``group_id`` are one instance: their union, with the label and
  ``z_order`` of the largest (``MergeInstanceSegments``, ``find_group_leader``); ungrouped
  shapes come first, then the groups by id;
* painted by ``z_order`` (a stable sort of that order: later on top).

``<tag>``, ``<polyline>``, ``<points>``, ``<skeleton>`` and ``<cuboid>`` carry no area and
CVAT's mask export leaves them out: counted by scan, not drawn. CVAT's "COCO 1.0" export is
a COCO JSON whose masks are ``iscrowd`` RLE (uncompressed, ``counts`` a list): see `coco`.
"""

from __future__ import annotations

import math
import os
import xml.etree.ElementTree as ET

import numpy as np

from converter.discover.annotations.base import (AnnotationFileError, coordinates, head_bytes, outside_ok,
                                                  read_annotation_file)
from converter.discover.annotations.coco import pycocotools_mask
from converter.discover.annotations.listing import AnnotationSet, Reader, make_sample, split_name
from converter.discover.files import file_names, is_file, join
from converter.discover.layout import BadInput
from converter.options import AnnotationOptions
from converter.transform.decode import DecodeError

_DRAWN = ("polygon", "box", "ellipse", "mask")


def cvat_files(root: str) -> list[str]:
    out = []
    for name in file_names(root):
        if name.lower().endswith(".xml"):
            path = join(root, name)
            head = head_bytes(path, 4096)
            if (not head and name.lower() == "annotations.xml") or (  # CVAT's export name, unreadable: _parse says why
                    b"<annotations" in head and (b"<version>1.1" in head or b"<meta" in head or b"<image " in head)):
                out.append(path)
    return out


def _parse(path: str) -> ET.Element:
    try:
        return ET.fromstring(read_annotation_file(path))
    except ET.ParseError as e:
        raise AnnotationFileError(path, f"invalid XML: {e}", "re-export the annotations") from e


def _label_names(root_el: ET.Element) -> list[str]:
    names = []
    for labels in root_el.iter("labels"):
        for label in labels.findall("label"):
            name = label.findtext("name")
            if name is not None and name not in names:
                names.append(name)
    return names


def _number(el: ET.Element, attr: str, path: str, where: str) -> float:
    return coordinates([el.get(attr)], path, where)[0]


class Cvat(Reader):
    name = "cvat"
    title = "CVAT for images 1.1 XML"
    overlap_rule = "z_order, then document order, later on top (CVAT's mask export)"

    def detect(self, root: str) -> str | None:
        files = cvat_files(root)
        return f"CVAT XML {', '.join(os.path.relpath(f, root) for f in files)}" if files else None

    def read(self, root: str, options: AnnotationOptions) -> AnnotationSet:
        out = AnnotationSet([], [], (), self.detect(root) or "")
        for path in cvat_files(root):
            self._read_file(root, path, options, out)
        return out

    def _read_file(self, root: str, path: str, options: AnnotationOptions, out: AnnotationSet) -> None:
        doc = _parse(path)
        images = doc.findall("image")
        names = _label_names(doc) or sorted({el.get("label", "") for im in images for el in im if el.get("label")})
        out.class_names = ("background",) + tuple(n for n in names if n != "background")
        value = {n: i for i, n in enumerate(out.class_names)}
        rows = []
        for im in images:
            where = f"image id {im.get('id')}"
            name = im.get("name") or ""
            h, w = (int(v) for v in coordinates([im.get("height"), im.get("width")], path, where))
            subset = im.get("subset") or "default"
            split = "train" if subset.lower() == "default" else split_name(subset)
            shapes = self._shapes(im, path, where, value, out)
            outside = sum(1 for s in shapes if s["kind"] in ("polygon", "box") and not outside_ok(s["xy"], (h, w)))
            if outside:
                out.problems["shapes reaching outside the image (clipped)"] += outside
            image = self._image(root, os.path.dirname(path), name, subset)
            if image is None:
                out.bad.append(BadInput(join(root, "images", name), f"listed in {path} ({where}) but not found",
                                        "put the images below images/", f"{split}/{name}", "missing_image"))
                continue
            rows.append((split, name, image, im.get("id") or name, h, w, shapes))
        for split, name, image, ident, h, w, shapes in rows:
            if split not in out.splits:
                out.splits.append(split)
            doc_ = {"size": [h, w], "ignore": out.ignore, "overlap": options.overlap.value, "shapes": shapes}
            out.samples.append(make_sample(split, f"{split}/{name}", image, self.name, path, str(ident), doc_))

    @staticmethod
    def _image(root: str, here: str, name: str, subset: str) -> str | None:
        for base in (join(here, "images"), join(here, "images", subset), here, join(root, "images")):
            if is_file(join(base, name)):
                return join(base, name)
        return None

    @staticmethod
    def _shapes(im: ET.Element, path: str, where: str, value: dict, out: AnnotationSet) -> list[dict]:
        """The drawn shapes in CVAT's order before the z sort: rotated boxes moved last (``RotatedBoxesToPolygons``)."""
        shapes = []
        for el in im:
            if el.tag not in _DRAWN:
                out.problems[f"<{el.tag}> elements (no area; not drawn)"] += 1
                continue
            label = el.get("label")
            if label not in value:
                raise AnnotationFileError(path, f"label {label!r} is not among the task's labels {list(value)[1:]}",
                                          "add the label or fix the shape", where)
            shape = _shape(el, path, where)
            if shape is None:
                out.problems["polygons with fewer than 3 points (dropped)"] += 1
                continue
            shape.update(v=value[label], z=int(_number(el, "z_order", path, where)) if el.get("z_order") else 0)
            group = int(_number(el, "group_id", path, where)) if el.get("group_id") else 0
            if group:
                shape["g"] = group
            shapes.append(shape)
            out.shapes[label] += 1
        return [s for s in shapes if not s.get("rot") or s["kind"] != "box"] + \
            [s for s in shapes if s.get("rot") and s["kind"] == "box"]

    def shapes(self, doc: dict, height: int, width: int, where: str):
        """(mask, value) in CVAT's painting order: instances (ungrouped, then groups by id), stable-sorted by z."""
        alone = [(s["z"], [s]) for s in doc["shapes"] if not s.get("g")]
        groups: dict[int, list[dict]] = {}
        for s in doc["shapes"]:
            if s.get("g"):
                groups.setdefault(int(s["g"]), []).append(s)
        merged = [_merge_group(members, height, width, where) for _, members in sorted(groups.items())]
        for z, members in sorted(alone + [(z, [m]) for z, m in merged], key=lambda item: item[0]):
            shape = members[0]
            if shape["kind"] == "merged":
                yield shape["mask"], int(shape["v"])
            else:
                yield shape_mask(shape, height, width, where), int(shape["v"])


def _shape(el: ET.Element, path: str, where: str) -> dict | None:
    """One drawn element as canonical numbers (None: a polygon of fewer than 3 points)."""
    if el.tag == "polygon":
        xy = coordinates([v for p in (el.get("points") or "").split(";") if p for v in p.split(",")], path, where)
        return {"kind": "polygon", "xy": xy} if len(xy) >= 6 else None
    rotation = _number(el, "rotation", path, where) if el.get("rotation") else 0.0
    if el.tag == "box":
        shape = {"kind": "box", "xy": [_number(el, a, path, where) for a in ("xtl", "ytl", "xbr", "ybr")]}
    elif el.tag == "ellipse":
        cx, cy, rx, ry = (_number(el, a, path, where) for a in ("cx", "cy", "rx", "ry"))
        if rx < 0 or ry < 0:
            raise AnnotationFileError(path, f"ellipse radii rx={rx}, ry={ry}: expected >= 0", "re-export", where)
        # CVAT's importer keeps the points cx, cy, cx + rx, cy - ry, each to 2 decimals
        shape = {"kind": "ellipse", "xy": [cx, cy, float(f"{cx + rx:.2f}"), float(f"{cy - ry:.2f}")]}
    else:
        box = [int(_number(el, a, path, where)) for a in ("left", "top", "width", "height")]
        runs = coordinates((el.get("rle") or "").split(","), path, where, 1 << 40)
        if box[2] <= 0 or box[3] <= 0 or any(r < 0 for r in runs) or sum(runs) > box[2] * box[3]:
            raise AnnotationFileError(path, f"mask RLE covers {sum(runs):,.0f} pixels, past its "
                                      f"{box[2]}x{box[3]} box (or a negative run)", "re-export", where)
        return {"kind": "mask", "box": box, "runs": [int(r) for r in runs]}
    if rotation:
        shape["rot"] = rotation
    return shape


def _rotated_box(xy: list[float], degrees: float) -> list[float]:
    """CVAT's ``RotatedBoxesToPolygons``: the 4 corners turned by `degrees` about the box centre."""
    x0, y0, x1, y1 = xy
    angle = math.radians(degrees)
    cx, cy = x0 + (x1 - x0) / 2, y0 + (y1 - y0) / 2
    out = []
    for x, y in ((x0, y0), (x1, y0), (x1, y1), (x0, y1)):
        out += [cx + math.cos(angle) * (x - cx) - math.sin(angle) * (y - cy),
                cy + math.sin(angle) * (x - cx) + math.cos(angle) * (y - cy)]
    return out


def _ellipse(xy: list[float], degrees: float, height: int, width: int, where: str) -> np.ndarray:
    """CVAT's ``EllipsesToMasks``: ``cv2.ellipse`` filled, centre and axes rounded (Python's round)."""
    try:
        import cv2
    except ImportError as e:
        raise DecodeError(where, "bad_annotation", "CVAT ellipses are drawn with OpenCV, which is not installed",
                          "pip install opencv-python-headless (or imgshard[yolo])") from e
    cx, cy, right, top = xy
    canvas = np.zeros((height, width), np.uint8)
    cv2.ellipse(canvas, (round(cx), round(cy)), (round(right - cx), round(cy - top)), degrees, 0, 360, 255,
                thickness=-1)
    return canvas.astype(bool)


def shape_mask(shape: dict, height: int, width: int, where: str) -> np.ndarray:
    """The bool mask of one CVAT shape at the image's size, as CVAT's mask export draws it."""
    if shape["kind"] == "mask":
        return mask_from_box_rle(shape["runs"], shape["box"], height, width, where)
    if shape["kind"] == "ellipse":
        return _ellipse(shape["xy"], float(shape.get("rot", 0.0)), height, width, where)
    xy = shape["xy"]
    if shape["kind"] == "box":
        x0, y0, x1, y1 = xy
        xy = _rotated_box(xy, shape["rot"]) if shape.get("rot") else [x0, y0, x1, y0, x1, y1, x0, y1]
    mask = pycocotools_mask()
    return mask.decode(mask.frPyObjects([xy], height, width)[0]).astype(bool)


def _merge_group(members: list[dict], height: int, width: int, where: str) -> tuple[int, dict]:
    """datumaro's ``MergeInstanceSegments``: one shape alone stays; several become their union, with the
    label and z_order of the largest (the first of equals, ``find_group_leader``)."""
    if len(members) == 1:
        return int(members[0]["z"]), members[0]
    union = np.zeros((height, width), bool)
    leader, most = members[0], -1
    for m in members:
        mask = shape_mask(m, height, width, where)
        area = int(np.count_nonzero(mask))
        if area > most:
            leader, most = m, area
        union |= mask
    return int(leader["z"]), {"kind": "merged", "mask": union, "v": leader["v"]}


def mask_from_box_rle(runs: list[int], box: list[int], height: int, width: int, where: str) -> np.ndarray:
    """CVAT's mask RLE (runs from background, row-major over the box) placed at `box` in the image."""
    left, top, w, h = box
    if left < 0 or top < 0 or left + w > width or top + h > height:
        raise DecodeError(where, "bad_annotation", f"mask box {box} reaches outside the {width}x{height} image",
                          "re-export the annotations")
    flat = np.repeat(np.arange(len(runs)) % 2 == 1, runs)
    inner = np.zeros(w * h, bool)
    inner[:len(flat)] = flat
    out = np.zeros((height, width), bool)
    out[top:top + h, left:left + w] = inner.reshape(h, w)
    return out


__all__ = ["Cvat", "cvat_files", "mask_from_box_rle", "shape_mask"]
