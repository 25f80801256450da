"""What a dataset's files show about the meaning of its mask pixels (issue 24).

Folder names say where the files are, not what their pixels mean: a dataset laid out
like Pascal VOC is not Pascal VOC, and a palette that looks like the VOC colour map is
not a class order. The layouts and `converter.discover.labels` decide from this
evidence, and say which evidence decided (`LayoutDefaults.classes_from`):

* `peek_masks(folder)`: a few masks spread over the folder's sorted listing, decoded as
  convert decodes them, and `peek_values` their values;
* `two_level(values)`: masks of two levels (0 and 1, 0 and 255, 0 and 65535, or 8-bit
  0/255 files beside 16-bit 0/65535 ones) are binary, never a class plus an ignore value
  (layouts then bring no defaults; scan, seeing every mask's values, proposes binary);
* `pascal_voc_evidence`: VOC image ids (``2007_000032``) and values within 0..20 plus 255;
* `palette_order(mask, classes)`: does a palette list the colour table's colours in table
  order (the index and colour readings agree), or not (only the colour reading is right);
* `voc_defaults`, `names_defaults`: the classes of a layout from that evidence;
* `instance_ids(samples)`: masks that number each image's objects 1..N (Cellpose's
  instance-id masks) are not class maps: per mask the ids are 1..N (nearly all present),
  each one blob and small, N varying from mask to mask.
"""

from __future__ import annotations

import os
import re

import numpy as np

from converter.discover.files import file_names, join, subfolders
from converter.discover.layout import IMAGE_EXTENSIONS, LayoutDefaults
from converter.discover.names_files import find_names_file, read_names
from converter.options import DEFAULT_MAX_PIXELS, MaskSemantics
from converter.transform.decode import DecodeError, MaskArray, decode_mask, read_source
from readers.manifest import ClassInfo

#: Masks decoded to look at a folder's values (spread over its sorted listing).
PEEK_MASKS = 8
#: Pascal VOC image ids: year_number (2007_000032).
VOC_IMAGE_ID = re.compile(r"^20\d\d_\d{6}$")
VOC_VALUES = frozenset(range(21)) | {255}
#: ADE20K file names (ADE_train_00000001, ADE_val_00000001).
ADE_NAME = re.compile(r"^ADE_[a-z]+_\d{8}$")
#: Instance-id masks: the most ids in one sampled mask at least, ids present / N per mask, the share
#: of ids that are one blob (Euler number 1), the median id's share of the mask's pixels at most.
INSTANCE_MIN_IDS = 20
INSTANCE_COVERAGE = 0.8
INSTANCE_ONE_BLOB = 0.75
INSTANCE_MEDIAN_AREA = 0.05
_GREY = (np.arange(256, dtype=np.uint32) * 0x010101).astype(np.uint32)


def mask_names(folder: str) -> list[str]:
    """Image-file names in `folder` (one level, sorted)."""
    return sorted(n for n in file_names(folder)
                  if not n.startswith(".") and os.path.splitext(n)[1].lower() in IMAGE_EXTENSIONS)


def spread(items: list, n: int = PEEK_MASKS) -> list:
    """Up to `n` items evenly spread over `items` (first and last included)."""
    if len(items) <= n:
        return list(items)
    return [items[round(i * (len(items) - 1) / (n - 1))] for i in range(n)]


def sample_masks(samples, n: int = PEEK_MASKS) -> list[str]:
    """Mask paths of up to `n` samples spread over `samples` (indexed, never listed whole)."""
    picked = [samples[i] for i in spread(range(len(samples)), n)]
    return [s.mask for s in picked if s.mask]


def peek_mask(path: str) -> MaskArray | None:
    """`path` decoded as convert decodes an index mask (16-bit values kept); None if unreadable."""
    try:
        return decode_mask(read_source(path, path), DEFAULT_MAX_PIXELS, wide=True)
    except DecodeError:
        return None


def peek_values(paths: list[str]) -> set[int] | None:
    """The values of the masks at `paths` (palette indices, grey levels); None when one is a colour mask."""
    values: set[int] = set()
    for path in paths:
        mask = peek_mask(path)
        if mask is None:
            continue
        if mask.indices is None:
            return None
        values |= {int(v) for v in np.unique(mask.indices)}
    return values


def is_palette(mask: MaskArray) -> bool:
    """True for a palette (P) mask: indices with a colour table that is not the grey ramp."""
    return mask.indices is not None and mask.table is not None and not np.array_equal(mask.table, _GREY)


