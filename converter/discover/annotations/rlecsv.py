"""Kaggle RLE in CSV (Airbus ships, TGS salt, Severstal steel, HuBMAP, Sartorius, DSB 2018's
``stage1_train_labels.csv``): ``ImageId,EncodedPixels[,ClassId]``, one or more rows per image.

Found by content: a ``.csv`` at the top whose header has an id column (``ImageId``,
``id``, ...) and a run column (``EncodedPixels``, ``rle``, ``annotation``, ...), beside a
folder of images (``train_images/``, ``train/``, ``images/``, ...) whose names match the
ids (with or without extension). Runs are the Kaggle convention: ``start length`` pairs,
1-based, numbered down the columns first (column-major; ``--rle-order rows`` for CSVs whose
runs go along the rows, as Carvana's: scan tells from the shapes); the image size comes from the
image. The class is the ``ClassId`` column (integer ids keep their value, named
``class_<id>``; names are sorted), else one class (``--rle-class NAME``, default
``foreground``). An empty run column is an image without objects. Rows paint in file
order, later on top. Images of the folder the CSV does not list are left out (counted).
Kaggle's ``sample_submission.csv`` (test ids, placeholder runs ``1 1``) is never annotations.
A CSV beside mask images of the same images (TGS ``train/masks/``, Carvana ``train_masks/``) is
one of two readings, compared by `converter.discover.annotations.ambiguity`.
"""

from __future__ import annotations

import csv
import io
import os

import numpy as np

from converter.discover.annotations.base import AnnotationFileError, head_bytes, read_annotation_file
from converter.discover.annotations.listing import AnnotationSet, Reader, images_by_stem, make_sample
from converter.discover.files import file_names, is_dir, join, subfolders
from converter.discover.layout import BadInput
from converter.options import AnnotationOptions
from converter.transform.decode import DecodeError

#: "imageid_classid" (Severstal's first release: ``0002cc93b.jpg_1``) holds both, split at the last "_".
ID_COLUMNS = ("imageid_classid", "imageid", "image_id", "id", "img", "image", "imagename", "filename", "file_name",
              "name")
RUN_COLUMNS = ("encodedpixels", "encoded_pixels", "rle", "rle_mask", "encoding", "annotation", "segmentation")
CLASS_COLUMNS = ("classid", "class_id", "class", "label", "category")


def _columns(header: list[str]) -> tuple[int, int, int | None] | None:
    """(id column, run column, class column or None; the id column's index when it holds the class too)."""
    low = [h.strip().lower() for h in header]
    idc = next((low.index(c) for c in ID_COLUMNS if c in low), None)
    run = next((low.index(c) for c in RUN_COLUMNS if c in low), None)
    cls = idc if idc is not None and low[idc] == "imageid_classid" else next(
        (low.index(c) for c in CLASS_COLUMNS if c in low), None)
    return None if idc is None or run is None else (idc, run, cls)


def _head(path: str, lines: int = 6) -> list[list[str]]:
    """The first rows of a CSV file (header first)."""
    text = head_bytes(path, 1 << 16).decode("utf-8-sig", "replace").splitlines()[:lines]
    return [row for row in csv.reader([t for t in text if t.strip()])]


def _is_rle_csv(path: str) -> bool:
    """A header with an id and a run column, and a run value of integers among the first rows (or none filled)."""
    rows = _head(path)
    cols = _columns(rows[0]) if rows else None
    if cols is None:
        return False
    runs = [r[cols[1]] for r in rows[1:] if len(r) > cols[1]]
    return bool(runs) and (any(v.replace(" ", "").isdigit() for v in runs) or not any(v.strip() for v in runs))


def _image_folder(root: str, csv_path: str, ids: list[str]) -> str | None:
    """The folder whose images the ids name: the one matching most of the first ids."""
    stem = os.path.splitext(os.path.basename(csv_path))[0].lower()
    best, hits = None, 0
    for d in sorted(subfolders(root), key=lambda d: (not stem.startswith(d.lower().split("_")[0]), d)):
        names = set(file_names(join(root, d))[:100000])
        stems = {os.path.splitext(n)[0] for n in names}
        n = sum(1 for i in ids[:50] if i in names or i in stems)
        if n > hits:
            best, hits = join(root, d), n
    return best


def _image_finder(root: str, csv_path: str, ids: list[str]):
    """(the image folder, id -> image name below it or None): one folder of images named by the
    ids, else (DSB 2018's ``stage1_train/<id>/images/<id>.png``) any image below SRC whose
    base name is the id."""
    folder = _image_folder(root, csv_path, ids)
    for base in ([folder] if folder is not None else []) + [root]:
        images = images_by_stem(base)
        by_name = {v: v for v in images.values()}
        by_base = {}
        if base == root:
            for stem, rel in images.items():
                by_base.setdefault(os.path.basename(stem), rel)
                by_base.setdefault(os.path.basename(rel), rel)

        def find(ident: str, images=images, by_name=by_name, by_base=by_base) -> str | None:
            return (by_name.get(ident) or images.get(ident) or images.get(os.path.splitext(ident)[0])
                    or by_base.get(ident) or by_base.get(os.path.splitext(ident)[0]))

        if sum(1 for i in ids[:50] if find(i) is not None) * 2 >= min(len(ids), 50):
            return base, find
    return folder or root.rstrip("/"), lambda ident: None


def _is_submission(name: str) -> bool:
    """Kaggle's prediction template (``sample_submission.csv``, ``submission_v2.csv``): the test ids with
    placeholder runs (``1 1``), never ground truth."""
    return "submission" in name.lower()


