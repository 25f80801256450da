"""Transform one source sample into its output arrays: decode, fit, colour -> class.

`SampleTransformer` is built once per worker (it owns the colour lookup table) and
called once per sample. It returns a `Transformed` sample or raises `DecodeError`
naming the bad file; it never touches the output folder.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from converter.discover.annotations.registry import rasterize, rasterize_read
from converter.discover.files import relative, use_storage_options
from converter.discover.layout import SourceSample
from converter.options import ExifMode, LabelOptions, MaskEncoding, MaskSemantics, OutputOptions, UnknownColor
from converter.plan.fingerprint import combine_fingerprints
from converter.transform.decode import DecodeError, MaskArray, SourceFile, decode_mask, read_source
from converter.transform.exif import apply_orientation, orient, orientation_of
from converter.transform.kinds import ImageReader
from converter.transform.resize import plan_geometry
from converter.transform.semantics import UnknownColorError, make_semantics
from readers.manifest import ClassInfo, SampleEntry
from readers.tasks import task_kind


def annotation_mask(annotation, height: int, width: int) -> MaskArray:
    """A sample's annotations rasterized at its image's size, as an index mask (`DecodeError` when unusable)."""
    values = rasterize(annotation, height, width)
    return MaskArray(height, width, indices=values, path=annotation.where)


def annotation_mask_read(annotation, height: int, width: int):
    """(`annotation_mask`, the annotation as its files were read: `registry.rasterize_read`)."""
    canvas, as_read = rasterize_read(annotation, height, width)
    return MaskArray(height, width, indices=canvas.values, path=annotation.where), as_read


@dataclass(frozen=True)
class Transformed:
    entry: SampleEntry
    image: np.ndarray  # (H, W, C) in the stored kind (`converter.imagekind`)
    mask: np.ndarray | None  # (H, W) class map, or (H, W, C) uint8 one-hot planes
    label: int | None
    class_pixels: np.ndarray  # (C,) int64
    ignore_pixels: int


def relative_key_path(path: str, base: str) -> str:
    """`path` relative to the source base, '/'-separated (absolute when outside it; URLs alike)."""
    rel = relative(path, base)
    return path if rel.startswith("..") else rel


#: Up to this many classes, pixels are counted by comparison passes instead of bincount.
_COMPARE_UP_TO = 16


class SampleTransformer:
    """Decode + fit + colour lookup for one worker; reuse it for every sample."""

    def __init__(self, options: OutputOptions, classes: tuple[ClassInfo, ...], source_base: str,
                 max_pixels: int, source_options: tuple = ()) -> None:
        use_storage_options(source_base, source_options)  # sources in a bucket: read with these options
        self.options = options
        self.classes = classes
        self.base = source_base
        self.max_pixels = max_pixels
        self.kind = task_kind(options.task)
        self.images = ImageReader(options.image_kind, max_pixels, exif_transpose=self.kind.exif_transpose)
        #: Annotation files: their coordinates are in the EXIF-oriented frame (labelme, CVAT, Ultralytics and
        #: Roboflow all orient the photo before it is annotated).
        self.oriented = ImageReader(options.image_kind, max_pixels, exif_transpose=True)
        self.segmentation = self.kind.dense
        labels = options.labels if options.labels is not None else LabelOptions()
        self.semantics = make_semantics(labels, classes, options.color_tolerance) if self.segmentation else None
        self.num_classes = len(classes)
        #: index/binary masks keep 16-bit values; colour tables map grey levels 0..255 only
        self.wide_masks = self.segmentation and labels.semantics in (MaskSemantics.INDEX, MaskSemantics.BINARY)

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
        ignore = self.semantics.ignore_index  # type: ignore[union-attr]
        if self.num_classes <= _COMPARE_UP_TO:
            # A class map holds class indices and the ignore index only: one comparison pass
            # per class is 3x faster than bincount (which widens every pixel to intp) here.
            for c in range(self.num_classes):
                counts[c] = np.count_nonzero(mask == c)
            return counts, int(mask.size - counts.sum())
        full = np.bincount(mask.ravel(), minlength=max(self.num_classes, ignore + 1))
        counts += full[: self.num_classes]
        return counts, int(full[ignore])

    def mask_classes(self, mask: MaskArray, path: str, geom=None) -> np.ndarray:
        """The stored class map of a decoded mask at the output size (`geom`; None: planned here).

        Raises `UnknownColorError` for ambiguous colours, and for unknown colours or values
        unless `--unknown-color ignore`.
        """
        semantics = self.semantics
        if semantics is None:
            raise ValueError(f"mask_classes needs a segmentation task. Received: task={self.options.task.value!r}")
        if geom is None:
            geom = plan_geometry((mask.height, mask.width), self.options.size, self.options.fit)
        return semantics.class_map(mask, geom, path, self.options.unknown_color is UnknownColor.FAIL)

    def _oriented(self, image: np.ndarray, img_src: SourceFile, mask: MaskArray, sample: SourceSample) -> np.ndarray:
        """The image turned by its EXIF orientation where `--exif` and the mask's size say so
        (`converter.transform.exif`); `DecodeError` for a pair the sizes cannot decide, or that fits neither way."""
        fits = (mask.height, mask.width) == image.shape[:2]
        if fits and self.options.exif is ExifMode.IGNORE:
            return image
        orientation = orientation_of(img_src)  # also under ignore, to name it when the sizes differ
        if orientation == 1 and fits:
            return image
        if apply_orientation(self.options.exif, orientation, image.shape[:2], (mask.height, mask.width),
                             sample.image, sample.mask or mask.path):
            return orient(image, orientation)
        return image

    def __call__(self, sample: SourceSample) -> Transformed:
        opts = self.options
        img_src = read_source(sample.image, relative_key_path(sample.image, self.base), sample.image_stat)
        mask_src = (read_source(sample.mask, relative_key_path(sample.mask, self.base), sample.mask_stat)
                    if sample.mask else None)
        bands = [read_source(p, relative_key_path(p, self.base)) for p in sample.bands or ()]
        image = (self.images if sample.annotation is None else self.oriented).decode(img_src, bands)
        mask = None
        if self.segmentation and sample.annotation is None and mask_src is not None:
            mask = decode_mask(mask_src, self.max_pixels, wide=self.wide_masks)
            image = self._oriented(image, img_src, mask, sample)
        geom = plan_geometry(image.shape[:2], opts.size, opts.fit)
        out_image = self.images.resize(image, geom, opts.image_filter)
        annotation = sample.annotation
        if self.segmentation and annotation is not None:  # annotation files: rasterized at the image's size
            mask, annotation = annotation_mask_read(annotation, image.shape[0], image.shape[1])
        mask_fp = (mask_src.fingerprint if mask_src else None) if annotation is None else \
            annotation.fingerprint(self.base)  # as read: an instance mask's stamp is that of its painted bytes
        image_fp = combine_fingerprints([img_src.fingerprint] + [b.fingerprint for b in bands])  # every band file
        entry = SampleEntry(sample.key, image_fp, mask_fp, sample.label)
        if not self.segmentation:
            counts, _ = self.count_classes(None, sample.label)
            return Transformed(entry, out_image, None, sample.label, counts, 0)

        if annotation is None and mask_src is None:
            raise DecodeError(sample.image, "missing_mask", "image without mask")
        if (mask.height, mask.width) != image.shape[:2]:
            raise DecodeError(
                sample.mask or "", "size_mismatch",
                f"mask is {mask.width}x{mask.height} but its image {sample.image} is "
                f"{image.shape[1]}x{image.shape[0]}",
                "masks must have the same size as their images",
            )
        class_map = self.mask_classes(mask, sample.mask or mask.path, geom)
        class_pixels, ignore_pixels = self.count_classes(class_map, None)
        if opts.mask_encoding is MaskEncoding.ONEHOT:
            planes = np.arange(self.num_classes, dtype=class_map.dtype)
            out_mask = (class_map[:, :, None] == planes).astype(np.uint8)
        else:
            out_mask = class_map
        return Transformed(entry, out_image, out_mask, None, class_pixels, ignore_pixels)
