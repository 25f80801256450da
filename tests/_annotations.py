"""Annotation exports written the way the producing tools write them (issue 27), with the
reference class map of each image computed by the reference implementation, never by
imgshard: pycocotools `annToMask`; labelme's `shape_to_mask` rule on `PIL.ImageDraw`
(re-implemented here from labelme/utils/shape.py); ultralytics' `polygon2mask`
(`cv2.fillPoly` on int32 points); a NumPy decoder of the Kaggle RLE written here; CVAT's
mask export step by step from its code (`cvat_reference`: cvat/apps/dataset_manager/formats/mask.py,
transformations.py, bindings.py and datumaro's transforms.py / annotation.py).

Every generator returns an `Export`: its root, and per key the image path and the
expected class map at the source resolution (`expected[key]`), plus the class names.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from converter.testing import synth

IGNORE = 255


@dataclass
class Export:
    root: Path
    names: list[str]
    images: dict[str, Path] = field(default_factory=dict)  # key -> image file
    expected: dict[str, np.ndarray] = field(default_factory=dict)  # key -> class map at the source size
    notes: dict = field(default_factory=dict)

    def splits(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for k in self.images:
            out[k.split("/")[0]] = out.get(k.split("/")[0], 0) + 1
        return out


def rng_for(seed: int, i: int) -> np.random.Generator:
    return np.random.default_rng([seed, i])


def write_image(path: Path, h: int, w: int, rng: np.random.Generator) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(synth.textured_image(h, w, rng)).save(path)


def reference(image: Path, class_map: np.ndarray, size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Pillow: the image RGB + BILINEAR, the class map NEAREST, to (h, w) `size`."""
    h, w = size
    img = np.asarray(Image.open(image).convert("RGB").resize((w, h), Image.Resampling.BILINEAR))
    cls = Image.fromarray(class_map.astype(np.int32), "I").resize((w, h), Image.Resampling.NEAREST)
    return img, np.asarray(cls).astype(np.int64)


# -- COCO -------------------------------------------------------------------------------------------

def _polygon(rng, h: int, w: int, n: int = 6, border: bool = False) -> list[float]:
    cx, cy = rng.uniform(0.2 * w, 0.8 * w), rng.uniform(0.2 * h, 0.8 * h)
    r = rng.uniform(0.15, 0.45) * min(h, w)
    pts = []
    for k in range(n):
        a = 2 * math.pi * k / n + rng.uniform(-0.3, 0.3)
        x, y = cx + r * math.cos(a), cy + r * math.sin(a)
        if border:
            x, y = min(max(x, 0.0), float(w)), min(max(y, 0.0), float(h))
        pts += [round(x, 2), round(y, 2)]
    return pts


def _blob(rng, h: int, w: int) -> np.ndarray:
    """A binary mask with a hole (what polygons cannot say: RLE)."""
    yy, xx = np.mgrid[:h, :w]
    cy, cx = rng.uniform(0.3 * h, 0.7 * h), rng.uniform(0.3 * w, 0.7 * w)
    d = np.hypot(yy - cy, xx - cx)
    return ((d < 0.35 * min(h, w)) & (d > 0.12 * min(h, w))).astype(np.uint8)


def coco_counts(flat: np.ndarray) -> list[int]:
    """Uncompressed COCO RLE counts of a column-major flattened binary mask (runs of 0 first)."""
    counts = [len(list(g)) for _, g in itertools.groupby(flat.tolist())]
    return ([0] + counts) if flat[0] else counts


def compressed_rle(mask: np.ndarray) -> str:
    """pycocotools' compressed RLE string of a binary mask."""
    from pycocotools import mask as mu

    return mu.encode(np.asfortranarray(mask.astype(np.uint8)))["counts"].decode("ascii")


