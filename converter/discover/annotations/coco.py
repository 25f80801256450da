"""COCO JSON (``images`` + ``annotations`` + ``categories``): polygons, RLE, compressed RLE.

Found by content: a ``*.json`` beside the images (Roboflow: ``{split}/_annotations.coco.json``),
in ``annotations/`` (COCO: ``annotations/instances_train2017.json`` + ``train2017/``) or at
the top. Category ids become contiguous classes in id order, 0 = background; an unused
category 0 that other categories name as their supercategory (Roboflow's placeholder
with the dataset's name) is left out. ``iscrowd`` regions go to the ignore index
(``--keep-crowd``: their class). Rasterized with pycocotools (``annToMask``'s rule),
imported when used; overlaps: file order, later annotations on top.
"""

from __future__ import annotations

import os
import re
from typing import Any

from converter.discover.annotations.base import (AnnotationFileError, coordinates, head_bytes, load_json, outside_ok,
                                                  read_annotation_file)
from converter.discover.annotations.listing import AnnotationSet, Reader, make_sample, split_name
from converter.discover.files import file_names, files_for, is_file, join, subfolders
from converter.discover.layout import BadInput
from converter.options import AnnotationOptions
from converter.transform.decode import DecodeError

_KEYS = (b'"images"', b'"annotations"', b'"categories"')


#: Names that say "a COCO file" (Roboflow's ``_annotations.coco.json``, COCO's ``instances_train2017.json``).
_NAMED = re.compile(r"(^instances_.+|\.coco)\.json$", re.IGNORECASE)
#: First bytes of a COCO object: its first key one of COCO's, holding a list or an object.
_HEAD = re.compile(rb'^\s*\{\s*"(?:info|licenses|images|annotations|categories)"\s*:\s*[\[{]')
NOT_COCO = "JSON without COCO's 'images', 'annotations' and 'categories'"

_SEEN: dict[tuple[str, int, int], str] = {}  # (path, size, stamp) -> _look's answer: detection asks more than once


def meant_as_coco(path: str) -> bool:
    """Whether a ``.json`` looks meant as a COCO file: by its name, its folder (``annotations/``) or its
    first bytes (a COCO object's first key)."""
    if _NAMED.search(os.path.basename(path)) or os.path.basename(os.path.dirname(path)).lower() == "annotations":
        return True
    return bool(_HEAD.match(head_bytes(path, 512).removeprefix(b"\xef\xbb\xbf")))


def _look(path: str) -> str:
    """"" when `path` is a COCO file, or one meant as COCO that cannot be used (reading it names why:
    never passed over in silence); else why it is not one (a stray JSON, passed over and listed)."""
    try:
        data = read_annotation_file(path)
    except AnnotationFileError as e:
        return "" if "above the limit" in e.reason or meant_as_coco(path) else e.reason
    if all(k in data for k in _KEYS) or _NAMED.search(os.path.basename(path)):
        return ""
    if meant_as_coco(path):
        try:
            load_json(path, data)
        except AnnotationFileError:
            return ""  # truncated or damaged: read names it
    return NOT_COCO


def coco_look(path: str) -> str:
    """`_look`, remembered per (path, size, stamp)."""
    try:
        key = (path, *files_for(path).stat(path))
    except OSError:
        return _look(path)  # a FIFO, a folder, gone: nothing to remember
    if key not in _SEEN:
        _SEEN[key] = _look(path)
        if len(_SEEN) > 256:
            _SEEN.pop(next(iter(_SEEN)))
    return _SEEN[key]


def is_coco(path: str) -> bool:
    """Whether `path` is read as a COCO JSON (its three keys, or meant as one: reading it says what is wrong)."""
    return coco_look(path) == ""


def _json_entries(root: str) -> list[str]:
    """``*.json`` at the top, in split folders and in ``annotations/``: files, and folders named so."""
    out = []
    for folder in [root] + [join(root, d) for d in subfolders(root)]:
        dirs, files = files_for(folder).entries(folder)
        out += [join(folder, n) for n in files + dirs if n.lower().endswith(".json")]
    return out