def rle_files(root: str) -> list[str]:
    return [join(root, n) for n in file_names(root)
            if n.lower().endswith(".csv") and not _is_submission(n) and _is_rle_csv(join(root, n))]


class RleCsv(Reader):
    name = "rlecsv"
    title = "Kaggle RLE CSV"

    def detect(self, root: str) -> str | None:
        for path in rle_files(root):
            return f"RLE CSV {os.path.basename(path)} (ImageId, EncodedPixels)"
        return None

    def read(self, root: str, options: AnnotationOptions) -> AnnotationSet:
        files = rle_files(root)
        out = AnnotationSet(["train"], [], (), self.detect(root) or "")
        path = files[0]
        try:
            rows = list(csv.reader(io.StringIO(read_annotation_file(path).decode("utf-8-sig"))))
        except (UnicodeDecodeError, csv.Error) as e:
            raise AnnotationFileError(path, f"not a readable CSV: {e}", "save it as UTF-8 CSV") from e
        idc, run, cls = _columns(rows[0])  # type: ignore[misc]
        per_image: dict[str, list[tuple[str, str, int]]] = {}
        for n, row in enumerate(rows[1:], 2):
            if len(row) <= max(idc, run, cls or 0):
                raise AnnotationFileError(path, f"{len(row)} columns, the header has {len(rows[0])}",
                                          "fix the row", f"row {n}")
            ident, klass = row[idc].strip(), row[cls].strip() if cls is not None else ""
            if cls == idc:  # ImageId_ClassId
                ident, _, klass = ident.rpartition("_")
            per_image.setdefault(ident, []).append((klass, row[run].strip(), n))
        names, value = self._classes(per_image, cls is not None, options)
        out.class_names = names
        folder, find = _image_finder(root, path, list(per_image))
        images = images_by_stem(folder) if folder != root.rstrip("/") and is_dir(folder) else {}
        for ident in sorted(per_image):
            rel = find(ident)
            if rel is None:
                out.bad.append(BadInput(join(folder, ident), f"listed in {path} but no image found",
                                        "put the images in one folder beside the CSV", f"train/{ident}",
                                        "missing_image"))
                continue
            shapes = [{"v": value[c], "runs": r, "row": n} for c, r, n in per_image[ident] if r]
            for s in shapes:
                out.shapes[names[s["v"]]] += 1
            doc = {"ignore": out.ignore, "overlap": options.overlap.value, "shapes": shapes}
            if options.rle_order.value != "columns":
                doc["order"] = options.rle_order.value  # absent: the Kaggle convention (fingerprints unchanged)
            out.samples.append(make_sample("train", f"train/{rel}", join(folder, rel), self.name, path, ident, doc))
        out.unpaired_images = max(0, len(images) - len(out.samples))
        if out.unpaired_images:
            out.notes.append(f"{out.unpaired_images} image(s) in {folder} are not in {os.path.basename(path)}: "
                             "left out")
        return out

    @staticmethod
    def _classes(per_image: dict, has_class: bool, options: AnnotationOptions) -> tuple[tuple[str, ...], dict]:
        if not has_class:
            return ("background", options.rle_class or "foreground"), {"": 1}
        found = sorted({c for rows in per_image.values() for c, r, _ in rows if r})
        if all(c.isdigit() for c in found):
            top = max((int(c) for c in found), default=0)
            return ("background",) + tuple(f"class_{k}" for k in range(1, top + 1)), {c: int(c) for c in found}
        return ("background",) + tuple(found), {c: i + 1 for i, c in enumerate(found)}

    def shapes(self, doc: dict, height: int, width: int, where: str):
        for s in doc["shapes"]:
            yield decode_runs(s["runs"], height, width, f"{where} (row {s['row']})",
                              doc.get("order", "columns")), int(s["v"])


def decode_runs(text: str, height: int, width: int, where: str, order: str = "columns") -> np.ndarray:
    """Kaggle RLE ``start length ...`` (1-based; down the columns first, or along the rows with
    `order` "rows") -> (height, width) bool."""
    try:
        nums = np.array(text.split(), dtype=np.int64)
    except (ValueError, OverflowError) as e:
        raise DecodeError(where, "bad_annotation", f"RLE is not integers: {text[:60]!r}", "fix the row") from e
    if len(nums) % 2:
        raise DecodeError(where, "bad_annotation", "RLE has an odd count of numbers (start length pairs)",
                          "fix the row")
    starts, lengths = nums[0::2] - 1, nums[1::2]
    if len(nums) and (starts.min() < 0 or lengths.min() < 0 or int((starts + lengths).max()) > height * width):
        raise DecodeError(where, "bad_annotation", f"RLE runs reach past the {width}x{height} image "
                          f"({height * width} pixels)", "the CSV is for other images, or the runs are damaged")
    flat = np.zeros(height * width + 1, np.int32)
    np.add.at(flat, starts, 1)
    np.add.at(flat, starts + lengths, -1)
    on = np.cumsum(flat[:-1]) > 0
    return on.reshape(height, width) if order == "rows" else on.reshape(width, height).T


def edges(mask: np.ndarray) -> int:
    """Neighbouring pixel pairs that differ: shapes decoded the wrong way round are refolded into
    stripes, with many more edges than the blobs the annotator drew (scan's run-order check)."""
    return int(np.count_nonzero(mask[1:] != mask[:-1]) + np.count_nonzero(mask[:, 1:] != mask[:, :-1]))


__all__ = ["RleCsv", "decode_runs", "edges", "rle_files"]
