"""Realistic synthetic datasets on disk, for tests, `scripts/demo.sh` and the benchmark.

Everything here is deterministic: the same arguments give byte-identical files, and
every random draw comes from a `numpy.random.Generator` seeded from ``seed`` and the
sample's position, so a sample can be regenerated on its own (in another process,
or later to recompute its expected class map).

What the generators imitate:

* `textured_image`: photo-like pixels (smooth colour fields, sharp-edged shapes,
  per-pixel sensor noise), so a 1920x1080 PNG weighs a few MB and takes real time
  to decode, like a photograph and unlike a flat colour.
* `random_mask`: street-scene-like class maps (large regions first, small objects on
  top), with every class present in most masks.
* `make_camvid`: the Semantic-Segmentation-Suite / CamVid layout::

      root/class_dict.csv
      root/train/0001TP_006690.png        root/train_labels/0001TP_006690_L.png
      root/val/...                        root/val_labels/...
      root/test/...                       root/test_labels/...

  with every image mode (RGB, RGBA, P, L; PNG or JPEG) and mask mode (RGB colour
  masks, RGBA with arbitrary alpha, P with a *shuffled* palette, L grey masks) a real
  dataset can hold, a quirky ``class_dict.csv`` and, on request, mask pixels whose
  colour is in no class.
* `make_explicit`: the flat ``--images DIR --masks DIR --classes CSV`` layout.
* `make_bench_dataset`: a real-size (1920x1080) CamVid-layout train split, generated
  in parallel and reused when already complete.
* `make_classification`: the Keras ``image_dataset_from_directory`` layout, with
  JPEG, PNG, GIF, BMP, greyscale and CMYK JPEGs and an EXIF-rotated JPEG.

Example::

    from converter.testing import synth

    ds = synth.make_camvid("/tmp/camvid", splits={"train": 4, "val": 2},
                           image_modes=("RGB", "P"), mask_modes=("RGB", "P"))
    image_path, mask_path = ds.pairs["train"][0]
    class_map = ds.expected_class_map(image_path)   # (H, W) uint8 class indices
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, Union

import numpy as np
from PIL import Image, ImageDraw

__all__ = [
    "CAMVID_LIKE_CLASSES",
    "CAMVID_11_NAMES",
    "CLASSIFICATION_KINDS",
    "IMAGE_MODES",
    "MASK_MODES",
    "JPEG_IMAGE_MODES",
    "DEFAULT_SIZE",
    "BENCH_STAMP_NAME",
    "Color",
    "ClassTable",
    "SynthSample",
    "PlantedUnknown",
    "SynthDataset",
    "SynthClassification",
    "textured_image",
    "random_mask",
    "grey_classes",
    "write_class_dict",
    "make_camvid",
    "make_explicit",
    "make_bench_dataset",
    "make_classification",
]

Color = tuple[int, int, int]
ClassTable = list[tuple[str, Color]]
Size = tuple[int, int]
PathLike = Union[str, "os.PathLike[str]"]

# The 32 CamVid classes with their official colours, most frequent street classes
# first, so that ``CAMVID_LIKE_CLASSES[:n]`` is a plausible n-class table.
CAMVID_LIKE_CLASSES: ClassTable = [
    ("Sky", (128, 128, 128)),
    ("Building", (128, 0, 0)),
    ("Road", (128, 64, 128)),
    ("Car", (64, 0, 128)),
    ("Pedestrian", (64, 64, 0)),
    ("Tree", (128, 128, 0)),
    ("Sidewalk", (0, 0, 192)),
    ("Column_Pole", (192, 192, 128)),
    ("SignSymbol", (192, 128, 128)),
    ("Fence", (64, 64, 128)),
    ("Bicyclist", (0, 128, 192)),
    ("Void", (0, 0, 0)),
    ("Animal", (64, 128, 64)),
    ("Archway", (192, 0, 128)),
    ("Bridge", (0, 128, 64)),
    ("CartLuggagePram", (64, 0, 192)),
    ("Child", (192, 128, 64)),
    ("LaneMkgsDriv", (128, 0, 192)),
    ("LaneMkgsNonDriv", (192, 0, 64)),
    ("Misc_Text", (128, 128, 64)),
    ("MotorcycleScooter", (192, 0, 192)),
    ("OtherMoving", (128, 64, 64)),
    ("ParkingBlock", (64, 192, 128)),
    ("RoadShoulder", (128, 128, 192)),
    ("SUVPickupTruck", (64, 128, 192)),
    ("TrafficCone", (0, 0, 64)),
    ("TrafficLight", (0, 64, 64)),
    ("Train", (192, 64, 128)),
    ("Truck_Bus", (192, 128, 192)),
    ("Tunnel", (64, 0, 64)),
    ("VegetationMisc", (192, 192, 0)),
    ("Wall", (64, 192, 0)),
]

# Classes flagged 1 in the ``class_11`` column of a quirky class_dict.csv.
CAMVID_11_NAMES = frozenset(
    {"Sky", "Building", "Column_Pole", "Road", "Sidewalk", "Tree", "SignSymbol",
     "Fence", "Car", "Pedestrian", "Bicyclist"}
)

IMAGE_MODES = ("RGB", "RGBA", "P", "L")
MASK_MODES = ("RGB", "RGBA", "P", "L")
JPEG_IMAGE_MODES = ("RGB", "L")
IMAGE_EXTS = (".png", ".jpg", ".jpeg")
DEFAULT_SIZE: Size = (64, 96)
DEFAULT_SPLITS: Mapping[str, int] = types.MappingProxyType({"train": 6, "val": 2, "test": 2})
DEFAULT_PER_CLASS: Mapping[str, int] = types.MappingProxyType({"train": 4, "val": 2})
JPEG_QUALITY = 90
BENCH_STAMP_NAME = ".imgshard-synth.json"
_BENCH_STAMP_VERSION = 1
MAX_CLASSES = 255  # class maps are uint8 and 255 stays free for "ignore"

# Independent random streams of one sample: np.random.default_rng([seed, index, stream]).
_IMAGE_STREAM = 0
_MASK_STREAM = 1
_AUX_STREAM = 2  # alpha, palette order
_UNKNOWN_STREAM = 0x5EED  # dataset level: where unknown colours go
_CLASSIFICATION_STREAM = 0xCA7

# (sequence prefix, frame format, first frame) of real CamVid sequences.
_CAMVID_SEQUENCES = (
    ("0001TP", "{:06d}", 6690),
    ("0006R0", "f{:05d}", 930),
    ("0016E5", "{:05d}", 390),
    ("Seq05VD", "f{:05d}", 0),
)
_P_MASK_SPARE_ENTRIES = 3  # unused palette entries in P masks, as real tools leave


# --------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SynthSample:
    """One generated (image, mask) pair and how it was made.

    Attributes:
        split: Split name (key of `SynthDataset.pairs`).
        name: File stem of the image, e.g. ``"0001TP_006690"``.
        image_path: Path of the image file.
        mask_path: Path of the mask file.
        image_mode: Pillow mode the image was saved in (``RGB``, ``RGBA``, ``P``, ``L``).
        mask_mode: Pillow mode the mask was saved in (``RGB``, ``RGBA``, ``P``, ``L``).
        height: Image and mask height in pixels.
        width: Image and mask width in pixels.
        seed: Dataset seed.
        index: Position of the sample in the whole dataset (seeds its random streams).
        num_classes: Number of classes the mask was drawn with.
    """

    split: str
    name: str
    image_path: Path
    mask_path: Path
    image_mode: str
    mask_mode: str
    height: int
    width: int
    seed: int
    index: int
    num_classes: int

    @property
    def image_format(self) -> str:
        """Pillow format name of the image file: ``"PNG"`` or ``"JPEG"``."""
        return "JPEG" if self.image_path.suffix.lower() in (".jpg", ".jpeg") else "PNG"


@dataclass(frozen=True)
class PlantedUnknown:
    """A rectangle of mask pixels whose colour is in no class.

    Attributes:
        image_path: Image of the pair whose mask holds the region.
        mask_path: Mask holding the region.
        color: The planted (r, g, b) colour (grey when the mask is an ``L`` mask).
        kind: ``"near"`` (1-2 levels off a class colour, like lossy-compression damage)
            or ``"far"`` (far from every class colour).
        nearest_class: Index of the class whose colour is nearest (L1 distance).
        region: ``(top, left, bottom, right)``, bottom and right exclusive.
    """

    image_path: Path
    mask_path: Path
    color: Color
    kind: str
    nearest_class: int
    region: tuple[int, int, int, int]

    @property
    def pixels(self) -> int:
        """Number of pixels in the region."""
        top, left, bottom, right = self.region
        return (bottom - top) * (right - left)


@dataclass(frozen=True, eq=False)
class SynthDataset:
    """A generated segmentation dataset.

    Attributes:
        root: Folder the dataset was generated in (for `make_explicit`: the parent of
            the images folder).
        classes: The class table written to `class_dict_path`: ``(name, (r, g, b))``.
        pairs: Split -> ``(image_path, mask_path)`` pairs, sorted by image file name.
        class_dict_path: Path of the class CSV.
        samples: Every sample, in generation order.
        planted_unknown: Regions of mask pixels with colours in no class.
    """

    root: Path
    classes: ClassTable
    pairs: dict[str, list[tuple[Path, Path]]]
    class_dict_path: Path
    samples: tuple[SynthSample, ...]
    planted_unknown: tuple[PlantedUnknown, ...] = ()
    _by_path: dict[str, SynthSample] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        for sample in self.samples:
            self._by_path[_path_key(sample.image_path)] = sample
            self._by_path[_path_key(sample.mask_path)] = sample

    @property
    def num_samples(self) -> int:
        """Number of (image, mask) pairs over all splits."""
        return len(self.samples)

    @property
    def colors(self) -> np.ndarray:
        """Class colours as a ``(num_classes, 3)`` uint8 array, row i = class i."""
        return np.array([color for _, color in self.classes], dtype=np.uint8)

    def sample(self, path: PathLike) -> SynthSample:
        """Returns the sample whose image or mask is at `path`.

        Raises:
            ValueError: `path` is neither an image nor a mask of this dataset.
        """
        try:
            return self._by_path[_path_key(path)]
        except KeyError:
            raise ValueError(
                "`path` must be an image or mask path of this dataset "
                f"(root {str(self.root)!r}). Received: path={str(path)!r}"
            ) from None

    def expected_class_map(
        self, path: PathLike, *, unknown_value: int | None = None
    ) -> np.ndarray:
        """Returns the full-resolution class map the mask at/for `path` was drawn from.

        Args:
            path: The image or the mask path of a sample.
            unknown_value: When given, pixels of planted unknown colours get this value
                (e.g. an ignore index); when None they keep the class drawn underneath.

        Returns:
            ``(height, width)`` uint8 array of class indices (recomputed from the seed).
        """
        sample = self.sample(path)
        class_map = random_mask(
            sample.height, sample.width, sample.num_classes,
            _sample_rng(sample.seed, sample.index, _MASK_STREAM),
        )
        if unknown_value is not None:
            if not isinstance(unknown_value, (int, np.integer)) or not 0 <= unknown_value <= 255:
                raise ValueError(
                    "`unknown_value` must be an int in [0, 255] or None. "
                    f"Received: unknown_value={unknown_value!r}"
                )
            for planted in self.planted_unknown:
                if planted.image_path == sample.image_path:
                    top, left, bottom, right = planted.region
                    class_map[top:bottom, left:right] = unknown_value
        return class_map

    def planted_in(self, path: PathLike) -> list[PlantedUnknown]:
        """Returns the unknown-colour regions planted in the mask of `path`'s sample."""
        sample = self.sample(path)
        return [p for p in self.planted_unknown if p.image_path == sample.image_path]