def two_level(values, per_file=()) -> bool:
    """True when mask values are two levels: 0 and 1, 0 and 255, 0 and 65535, or 0/255 files
    beside 0/65535 ones (`per_file`: each file's value set, when known, must hold one level)."""
    values = set(values)
    if 0 not in values or len(values) < 2:
        return False
    if values <= {0, 1}:
        return True
    if not values <= {0, 255, 65535}:
        return False
    return all(not {255, 65535} <= set(v) for v in per_file)


def palette_order(mask: MaskArray, classes: tuple[ClassInfo, ...]) -> str:
    """'table order' when palette entry i is table row i's colour for every row, else 'differs'."""
    table = mask.table if mask.table is not None else _GREY
    colours = [(int(c) >> 16 & 255, int(c) >> 8 & 255, int(c) & 255) for c in table[:len(classes)]]
    same = len(classes) <= len(table) and all(tuple(ci.color or ()) == c for ci, c in zip(classes, colours))
    return "table order" if same else "differs"


def palette_conflict(mask: MaskArray, classes: tuple[ClassInfo, ...]) -> list[tuple[int, tuple, int]]:
    """(index, colour, pixels) of palette indices used in `mask` whose colour is in no table row."""
    known = {tuple(c.color) for c in classes if c.color is not None}
    used = np.bincount(mask.indices.ravel(), minlength=256)  # type: ignore[union-attr]
    out = []
    for i in np.nonzero(used)[0]:
        c = int(mask.table[i])  # type: ignore[index]
        colour = (c >> 16 & 255, c >> 8 & 255, c & 255)
        if colour not in known:
            out.append((int(i), colour, int(used[i])))
    return out


def pascal_voc_evidence(stems: list[str], values: set[int] | None) -> tuple[bool, str]:
    """(is Pascal VOC, why): VOC image ids and mask values within 0..20 plus 255."""
    odd = [s for s in stems if not VOC_IMAGE_ID.match(s)]
    if not stems or odd:
        return False, f"mask names are not VOC image ids (e.g. {odd[0] if odd else 'none found'!r})"
    if values is None:
        return False, "the masks are colour images"
    beyond = sorted(values - VOC_VALUES)
    if beyond:
        return False, f"mask values beyond 0..20 and 255 (e.g. {beyond[:4]})"
    return True, "Pascal VOC (VOC folders, VOC image ids, mask values within 0..20 and 255)"


def names_defaults(path: str, values: set[int] | None, ignore: tuple[int, ...] = ()) -> LayoutDefaults:
    """Index masks named by the names file at `path`; binary when the masks hold two levels above 1."""
    names = read_names(path)
    where = f"the names file {os.path.basename(path)} ({len(names.names)} classes)"
    if values is not None and two_level(values) and max(values) > 1:
        return LayoutDefaults(names_file=path, two_level=True,  # semantics left open: scan decides
                              classes_from=where + f"; masks of two levels (0 and {max(values)}): binary")
    keep = tuple(v for v in ignore if v >= len(names.names) and not (values is not None and two_level(values)))
    return LayoutDefaults(MaskSemantics.INDEX, keep, names_file=path, classes_from=where)


def _binary(values: set[int], why: str = "") -> LayoutDefaults:
    """Two-level masks seen in the sampled masks: no layout default (no VOC classes, no reduced zero,
    no 255 void); the semantics is left open, so scan decides binary from every mask's values (a
    rare class missing from the sample must not be read as background)."""
    return LayoutDefaults(two_level=True,
                          classes_from=f"masks of two levels (0 and {max(values)}): background and foreground{why}")


def folder_pair_defaults(root: str, masks_name: str, reduce: bool) -> LayoutDefaults:
    """Classes of an ``images/`` + ``annotations/`` (or mmseg) dataset: binary for two-level
    masks; ADE20K's reduced zero label only with ADE20K's file names (``ADE_train_00000001``)."""
    masks = join(root, masks_name)
    folder = next((join(masks, d) for d in subfolders(masks) if mask_names(join(masks, d))), masks)
    names = mask_names(folder)
    values = peek_values([join(folder, n) for n in spread(names)])
    if values is not None and two_level(values):
        return _binary(values)
    if not reduce:
        return LayoutDefaults(MaskSemantics.INDEX, classes_from="the mask values present, class_0..")
    odd = [n for n in names if not ADE_NAME.match(os.path.splitext(n)[0])]
    if names and not odd:
        return LayoutDefaults(MaskSemantics.INDEX, reduce_zero_label=True,
                              classes_from="the mask values present; ADE20K (ADE_ file names): 0 = other, "
                              "reduced (v -> v-1)")
    return LayoutDefaults(MaskSemantics.INDEX, classes_from="the mask values present, class_0.. (not ADE20K: "
                          f"names like {(odd or ['none'])[0]!r}, so 0 is a class, not reduced)")


