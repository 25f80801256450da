"""Mask semantics: how a decoded mask's pixels become class ids (a small strategy per kind).

* `ColourSemantics`: RGB colour -> class through `ColorMap` (class_dict.csv).
* `IndexSemantics`: the pixel value is the class id (grey level, palette index of a P
  mask, 16-bit value), after the ignore values, the label map or --reduce-zero-label.
* `BinarySemantics`: 0 is background, the other level foreground ({0,255} or {0,1});
  JPEG masks are thresholded at the mid level (`binary_threshold`).

`SampleTransformer` asks its semantics for `class_map(mask, geom, path, fail_on_unknown)`:
the stored class map at the output size. Index and binary masks go through one lookup
table (value -> stored class id) applied after Pillow's NEAREST sampling, so the result
is exact; unknown values are found at full resolution first (one bincount).
"""

from __future__ import annotations

import numpy as np

from converter.options import LabelOptions, MaskSemantics
from converter.transform.colormap import AMBIGUOUS, UNKNOWN, ColorMap, UnknownColors, ignore_index_for, mask_dtype_for
from converter.transform.decode import DecodeError, MaskArray
from converter.transform.resize import Geometry, nearest_rows_cols, resize_nearest
from readers.manifest import ClassInfo


class UnknownColorError(DecodeError):
    """A mask holds colours that are not in the class table."""

    def __init__(self, path: str, unknown: UnknownColors, colormap) -> None:
        parts = []
        if unknown.counts and isinstance(next(iter(unknown.counts)), int):  # index masks: values
            listed = ", ".join(f"{v} x{n} px" for v, n in sorted(unknown.counts.items(), key=lambda kv: -kv[1])[:8])
            super().__init__(
                path, "unknown_color", f"mask values with no class: {listed} "
                f"(classes are 0..{colormap.num_classes - 1})",
                "give the class table (--classes names.txt / --num-classes K), map them with --ignore-index V or "
                "--label-map, or use --unknown-color ignore",
            )
            self.unknown = unknown
            return
        for color, n in sorted(unknown.counts.items(), key=lambda kv: -kv[1])[:8]:
            name, dist = colormap.nearest(color)
            parts.append(f"{color} x{n} px (nearest {name!r}, distance {dist})")
        for color, n in sorted(unknown.ambiguous.items(), key=lambda kv: -kv[1])[:8]:
            parts.append(f"{color} x{n} px is within --color-tolerance of two classes (ambiguous)")
        kind = "ambiguous_color" if unknown.ambiguous and not unknown.counts else "unknown_color"
        super().__init__(
            path, kind, "unknown mask colours: " + "; ".join(parts),
            "fix the mask or class_dict.csv, or use --color-tolerance N / --unknown-color ignore",
        )
        self.unknown = unknown


def mask_values(mask: MaskArray) -> np.ndarray:
    """(H, W) pixel values of a mask: palette indices (P), grey levels (L, 1), 16-bit values;
    a colour mask only when it is grey (R == G == B), else a `DecodeError`."""
    if mask.indices is not None:
        return mask.indices
    packed = mask.colors()
    r, g, b = packed >> 16, (packed >> 8) & 255, packed & 255
    if not (np.array_equal(r, g) and np.array_equal(g, b)):
        raise DecodeError(mask.path, "colour_mask", "a colour (RGB) mask, but the mask semantics is index/binary "
                          "(pixel value = class id)",
                          "use --mask-semantics colour with a class_dict.csv (name,r,g,b)")
    return b.astype(np.uint8)


def binary_values(mask: MaskArray) -> np.ndarray:
    """(H, W) levels of a binary mask: its values, or the brightest channel of a colour mask (JPEG RGB)."""
    if mask.indices is None:
        packed = mask.colors()
        return np.maximum(np.maximum(packed >> 16, (packed >> 8) & 255), packed & 255).astype(np.uint8)
    return mask.indices


