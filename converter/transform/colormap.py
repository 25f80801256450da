"""Colour -> class index with a lookup table: O(pixels), not O(pixels x classes).

The table has one entry per 24-bit colour (16.7 M entries, uint16: 32 MiB of address
space, stored bitwise-inverted so that it starts as untouched zero pages: building it
costs nothing and only the pages class colours fall on become resident). Exact matches map to their class; with ``color_tolerance=N`` every colour
within N per channel of exactly one class colour snaps to it, and colours within N of
two classes are marked ambiguous (an error if a mask uses one). Palette and greyscale
masks are looked up through their 256-entry colour table first, so the per-pixel work
is a 256-entry ``take``.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field

import numpy as np

from converter.transform.decode import MaskArray
from readers.manifest import ClassInfo

UNKNOWN = np.uint16(0xFFFF)
AMBIGUOUS = np.uint16(0xFFFE)
MAX_CLASSES = 0xFFFD


def ignore_index_for(num_classes: int) -> int:
    """255 for uint8 class maps (<= 255 classes); 65535 for uint16 ones."""
    return 255 if num_classes <= 255 else 65535


def mask_dtype_for(num_classes: int) -> np.dtype:
    return np.dtype(np.uint8) if num_classes <= 255 else np.dtype("<u2")


def _unpack(c: int) -> tuple[int, int, int]:
    return (int(c) >> 16) & 255, (int(c) >> 8) & 255, int(c) & 255


@dataclass
class UnknownColors:
    """Pixel counts of colours that matched no class in one mask."""

    counts: dict[tuple[int, int, int], int] = field(default_factory=dict)
    ambiguous: dict[tuple[int, int, int], int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.counts or self.ambiguous)


class ColorMap:
    """Maps packed 0xRRGGBB colours to class indices."""

    def __init__(self, classes: tuple[ClassInfo, ...], tolerance: int = 0) -> None:
        if len(classes) > MAX_CLASSES:
            raise ValueError(f"At most {MAX_CLASSES} classes are supported. Received: {len(classes)}")
        self.classes = classes
        self.tolerance = tolerance
        self.num_classes = len(classes)
        self.ignore_index = ignore_index_for(self.num_classes)
        self.dtype = mask_dtype_for(self.num_classes)
        self.colors = np.array([c.color for c in classes], dtype=np.int64).reshape(-1, 3)
        self._inverted: np.ndarray | None = None

    @property
    def inverted_lut(self) -> np.ndarray:
        """(2**24,) uint16 holding ~value (bitwise not) for each packed colour.

        value is the class index, UNKNOWN or AMBIGUOUS. Stored inverted, UNKNOWN is 0:
        the table starts as untouched zero pages (no 32 MiB fill, no resident memory) and
        only the pages that class colours (and their tolerance boxes) fall on are ever
        written or read. Built lazily: palette masks never need it.
        """
        if self._inverted is None:
            self._inverted = self._build()
        return self._inverted

    def lookup_colors(self, packed: np.ndarray) -> np.ndarray:
        """uint16 class index, UNKNOWN or AMBIGUOUS of each packed 0xRRGGBB colour."""
        return ~self.inverted_lut[packed]

    def _build(self) -> np.ndarray:
        # An anonymous map is zero pages by definition (~UNKNOWN == 0): np.zeros could be
        # served from the reused heap (`tune_allocator`), which clears 32 MiB first (9 ms).
        inv = np.frombuffer(mmap.mmap(-1, 2 << 24), dtype=np.uint16)
        cube = inv.reshape(256, 256, 256)
        n = self.tolerance
        if n:
            for i, (r, g, b) in enumerate(self.colors):
                sl = (slice(max(0, r - n), r + n + 1), slice(max(0, g - n), g + n + 1), slice(max(0, b - n), b + n + 1))
                region = cube[sl]
                free = region == np.uint16(~UNKNOWN)
                clash = ~free & (region != np.uint16(~np.uint16(i)))
                region[free] = ~np.uint16(i)
                region[clash] = ~AMBIGUOUS
        for i, (r, g, b) in enumerate(self.colors):  # exact colours always win
            cube[r, g, b] = ~np.uint16(i)
        return inv

    def nearest(self, color: tuple[int, int, int]) -> tuple[str, int]:
        """Nearest class by Chebyshev distance (what --color-tolerance measures)."""
        d = np.abs(self.colors - np.array(color)).max(axis=1)
        i = int(d.argmin())
        return self.classes[i].name, int(d[i])

    def lookup(self, mask: MaskArray, *, stats: bool = True) -> tuple[np.ndarray, UnknownColors]:
        """Full-resolution class map (uint16 with UNKNOWN/AMBIGUOUS marks) and unknown colour stats.

        `stats=False` (unknown colours are ignored by the caller): a colour mask's stats
        are gathered only when it holds an ambiguous colour, which is still an error;
        they cost a second unfilter of the PNG and a pass over every pixel.
        """
        if mask.indices is not None:
            table = self._lookup_packed(mask.table)  # type: ignore[arg-type]
            classes = table[mask.indices]
            unknown = UnknownColors()
            if (table >= AMBIGUOUS).any():
                used = np.bincount(mask.indices.ravel(), minlength=256)
                for idx in np.nonzero((table >= AMBIGUOUS) & (used > 0))[0]:
                    target = unknown.counts if table[idx] == UNKNOWN else unknown.ambiguous
                    color = _unpack(mask.table[idx])  # type: ignore[index]
                    target[color] = target.get(color, 0) + int(used[idx])
            return classes, unknown
        classes, flagged = mask.lookup(self.inverted_lut, int(AMBIGUOUS))
        unknown = UnknownColors()
        if flagged and (stats or (classes == AMBIGUOUS).any()):
            colors, counts = np.unique(mask.colors()[classes >= AMBIGUOUS], return_counts=True)
            marks = self.lookup_colors(colors)
            for c, k, m in zip(colors, counts, marks):
                (unknown.counts if m == UNKNOWN else unknown.ambiguous)[_unpack(c)] = int(k)
        return classes, unknown

    def _lookup_packed(self, packed: np.ndarray) -> np.ndarray:
        if self.tolerance == 0 and self.num_classes < 64:
            # Small exact tables: compare 256 entries against the class colours, no 32 MiB table.
            out = np.full(packed.shape, UNKNOWN, dtype=np.uint16)
            class_packed = (self.colors[:, 0] << 16) | (self.colors[:, 1] << 8) | self.colors[:, 2]
            for i, c in enumerate(class_packed):
                out[packed == c] = i
            return out
        return self.lookup_colors(packed)

    def finish(self, classes: np.ndarray, ignore_unknown: bool) -> np.ndarray:
        """Turn a looked-up uint16 map into the stored dtype; unknowns -> ignore index."""
        if ignore_unknown:
            classes = np.where(classes >= AMBIGUOUS, np.uint16(self.ignore_index), classes)
        return classes.astype(self.dtype, copy=False)