def voc_defaults(root: str, base: str, mask_dir: str) -> LayoutDefaults:
    """Classes of a VOC-layout dataset: a names file beside it, the 21 VOC classes only for
    Pascal VOC itself, else binary for two-level masks or the values present."""
    from converter.discover.labelmaps import VOC_CLASSES

    folder = join(base, mask_dir)
    names = mask_names(folder)
    values = peek_values([join(folder, n) for n in spread(names)])
    names_path = find_names_file(base) or (find_names_file(root) if root != base else None)
    if names_path is not None:
        return names_defaults(names_path, values, (255,))
    stems = [os.path.splitext(n)[0] for n in names]
    voc, why = pascal_voc_evidence(stems, values)
    if voc:
        return LayoutDefaults(MaskSemantics.INDEX, (255,), class_names=VOC_CLASSES, classes_from=why)
    if values is not None and two_level(values):
        return _binary(values, f" (not Pascal VOC: {why})")
    return LayoutDefaults(classes_from=f"the mask values present, class_0.. (not Pascal VOC: {why}; "
                          "no names file beside the data)")


def euler_numbers(values: np.ndarray) -> np.ndarray:
    """Per value v, the Euler number of the pixels equal to v (4-connected): blobs minus holes,
    V - E + F (pixels, equal neighbour pairs, equal 2x2 blocks); 1 for one blob without holes."""
    size = int(values.max()) + 1
    h = values[:, 1:] == values[:, :-1]
    v = values[1:, :] == values[:-1, :]
    f = h[1:, :] & h[:-1, :] & v[:, 1:]
    out = np.bincount(values.ravel(), minlength=size).astype(np.int64)
    out -= np.bincount(values[:, 1:][h], minlength=size) + np.bincount(values[1:, :][v], minlength=size)
    return out + np.bincount(values[1:, 1:][f], minlength=size)


def instance_reading(mask: MaskArray) -> dict | None:
    """One mask's instance-id evidence ({'ids', 'top', 'one_blob', 'median_area'}), None when it is
    no instance-id mask (ids not 1..N nearly all present, not one blob each, not small); {} when it holds
    fewer than two ids (tells nothing)."""
    if mask.indices is None or mask.indices.ndim != 2 or min(mask.indices.shape) < 2:
        return None
    values = mask.indices
    counts = np.bincount(values.ravel())
    ids = np.nonzero(counts[1:])[0] + 1
    if len(ids) < 2:
        return {}
    top = int(ids.max())
    one_blob = float(np.mean(euler_numbers(values)[ids] == 1))
    median_area = float(np.median(counts[ids])) / values.size
    if len(ids) < INSTANCE_COVERAGE * top or one_blob < INSTANCE_ONE_BLOB or median_area > INSTANCE_MEDIAN_AREA:
        return None
    return {"ids": len(ids), "top": top, "one_blob": one_blob, "median_area": median_area}


def instance_ids(samples, n: int = PEEK_MASKS) -> dict | None:
    """The evidence that the masks of `samples` are instance ids, not classes (`instance_reading` of up to
    `n` masks spread over them, decoded one by one, stopping at the first that is not), or None: at least
    two masks with ids, every one 1..N, one blob each, small; N varying; one mask with `INSTANCE_MIN_IDS`."""
    seen = []
    for path in sample_masks(samples, n):
        mask = peek_mask(path)
        if mask is None:
            continue
        one = instance_reading(mask)
        if one is None:
            return None
        if one:
            seen.append(one)
    if len(seen) < 2 or len({s["top"] for s in seen}) < 2 or max(s["ids"] for s in seen) < INSTANCE_MIN_IDS:
        return None
    return {"masks": len(seen), "ids": [s["ids"] for s in seen], "top": [s["top"] for s in seen],
            "one_blob": round(min(s["one_blob"] for s in seen), 3),
            "median_area": round(max(s["median_area"] for s in seen), 5)}


def describe_instances(ev: dict) -> str:
    """The instance-id evidence, for people."""
    return (f"instance ids: in {ev['masks']} sampled mask(s) the values are ids 1..N with N = "
            f"{min(ev['top'])}..{max(ev['top'])} varying per mask, nearly all present, each id one blob "
            f"(at least {ev['one_blob']:.0%}) of at most {ev['median_area']:.2%} of the mask (median): objects "
            "numbered per image, not classes")


__all__ = ["PEEK_MASKS", "describe_instances", "euler_numbers", "folder_pair_defaults", "instance_ids",
           "instance_reading", "is_palette", "mask_names", "names_defaults", "palette_conflict",
           "palette_order", "pascal_voc_evidence", "peek_mask", "peek_values", "sample_masks", "spread", "two_level",
           "voc_defaults"]
