"""Instance-mask folders (Data Science Bowl 2018): ``<id>/images/<id>.png`` + ``<id>/masks/*.png``,
one binary mask per object (any non-zero pixel is the object), unioned into a class map.

Found by content: sample folders (at the top, or in split folders such as
``stage1_train/``) each holding ``images/`` and ``masks/``. Masks straight in ``masks/``
are class 1 (``foreground``); masks grouped by class (``masks/<class>/*.png``) get a
class per folder name, sorted. Painted by class folder, then file name (later on top).
A mask's fingerprint is its name, size and modification time: listed by discovery, then replaced
in the worker by those of the stable read whose bytes are painted (the same when it did not move).
"""

from __future__ import annotations

import io
import os

import numpy as np

from converter.discover.annotations.listing import AnnotationSet, Reader, make_sample
from converter.discover.files import files_for, is_dir, join, subfolders
from converter.discover.layout import WELL_KNOWN_SPLITS, BadInput, list_images
from converter.options import AnnotationOptions
from converter.transform.decode import DecodeError, read_source

#: Sample folders looked at to decide that a folder holds instance masks.
_PEEK = 5


def _is_sample(folder: str) -> bool:
    """A DSB sample folder: ``images/`` with its one image, beside ``masks/`` (a U-Net split folder,
    ``train/images`` + ``train/masks``, has many images and is not one)."""
    if not (is_dir(join(folder, "images")) and is_dir(join(folder, "masks"))):
        return False
    return len(list_images(join(folder, "images"))) == 1 and os.path.basename(folder.rstrip("/")).lower() not in \
        WELL_KNOWN_SPLITS


def sample_parents(root: str) -> list[tuple[str, str]]:
    """(split, folder holding sample folders): `root` itself, or its sub-folders that hold them."""
    dirs = subfolders(root)
    if dirs and all(_is_sample(join(root, d)) for d in dirs[:_PEEK]):
        return [("train", root)]
    out = []
    for d in dirs:
        inner = subfolders(join(root, d))
        if inner and all(_is_sample(join(root, d, i)) for i in inner[:_PEEK]):
            low = d.lower()
            out.append(("test" if "test" in low else "val" if "val" in low else "train" if "train" in low else d,
                        join(root, d)))
    return out


class InstanceMasks(Reader):
    name = "instances"
    title = "instance-mask folders (DSB 2018)"
    overlap_rule = "union: class folders in name order, then mask files in name order, later on top"

    def detect(self, root: str) -> str | None:
        parents = sample_parents(root)
        if not parents:
            return None
        return "instance-mask folders <id>/images/ + <id>/masks/ in " + ", ".join(
            (os.path.relpath(p, root) + "/").replace("./", "") or "./" for _, p in parents)

    def read(self, root: str, options: AnnotationOptions) -> AnnotationSet:
        out = AnnotationSet([], [], (), self.detect(root) or "")
        rows = []
        classes: set[str] = set()
        for split, parent in sample_parents(root):
            if split not in out.splits:
                out.splits.append(split)
            for ident in subfolders(parent):
                folder = join(parent, ident)
                images = list_images(join(folder, "images")) if _is_sample(folder) else []
                if not images:
                    out.bad.append(BadInput(folder, "sample folder without an image in images/",
                                            "add the image or remove the folder", f"{split}/{ident}", "missing_image"))
                    continue
                masks = self._masks(join(folder, "masks"))
                classes |= {c for c, _ in masks if c}
                rows.append((split, ident, join(folder, "images", images[0]), folder, masks))
        names = sorted(classes)
        if names and any(c == "" for *_, masks in rows for c, _ in masks):
            names = ["foreground"] + [n for n in names if n != "foreground"]
        out.class_names = ("background",) + (tuple(names) if names else ("foreground",))
        value = {n: i for i, n in enumerate(out.class_names)}
        for split, ident, image, folder, masks in rows:
            shapes = []
            for cls, rel in masks:
                size, stamp = files_for(join(folder, "masks", rel)).stat(join(folder, "masks", rel))
                shapes.append({"v": value[cls or "foreground"], "file": rel, "size": size, "stamp": stamp})
                out.shapes[cls or "foreground"] += 1
            doc = {"ignore": out.ignore, "overlap": options.overlap.value, "shapes": shapes}
            out.samples.append(make_sample(split, f"{split}/{ident}", image, self.name, folder, "", doc))
        return out

    @staticmethod
    def _masks(folder: str) -> list[tuple[str, str]]:
        """(class folder or "", name relative to masks/) of every mask, class folders first by name."""
        out = [("", rel) for rel in list_images(folder) if "/" not in rel]
        for cls in subfolders(folder):
            out += [(cls, f"{cls}/{rel}") for rel in list_images(join(folder, cls))]
        return sorted(out)

    def shapes(self, doc: dict, height: int, width: int, where: str):
        """Each mask read once, stably (`converter.transform.decode.read_source`: a file still being
        rewritten is a `changed_during_read` bad input); the shape's size and stamp become those of
        that read, so the fingerprint recorded belongs to the bytes painted."""
        from PIL import Image

        for s in doc["shapes"]:
            path = join(where, "masks", s["file"])
            src = read_source(path, s["file"], (int(s.get("size", 0)), int(s.get("stamp", 0))))  # objects: as listed
            s["size"], s["stamp"] = src.fingerprint.size, src.fingerprint.mtime_ns
            try:
                with Image.open(io.BytesIO(src.data)) as im:
                    size = im.size
                    values = np.asarray(im) if size == (width, height) else None  # never decode a wrong size
            except (OSError, ValueError, Image.DecompressionBombError) as e:
                raise DecodeError(path, "undecodable", f"cannot decode the instance mask: {e}",
                                  "re-export the mask") from e
            if values is None:
                raise DecodeError(path, "size_mismatch", f"mask is {size[0]}x{size[1]} but its "
                                  f"image is {width}x{height}", "masks must have the same size as their images")
            yield (values.any(axis=2) if values.ndim == 3 else values != 0), int(s["v"])

__all__ = ["InstanceMasks", "sample_parents"]