@dataclass(frozen=True, eq=False)
class SynthClassification:
    """A generated classification dataset (Keras ``image_dataset_from_directory``).

    Attributes:
        root: Folder the dataset was generated in.
        classes: Class names, in label order (sorted, as Keras infers them).
        files: Split -> ``(path, label)`` list sorted by path; the key is ``""`` for the
            flat layout (``root/<class>/*``).
        expected_sizes: Path -> ``(height, width)`` of the image as displayed, i.e.
            after applying its EXIF orientation.
        kinds: Path -> how the file was written, one of `CLASSIFICATION_KINDS`.
    """

    root: Path
    classes: list[str]
    files: dict[str, list[tuple[Path, int]]]
    expected_sizes: dict[Path, Size]
    kinds: dict[Path, str]

    def paths_of_kind(self, kind: str) -> list[Path]:
        """Returns the paths written as `kind` (e.g. ``"jpeg_cmyk"``), sorted."""
        return sorted(p for p, k in self.kinds.items() if k == kind)


# --------------------------------------------------------------------------------------
# Pixels
# --------------------------------------------------------------------------------------


def textured_image(height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """Returns a photo-like ``(height, width, 3)`` uint8 image.

    Several octaves of smooth value noise (random low-resolution grids upsampled
    bilinearly) give colour gradients and blobs; sharp-edged polygons, ellipses and
    rectangles blended over them give edges; per-pixel Gaussian noise gives the
    entropy of a camera sensor, so PNG sizes and decode times resemble photographs
    (a 1920x1080 image compresses to roughly 4 MB).

    Args:
        height: Image height in pixels, > 0.
        width: Image width in pixels, > 0.
        rng: Source of randomness.
    """
    _check_dim("height", height)
    _check_dim("width", width)
    _check_rng(rng)

    # Smooth fields are built at quarter resolution and upsampled once: the result is
    # smooth anyway, and one full-size resize is the expensive step.
    canvas_h, canvas_w = max(2, -(-height // 4)), max(2, -(-width // 4))
    field_ = np.zeros((canvas_h, canvas_w, 3), np.float32)
    total = 0.0
    for cell_px, amplitude in ((480, 1.0), (120, 0.55), (32, 0.3), (8, 0.15)):
        grid_h = max(2, -(-height // cell_px) + 1)
        grid_w = max(2, -(-width // cell_px) + 1)
        # Mostly a shared brightness, partly per-channel colour: photographs' channels
        # are strongly correlated.
        brightness = rng.integers(0, 256, (grid_h, grid_w, 1)).astype(np.float32)
        tint = rng.integers(0, 256, (grid_h, grid_w, 3)).astype(np.float32)
        grid = (0.6 * brightness + 0.4 * tint).astype(np.uint8)
        up = Image.fromarray(grid, "RGB").resize((canvas_w, canvas_h), Image.Resampling.BILINEAR)
        field_ += amplitude * np.asarray(up, np.float32)
        total += amplitude
    field_ /= total
    # Stretch each channel to a random range, as exposure and white balance would.
    low = field_.min(axis=(0, 1))
    span = np.maximum(field_.max(axis=(0, 1)) - low, 1.0)
    out_low = rng.uniform(0, 70, 3).astype(np.float32)
    out_high = rng.uniform(170, 255, 3).astype(np.float32)
    field_ = (field_ - low) / span * (out_high - out_low) + out_low
    base = Image.fromarray(field_.astype(np.uint8), "RGB").resize(
        (width, height), Image.Resampling.BILINEAR
    )

    # Sharp-edged objects, semi-transparent so the texture shows through them.
    drawn = base.copy()
    draw = ImageDraw.Draw(drawn)
    short = min(height, width)
    for _ in range(int(rng.integers(5, 13))):
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        cx, cy = float(rng.uniform(0, width)), float(rng.uniform(0, height))
        radius = float(rng.uniform(0.04, 0.3)) * short + 1.0
        shape = int(rng.integers(0, 3))
        if shape == 0:
            draw.polygon(_polygon(cx, cy, radius, radius, rng), fill=color)
        elif shape == 1:
            ry = radius * float(rng.uniform(0.4, 1.0))
            draw.ellipse([cx - radius, cy - ry, cx + radius, cy + ry], fill=color)
        else:
            rw = radius * float(rng.uniform(0.3, 1.0))
            draw.rectangle([cx - rw, cy - radius, cx + rw, cy + radius], fill=color)
    blended = Image.blend(base, drawn, float(rng.uniform(0.55, 0.8)))

    pixels = np.asarray(blended, np.float32)  # a fresh array: Pillow -> numpy copies
    sigma = float(rng.uniform(4.0, 7.0))
    pixels += rng.standard_normal(pixels.shape, dtype=np.float32) * sigma
    np.clip(pixels, 0, 255, out=pixels)
    return pixels.astype(np.uint8)


def random_mask(
    height: int, width: int, num_classes: int, rng: np.random.Generator
) -> np.ndarray:
    """Returns a street-scene-like ``(height, width)`` uint8 class map.

    Class 0 is the background; each further class is drawn as one to three polygons,
    ellipses or rectangles, large ones first (buildings, road) and smaller ones on top
    (cars, pedestrians), so every class is present in most masks.

    Args:
        height: Mask height in pixels, > 0.
        width: Mask width in pixels, > 0.
        num_classes: Number of classes, in [1, 255].
        rng: Source of randomness.
    """
    _check_dim("height", height)
    _check_dim("width", width)
    _check_num_classes(num_classes)
    _check_rng(rng)

    canvas = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(canvas)
    for k in range(1, num_classes):
        scale = max(0.1, 0.45 * 0.8 ** (k - 1))
        for _ in range(int(rng.integers(1, 4))):
            rx = float(rng.uniform(0.5, 1.0)) * scale * width + 1.0
            ry = float(rng.uniform(0.5, 1.0)) * scale * height + 1.0
            cx = float(rng.uniform(0, width))
            # Big classes sit low in the frame (road, buildings), small ones anywhere.
            cy = float(rng.uniform(0.3 if k <= 2 else 0.0, 1.0)) * height
            shape = int(rng.integers(0, 3))
            if shape == 0:
                draw.polygon(_polygon(cx, cy, rx, ry, rng), fill=k)
            elif shape == 1:
                draw.ellipse([cx - rx, cy - ry, cx + rx, cy + ry], fill=k)
            else:
                draw.rectangle([cx - rx, cy - ry, cx + rx, cy + ry], fill=k)
    return np.array(canvas, dtype=np.uint8)


def _polygon(
    cx: float, cy: float, rx: float, ry: float, rng: np.random.Generator
) -> list[tuple[float, float]]:
    """A random star-convex polygon of 3 to 8 vertices around (cx, cy)."""
    n = int(rng.integers(3, 9))
    angles = np.sort(rng.uniform(0, 2 * np.pi, n))
    radii = rng.uniform(0.5, 1.0, n)
    xs = cx + rx * radii * np.cos(angles)
    ys = cy + ry * radii * np.sin(angles)
    return [(float(x), float(y)) for x, y in zip(xs, ys)]


def _smooth_field(height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """A smooth ``(height, width)`` uint8 field spanning most of 0..255 (for alpha)."""
    grid = rng.integers(0, 256, (4, 5), dtype=np.uint8)
    return np.array(
        Image.fromarray(grid, "L").resize((width, height), Image.Resampling.BILINEAR)
    )


# --------------------------------------------------------------------------------------
# Class tables
# --------------------------------------------------------------------------------------


def grey_classes(num_classes: int, *, step: int | None = None) -> ClassTable:
    """Returns a class table whose colours are all grey, for ``L`` masks.

    Class i gets colour ``(i * step,) * 3`` and the name of `CAMVID_LIKE_CLASSES[i]`.
    The default step, ``min(40, 255 // (num_classes - 1))``, keeps grey values apart
    from class indices, so code that reads grey values as class indices is caught;
    pass ``step=1`` for the "grey value == class index" convention.

    Args:
        num_classes: Number of classes, in [1, len(CAMVID_LIKE_CLASSES)].
        step: Grey-level distance between consecutive classes.
    """
    if (
        not isinstance(num_classes, int) or isinstance(num_classes, bool)
        or not 1 <= num_classes <= len(CAMVID_LIKE_CLASSES)
    ):
        raise ValueError(
            f"`num_classes` must be an int in [1, {len(CAMVID_LIKE_CLASSES)}]. "
            f"Received: num_classes={num_classes!r}"
        )
    if step is None:
        step = min(40, 255 // max(num_classes - 1, 1))
    if (
        not isinstance(step, int) or isinstance(step, bool) or step < 1
        or step * (num_classes - 1) > 255
    ):
        raise ValueError(
            f"`step` must be a positive int with step * (num_classes - 1) <= 255. "
            f"Received: step={step!r}, num_classes={num_classes}"
        )
    return [(CAMVID_LIKE_CLASSES[i][0], (i * step,) * 3) for i in range(num_classes)]


def write_class_dict(path: PathLike, classes: Sequence[tuple[str, Sequence[int]]], *,
                     quirks: bool = False) -> Path:
    """Writes a ``class_dict.csv`` (``name,r,g,b``), as in the Semantic-Segmentation-Suite.

    With ``quirks=True`` the file looks like real ones found in the wild: a UTF-8 byte
    order mark, CRLF line ends, a space after every comma, a fifth ``class_11`` column
    (1 for the CamVid 11-class subset, else 0) and blank lines (one after the second
    row, two at the end).

    Args:
        path: File to write (parent folders are created).
        classes: ``(name, (r, g, b))`` rows, in class-index order.
        quirks: Whether to add the quirks above.

    Returns:
        The path written.
    """
    table = _check_classes(classes, "classes")
    if not isinstance(quirks, bool):
        raise TypeError(f"`quirks` must be a bool. Received: quirks={quirks!r}")
    if quirks:
        lines = ["name, r, g, b, class_11"]
        for i, (name, (r, g, b)) in enumerate(table):
            lines.append(f"{name}, {r}, {g}, {b}, {int(name in CAMVID_11_NAMES)}")
            if i == 1:
                lines.append("")
        text = "\ufeff" + "\r\n".join(lines) + "\r\n\r\n\r\n"
    else:
        lines = ["name,r,g,b"] + [f"{name},{r},{g},{b}" for name, (r, g, b) in table]
        text = "\n".join(lines) + "\n"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write_bytes(path, text.encode("utf-8"))
    return path


# --------------------------------------------------------------------------------------
# Segmentation datasets
# --------------------------------------------------------------------------------------


def make_camvid(
    root: PathLike,
    *,
    splits: Mapping[str, int] = DEFAULT_SPLITS,
    size: Size | Sequence[Size] = DEFAULT_SIZE,
    num_classes: int | None = None,
    image_modes: Sequence[str] = ("RGB",),
    mask_modes: Sequence[str] = ("RGB",),
    mask_suffix: str = "_L",
    image_ext: str = ".png",
    quirks: bool = True,
    seed: int = 0,
    unknown_colors: int = 0,
    classes: Sequence[tuple[str, Sequence[int]]] | None = None,
) -> SynthDataset:
    """Writes a CamVid-layout dataset and returns what it holds.

    Layout: ``root/{split}/NAME{image_ext}`` images, ``root/{split}_labels/NAME{mask_suffix}.png``
    masks and ``root/class_dict.csv``. Sample i of the whole dataset (splits in the
    order given) uses ``size[i % len]``, ``image_modes[i % len]`` and
    ``mask_modes[i % len]``.

    Image modes: ``RGB``; ``RGBA`` (smooth random alpha, colours not premultiplied);
    ``P`` (256-colour palette quantized from the textured image); ``L`` (greyscale).
    With ``image_ext=".jpg"`` (quality 90) only ``RGB`` and ``L`` are possible.

    Mask modes (always PNG): ``RGB`` colour masks; ``RGBA`` (exact colours, arbitrary
    per-pixel alpha, zero included); ``P`` (palette PNG whose palette maps indices to
    class colours in a shuffled order, so pixel index != class index, plus a few unused
    entries); ``L`` (grey value of the class colour). ``L`` masks can only encode grey
    colours, so when `mask_modes` contains ``"L"`` and `classes` is None the class
    table is `grey_classes(num_classes)`, and a given table must be all grey.

    Args:
        root: Dataset folder (created).
        splits: Split name -> number of samples (0 gives empty folders).
        size: ``(height, width)``, or a list of them cycled over the samples.
        num_classes: Number of classes; None means 5, or ``len(classes)``.
        image_modes: Image modes cycled over the samples.
        mask_modes: Mask modes cycled over the samples.
        mask_suffix: Appended to the image stem to name the mask (``""``: same stem).
        image_ext: ``".png"``, ``".jpg"`` or ``".jpeg"``.
        quirks: Write a quirky class_dict.csv (see `write_class_dict`).
        seed: Non-negative seed; same arguments -> byte-identical files.
        unknown_colors: Number of mask regions to paint in colours that are in no class,
            alternately "near" (1-2 levels off a class colour) and "far"; recorded in
            `SynthDataset.planted_unknown`.
        classes: Class table; None means `CAMVID_LIKE_CLASSES[:num_classes]` (or
            `grey_classes` when `mask_modes` contains ``"L"``).
    """
    root = Path(root)
    split_counts = _check_splits(splits)
    table, image_ext, sizes = _check_common(
        size=size, num_classes=num_classes, classes=classes, image_modes=image_modes,
        mask_modes=mask_modes, mask_suffix=mask_suffix, image_ext=image_ext,
        quirks=quirks, seed=seed, unknown_colors=unknown_colors,
    )
    samples = []
    index = 0
    for split, count in split_counts.items():
        image_dir, mask_dir = root / split, root / f"{split}_labels"
        for _ in range(count):
            samples.append(_plan_sample(
                index, split, image_dir, mask_dir, image_ext, mask_suffix, sizes,
                image_modes, mask_modes, seed, len(table)))
            index += 1
    for split in split_counts:
        (root / split).mkdir(parents=True, exist_ok=True)
        (root / f"{split}_labels").mkdir(parents=True, exist_ok=True)
    return _generate(root, root / "class_dict.csv", table, samples, quirks=quirks,
                     seed=seed, unknown_colors=unknown_colors, workers=1)


def make_explicit(
    images_dir: PathLike,
    masks_dir: PathLike,
    csv_path: PathLike,
    n: int,
    *,
    size: Size | Sequence[Size] = DEFAULT_SIZE,
    num_classes: int | None = None,
    image_modes: Sequence[str] = ("RGB",),
    mask_modes: Sequence[str] = ("RGB",),
    mask_suffix: str = "",
    image_ext: str = ".png",
    quirks: bool = True,
    seed: int = 0,
    unknown_colors: int = 0,
    classes: Sequence[tuple[str, Sequence[int]]] | None = None,
    split: str = "train",
) -> SynthDataset:
    """Writes the flat layout given to the converter as ``--images/--masks/--classes``.

    ``images_dir/NAME{image_ext}``, ``masks_dir/NAME{mask_suffix}.png`` and the class CSV
    at `csv_path`; the other arguments are those of `make_camvid`. `split` only names
    the key of `SynthDataset.pairs`. `SynthDataset.root` is the parent of `images_dir`.

    Args:
        images_dir: Folder for the images (created).
        masks_dir: Folder for the masks (created; may equal `images_dir` when
            `mask_suffix` is not empty).
        csv_path: Path of the class CSV.
        n: Number of samples, >= 0.
    """
    images_dir, masks_dir = Path(images_dir), Path(masks_dir)
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"`n` must be an int >= 0. Received: n={n!r}")
    if not isinstance(split, str) or not split:
        raise ValueError(f"`split` must be a non-empty str. Received: split={split!r}")
    table, image_ext, sizes = _check_common(
        size=size, num_classes=num_classes, classes=classes, image_modes=image_modes,
        mask_modes=mask_modes, mask_suffix=mask_suffix, image_ext=image_ext,
        quirks=quirks, seed=seed, unknown_colors=unknown_colors,
    )
    if images_dir.resolve() == masks_dir.resolve() and not mask_suffix and image_ext == ".png":
        raise ValueError(
            "`mask_suffix` must not be empty when `images_dir` and `masks_dir` are the "
            "same folder and `image_ext` is '.png' (masks would overwrite images). "
            f"Received: images_dir={str(images_dir)!r}, masks_dir={str(masks_dir)!r}, "
            f"mask_suffix={mask_suffix!r}"
        )
    samples = [
        _plan_sample(i, split, images_dir, masks_dir, image_ext, mask_suffix, sizes,
                     image_modes, mask_modes, seed, len(table))
        for i in range(n)
    ]
    images_dir.mkdir(parents=True, exist_ok=True)
    masks_dir.mkdir(parents=True, exist_ok=True)
    return _generate(images_dir.parent, Path(csv_path), table, samples, quirks=quirks,
                     seed=seed, unknown_colors=unknown_colors, workers=1)


def make_bench_dataset(
    root: PathLike,
    n: int = 150,
    size: Size = (1080, 1920),
    num_classes: int = 5,
    seed: int = 0,
    workers: int = 2,
) -> SynthDataset:
    """Writes (or reuses) a real-size CamVid-layout train split for the benchmark.

    RGB PNG images and RGB PNG masks in ``root/train`` and ``root/train_labels`` and a
    quirky ``root/class_dict.csv``, generated by `workers` processes. A stamp file
    (`BENCH_STAMP_NAME`) written last records the parameters and every file's size; when
    it matches, nothing is regenerated. Files are written atomically, so an interrupted
    run never leaves a truncated PNG behind; PNGs of an earlier run that this one does
    not plan (a larger `n`) are deleted.

    Worker processes are started with ``spawn`` (safe when TensorFlow is loaded), so a
    script calling this with ``workers > 1`` must do so under
    ``if __name__ == "__main__":``.

    Args:
        root: Dataset folder (created).
        n: Number of samples, >= 1.
        size: ``(height, width)`` of every sample.
        num_classes: Number of classes, in [1, 32].
        seed: Non-negative seed.
        workers: Number of processes; 1 generates in this process.
    """
    root = Path(root)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"`n` must be an int >= 1. Received: n={n!r}")
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"`workers` must be an int >= 1. Received: workers={workers!r}")
    sizes = _check_sizes(size)
    if len(sizes) != 1:
        raise ValueError(f"`size` must be one (height, width) pair. Received: size={size!r}")
    params = {"n": n, "size": list(sizes[0]), "num_classes": num_classes, "seed": seed}
    stamp_path = root / BENCH_STAMP_NAME

    table, image_ext, sizes = _check_common(
        size=sizes[0], num_classes=num_classes, classes=None, image_modes=("RGB",),
        mask_modes=("RGB",), mask_suffix="_L", image_ext=".png", quirks=True,
        seed=seed, unknown_colors=0,
    )
    samples = [
        _plan_sample(i, "train", root / "train", root / "train_labels", image_ext, "_L",
                     sizes, ("RGB",), ("RGB",), seed, len(table))
        for i in range(n)
    ]
    csv_path = root / "class_dict.csv"
    if _bench_stamp_matches(stamp_path, params, root):
        return _dataset(root, csv_path, table, samples, ())

    stamp_path.unlink(missing_ok=True)
    planned = {p for s in samples for p in (s.image_path, s.mask_path)}
    for folder in (root / "train", root / "train_labels"):
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("*.png"):  # e.g. left by an earlier run with a larger n
            if stale not in planned:
                stale.unlink()
    dataset = _generate(root, csv_path, table, samples, quirks=True, seed=seed,
                        unknown_colors=0, workers=workers)
    files = [csv_path] + [p for s in samples for p in (s.image_path, s.mask_path)]
    stamp = {
        "generator": "converter.testing.synth.make_bench_dataset",
        "stamp_version": _BENCH_STAMP_VERSION,
        "params": params,
        "files": {p.relative_to(root).as_posix(): p.stat().st_size for p in files},
    }
    _atomic_write_bytes(stamp_path, json.dumps(stamp, indent=1, sort_keys=True).encode())
    return dataset


def _bench_stamp_matches(stamp_path: Path, params: dict[str, Any], root: Path) -> bool:
    """Whether the stamp exists, has these parameters, and every file it lists is intact."""
    try:
        stamp = json.loads(stamp_path.read_text())
    except (OSError, ValueError):
        return False
    if (
        not isinstance(stamp, dict)
        or stamp.get("stamp_version") != _BENCH_STAMP_VERSION
        or stamp.get("params") != params
        or not isinstance(stamp.get("files"), dict)
        or len(stamp["files"]) != 1 + 2 * params["n"]
    ):
        return False
    for rel, size in stamp["files"].items():
        try:
            if (root / rel).stat().st_size != size:
                return False
        except OSError:
            return False
    return True


def _plan_sample(
    index: int, split: str, image_dir: Path, mask_dir: Path, image_ext: str,
    mask_suffix: str, sizes: list[Size], image_modes: Sequence[str],
    mask_modes: Sequence[str], seed: int, num_classes: int,
) -> SynthSample:
    """The `SynthSample` at position `index` of a dataset (names, modes, size)."""
    prefix, frame_format, first = _CAMVID_SEQUENCES[index % len(_CAMVID_SEQUENCES)]
    frame = first + 30 * (index // len(_CAMVID_SEQUENCES))
    name = f"{prefix}_{frame_format.format(frame)}"
    height, width = sizes[index % len(sizes)]
    return SynthSample(
        split=split, name=name,
        image_path=image_dir / f"{name}{image_ext}",
        mask_path=mask_dir / f"{name}{mask_suffix}.png",
        image_mode=image_modes[index % len(image_modes)],
        mask_mode=mask_modes[index % len(mask_modes)],
        height=height, width=width, seed=seed, index=index, num_classes=num_classes,
    )


def _generate(
    root: Path, csv_path: Path, table: ClassTable, samples: list[SynthSample], *,
    quirks: bool, seed: int, unknown_colors: int, workers: int,
) -> SynthDataset:
    """Writes the class CSV and every sample; returns the dataset record."""
    write_class_dict(csv_path, table, quirks=quirks)
    planted = _plan_unknown(table, samples, seed, unknown_colors)
    colors = tuple(color for _, color in table)
    jobs = [
        (s, colors, tuple(p for p in planted if p.image_path == s.image_path))
        for s in samples
    ]
    if workers == 1 or len(jobs) <= 1:
        for job in jobs:
            _write_sample(*job)
    else:
        # spawn, not fork: the caller may have TensorFlow (and its threads) loaded.
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            futures = [pool.submit(_write_sample, *job) for job in jobs]
            for future in concurrent.futures.as_completed(futures):
                future.result()  # re-raises a worker's exception
    return _dataset(root, csv_path, table, samples, planted)


def _dataset(
    root: Path, csv_path: Path, table: ClassTable, samples: list[SynthSample],
    planted: Sequence[PlantedUnknown],
) -> SynthDataset:
    pairs: dict[str, list[tuple[Path, Path]]] = {}
    for s in samples:
        pairs.setdefault(s.split, []).append((s.image_path, s.mask_path))
    for split in pairs:
        pairs[split].sort(key=lambda pair: pair[0].name)
    return SynthDataset(root=root, classes=list(table), pairs=pairs,
                        class_dict_path=csv_path, samples=tuple(samples),
                        planted_unknown=tuple(planted))


def _write_sample(
    sample: SynthSample, colors: tuple[Color, ...], planted: tuple[PlantedUnknown, ...]
) -> None:
    """Renders and writes one image and its mask (runs in worker processes too)."""
    image_rng = _sample_rng(sample.seed, sample.index, _IMAGE_STREAM)
    aux_rng = _sample_rng(sample.seed, sample.index, _AUX_STREAM)
    h, w = sample.height, sample.width

    rgb = textured_image(h, w, image_rng)
    if sample.image_mode == "RGB":
        image = Image.fromarray(rgb, "RGB")
    elif sample.image_mode == "RGBA":
        image = Image.fromarray(np.dstack([rgb, _smooth_field(h, w, image_rng)]), "RGBA")
    elif sample.image_mode == "P":
        image = Image.fromarray(rgb, "RGB").quantize(256)
    else:  # "L"
        image = Image.fromarray(rgb, "RGB").convert("L")
    if sample.image_format == "JPEG":
        _atomic_save(image, sample.image_path, "JPEG", quality=JPEG_QUALITY)
    else:
        _atomic_save(image, sample.image_path, "PNG")

    class_map = random_mask(h, w, sample.num_classes,
                            _sample_rng(sample.seed, sample.index, _MASK_STREAM))
    palette = np.array(colors, dtype=np.uint8)
    if sample.mask_mode == "P":
        extra = [_unused_color(colors, aux_rng) for _ in range(_P_MASK_SPARE_ENTRIES)]
        entries = list(colors) + extra + [p.color for p in planted]
        order = aux_rng.permutation(len(entries))
        if len(colors) > 1 and np.array_equal(order[: len(colors)], np.arange(len(colors))):
            order = np.roll(order, 1)
        # Entry order[j] of the file palette holds colour j of `entries`.
        file_palette = np.zeros((len(entries), 3), np.uint8)
        file_palette[order] = np.array(entries, np.uint8)
        indices = order[class_map].astype(np.uint8)
        for j, p in enumerate(planted):
            top, left, bottom, right = p.region
            indices[top:bottom, left:right] = order[len(colors) + len(extra) + j]
        mask = Image.fromarray(indices, "P")
        mask.putpalette(file_palette.tobytes(), "RGB")
    else:
        mask_rgb = palette[class_map]
        for p in planted:
            top, left, bottom, right = p.region
            mask_rgb[top:bottom, left:right] = p.color
        if sample.mask_mode == "RGB":
            mask = Image.fromarray(mask_rgb, "RGB")
        elif sample.mask_mode == "RGBA":
            alpha = aux_rng.integers(0, 256, (h, w), dtype=np.uint8)
            mask = Image.fromarray(np.dstack([mask_rgb, alpha]), "RGBA")
        else:  # "L": the table is all grey (checked), so any channel is the grey value
            mask = Image.fromarray(np.ascontiguousarray(mask_rgb[..., 0]), "L")
    _atomic_save(mask, sample.mask_path, "PNG")


def _plan_unknown(
    table: ClassTable, samples: list[SynthSample], seed: int, count: int
) -> list[PlantedUnknown]:
    """Chooses masks, rectangles and colours for `count` unknown-colour regions."""
    if count == 0:
        return []
    if not samples:
        raise ValueError(
            f"`unknown_colors` needs at least one sample to plant into. "
            f"Received: unknown_colors={count} with 0 samples"
        )
    rng = np.random.default_rng([seed, _UNKNOWN_STREAM])
    colors = np.array([c for _, c in table], np.int64)
    order = rng.permutation(len(samples))
    per_sample: dict[int, int] = {}
    for j in range(count):
        position = int(order[j % len(samples)])
        per_sample[position] = per_sample.get(position, 0) + 1
    taken = {tuple(c) for c in colors.tolist()}
    slot: dict[int, int] = {}
    planted = []
    for j in range(count):
        position = int(order[j % len(samples)])
        s = samples[position]
        grey = s.mask_mode == "L"
        kind = "near" if j % 2 == 0 else "far"
        pick = _near_color if kind == "near" else _far_color
        color = pick(colors, taken, rng, grey)
        taken.add(color)
        nearest = int(np.abs(colors - np.array(color)).sum(axis=1).argmin())
        # Regions of one mask go in separate vertical strips, so they never overlap.
        strips = per_sample[position]
        k = slot.get(position, 0)
        slot[position] = k + 1
        if strips > s.width:
            raise ValueError(
                f"`unknown_colors` puts {strips} regions in a mask {s.width} pixels wide; "
                f"use fewer or more samples. Received: unknown_colors={count}"
            )
        strip_w = s.width // strips
        rh = max(1, min(s.height, s.height // 6 or 1))
        rw = max(1, min(strip_w, s.width // 6 or 1))
        top = int(rng.integers(0, s.height - rh + 1))
        left = k * strip_w + int(rng.integers(0, strip_w - rw + 1))
        planted.append(PlantedUnknown(
            image_path=s.image_path, mask_path=s.mask_path, color=color, kind=kind,
            nearest_class=nearest, region=(top, left, top + rh, left + rw)))
    return planted


def _near_color(colors: np.ndarray, taken: set, rng: np.random.Generator, grey: bool) -> Color:
    """A colour 1-2 levels off a class colour (every channel when `grey`), in no class."""
    for c in rng.permutation(len(colors)):
        for delta in (int(d) for d in rng.permutation([1, -1, 2, -2])):
            base = colors[c].copy()
            if grey:
                base += delta
            else:
                base[int(rng.integers(0, 3))] += delta
            candidate = tuple(int(v) for v in base)
            if all(0 <= v <= 255 for v in candidate) and candidate not in taken:
                return candidate  # type: ignore[return-value]
    raise ValueError("no colour 1-2 levels off a class colour is free")  # pragma: no cover


def _far_color(colors: np.ndarray, taken: set, rng: np.random.Generator, grey: bool) -> Color:
    """The colour, among random candidates, farthest from every class colour."""
    candidates = rng.integers(0, 256, (64, 1 if grey else 3))
    if grey:
        candidates = np.repeat(candidates, 3, axis=1)
    distance = np.abs(candidates[:, None, :] - colors[None, :, :]).sum(axis=2).min(axis=1)
    for i in np.argsort(-distance, kind="stable"):
        candidate = tuple(int(v) for v in candidates[i])
        if candidate not in taken:
            return candidate  # type: ignore[return-value]
    raise ValueError("no far colour is free")  # pragma: no cover


def _unused_color(colors: Iterable[Color], rng: np.random.Generator) -> Color:
    """A random colour that is not a class colour (for spare palette entries)."""
    used = set(colors)
    while True:
        candidate = tuple(int(v) for v in rng.integers(0, 256, 3))
        if candidate not in used:
            return candidate  # type: ignore[return-value]


# --------------------------------------------------------------------------------------
# Classification datasets
# --------------------------------------------------------------------------------------

# How each classification file is written. The special kinds appear once each (spread
# over the dataset); the remaining files cycle through `_COMMON_KINDS`.
CLASSIFICATION_KINDS = (
    "jpeg_rgb", "png_rgb", "png_grey", "png_rgba", "jpeg_grey", "jpeg_cmyk",
    "jpeg_exif_rotated", "gif", "bmp",
)
_SPECIAL_KINDS = ("jpeg_exif_rotated", "gif", "bmp", "jpeg_cmyk", "jpeg_grey", "png_grey",
                  "png_rgba")
_COMMON_KINDS = ("jpeg_rgb", "png_rgb", "jpeg_rgb", "png_rgb", "jpeg_grey")
_KIND_EXT = {
    "jpeg_rgb": ".jpg", "png_rgb": ".png", "png_grey": ".png", "png_rgba": ".png",
    "jpeg_grey": ".JPG", "jpeg_cmyk": ".jpeg", "jpeg_exif_rotated": ".jpg",
    "gif": ".gif", "bmp": ".bmp",
}
_EXIF_ORIENTATION_TAG = 0x0112
_EXIF_ROTATE_90 = 6  # "rotate 90 CW to display": width and height swap


def _check_class_names(classes: Sequence[str]) -> list[str]:
    """`classes` as a list of unique, non-empty folder names (else a ValueError)."""
    if isinstance(classes, str) or not isinstance(classes, Sequence) or not classes:
        raise ValueError(
            f"`classes` must be a non-empty sequence of names. Received: classes={classes!r}"
        )
    names = list(classes)
    for name in names:
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise ValueError(
                "`classes` must hold non-empty folder names without '/' or a leading '.'. "
                f"Received: classes={classes!r}"
            )
    if len(set(names)) != len(names):
        raise ValueError(f"`classes` must be unique. Received: classes={classes!r}")
    return names


def _class_counts(per_class: Mapping[str, int] | int, flat: bool) -> dict[str, int]:
    """Split -> files per class ({"": n} for the flat layout), checked."""
    if flat:
        if isinstance(per_class, int) and not isinstance(per_class, bool):
            total = per_class
        else:
            total = sum(_check_splits(per_class, name="per_class").values())
        if total < 0:
            raise ValueError(f"`per_class` must be >= 0. Received: per_class={per_class!r}")
        return {"": total}
    if not isinstance(per_class, Mapping):
        raise TypeError(
            "`per_class` must be a mapping split -> count unless `flat=True`. "
            f"Received: per_class={per_class!r}"
        )
    return _check_splits(per_class, name="per_class")


def make_classification(
    root: PathLike,
    classes: Sequence[str] = ("cat", "dog", "bird"),
    per_class: Mapping[str, int] | int = DEFAULT_PER_CLASS,
    flat: bool = False,
    seed: int = 0,
) -> SynthClassification:
    """Writes a classification dataset in the Keras ``image_dataset_from_directory`` layout.

    ``root/{split}/{class}/NAME.ext`` (or ``root/{class}/NAME.ext`` with ``flat=True``).
    Files are mostly RGB JPEG and PNG; once each (spread over classes and splits while
    there are enough files): a JPEG with EXIF orientation 6 (stored landscape, displayed
    portrait: `SynthClassification.expected_sizes` gives the displayed size), a GIF, a
    BMP, a CMYK JPEG, a greyscale JPEG with an upper-case ``.JPG`` extension, a
    greyscale PNG and an RGBA PNG. Every image has its own size (32..72 pixels a side).

    Args:
        root: Dataset folder (created).
        classes: Class names (folder names), unique and non-empty.
        per_class: Split -> files per class; with ``flat=True`` also an int (a mapping
            is summed).
        flat: Omit the split level.
        seed: Non-negative seed; same arguments -> byte-identical files.
    """
    root = Path(root)
    names = _check_class_names(classes)
    if not isinstance(flat, bool):
        raise TypeError(f"`flat` must be a bool. Received: flat={flat!r}")
    _check_seed(seed)
    counts = _class_counts(per_class, flat)
    planned: list[tuple[str, str, int, Path]] = []  # split, class, label, path
    label_of = {name: i for i, name in enumerate(sorted(names))}
    for split, count in counts.items():
        for name in names:
            folder = root / split / name if split else root / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                planned.append((split, name, label_of[name], folder / f"{name}_{i:04d}"))
    total_files = len(planned)
    kinds = [_COMMON_KINDS[i % len(_COMMON_KINDS)] for i in range(total_files)]
    specials = _SPECIAL_KINDS[:total_files]
    for j, kind in enumerate(specials):
        kinds[(j * total_files) // len(specials)] = kind

    rng = np.random.default_rng([seed, _CLASSIFICATION_STREAM])
    files: dict[str, list[tuple[Path, int]]] = {split: [] for split in counts}
    expected_sizes: dict[Path, Size] = {}
    kind_of: dict[Path, str] = {}
    for (split, _name, label, stem), kind in zip(planned, kinds):
        height, width = (int(v) for v in rng.integers(32, 73, 2))
        if kind == "jpeg_exif_rotated" and height >= width:
            height, width = min(height, width) - 8, max(height, width)  # clearly landscape
        path = stem.with_name(stem.name + _KIND_EXT[kind])
        _write_classification_file(path, kind, textured_image(height, width, rng))
        files[split].append((path, label))
        expected_sizes[path] = (width, height) if kind == "jpeg_exif_rotated" else (height, width)
        kind_of[path] = kind
    for split in files:
        files[split].sort()
    return SynthClassification(root=root, classes=sorted(names), files=files,
                               expected_sizes=expected_sizes, kinds=kind_of)


def _write_classification_file(path: Path, kind: str, rgb: np.ndarray) -> None:
    image = Image.fromarray(rgb, "RGB")
    if kind == "jpeg_rgb":
        _atomic_save(image, path, "JPEG", quality=JPEG_QUALITY)
    elif kind == "png_rgb":
        _atomic_save(image, path, "PNG")
    elif kind == "png_grey":
        _atomic_save(image.convert("L"), path, "PNG")
    elif kind == "png_rgba":
        alpha = np.linspace(0, 255, rgb.shape[1], dtype=np.uint8)[None, :].repeat(rgb.shape[0], 0)
        _atomic_save(Image.fromarray(np.dstack([rgb, alpha]), "RGBA"), path, "PNG")
    elif kind == "jpeg_grey":
        _atomic_save(image.convert("L"), path, "JPEG", quality=JPEG_QUALITY)
    elif kind == "jpeg_cmyk":
        _atomic_save(image.convert("CMYK"), path, "JPEG", quality=JPEG_QUALITY)
    elif kind == "jpeg_exif_rotated":
        exif = Image.Exif()
        exif[_EXIF_ORIENTATION_TAG] = _EXIF_ROTATE_90
        _atomic_save(image, path, "JPEG", quality=JPEG_QUALITY, exif=exif.tobytes())
    elif kind == "gif":
        _atomic_save(image.quantize(64), path, "GIF")
    elif kind == "bmp":
        _atomic_save(image, path, "BMP")
    else:  # pragma: no cover - kinds come from the tables above
        raise ValueError(f"unknown classification kind {kind!r}")


# --------------------------------------------------------------------------------------
# Validation and I/O helpers
# --------------------------------------------------------------------------------------


def _sample_rng(seed: int, index: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, index, stream])


def _path_key(path: PathLike) -> str:
    return os.path.abspath(os.fspath(path))


def _atomic_save(image: Image.Image, path: Path, format: str, **params: Any) -> None:
    """Saves `image` under a hidden temporary name, then renames it to `path`."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        image.save(tmp, format=format, **params)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _check_dim(name: str, value: Any) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"`{name}` must be a positive int. Received: {name}={value!r}")


def _check_rng(rng: Any) -> None:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            "`rng` must be a numpy.random.Generator (np.random.default_rng(seed)). "
            f"Received: rng of type {type(rng).__name__}"
        )


def _check_num_classes(num_classes: Any) -> None:
    if (
        not isinstance(num_classes, (int, np.integer)) or isinstance(num_classes, bool)
        or not 1 <= num_classes <= MAX_CLASSES
    ):
        raise ValueError(
            f"`num_classes` must be an int in [1, {MAX_CLASSES}]. "
            f"Received: num_classes={num_classes!r}"
        )


def _check_seed(seed: Any) -> None:
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"`seed` must be an int >= 0. Received: seed={seed!r}")


def _check_sizes(size: Any) -> list[Size]:
    """Normalises `size` to a non-empty list of (height, width) pairs."""
    def is_pair(value: Any) -> bool:
        return (
            isinstance(value, (tuple, list)) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
        )

    if is_pair(size):
        return [(int(size[0]), int(size[1]))]
    if isinstance(size, (tuple, list)) and size and all(is_pair(s) for s in size):
        return [(int(h), int(w)) for h, w in size]
    raise ValueError(
        "`size` must be a (height, width) pair of positive ints or a non-empty list of "
        f"them. Received: size={size!r}"
    )


def _check_splits(splits: Any, name: str = "splits") -> dict[str, int]:
    if not isinstance(splits, Mapping) or not splits:
        raise ValueError(
            f"`{name}` must be a non-empty mapping split name -> count. Received: {name}={splits!r}"
        )
    out = {}
    for split, count in splits.items():
        if not isinstance(split, str) or not split or "/" in split or split.startswith("."):
            raise ValueError(
                f"`{name}` keys must be folder names (no '/', no leading '.'). "
                f"Received: {name}={splits!r}"
            )
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"`{name}` counts must be ints >= 0. Received: {name}={splits!r}")
        out[split] = count
    return out


def _check_modes(name: str, modes: Any, allowed: Sequence[str]) -> None:
    if (
        isinstance(modes, str) or not isinstance(modes, Sequence) or not modes
        or any(m not in allowed for m in modes)
    ):
        raise ValueError(
            f"`{name}` must be a non-empty sequence of modes from {list(allowed)}. "
            f"Received: {name}={modes!r}"
        )


def _check_classes(classes: Any, name: str) -> ClassTable:
    """Validates a class table: non-empty, <= 255 rows, unique names and colours."""
    if isinstance(classes, (str, bytes)) or not isinstance(classes, Sequence) or not classes:
        raise ValueError(
            f"`{name}` must be a non-empty sequence of (name, (r, g, b)). Received: {name}={classes!r}"
        )
    table: ClassTable = []
    for row in classes:
        try:
            class_name, color = row
            r, g, b = color
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"`{name}` rows must be (name, (r, g, b)). Received row: {row!r}"
            ) from e
        if (
            not isinstance(class_name, str) or not class_name.strip()
            or any(ch in class_name for ch in ',"\r\n')
        ):
            raise ValueError(
                f"`{name}` names must be non-empty str without commas, quotes or newlines. "
                f"Received row: {row!r}"
            )
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 <= v <= 255
                   for v in (r, g, b)):
            raise ValueError(
                f"`{name}` colours must be three ints in [0, 255]. Received row: {row!r}"
            )
        table.append((class_name, (int(r), int(g), int(b))))
    if len(table) > MAX_CLASSES:
        raise ValueError(
            f"`{name}` must have at most {MAX_CLASSES} rows. Received: {len(table)} rows"
        )
    if len({n for n, _ in table}) != len(table):
        raise ValueError(f"`{name}` names must be unique. Received: {[n for n, _ in table]}")
    if len({c for _, c in table}) != len(table):
        raise ValueError(f"`{name}` colours must be distinct. Received: {[c for _, c in table]}")
    return table


def _check_common(
    *, size: Any, num_classes: Any, classes: Any, image_modes: Any, mask_modes: Any,
    mask_suffix: Any, image_ext: Any, quirks: Any, seed: Any, unknown_colors: Any,
) -> tuple[ClassTable, str, list[Size]]:
    """Validates the arguments shared by `make_camvid` and `make_explicit`.

    Returns:
        The class table, the normalised (lower-case) image extension and the sizes.
    """
    sizes = _check_sizes(size)
    _check_seed(seed)
    if not isinstance(quirks, bool):
        raise TypeError(f"`quirks` must be a bool. Received: quirks={quirks!r}")
    if not isinstance(mask_suffix, str) or any(ch in mask_suffix for ch in "/\\"):
        raise ValueError(
            f"`mask_suffix` must be a str without path separators. Received: mask_suffix={mask_suffix!r}"
        )
    if not isinstance(image_ext, str) or image_ext.lower() not in IMAGE_EXTS:
        raise ValueError(
            f"`image_ext` must be one of {list(IMAGE_EXTS)}. Received: image_ext={image_ext!r}"
        )
    image_ext = image_ext.lower()
    is_jpeg = image_ext != ".png"
    _check_modes("image_modes", image_modes, JPEG_IMAGE_MODES if is_jpeg else IMAGE_MODES)
    _check_modes("mask_modes", mask_modes, MASK_MODES)
    if not isinstance(unknown_colors, int) or isinstance(unknown_colors, bool) or unknown_colors < 0:
        raise ValueError(
            f"`unknown_colors` must be an int >= 0. Received: unknown_colors={unknown_colors!r}"
        )

    if classes is None:
        if num_classes is None:
            num_classes = 5
        if (
            not isinstance(num_classes, int) or isinstance(num_classes, bool)
            or not 1 <= num_classes <= len(CAMVID_LIKE_CLASSES)
        ):
            raise ValueError(
                f"`num_classes` must be an int in [1, {len(CAMVID_LIKE_CLASSES)}] when "
                f"`classes` is None. Received: num_classes={num_classes!r}"
            )
        table = grey_classes(num_classes) if "L" in mask_modes else CAMVID_LIKE_CLASSES[:num_classes]
    else:
        table = _check_classes(classes, "classes")
        if num_classes is not None and num_classes != len(table):
            raise ValueError(
                "`num_classes` must be None or len(classes). "
                f"Received: num_classes={num_classes!r}, len(classes)={len(table)}"
            )
        if "L" in mask_modes and any(len(set(c)) != 1 for _, c in table):
            raise ValueError(
                "`classes` must be all grey (r == g == b) when `mask_modes` contains 'L': an "
                "L mask can only hold grey colours (see grey_classes()). "
                f"Received: mask_modes={list(mask_modes)!r}, classes={table!r}"
            )
    palette_need = len(table) + _P_MASK_SPARE_ENTRIES + unknown_colors
    if "P" in mask_modes and palette_need > 256:
        raise ValueError(
            "`classes` plus `unknown_colors` plus spare entries must fit a 256-entry "
            f"palette for P masks. Received: {len(table)} classes, unknown_colors={unknown_colors}"
        )
    return list(table), image_ext, sizes
