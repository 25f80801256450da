"""Transform one source sample into its output arrays: decode, fit, colour -> class.

`SampleTransformer` is built once per worker (it owns the colour lookup table) and
called once per sample. It returns a `Transformed` sample or raises `DecodeError`
naming the bad file; it never touches the output folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from converter.discover.layout import SourceSample
from converter.options import MaskEncoding, OutputOptions, UnknownColor
from converter.transform.colormap import ColorMap, UnknownColors
from converter.transform.decode import DecodeError, MaskArray, decode_image, decode_mask, read_source
from converter.transform.resize import plan_geometry, resize_image, resize_nearest
from readers.manifest import ClassInfo, SampleEntry
from readers.tasks import task_kind


@dataclass(frozen=True)
class Transformed:
    entry: SampleEntry
    image: np.ndarray  # (H, W, 3) uint8
    mask: np.ndarray | None  # (H, W) class map, or (H, W, C) uint8 one-hot planes
    label: int | None
    class_pixels: np.ndarray  # (C,) int64
    ignore_pixels: int


class UnknownColorError(DecodeError):
    """A mask holds colours that are not in the class table."""

    def __init__(self, path: str, unknown: UnknownColors, colormap: ColorMap) -> None:
        parts = []
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


def relative_key_path(path: str, base: str) -> str:
    """`path` relative to the source base, '/'-separated (absolute when outside it)."""
    rel = os.path.relpath(path, base)
    return path if rel.startswith("..") else rel.replace(os.sep, "/")


#: Up to this many classes, pixels are counted by comparison passes instead of bincount.
_COMPARE_UP_TO = 16


class SampleTransformer:
    """Decode + fit + colour lookup for one worker; reuse it for every sample."""

    def __init__(self, options: OutputOptions, classes: tuple[ClassInfo, ...], source_base: str,
                 max_pixels: int) -> None:
        self.options = options
        self.classes = classes
        self.base = source_base
        self.max_pixels = max_pixels
        self.kind = task_kind(options.task)
        self.segmentation = self.kind.dense
        self.colormap = ColorMap(classes, options.color_tolerance) if self.segmentation else None
        self.num_classes = len(classes)

    def count_classes(self, mask: np.ndarray | None, label: int | None) -> tuple[np.ndarray, int]:
        """Per-class pixel counts of a stored mask (class map or one-hot), or a one-sample label count."""
        counts = np.zeros(self.num_classes, dtype=np.int64)
        if mask is None:
            if label is not None:
                counts[label] = 1
            return counts, 0
        if mask.ndim == 3:  # one-hot planes; an all-zero row is the ignore index
            counts += mask.reshape(-1, mask.shape[-1]).sum(axis=0, dtype=np.int64)[: self.num_classes]
            return counts, int(mask.shape[0] * mask.shape[1] - counts.sum())
        ignore = self.colormap.ignore_index  # type: ignore[union-attr]
        if self.num_classes <= _COMPARE_UP_TO:
            # A class map holds class indices and the ignore index only: one comparison pass
            # per class is 3x faster than bincount (which widens every pixel to intp) here.
            for c in range(self.num_classes):
                counts[c] = np.count_nonzero(mask == c)
            return counts, int(mask.size - counts.sum())
        full = np.bincount(mask.ravel(), minlength=max(self.num_classes, ignore + 1))
        counts += full[: self.num_classes]
        return counts, int(full[ignore])

    def mask_classes(self, mask: MaskArray, path: str) -> np.ndarray:
        """Look a decoded mask's colours up: the full-resolution uint16 class map.

        Raises `UnknownColorError` for ambiguous colours, and for unknown ones unless
        `--unknown-color ignore`.
        """
        cmap = self.colormap
        if cmap is None:
            raise ValueError(f"mask_classes needs a segmentation task. Received: task={self.options.task.value!r}")
        fail_on_unknown = self.options.unknown_color is UnknownColor.FAIL
        classes, unknown = cmap.lookup(mask, stats=fail_on_unknown)
        if unknown.ambiguous or (unknown.counts and fail_on_unknown):
            raise UnknownColorError(path, unknown, cmap)
        return classes

    def __call__(self, sample: SourceSample) -> Transformed:
        opts = self.options
        img_src = read_source(sample.image, relative_key_path(sample.image, self.base))
        mask_src = read_source(sample.mask, relative_key_path(sample.mask, self.base)) if sample.mask else None
        image = decode_image(img_src, self.max_pixels, exif_transpose=self.kind.exif_transpose)
        geom = plan_geometry(image.shape[:2], opts.size, opts.fit)
        out_image = resize_image(image, geom, opts.image_filter)
        entry = SampleEntry(sample.key, img_src.fingerprint, mask_src.fingerprint if mask_src else None, sample.label)
        if not self.segmentation:
            counts, _ = self.count_classes(None, sample.label)
            return Transformed(entry, out_image, None, sample.label, counts, 0)

        if mask_src is None:
            raise DecodeError(sample.image, "missing_mask", "image without mask")
        mask = decode_mask(mask_src, self.max_pixels)
        if (mask.height, mask.width) != image.shape[:2]:
            raise DecodeError(
                sample.mask or "", "size_mismatch",
                f"mask is {mask.width}x{mask.height} but its image {sample.image} is "
                f"{image.shape[1]}x{image.shape[0]}",
                "masks must have the same size as their images",
            )
        classes = self.mask_classes(mask, sample.mask or "")
        cmap = self.colormap
        class_map = resize_nearest(classes, geom, cmap.ignore_index)  # type: ignore[union-attr]
        class_map = cmap.finish(class_map, ignore_unknown=True)  # type: ignore[union-attr]
        class_pixels, ignore_pixels = self.count_classes(class_map, None)
        if opts.mask_encoding is MaskEncoding.ONEHOT:
            planes = np.arange(self.num_classes, dtype=class_map.dtype)
            out_mask = (class_map[:, :, None] == planes).astype(np.uint8)
        else:
            out_mask = class_map
        return Transformed(entry, out_image, out_mask, None, class_pixels, ignore_pixels)
