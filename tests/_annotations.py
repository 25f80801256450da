"""Annotation exports written the way the producing tools write them (issue 27), with the
reference class map of each image computed by the reference implementation, never by
imgshard: pycocotools `annToMask`; labelme's `shape_to_mask` rule on `PIL.ImageDraw`
(re-implemented here from labelme/utils/shape.py); ultralytics' `polygon2mask`
(`cv2.fillPoly` on int32 points); a NumPy decoder of the Kaggle and CVAT RLEs written here.

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