def coco_files(root: str) -> list[str]:
    """COCO JSON files at the top, in split folders and in ``annotations/``, sorted."""
    return sorted(p for p in _json_entries(root) if is_coco(p))


#: JSON files scan looks at to list what was passed over (LabelMe folders hold thousands).
PASSED_OVER_LOOKS = 64


def passed_over(root: str) -> list[str]:
    """The JSON files detection passed over, each with why (what scan lists; the first `PASSED_OVER_LOOKS`)."""
    entries = sorted(_json_entries(root))
    out = [f"{os.path.relpath(p, root)} ({why})" for p in entries[:PASSED_OVER_LOOKS] for why in [coco_look(p)]
           if why]
    if len(entries) > PASSED_OVER_LOOKS:
        out.append(f"... {len(entries) - PASSED_OVER_LOOKS} more JSON file(s) not looked at here")
    return out


def pycocotools_mask():
    try:
        from pycocotools import mask
    except ImportError as e:
        raise ImportError("COCO and CVAT annotations are rasterized with pycocotools, which is not installed. "
                          "Install it: pip install 'imgshard[coco]' (or pip install pycocotools).") from e
    return mask


def _image_base(root: str, path: str, first: str) -> str | None:
    """The folder `file_name`s are relative to: beside the JSON, above it, ``images/``, or the split folder
    (``<split>/``, or ``images/<split>/`` as CVAT's and datumaro's COCO export writes it)."""
    here = os.path.dirname(path)
    stem = os.path.splitext(os.path.basename(path))[0]
    candidates = [here, root, join(here, "images"), join(root, "images")]
    if stem.startswith("instances_"):
        candidates[:0] = [join(root, stem[len("instances_"):]), join(root, "images", stem[len("instances_"):])]
    for base in candidates:
        if is_file(join(base, first)):
            return base
    return None


def _classes(doc: dict, path: str) -> tuple[tuple[str, ...], dict[int, int], str | None]:
    """(class names with background first, category id -> class, the placeholder left out or None)."""
    cats = doc.get("categories")
    if not isinstance(cats, list) or not all(isinstance(c, dict) and "id" in c for c in cats):
        raise AnnotationFileError(path, "'categories' must be a list of objects with an 'id'",
                                  "re-export the annotations")
    used = {a.get("category_id") for a in doc["annotations"] if isinstance(a, dict)}
    placeholder = None
    for c in cats:
        name = str(c.get("name", c["id"]))
        if c["id"] == 0 and 0 not in used and any(o.get("supercategory") == name for o in cats if o is not c):
            placeholder = name
    kept = sorted((c for c in cats if not (placeholder is not None and c["id"] == 0)), key=lambda c: c["id"])
    names = ("background",) + tuple(str(c.get("name", c["id"])) for c in kept)
    return names, {c["id"]: i + 1 for i, c in enumerate(kept)}, placeholder


def _check_segmentation(seg: Any, path: str, where: str, size: tuple[int, int] | None, out: AnnotationSet) -> Any:
    """The segmentation as pycocotools takes it, checked; None when nothing is drawn (too few points)."""
    if isinstance(seg, list):
        polys = []
        for poly in seg:
            xy = coordinates(poly if isinstance(poly, list) else [poly], path, where)
            if len(xy) < 6 or len(xy) % 2:
                out.problems["polygons with fewer than 3 points (dropped)"] += 1
                continue
            if size is not None and not outside_ok(xy, size):
                out.problems["polygons reaching outside the image (clipped)"] += 1
            polys.append(xy)
        return polys or None
    if isinstance(seg, dict) and "counts" in seg and "size" in seg:
        rle_size = [int(v) for v in coordinates(seg["size"], path, where)]
        if len(rle_size) != 2 or min(rle_size) <= 0 or (size is not None and rle_size != list(size)):
            raise AnnotationFileError(path, f"RLE size {seg['size']} differs from its image's "
                                      f"{list(size) if size else 'height, width'}", "re-export the annotations", where)
        size = (rle_size[0], rle_size[1])
        counts = seg["counts"]
        runs = coordinates(counts, path, where, 1 << 40) if isinstance(counts, list) else _string_counts(
            counts, path, where)
        if any(r < 0 for r in runs) or sum(runs) > size[0] * size[1]:
            raise AnnotationFileError(path, f"RLE runs cover {sum(runs):,} pixels, past the {size[0]}x{size[1]} "
                                      "image (or negative)", "re-export the annotations", where)
        return {"size": [int(size[0]), int(size[1])], "counts": counts}
    raise AnnotationFileError(path, f"segmentation is neither polygons nor RLE: {str(seg)[:80]}",
                              "fix or remove the annotation", where)


