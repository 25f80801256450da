"""CVAT for images 1.1 XML (``annotations.xml``): ``<polygon>``, ``<box>`` and ``<mask>`` per ``<image>``.

Found by content: an ``.xml`` at the top whose root is ``<annotations>`` with ``<image>``
elements. Images are below ``images/`` (or ``images/<subset>/``, or beside the XML);
the split is the image's ``subset`` (``default``: train). Classes: background + the
``<meta>`` labels in order (else the labels found, sorted). Polygons and boxes are
rasterized as CVAT's mask export (Datumaro) does, with pycocotools (a box as its
4-corner polygon); a ``<mask>`` is an RLE over its box ``left top width height``: run
lengths alternating from background, row by row. Drawn by ``z_order``, then document
order (later on top), as CVAT's own mask export. ``<tag>``, ``<polyline>`` and
``<points>`` carry no area: counted by scan, not drawn. CVAT's "COCO 1.0" export is a
COCO JSON (masks as ``iscrowd`` RLE): see `coco`.
"""

from __future__ import annotations

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

_DRAWN = ("polygon", "box", "mask")


def cvat_files(root: str) -> list[str]:
    out = []
    for name in file_names(root):
        if name.lower().endswith(".xml"):
            path = join(root, name)
            head = head_bytes(path, 4096)
            if b"<annotations" in head and (b"<version>1.1" in head or b"<meta" in head or b"<image " in head):
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
            outside = sum(1 for s in shapes if "xy" in s and not outside_ok(s["xy"], (h, w)))
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
        shapes = []
        for order, el in enumerate(im):
            if el.tag not in _DRAWN:
                out.problems[f"<{el.tag}> elements (no area; not drawn)"] += 1
                continue
            label = el.get("label")
            if label not in value:
                raise AnnotationFileError(path, f"label {label!r} is not among the task's labels {list(value)[1:]}",
                                          "add the label or fix the shape", where)
            z = int(_number(el, "z_order", path, where)) if el.get("z_order") is not None else 0
            shape = {"kind": el.tag, "v": value[label], "z": z, "n": order}
            if el.tag == "polygon":
                xy = coordinates([v for p in (el.get("points") or "").split(";") if p for v in p.split(",")],
                                 path, where)
                if len(xy) < 6:
                    out.problems["polygons with fewer than 3 points (dropped)"] += 1
                    continue
                shape["xy"] = xy
            elif el.tag == "box":
                shape["xy"] = [_number(el, a, path, where) for a in ("xtl", "ytl", "xbr", "ybr")]
            else:
                box = [int(_number(el, a, path, where)) for a in ("left", "top", "width", "height")]
                runs = coordinates((el.get("rle") or "").split(","), path, where, 1 << 40)
                if box[2] <= 0 or box[3] <= 0 or any(r < 0 for r in runs) or sum(runs) > box[2] * box[3]:
                    raise AnnotationFileError(path, f"mask RLE covers {sum(runs):,.0f} pixels, past its "
                                              f"{box[2]}x{box[3]} box (or a negative run)", "re-export", where)
                shape.update(box=box, runs=[int(r) for r in runs])
            shapes.append(shape)
            out.shapes[label] += 1
        shapes.sort(key=lambda s: (s["z"], s["n"]))
        return shapes

    def shapes(self, doc: dict, height: int, width: int, where: str):
        for s in doc["shapes"]:
            if s["kind"] == "mask":
                yield mask_from_box_rle(s["runs"], s["box"], height, width, where), int(s["v"])
                continue
            mask = pycocotools_mask()
            xy = s["xy"]
            if s["kind"] == "box":
                x0, y0, x1, y1 = xy
                xy = [x0, y0, x1, y0, x1, y1, x0, y1]
            rle = mask.frPyObjects([xy], height, width)[0]
            yield mask.decode(rle).astype(bool), int(s["v"])


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


__all__ = ["Cvat", "cvat_files", "mask_from_box_rle"]