def make_coco(root: Path, seed: int = 0, splits=("train", "valid"), per_split: int = 4, roboflow: bool = True,
              extra_image: bool = False, move_polygon: bool = False) -> Export:
    """Roboflow "COCO Segmentation": ``{split}/_annotations.coco.json`` beside the images, category 0 a
    placeholder naming the dataset, sparse category ids, polygons (multi-part, border-touching),
    uncompressed crowd RLE, compressed RLE with a hole, overlaps, an empty image, shuffled ids."""
    from pycocotools import mask as mu
    from pycocotools.coco import COCO

    cats = [{"id": 0, "name": "shapes-xyz", "supercategory": "none"},
            {"id": 7, "name": "car", "supercategory": "shapes-xyz"},
            {"id": 1, "name": "cat", "supercategory": "shapes-xyz"},
            {"id": 3, "name": "dog", "supercategory": "shapes-xyz"}]
    class_of = {1: 1, 3: 2, 7: 3}
    exp = Export(root, ["background", "cat", "dog", "car"])
    for si, split in enumerate(splits):
        folder = root / split
        images, anns = [], []
        n = per_split + (1 if extra_image and split == splits[0] else 0)
        for i in range(n):
            rng = rng_for(seed + si, i)
            h, w = [(30, 44), (36, 30), (28, 28)][i % 3]
            name = f"img_{i:03d}_jpg.rf.{i * 7919 % 10000:04x}.jpg"
            write_image(folder / name, h, w, rng)
            image_id = 100 - i  # not in file order
            images.append({"id": image_id, "license": 1, "file_name": name, "height": h, "width": w,
                           "date_captured": "2026-01-01T00:00:00+00:00"})
            if i == 1:
                continue  # an empty image: background only
            k = len(anns) * 3 + 11
            polys = [_polygon(rng, h, w)] + ([_polygon(rng, h, w, 4)] if i % 2 == 0 else [])
            if move_polygon and i == 2 and split == splits[0]:
                polys[0] = [v + 1.5 for v in polys[0]]
            anns.append({"id": k, "image_id": image_id, "category_id": 1, "segmentation": polys,
                         "area": 1.0, "bbox": [0, 0, 1, 1], "iscrowd": 0})
            anns.append({"id": k + 1, "image_id": image_id, "category_id": 7,
                         "segmentation": [_polygon(rng, h, w, 5, border=True)], "area": 1.0, "bbox": [0, 0, 1, 1],
                         "iscrowd": 0})
            blob = _blob(rng, h, w)
            rle = mu.encode(np.asfortranarray(blob))
            anns.append({"id": k + 2, "image_id": image_id, "category_id": 3,
                         "segmentation": {"size": [h, w], "counts": rle["counts"].decode("ascii")},
                         "area": 1.0, "bbox": [0, 0, 1, 1], "iscrowd": 0})
            crowd = np.zeros((h, w), np.uint8)
            crowd[: h // 3, w // 2:] = 1
            counts = coco_counts(crowd.flatten(order="F"))
            anns.append({"id": k + 3, "image_id": image_id, "category_id": 1,
                         "segmentation": {"size": [h, w], "counts": counts}, "area": 1.0, "bbox": [0, 0, 1, 1],
                         "iscrowd": 1})
        order = sorted(range(len(anns)), key=lambda j: anns[j]["id"] * 7919 % 1009)  # shuffled, stable as it grows
        doc = {"info": {"description": "shapes"}, "licenses": [], "categories": cats, "images": images,
               "annotations": [anns[j] for j in order]}
        path = folder / "_annotations.coco.json"
        path.write_text(json.dumps(doc))
        (folder / "notes.json").write_text(json.dumps({"images": 3}))  # a decoy JSON
        coco = COCO(str(path))
        for im in images:
            cls = np.zeros((im["height"], im["width"]), np.int64)
            for a in doc["annotations"]:
                if a["image_id"] == im["id"]:
                    m = coco.annToMask(a).astype(bool)
                    cls[m] = IGNORE if a["iscrowd"] else class_of[a["category_id"]]
            key = f"{split}/{im['file_name']}"
            exp.images[key] = folder / im["file_name"]
            exp.expected[key] = cls
    return exp


# -- YOLO (Ultralytics / Roboflow YOLOv8 segmentation) ----------------------------------------------

def ultralytics_mask(h: int, w: int, xy: list[float]) -> np.ndarray:
    """Ultralytics' `polygon2mask` (downsample 1): points scaled to pixels, int32, `cv2.fillPoly`."""
    import cv2

    pts = np.asarray(np.array(xy).reshape(-1, 2) * [w, h], dtype=np.int32)
    mask = np.zeros((h, w), np.uint8)
    cv2.fillPoly(mask, [pts.reshape(1, -1, 2)[0]], color=1)
    return mask.astype(bool)


def make_yolo(root: Path, seed: int = 1, names_as: str = "list", roboflow: bool = True) -> Export:
    """``{split}/images`` + ``{split}/labels`` (Roboflow) or ``images/{split}`` + ``labels/{split}``
    (Ultralytics), ``data.yaml`` names as a list or a dict; an image without a label file."""
    names = ["crack", "hole", "rust"]
    exp = Export(root, ["background"] + names)
    root.mkdir(parents=True, exist_ok=True)
    listed = "\n".join(f"  {i}: {n}" for i, n in enumerate(names)) if names_as == "dict" else \
        "\n".join(f"  - {n}" for n in names)
    if names_as == "classes_txt":
        (root / "classes.txt").write_text("\n".join(names) + "\n")
    else:
        (root / "data.yaml").write_text(f"train: ../train/images\nval: ../valid/images\nnc: 3\nnames:\n{listed}\n")
    for si, split in enumerate(("train", "valid")):
        images = root / split / "images" if roboflow else root / "images" / split
        labels = root / split / "labels" if roboflow else root / "labels" / split
        labels.mkdir(parents=True, exist_ok=True)
        for i in range(3):
            rng = rng_for(seed + si, i)
            h, w = [(30, 40), (26, 34), (32, 32)][i]
            name = f"frame_{i:02d}"
            write_image(images / f"{name}.jpg", h, w, rng)
            cls = np.zeros((h, w), np.int64)
            if i == 2 and split == "valid":
                exp.images[f"{split}/{name}.jpg"], exp.expected[f"{split}/{name}.jpg"] = images / f"{name}.jpg", cls
                continue  # no label file: background only
            lines = []
            for k in range(3):
                c = int(rng.integers(0, 3))
                xy = [min(max(v / (w if j % 2 == 0 else h), 0.0), 1.0)
                      for j, v in enumerate(_polygon(rng, h, w, 5 + k, border=k == 2))]
                lines.append(" ".join([str(c)] + [f"{v:.6f}" for v in xy]))
                cls[ultralytics_mask(h, w, [float(f"{v:.6f}") for v in xy])] = c + 1
            (labels / f"{name}.txt").write_text("\n".join(lines) + "\n")
            exp.images[f"{split}/{name}.jpg"], exp.expected[f"{split}/{name}.jpg"] = images / f"{name}.jpg", cls
    return exp


# -- LabelMe -----------------------------------------------------------------------------------------

def labelme_shape_to_mask(img_shape, points, shape_type=None, line_width=10, point_size=5) -> np.ndarray:
    """labelme/utils/shape.py `shape_to_mask`, re-implemented on PIL.ImageDraw from its source."""
    mask = Image.fromarray(np.zeros(img_shape[:2], dtype=np.uint8))
    draw = ImageDraw.Draw(mask)
    xy = [tuple(point) for point in points]
    if shape_type == "circle":
        (cx, cy), (px, py) = xy
        d = math.sqrt((cx - px) ** 2 + (cy - py) ** 2)
        draw.ellipse([cx - d, cy - d, cx + d, cy + d], outline=1, fill=1)
    elif shape_type == "rectangle":
        draw.rectangle(xy, outline=1, fill=1)
    elif shape_type in ("line", "linestrip"):
        draw.line(xy=xy, fill=1, width=line_width)
    elif shape_type == "point":
        cx, cy = xy[0]
        r = point_size
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], outline=1, fill=1)
    else:
        draw.polygon(xy=xy, outline=1, fill=1)
    return np.array(mask, dtype=bool)