def _string_counts(s: Any, path: str, where: str) -> list[int]:
    """The runs of a compressed RLE string (pycocotools' ``rleFrString``), to check them before decoding."""
    if not isinstance(s, str) or not s.isascii():
        raise AnnotationFileError(path, "compressed RLE counts must be an ASCII string", "re-export", where)
    runs: list[int] = []
    p = 0
    while p < len(s):
        x, k, more = 0, 0, True
        while more:
            if p >= len(s):
                raise AnnotationFileError(path, "compressed RLE string ends inside a number", "re-export", where)
            c = ord(s[p]) - 48
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p += 1
            k += 1
            if not more and (c & 0x10):
                x |= -1 << (5 * k)
        if len(runs) > 2:
            x += runs[-2]
        runs.append(x)
    return runs


def _split_of(root: str, path: str, files: int) -> str:
    """Roboflow: the split folder holding the JSON; COCO: the split in the file name; one file: train."""
    folder = os.path.basename(os.path.dirname(path))
    for name in (folder, os.path.basename(path)):
        split = split_name(name, "")
        if split in ("train", "val", "valid", "validation", "test"):
            return split
    if files == 1:
        return "train"
    return split_name(os.path.splitext(os.path.basename(path))[0])


class Coco(Reader):
    name = "coco"
    title = "COCO JSON"
    overlap_rule = "file order of `annotations`, later on top (as annToMask masks are painted in turn)"

    def detect(self, root: str) -> str | None:
        files = coco_files(root)
        return f"COCO JSON {', '.join(os.path.relpath(f, root) for f in files)}" if files else None

    def read(self, root: str, options: AnnotationOptions) -> AnnotationSet:
        files = coco_files(root)
        out = AnnotationSet([], [], (), self.detect(root) or "")
        for path in files:
            self._read_file(root, path, options, out, _split_of(root, path, len(files)))
        out.notes += [f"passed over {p}" for p in passed_over(root)]
        return out

    def _read_file(self, root: str, path: str, options: AnnotationOptions, out: AnnotationSet, split: str) -> None:
        doc = load_json(path)
        if not isinstance(doc, dict) or not all(isinstance(doc.get(k), list) for k in ("images", "annotations")):
            raise AnnotationFileError(path, "a COCO file needs 'images' and 'annotations' lists",
                                      "re-export the annotations")
        names, class_of, placeholder = _classes(doc, path)
        if out.class_names and out.class_names != names:
            raise AnnotationFileError(path, f"its categories {list(names[1:])} differ from another split's "
                                      f"{list(out.class_names[1:])}", "export every split with the same categories")
        out.class_names = names
        if placeholder is not None:
            out.notes.append(f"{os.path.relpath(path, root)}: category 0 {placeholder!r} is Roboflow's placeholder "
                             "(unused, the others' supercategory): left out")
        images = self._images(doc, path)
        per_image: dict[Any, list] = {i: [] for i in images}
        for a in doc["annotations"]:
            self._add(a, path, images, per_image, class_of, names, options, out)
        if split not in out.splits:
            out.splits.append(split)
        base = _image_base(root, path, next(iter(images.values()))[0]) if images else None
        for image_id, (file_name, h, w) in sorted(images.items(), key=lambda kv: kv[1][0]):
            image = join(base or os.path.dirname(path), file_name)
            if base is None or not is_file(image):
                out.bad.append(BadInput(image, f"listed in {path} (image id {image_id}) but not found",
                                        "put the images beside the JSON (or below images/)", f"{split}/{file_name}",
                                        "missing_image"))
                continue
            shapes = per_image[image_id]
            doc_ = {"size": [h, w] if h else None, "ignore": out.ignore, "overlap": options.overlap.value,
                    "shapes": shapes}
            out.samples.append(make_sample(split, f"{split}/{file_name}", image, self.name, path, str(image_id), doc_))

    @staticmethod
    def _images(doc: dict, path: str) -> dict[Any, tuple[str, int, int]]:
        images = {}
        for im in doc["images"]:
            where = f"image id {im.get('id') if isinstance(im, dict) else im!r}"
            if not isinstance(im, dict) or "id" not in im or not isinstance(im.get("file_name"), str):
                raise AnnotationFileError(path, "an image entry needs 'id' and 'file_name'", "re-export", where)
            h, w = (int(v) for v in coordinates([im.get("height") or 0, im.get("width") or 0], path, where))
            if h < 0 or w < 0 or (h == 0) != (w == 0):
                raise AnnotationFileError(path, "image width and height must be positive (or both left out)",
                                          "re-export", where)
            if im["id"] in images:
                raise AnnotationFileError(path, "image id listed twice", "re-export the annotations", where)
            images[im["id"]] = (im["file_name"].replace("\\", "/"), h, w)
        return images

    @staticmethod
    def _add(a: Any, path: str, images: dict, per_image: dict, class_of: dict, names: tuple, options, out) -> None:
        where = f"annotation id {a.get('id') if isinstance(a, dict) else a!r}"
        if not isinstance(a, dict):
            raise AnnotationFileError(path, "an annotation must be an object", "re-export", where)
        if a.get("image_id") not in images:
            raise AnnotationFileError(path, f"image_id {a.get('image_id')!r} is not in 'images'",
                                      "fix or remove the annotation", where)
        if a.get("category_id") not in class_of:
            raise AnnotationFileError(path, f"category_id {a.get('category_id')!r} is not in 'categories' "
                                      f"(ids {sorted(class_of)})", "fix the annotation or add the category", where)
        _, h, w = images[a["image_id"]]  # 0, 0: sizes left out, the image's own size rules
        if not a.get("segmentation"):  # absent, or [] as CVAT's COCO 1.0 export writes a box alone
            out.problems["annotations without segmentation (boxes only; skipped)"] += 1
            return
        seg = _check_segmentation(a["segmentation"], path, where, (h, w) if h else None, out)
        if seg is None:
            return
        crowd = bool(a.get("iscrowd", 0))
        value = class_of[a["category_id"]] if options.keep_crowd or not crowd else out.ignore
        if crowd:
            out.problems["crowd regions (" + ("kept as their class" if options.keep_crowd else "ignored") + ")"] += 1
        out.shapes[names[class_of[a["category_id"]]]] += 1
        per_image[a["image_id"]].append({"seg": seg, "v": value})  # no id: a re-export that renumbers changes nothing

    def shapes(self, doc: dict, height: int, width: int, where: str):
        mask = pycocotools_mask()
        for n, s in enumerate(doc["shapes"]):
            seg = s["seg"]
            try:
                if isinstance(seg, list):
                    rle = mask.merge(mask.frPyObjects(seg, height, width))
                elif isinstance(seg["counts"], list):
                    rle = mask.frPyObjects(seg, height, width)
                else:
                    rle = {"size": seg["size"], "counts": seg["counts"].encode("ascii")}
                if not isinstance(seg, list) and list(seg["size"]) != [height, width]:
                    raise ValueError(f"its RLE is {seg['size'][1]}x{seg['size'][0]} but the image is {width}x{height}")
                yield mask.decode(rle).astype(bool), int(s["v"])
            except (ValueError, TypeError) as e:
                raise DecodeError(where, "bad_annotation", f"annotation {n + 1} of this image: {e}",
                                  "fix or remove the annotation") from e


__all__ = ["Coco", "coco_files", "coco_look", "is_coco", "meant_as_coco", "passed_over", "pycocotools_mask"]
