"""LabelMe: one ``<name>.json`` per image (``shapes``, ``imagePath``) beside the images.

Found by content: JSON files with ``shapes`` and ``imagePath`` at the top or in split
folders. Shapes (polygon, rectangle, circle, line, linestrip, point; ``mask``: a base64 PNG
over its box) are rasterized as
labelme's own ``utils.shape_to_mask`` draws them on ``PIL.ImageDraw`` (line width 10,
point radius 5); labelme2voc's ``shapes_to_label`` paints them in file order, later on
top. Classes from ``labels.txt`` (``__ignore__`` -> the ignore index, ``_background_`` ->
0, then one class per line), else background + the labels found, sorted.
"""

from __future__ import annotations

import math
import os

import numpy as np

from converter.discover.annotations.base import AnnotationFileError, coordinates, head_bytes, load_json, outside_ok
from converter.discover.annotations.listing import AnnotationSet, Reader, make_sample, split_folders
from converter.discover.files import file_names, is_file, join
from converter.discover.names_files import NamesFileError, read_names
from converter.discover.layout import IMAGE_EXTENSIONS, BadInput
from converter.options import AnnotationOptions
from converter.transform.decode import DecodeError

#: labelme's `shape_to_mask` defaults.
LINE_WIDTH, POINT_SIZE = 10, 5
_POINTS = {"rectangle": 2, "circle": 2, "line": 2, "point": 1, "mask": 2}
IGNORE_LABEL, BACKGROUND_LABEL = "__ignore__", "_background_"


def _is_labelme(path: str) -> bool:
    head = head_bytes(path, 1 << 16)
    return b'"shapes"' in head and (b'"imagePath"' in head or b'"imageHeight"' in head)


def labelme_folders(root: str) -> list[tuple[str, str]]:
    """(split, folder) of folders holding LabelMe JSON files: split folders, else the top."""
    out = []
    for split in split_folders(root):
        folder = join(root, split)
        if any(n.endswith(".json") and _is_labelme(join(folder, n)) for n in file_names(folder)[:50]):
            out.append((split, folder))
    if not out and any(n.endswith(".json") and _is_labelme(join(root, n)) for n in file_names(root)[:50]):
        out.append(("train", root))
    return out


def label_table(root: str) -> dict[str, int | None] | None:
    """labels.txt as labelme2voc reads it: name -> class (None: ignore); None without the file."""
    for folder in (root, os.path.dirname(root.rstrip("/"))):
        path = join(folder, "labels.txt")
        if is_file(path):
            try:
                found = read_names(path)
            except NamesFileError as e:
                raise AnnotationFileError(path, str(e), "fix labels.txt") from e
            names = [BACKGROUND_LABEL] + [n for n in found.names if n != BACKGROUND_LABEL]
            return {**{n: None for n in found.ignore_names}, **{n: i for i, n in enumerate(names)}}
    return None


def shape_mask(kind: str, xy: list[tuple[float, float]], height: int, width: int) -> np.ndarray:
    """labelme's ``shape_to_mask``: the shape drawn with value 1 on a mode-L image."""
    from PIL import Image, ImageDraw

    image = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(image)
    if kind == "circle":
        (cx, cy), (px, py) = xy
        d = math.sqrt((cx - px) ** 2 + (cy - py) ** 2)
        draw.ellipse([cx - d, cy - d, cx + d, cy + d], outline=1, fill=1)
    elif kind == "rectangle":
        (x0, y0), (x1, y1) = xy
        draw.rectangle([min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)], outline=1, fill=1)
    elif kind in ("line", "linestrip"):
        draw.line(xy=xy, fill=1, width=LINE_WIDTH)
    elif kind == "point":
        cx, cy = xy[0]
        r = POINT_SIZE
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], outline=1, fill=1)
    else:
        draw.polygon(xy=xy, outline=1, fill=1)
    return np.asarray(image, dtype=bool)