def make_labelme(root: Path, seed: int = 2, labels_txt: bool = True) -> Export:
    """Per-image JSON beside the images, every shape type, `labels.txt` with `__ignore__` and `_background_`
    (labelme2voc: `__ignore__` -> -1 saved as 255)."""
    names = ["person", "bike", "road"]
    table = {"__ignore__": IGNORE, "_background_": 0, **{n: i + 1 for i, n in enumerate(names)}}
    exp = Export(root, ["_background_"] + names if labels_txt else ["_background_"] + sorted(names))
    root.mkdir(parents=True, exist_ok=True)
    if labels_txt:
        (root / "labels.txt").write_text("__ignore__\n_background_\n" + "\n".join(names) + "\n")
    else:
        table = {"__ignore__": IGNORE, "_background_": 0, **{n: i + 1 for i, n in enumerate(sorted(names))}}
    for i in range(4):
        rng = rng_for(seed, i)
        h, w = [(40, 50), (36, 44), (44, 40), (38, 38)][i]
        name = f"IMG_{i:04d}"
        write_image(root / f"{name}.png", h, w, rng)
        p = lambda: [round(float(rng.uniform(0, w)), 1), round(float(rng.uniform(0, h)), 1)]  # noqa: E731
        shapes = [
            {"label": "road", "points": [p() for _ in range(6)], "shape_type": "polygon"},
            {"label": "person", "points": sorted([p(), p()]), "shape_type": "rectangle"},
            {"label": "bike", "points": [p(), p()], "shape_type": "circle"},
            {"label": "person", "points": [p(), p()], "shape_type": "line"},
            {"label": "bike", "points": [p() for _ in range(4)], "shape_type": "linestrip"},
            {"label": "road", "points": [p()], "shape_type": "point"},
            {"label": "__ignore__", "points": [p() for _ in range(4)], "shape_type": "polygon"},
        ]
        (x0, y0), (x1, y1) = shapes[1]["points"]
        shapes[1]["points"] = [[min(x0, x1), min(y0, y1)], [max(x0, x1), max(y0, y1)]]
        rng.shuffle(shapes)
        for s in shapes:
            s.update(group_id=None, description="", flags={})
        doc = {"version": "5.4.1", "flags": {}, "shapes": shapes, "imagePath": f"{name}.png", "imageData": None,
               "imageHeight": h, "imageWidth": w}
        (root / f"{name}.json").write_text(json.dumps(doc, indent=2))
        cls = np.zeros((h, w), np.int64)
        for s in shapes:  # labelme2voc: shapes_to_label, later on top
            cls[labelme_shape_to_mask((h, w), s["points"], s["shape_type"])] = table[s["label"]]
        exp.images[f"train/{name}.png"], exp.expected[f"train/{name}.png"] = root / f"{name}.png", cls
    (root / "notes.json").write_text(json.dumps({"author": "x"}))  # a JSON that is not LabelMe
    return exp