def resize_table(values: np.ndarray, lut: np.ndarray, geom: Geometry, fill: int) -> np.ndarray:
    """`lut[values]` at the output size: Pillow's NEAREST sampling first, then the table (exact);
    padding (--fit contain, crop-or-pad) gets `fill`."""
    rows, cols = nearest_rows_cols(geom)
    out = lut[resize_nearest(values, geom, 0)]
    if geom.pads:
        py, px = geom.offset
        inner = out[py:py + len(rows), px:px + len(cols)].copy()
        out.fill(fill)
        out[py:py + len(rows), px:px + len(cols)] = inner
    return out


class ColourSemantics:
    """class_dict.csv colours (today's behaviour)."""

    kind = MaskSemantics.COLOUR

    def __init__(self, classes: tuple[ClassInfo, ...], tolerance: int = 0) -> None:
        self.colormap = ColorMap(classes, tolerance)
        self.ignore_index = self.colormap.ignore_index
        self.dtype = self.colormap.dtype

    def nearest(self, color) -> tuple[str, int]:
        return self.colormap.nearest(color)

    def lookup(self, mask: MaskArray, *, stats: bool = True) -> tuple[np.ndarray, UnknownColors]:
        return self.colormap.lookup(mask, stats=stats)

    def class_map(self, mask: MaskArray, geom: Geometry, path: str, fail_on_unknown: bool) -> np.ndarray:
        classes, unknown = self.colormap.lookup(mask, stats=fail_on_unknown)
        if unknown.ambiguous or (unknown.counts and fail_on_unknown):
            raise UnknownColorError(path, unknown, self)
        class_map = resize_nearest(classes, geom, self.ignore_index)
        return self.colormap.finish(class_map, ignore_unknown=True)

    def warm_up(self) -> None:
        self.colormap.inverted_lut  # noqa: B018 - built on first access