class LabelMe(Reader):
    name = "labelme"
    title = "LabelMe JSON"
    overlap_rule = "file order of `shapes`, later on top (labelme2voc's shapes_to_label)"

    def detect(self, root: str) -> str | None:
        folders = labelme_folders(root)
        return ("LabelMe JSON files in " + ", ".join((os.path.relpath(f, root) + "/").replace("./", "") or "./"
                                                     for _, f in folders)) if folders else None

    def read(self, root: str, options: AnnotationOptions) -> AnnotationSet:
        table = label_table(root)
        out = AnnotationSet([], [], (), self.detect(root) or "")
        rows = []
        for split, folder in labelme_folders(root):
            out.splits.append(split)
            for name in sorted(n for n in file_names(folder) if n.endswith(".json")):
                path = join(folder, name)
                doc = load_json(path)
                if not isinstance(doc, dict) or not isinstance(doc.get("shapes"), list):
                    continue  # another JSON beside the images
                image = self._image(folder, name, doc)
                if image is None:
                    out.bad.append(BadInput(path, "no image for this LabelMe file (imagePath "
                                            f"{doc.get('imagePath')!r})", "put the image beside it",
                                            f"{split}/{name}", "missing_image"))
                    continue
                size = [doc["imageHeight"], doc["imageWidth"]] if all(
                    isinstance(doc.get(k), int) for k in ("imageHeight", "imageWidth")) else None
                rows.append((split, folder, image, path, size, self._shapes(doc, path, out)))
        labels = sorted({s["label"] for *_, shapes in rows for s in shapes} - {IGNORE_LABEL, BACKGROUND_LABEL})
        if table is None:
            table = {IGNORE_LABEL: None, BACKGROUND_LABEL: 0, **{n: i + 1 for i, n in enumerate(labels)}}
            out.notes.append("no labels.txt: background + the labels found, sorted")
        out.class_names = tuple(n for n, v in sorted(((n, v) for n, v in table.items() if v is not None),
                                                     key=lambda kv: kv[1]))
        for split, folder, image, path, size, shapes in rows:
            doc = {"ignore": out.ignore, "overlap": options.overlap.value, "size": size, "shapes": []}
            for s in shapes:
                if size is not None and not outside_ok(s["xy"], size):
                    out.problems["shapes reaching outside the image (clipped)"] += 1
                if s["label"] not in table:
                    raise AnnotationFileError(path, f"label {s['label']!r} is not in labels.txt",
                                              "add it to labels.txt (or fix the label)", f"shape {s['n']}")
                value = table[s["label"]]
                doc["shapes"].append({"kind": s["kind"], "xy": s["xy"], "v": out.ignore if value is None else value,
                                      **({"mask": s["mask"]} if "mask" in s else {})})
                out.shapes[s["label"]] += 1
            rel = os.path.relpath(image, folder).replace(os.sep, "/")
            out.samples.append(make_sample(split, f"{split}/{rel}", image, self.name, path, "", doc))
        return out

    @staticmethod
    def _image(folder: str, name: str, doc: dict) -> str | None:
        given = doc.get("imagePath")
        if isinstance(given, str) and given:
            path = join(folder, given.replace("\\", "/"))
            path = path if "://" in path else os.path.normpath(path)
            if is_file(path):
                return path
        stem = os.path.splitext(name)[0]
        for ext in sorted(IMAGE_EXTENSIONS):
            if is_file(join(folder, stem + ext)):
                return join(folder, stem + ext)
        return None

    @staticmethod
    def _shapes(doc: dict, path: str, out: AnnotationSet) -> list[dict]:
        shapes = []
        for n, s in enumerate(doc["shapes"]):
            where = f"shape {n}"
            if not isinstance(s, dict) or not isinstance(s.get("label"), str):
                raise AnnotationFileError(path, "a shape needs a 'label'", "fix the file", where)
            kind = s.get("shape_type") or "polygon"
            if kind not in ("polygon", "rectangle", "circle", "line", "linestrip", "point", "mask"):
                out.problems[f"{kind} shapes (not supported; skipped)"] += 1
                continue
            pts = s.get("points")
            xy = coordinates([v for p in pts for v in p] if isinstance(pts, list) and all(
                isinstance(p, list) and len(p) == 2 for p in pts) else [pts], path, where)
            want = _POINTS.get(kind)
            if (want is not None and len(xy) != 2 * want) or (kind == "polygon" and len(xy) < 6) or not xy:
                out.problems[f"{kind} shapes with a wrong number of points (skipped)"] += 1
                continue
            shape = {"label": s["label"], "kind": kind, "xy": xy, "n": n}
            if kind == "mask":
                if not isinstance(s.get("mask"), str):
                    raise AnnotationFileError(path, "a mask shape needs its base64 PNG 'mask'", "fix the file", where)
                shape["mask"] = s["mask"]
            shapes.append(shape)
        return shapes

    def shapes(self, doc: dict, height: int, width: int, where: str):
        for s in doc["shapes"]:
            if s["kind"] == "mask":
                yield embedded_mask(s["mask"], s["xy"], height, width, where), int(s["v"])
                continue
            xy = list(zip(s["xy"][0::2], s["xy"][1::2]))
            yield shape_mask(s["kind"], xy, height, width), int(s["v"])


def embedded_mask(b64: str, xy: list[float], height: int, width: int, where: str) -> np.ndarray:
    """labelme's ``mask`` shape: a base64 PNG over its box, whose top-left corner is the first point
    (labelme crops ``mask[ymin:ymax + 1, xmin:xmax + 1]``); clipped to the image."""
    import base64
    import binascii
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(base64.b64decode(b64, validate=True))) as im:
            if im.width > width or im.height > height:  # a crop of the image: never decode more than it
                raise DecodeError(where, "bad_annotation", f"a mask shape's PNG is {im.width}x{im.height}, larger "
                                  f"than its image ({width}x{height})", "fix or remove the shape")
            box = np.asarray(im.convert("L")) > 0
    except DecodeError:
        raise
    except Image.DecompressionBombError as e:
        raise DecodeError(where, "bad_annotation", f"a mask shape's PNG declares more pixels than Pillow "
                          f"decodes ({e})", "fix or remove the shape") from e
    except (binascii.Error, OSError, ValueError) as e:
        raise DecodeError(where, "bad_annotation", f"a mask shape's PNG cannot be decoded: {e}",
                          "fix or remove the shape") from e
    out = np.zeros((height, width), bool)
    x0, y0 = int(xy[0]), int(xy[1])
    top, left = max(y0, 0), max(x0, 0)
    part = box[top - y0:height - y0, left - x0:width - x0]
    out[top:top + part.shape[0], left:left + part.shape[1]] = part
    return out


__all__ = ["LabelMe", "label_table", "labelme_folders", "shape_mask"]