# -- CVAT for images 1.1 ----------------------------------------------------------------------------

def cvat_rle(mask: np.ndarray) -> list[int]:
    """CVAT's mask RLE over the mask's box, as ``import_dm_annotations`` (bindings.py) encodes it:
    row-major, the first run is background (0 when the first pixel is set)."""
    counts = [len(list(g)) for _, g in itertools.groupby(mask.flatten(order="C").tolist())]
    return ([0] + counts) if mask.flat[0] else counts


def decode_cvat_rle(runs: list[int], left: int, top: int, width: int, h: int, w: int) -> np.ndarray:
    """CVAT's ``CVATRleToCOCORle.convert_mask`` rule (transformations.py), written here: runs alternate
    from 0, pixel k of the runs at (top + k // width, left + k % width) of an h x w image."""
    out = np.zeros((h, w), np.uint8)
    value, offset = 0, 0
    for r in runs:
        for _ in range(r):
            out[top + offset // width][left + offset % width] = value
            offset += 1
        value = 1 - value
    return out.astype(bool)


def cvat_reference(shapes: list[dict], h: int, w: int) -> np.ndarray:
    """CVAT's "Segmentation mask 1.1" export of one image (formats/mask.py ``_export``), step by step:
    ``RotatedBoxesToPolygons`` (rotated boxes removed, appended as polygons), ``polygons_to_masks`` and
    ``boxes_to_masks`` (pycocotools ``frPyObjects``), ``merge_instance_segments`` (``find_instances``: sorted
    by group, group 0 one instance each; a group's union takes its largest member's label and z_order), then
    ``CompiledMask.from_instance_masks`` (sorted by z_order, later on top). Shapes: dicts with kind, label
    value, z, group and the mask already drawn (``mask``)."""
    anns = list(shapes)
    for ann in [a for a in anns if a["kind"] == "box" and a.get("rotation")]:
        anns.remove(ann)
        anns.append(ann)
    anns = sorted(anns, key=lambda a: a["group"])
    instances = []
    for group, members in itertools.groupby(anns, key=lambda a: a["group"]):
        members = list(members)
        if not group:
            instances += [(m["mask"], m["value"], m["z"]) for m in members]
            continue
        leader = max(members, key=lambda m: int(m["mask"].sum()))
        union = np.logical_or.reduce([m["mask"] for m in members])
        instances.append((union, leader["value"], leader["z"]))
    cls = np.zeros((h, w), np.int64)
    for mask, value, _ in sorted(instances, key=lambda i: i[2]):
        cls = np.where(mask, value, cls)
    return cls


def _cvat_element(kind: str, label: str, rng, h: int, w: int, z: int, group: int, k: int) -> tuple[str, dict]:
    """One shape as CVAT's ``dump_as_cvat_annotation`` writes it (label, source, occluded, coordinates to 2
    decimals, rotation when set, z_order, group_id when set), and its mask by CVAT's rule."""
    from pycocotools import mask as mu
    import cv2

    head = f'label="{label}" source="manual" occluded="0" '
    tail = f' z_order="{z}"' + (f' group_id="{group}"' if group else "")
    shape = {"kind": kind, "z": z, "group": group}
    if kind == "polygon":
        xy = [float(f"{v:.2f}") for v in _polygon(rng, h, w, 5, border=k == 3)]
        pts = ";".join(f"{xy[j]:.2f},{xy[j + 1]:.2f}" for j in range(0, len(xy), 2))
        shape["mask"] = mu.decode(mu.frPyObjects([xy], h, w)[0]).astype(bool)
        return f'<polygon {head}points="{pts}"{tail}>\n    </polygon>', shape
    if kind == "box":
        x0, y0 = float(rng.uniform(0, w / 2)), float(rng.uniform(0, h / 2))
        x0, y0, x1, y1 = (float(f"{v:.2f}") for v in (x0, y0, x0 + rng.uniform(3, w / 2), y0 + rng.uniform(3, h / 2)))
        rot = float(f"{rng.uniform(5, 80):.2f}") if k % 2 else 0.0
        corners = [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]
        if rot:  # RotatedBoxesToPolygons._rotate_point about the centre
            a, cx, cy = math.radians(rot), x0 + (x1 - x0) / 2, y0 + (y1 - y0) / 2
            corners = [(cx + math.cos(a) * (x - cx) - math.sin(a) * (y - cy),
                        cy + math.sin(a) * (x - cx) + math.cos(a) * (y - cy)) for x, y in corners]
        shape.update(rotation=rot, mask=mu.decode(mu.frPyObjects([[v for c in corners for v in c]], h, w)[0]).astype(bool))
        rotation = f' rotation="{rot:.2f}"' if rot else ""
        return (f'<box {head}xtl="{x0:.2f}" ytl="{y0:.2f}" xbr="{x1:.2f}" ybr="{y1:.2f}"{rotation}{tail}>\n'
                f'    </box>'), shape
    if kind == "ellipse":
        cx, cy = float(f"{rng.uniform(w / 4, 3 * w / 4):.2f}"), float(f"{rng.uniform(h / 4, 3 * h / 4):.2f}")
        rx, ry = float(f"{rng.uniform(2, w / 3):.2f}"), float(f"{rng.uniform(2, h / 3):.2f}")
        rot = float(f"{rng.uniform(0, 90):.2f}")
        right, top = float(f"{cx + rx:.2f}"), float(f"{cy - ry:.2f}")  # load_anno's points
        canvas = np.zeros((h, w), np.uint8)  # EllipsesToMasks.convert_ellipse
        cv2.ellipse(canvas, (round(cx), round(cy)), (round(right - cx), round(cy - top)), rot, 0, 360, 255, thickness=-1)
        shape["mask"] = canvas.astype(bool)
        return (f'<ellipse {head}cx="{cx:.2f}" cy="{cy:.2f}" rx="{rx:.2f}" ry="{ry:.2f}" rotation="{rot:.2f}"{tail}>\n'
                f'    </ellipse>'), shape
    left, top = int(rng.integers(0, w // 2)), int(rng.integers(0, h // 2))
    bw, bh = int(rng.integers(6, w - left)), int(rng.integers(6, h - top))
    inner = _blob(rng, bh, bw).astype(bool)
    ys, xs = np.nonzero(inner)  # CVAT keeps the tight box of the drawn pixels
    inner = inner[ys.min():ys.max() + 1, xs.min():xs.max() + 1]
    left, top, bh, bw = left + int(xs.min()), top + int(ys.min()), inner.shape[0], inner.shape[1]
    runs = cvat_rle(inner)
    shape["mask"] = decode_cvat_rle(runs, left, top, bw, h, w)
    return (f'<mask {head}rle="{", ".join(map(str, runs))}" left="{left}" top="{top}" width="{bw}" height="{bh}"'
            f'{tail}>\n    </mask>'), shape


def make_cvat(root: Path, seed: int = 3) -> Export:
    """``annotations.xml`` + ``images/``, as CVAT's project export writes it (formats/cvat.py
    ``dump_as_cvat_annotation``): polygons, boxes (some rotated), ellipses and masks with z_order and
    group_id, then a polyline and points (shapes CVAT's mask export leaves out), tags after the shapes."""
    labels = ["tree", "house", "sky"]
    exp = Export(root, ["background"] + labels)
    (root / "images").mkdir(parents=True, exist_ok=True)
    parts = ['<?xml version="1.0" encoding="utf-8"?>', "<annotations>", "  <version>1.1</version>",
             "  <meta><project><id>3</id><name>t</name><labels>"]
    parts += [f"<label><name>{n}</name><color>#aabbcc</color><type>any</type><attributes/></label>" for n in labels]
    parts += ["</labels></project></meta>"]
    kinds = ("polygon", "box", "mask", "polygon", "ellipse", "box", "mask")
    for i in range(4):
        rng = rng_for(seed, i)
        h, w = [(30, 40), (34, 28), (28, 36), (32, 32)][i]
        name = f"frame_{i:06d}.png"
        write_image(root / "images" / name, h, w, rng)
        subset = "Train" if i < 3 else "Validation"
        shapes, elements = [], []
        for k, kind in enumerate(kinds):
            label = labels[int(rng.integers(0, 3))]
            group = (0, 0, 1, 1, 0, 2, 2)[k] if i % 2 == 0 else 0
            element, shape = _cvat_element(kind, label, rng, h, w, int(rng.integers(-1, 3)), group, k)
            elements.append(element)
            shapes.append({**shape, "value": labels.index(label) + 1})
        elements.append('<polyline label="tree" source="manual" occluded="0" points="1.00,1.00;5.00,5.00" '
                        'z_order="3">\n    </polyline>')
        elements.append('<points label="house" source="manual" occluded="0" points="2.00,2.00" z_order="3">\n'
                        '    </points>')
        elements.append('<tag label="sky" source="manual">\n    </tag>')
        parts.append(f'  <image id="{i}" name="{name}" subset="{subset}" task_id="3" width="{w}" height="{h}">')
        parts += ["    " + e for e in elements] + ["  </image>"]
        split = "train" if subset == "Train" else "validation"
        exp.images[f"{split}/{name}"] = root / "images" / name
        exp.expected[f"{split}/{name}"] = cvat_reference(shapes, h, w)
    parts.append("</annotations>")
    (root / "annotations.xml").write_text("\n".join(parts))
    return exp


# -- instance-mask folders (DSB 2018) ----------------------------------------------------------------

def make_instances(root: Path, seed: int = 4, grouped: bool = False) -> Export:
    """``stage1_train/<id>/images/<id>.png`` + ``<id>/masks/*.png`` (0/255 each); grouped: ``masks/<class>/``."""
    classes = ["nucleus", "cytoplasm"]
    exp = Export(root, ["background"] + (classes[::-1] if grouped else ["foreground"]))
    for i in range(3):
        rng = rng_for(seed, i)
        h, w = [(30, 30), (26, 34), (32, 28)][i]
        ident = f"{rng.integers(1 << 60):016x}"
        folder = root / "stage1_train" / ident
        write_image(folder / "images" / f"{ident}.png", h, w, rng)
        cls = np.zeros((h, w), np.int64)
        entries = []
        for k in range(4):
            m = np.zeros((h, w), np.uint8)
            cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(3, 9)
            yy, xx = np.mgrid[:h, :w]
            m[np.hypot(yy - cy, xx - cx) < r] = 255
            sub = f"{classes[k % 2]}/" if grouped else ""
            fname = f"{rng.integers(1 << 60):016x}.png"
            (folder / "masks" / sub).mkdir(parents=True, exist_ok=True)
            Image.fromarray(m).save(folder / "masks" / sub / fname)
            value = (sorted(classes).index(classes[k % 2]) + 1) if grouped else 1
            entries.append((sub.rstrip("/"), fname, m > 0, value))
        for _, _, m, v in sorted(entries, key=lambda e: (e[0], e[1])):
            cls[m] = v
        exp.images[f"train/{ident}"], exp.expected[f"train/{ident}"] = folder / "images" / f"{ident}.png", cls
    return exp


# -- Kaggle RLE CSV -----------------------------------------------------------------------------------

def kaggle_rle(mask: np.ndarray) -> str:
    """The Kaggle encoder (`rle_encode` of the competitions' kernels): column-major, 1-based starts."""
    pixels = np.concatenate([[0], mask.T.flatten(), [0]])
    runs = np.where(pixels[1:] != pixels[:-1])[0] + 1
    runs[1::2] -= runs[::2]
    return " ".join(str(x) for x in runs)


def decode_kaggle_rle(text: str, h: int, w: int) -> np.ndarray:
    """A NumPy decoder of the Kaggle RLE, written here."""
    s = text.split()
    starts, lengths = [np.asarray(x, dtype=int) for x in (s[0::2], s[1::2])]
    flat = np.zeros(h * w, np.uint8)
    for lo, n in zip(starts - 1, lengths):
        flat[lo:lo + n] = 1
    return flat.reshape(w, h).T.astype(bool)


def make_rlecsv(root: Path, seed: int = 5, class_column: bool = True) -> Export:
    """Severstal-like ``train.csv`` (ImageId,ClassId,EncodedPixels; several rows per image, ClassId 1..4 with
    gaps) beside ``train_images/``; without a class column, Airbus-like (empty runs = no ship)."""
    exp = Export(root, ["background", "class_1", "class_2", "class_3", "class_4"] if class_column
                 else ["background", "foreground"])
    (root / "train_images").mkdir(parents=True, exist_ok=True)
    rows = ["ImageId,ClassId,EncodedPixels" if class_column else "ImageId,EncodedPixels"]
    for i in range(4):
        rng = rng_for(seed, i)
        h, w = [(24, 40), (30, 30), (20, 36), (28, 28)][i]
        name = f"{rng.integers(1 << 36):09x}.jpg"
        write_image(root / "train_images" / name, h, w, rng)
        cls = np.zeros((h, w), np.int64)
        if i == 3:
            rows.append(f"{name},," if class_column else f"{name},")
        for k in range(2 if i < 3 else 0):
            m = np.zeros((h, w), bool)
            y0, x0 = int(rng.integers(0, h - 4)), int(rng.integers(0, w - 4))
            m[y0:y0 + int(rng.integers(3, h - y0 + 1)), x0:x0 + int(rng.integers(3, w - x0 + 1))] = True
            m[y0, :] |= k == 1  # a run crossing columns
            c = (1, 4, 3)[(i + k) % 3]
            text = kaggle_rle(m.astype(np.uint8))
            rows.append(f"{name},{c},{text}" if class_column else f"{name},{text}")
            cls[decode_kaggle_rle(text, h, w)] = c if class_column else 1
        exp.images[f"train/{name}"], exp.expected[f"train/{name}"] = root / "train_images" / name, cls
    (root / "train.csv").write_text("\n".join(rows) + "\n")
    write_image(root / "train_images" / "unlisted.jpg", 20, 20, rng_for(seed, 99))  # not in the CSV: left out
    return exp


# -- an annotation file beside mask images of the same images (two readings) --------------------------

def make_tgs_like(root: Path, seed: int = 8, disagree: bool = False) -> Export:
    """TGS salt: ``train/images/<id>.png``, ``train/masks/<id>.png`` (0/255) and ``train.csv``
    (``id,rle_mask``) encoding the same masks; `disagree`: the CSV's shapes are shifted 5 pixels."""
    exp = Export(root, ["background", "foreground"])
    rows = ["id,rle_mask"]
    for i in range(5):
        rng = rng_for(seed, i)
        h = w = 40
        ident = f"{int(rng.integers(1 << 30)):08x}"
        write_image(root / "train" / "images" / f"{ident}.png", h, w, rng)
        mask = _blob(rng, h, w).astype(bool) if i != 2 else np.zeros((h, w), bool)  # one image without salt
        (root / "train" / "masks").mkdir(parents=True, exist_ok=True)
        Image.fromarray(mask.astype(np.uint8) * 255).save(root / "train" / "masks" / f"{ident}.png")
        rows.append(f"{ident},{kaggle_rle((np.roll(mask, 5, axis=1) if disagree else mask).astype(np.uint8))}")
        exp.images[f"train/{ident}.png"] = root / "train" / "images" / f"{ident}.png"
        exp.expected[f"train/{ident}.png"] = mask.astype(np.int64)
    (root / "train.csv").write_text("\n".join(rows) + "\n")
    return exp


def make_coco_beside_voc(root: Path, seed: int = 9, disagree: bool = False) -> Export:
    """Pascal VOC (``JPEGImages/``, palette ``SegmentationClass/`` with the 255 border, ``ImageSets/
    Segmentation/train.txt``) and a COCO file ``annotations/instances_train.json`` of the same images
    (``file_name`` ``JPEGImages/<id>.jpg``); the class masks are pycocotools' rasterization of the
    polygons (class = category position), with a 255 border painted on the edges; `disagree`: the
    COCO categories in the other order."""
    from pycocotools import mask as mu

    cats = ["cat", "dog"]
    exp = Export(root, ["background"] + cats)
    images, anns, ids = [], [], []
    for i in range(4):
        rng = rng_for(seed, i)
        h, w = 30, 36
        name = f"2008_{i:06d}"
        path = root / "JPEGImages" / f"{name}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(synth.textured_image(h, w, rng)).save(path, quality=95)
        cls = np.zeros((h, w), np.int64)
        for k in range(2):
            xy = [float(f"{v:.2f}") for v in _polygon(rng, h, w, 6)]
            value = 1 + int(rng.integers(0, 2))
            m = mu.decode(mu.frPyObjects([xy], h, w)[0]).astype(bool)
            cls[m] = value  # file order, later on top
            category = value if not disagree else 3 - value
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": category, "iscrowd": 0,
                         "segmentation": [xy], "area": float(m.sum()), "bbox": [0, 0, 1, 1]})
        images.append({"id": i + 1, "file_name": f"JPEGImages/{name}.jpg", "height": h, "width": w})
        border = cls.copy()
        edge = (np.diff(cls, axis=1, prepend=cls[:, :1]) != 0) | (np.diff(cls, axis=0, prepend=cls[:1]) != 0)
        border[edge] = 255  # VOC's 255 outline
        voc = Image.fromarray(border.astype(np.uint8), "P")
        voc.putpalette([0, 0, 0, 128, 0, 0, 0, 128, 0] + [0] * (3 * 252) + [224, 224, 192])
        (root / "SegmentationClass").mkdir(exist_ok=True)
        voc.save(root / "SegmentationClass" / f"{name}.png")
        ids.append(name)
        exp.images[f"train/{name}.jpg"], exp.expected[f"train/{name}.jpg"] = path, cls
    (root / "ImageSets" / "Segmentation").mkdir(parents=True)
    (root / "ImageSets" / "Segmentation" / "train.txt").write_text("\n".join(ids) + "\n")
    (root / "annotations").mkdir()
    doc = {"images": images, "annotations": anns,
           "categories": [{"id": j + 1, "name": n, "supercategory": ""} for j, n in enumerate(cats)]}
    (root / "annotations" / "instances_train.json").write_text(json.dumps(doc))
    return exp