class IndexSemantics:
    """Pixel value -> class id through one table (ignore values, label map, reduce-zero-label)."""

    kind = MaskSemantics.INDEX

    def __init__(self, classes: tuple[ClassInfo, ...], labels: LabelOptions) -> None:
        self.classes = classes
        self.num_classes = len(classes)
        self.ignore_index = ignore_index_for(self.num_classes)
        self.dtype = mask_dtype_for(self.num_classes)
        self.labels = labels
        self._tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def target(self, v: int) -> int | None:
        """Class id of value v, `ignore_index`, or None (unknown)."""
        lab = self.labels
        if v in (lab.ignore_values or ()):
            return self.ignore_index
        if lab.label_map is not None:
            t = dict(lab.label_map).get(v)
            if t is None or t >= self.num_classes:
                return self.ignore_index
            return t
        if lab.reduce_zero_label:
            if v == 0:
                return self.ignore_index
            v -= 1
        return v if v < self.num_classes else None

    def table(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        """(value -> stored class id with unknowns at the ignore index, value -> unknown?) for `size` values."""
        if size not in self._tables:
            lab, nc, ignore = self.labels, self.num_classes, self.ignore_index
            values = np.arange(size, dtype=np.int64)
            if lab.label_map is not None:  # unlisted (and beyond the table) -> ignore
                t = np.full(size, ignore, np.int64)
                for a, b in lab.label_map:
                    if a < size:
                        t[a] = b if b < nc else ignore
                unknown = np.zeros(size, bool)
            else:
                t = values - 1 if lab.reduce_zero_label else values
                unknown = t >= nc
                if lab.reduce_zero_label:
                    unknown[0] = False
                t = np.where(unknown, ignore, t)
                if lab.reduce_zero_label:
                    t[0] = ignore
            for v in lab.ignore_values or ():
                if v < size:
                    t[v] = ignore
                    unknown[v] = False
            self._tables[size] = (t.astype(self.dtype), unknown)
        return self._tables[size]

    def nearest(self, value) -> tuple[str, int]:
        return f"(values are class ids 0..{self.num_classes - 1})", 0

    def values(self, mask: MaskArray) -> np.ndarray:
        return mask_values(mask)

    def lookup(self, mask: MaskArray, *, stats: bool = True) -> tuple[np.ndarray, UnknownColors]:
        """Full-resolution uint16 class ids (UNKNOWN marks) and the unknown values' pixel counts."""
        values = self.values(mask)
        lut, unknown = self.table(256 if values.dtype == np.uint8 else 65536)
        classes = lut[values].astype(np.uint16)
        found = UnknownColors()
        if unknown.any():
            bad = unknown[values]
            if bad.any():
                classes[bad] = UNKNOWN
                vals, counts = np.unique(values[bad], return_counts=True)
                found.counts = {int(v): int(n) for v, n in zip(vals, counts)}
        return classes, found

    def unknown_counts(self, values: np.ndarray) -> dict[int, int]:
        """Pixels of each value with no class, at full resolution.

        Without a label map the unknown values are those from a threshold up (the class
        count, plus one with --reduce-zero-label) except the ignore values: one max and, only
        when it reaches the threshold, one comparison pass; the few pixels above it are
        then counted (VOC's 255 border costs a pass, not a histogram of every pixel)."""
        if self.labels.label_map is not None or not values.size:
            return {}
        threshold = self.num_classes + (1 if self.labels.reduce_zero_label else 0)
        if int(values.max()) < threshold:
            return {}
        high = values[values >= threshold]
        if self.labels.ignore_values:
            high = high[~np.isin(high, self.labels.ignore_values)]
        if not high.size:
            return {}
        found, counts = np.unique(high, return_counts=True)
        return {int(v): int(n) for v, n in zip(found, counts)}

    def class_map(self, mask: MaskArray, geom: Geometry, path: str, fail_on_unknown: bool) -> np.ndarray:
        values = self.values(mask)
        lut, _ = self.table(256 if values.dtype == np.uint8 else 65536)
        if fail_on_unknown:
            counts = self.unknown_counts(values)
            if counts:
                raise UnknownColorError(path, UnknownColors(counts=counts), self)  # type: ignore[arg-type]
        return resize_table(values, lut, geom, self.ignore_index)

    def warm_up(self) -> None:
        self.table(256)


class BinarySemantics(IndexSemantics):
    """Two classes: background (0) and foreground (the other level)."""

    kind = MaskSemantics.BINARY

    def values(self, mask: MaskArray) -> np.ndarray:
        return binary_values(mask)

    def table(self, size: int, top: int = 255) -> tuple[np.ndarray, np.ndarray]:
        key = size * 2 + (top <= 1)
        if key not in self._tables:
            values = np.arange(size)
            lut = (values >= (1 if top <= 1 else self.labels.binary_threshold)).astype(self.dtype)
            for v in self.labels.ignore_values or ():
                if v < size:
                    lut[v] = self.ignore_index
            self._tables[key] = (lut, np.zeros(size, bool))
        return self._tables[key]

    def _table_for(self, values: np.ndarray) -> np.ndarray:
        ignore = set(self.labels.ignore_values or ())
        kept = values if not ignore else values[~np.isin(values, list(ignore))]
        top = int(kept.max()) if kept.size else 0
        return self.table(256 if values.dtype == np.uint8 else 65536, top)[0]

    def lookup(self, mask: MaskArray, *, stats: bool = True) -> tuple[np.ndarray, UnknownColors]:
        values = self.values(mask)
        return self._table_for(values)[values].astype(np.uint16), UnknownColors()

    def class_map(self, mask: MaskArray, geom: Geometry, path: str, fail_on_unknown: bool) -> np.ndarray:
        values = self.values(mask)
        lut = self._table_for(values)
        return resize_table(values, lut, geom, self.ignore_index)


BINARY_CLASSES = (ClassInfo("background", (0, 0, 0)), ClassInfo("foreground", (255, 255, 255)))


def make_semantics(labels: LabelOptions, classes: tuple[ClassInfo, ...], tolerance: int = 0):
    """The strategy for resolved `labels` (semantics None: colour, as before semantics existed)."""
    if labels.semantics is MaskSemantics.INDEX:
        return IndexSemantics(classes, labels)
    if labels.semantics is MaskSemantics.BINARY:
        return BinarySemantics(classes, labels)
    return ColourSemantics(classes, tolerance)


__all__ = ["AMBIGUOUS", "BINARY_CLASSES", "BinarySemantics", "ColourSemantics", "IndexSemantics", "UnknownColorError",
           "binary_values", "make_semantics", "mask_values"]
