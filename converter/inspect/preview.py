"""`imgshard preview`: a contact sheet PNG of a converted dataset or of raw sources.

Segmentation: one row per sample, captioned with its key: the image, the mask in class
colours, and the mask blended over the image; a legend of class names and colours at
the bottom. Small images are enlarged by an integer factor with nearest sampling, so
each stored pixel is a crisp block and mask colours stay exact; large ones are reduced
to fit a tile. Ignored pixels (the ignore index) show as a grey checkerboard. On raw
sources, mask pixels whose colour matches no class (at ``--color-tolerance``) show as a
loud magenta/black checkerboard, so the places where masks and class_dict.csv disagree
stand out.

Classification: a grid of images with their key and class name.

Pillow drawing with its default font; deterministic for a given seed.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from converter.inspect.display import to_display
from readers.manifest import ClassInfo
from readers.tasks import task_kind

#: Layout, in pixels.
MARGIN = 12
GAP = 8
TILE_TARGET = 192  # small images are enlarged by an integer factor up to this side
TILE_MAX = 320  # larger images are reduced to fit this side
CAPTION_H = 22
HEADER_H = 28
LEGEND_SWATCH = 16
LEGEND_COL_W = 200
LEGEND_ROW_H = 22
FONT_SIZE = 14
BLEND_ALPHA = 0.5
CHECK_PX = 4  # checkerboard cell

BACKGROUND = (255, 255, 255)
TEXT = (20, 20, 20)
ERROR_TEXT = (200, 0, 0)
UNKNOWN_COLORS = ((255, 0, 255), (0, 0, 0))  # loud magenta / black checker
IGNORE_COLORS = ((200, 200, 200), (150, 150, 150))
COLUMNS = ("image", "mask", "overlay")
GRID_COLUMNS = 6  # classification


@dataclass(frozen=True)
class PreviewOptions:
    split: str | None = None
    n: int = 8
    seed: int = 0
    keys: tuple[str, ...] = ()
    color_tolerance: int = 0  # raw sources only
    #: A `readers.augment.Augment`: show each sample as training with `seed` sees it in
    #: `epoch` (converted datasets only).
    augment: Any = None
    epoch: int = 0
    #: Bands drawn (1-based; one for grey, three for RGB) of images beyond 8-bit RGB; None: the first three.
    display_bands: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or not 1 <= self.n <= 1000:
            raise ValueError(f"-n must be an integer in 1..1000. Received: {self.n!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TypeError(f"--seed must be an int. Received: {self.seed!r}")
        if not isinstance(self.color_tolerance, int) or not 0 <= self.color_tolerance <= 255:
            raise ValueError(f"--color-tolerance must be an integer in 0..255. Received: {self.color_tolerance!r}")
        object.__setattr__(self, "keys", tuple(self.keys))


@dataclass
class PreviewSample:
    """One row (segmentation) or cell (classification) of the sheet."""

    key: str
    image: np.ndarray | None  # (H, W, 3) uint8
    class_map: np.ndarray | None = None  # (H, W) int; >= num_classes: ignore / unknown marks
    label: int | None = None
    unknown_mask: np.ndarray | None = None  # (H, W) bool: colours in no class (raw sources)
    note: str = ""
    error: str = ""


@dataclass
class Sheet:
    """The rendered sheet and where everything is (for tests and callers)."""

    image: Image.Image
    boxes: list[dict[str, Any]] = field(default_factory=list)  # per sample: key, scale, and column boxes
    legend: list[dict[str, Any]] = field(default_factory=list)  # per entry: name, box of its swatch

    @property
    def size(self) -> tuple[int, int]:
        return self.image.size


def _font(size: int = FONT_SIZE) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError, ImportError):  # Pillow without FreeType: the bitmap font
        return ImageFont.load_default()


def tile_scale(height: int, width: int) -> float:
    """Integer enlargement for small images, reduction to TILE_MAX for large ones."""
    side = max(height, width)
    if side <= TILE_TARGET:
        return float(max(1, TILE_TARGET // side))
    if side > TILE_MAX:
        return TILE_MAX / side
    return 1.0


def _resize(arr: np.ndarray, scale: float, *, smooth: bool) -> Image.Image:
    im = Image.fromarray(arr)
    if scale == 1.0:
        return im
    h, w = arr.shape[:2]
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return im.resize(size, Image.BILINEAR if smooth and scale < 1 else Image.NEAREST)


def _checker(h: int, w: int, colors: tuple[tuple[int, int, int], tuple[int, int, int]]) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    on = ((yy // CHECK_PX) + (xx // CHECK_PX)) % 2 == 0
    out = np.empty((h, w, 3), np.uint8)
    out[on] = colors[0]
    out[~on] = colors[1]
    return out


def class_colors(classes: Sequence[ClassInfo]) -> list[tuple[int, int, int]]:
    """Each class's colour; a class without one (index masks) gets the VOC colour map's, so a
    0/1 or 0..5 mask is never drawn black on black."""
    from converter.discover.labelmaps import voc_color

    return [c.color if c.color is not None else voc_color(i % 256) for i, c in enumerate(classes)]


def colorize(class_map: np.ndarray, classes: Sequence[ClassInfo], unknown: np.ndarray | None = None) -> np.ndarray:
    """(H, W) class indices -> (H, W, 3) class colours; other indices grey checker, unknown magenta checker."""
    h, w = class_map.shape
    palette = np.array(class_colors(classes), np.uint8).reshape(-1, 3)
    idx = class_map.astype(np.int64)
    known = idx < len(classes)
    out = _checker(h, w, IGNORE_COLORS)
    out[known] = palette[idx[known]]
    if unknown is not None and unknown.any():
        loud = _checker(h, w, UNKNOWN_COLORS)
        out[unknown] = loud[unknown]
    return out


def blend(image: np.ndarray, colored: np.ndarray, class_map: np.ndarray, num_classes: int,
          unknown: np.ndarray | None = None, alpha: float = BLEND_ALPHA) -> np.ndarray:
    """The class colours over the image; ignored pixels keep the image, unknown ones are loud."""
    out = image.astype(np.float32)
    known = class_map < num_classes
    out[known] = out[known] * (1 - alpha) + colored[known].astype(np.float32) * alpha
    out = np.clip(np.rint(out), 0, 255).astype(np.uint8)
    if unknown is not None and unknown.any():
        out[unknown] = colored[unknown]
    return out


def _rgb(image: np.ndarray) -> np.ndarray:
    return np.repeat(image[:, :, None], 3, axis=2) if image.ndim == 2 else image


# -- rendering ------------------------------------------------------------------------------------

def render_segmentation(samples: Sequence[PreviewSample], classes: Sequence[ClassInfo], title: str, *,
                        show_unknown: bool = False) -> Sheet:
    font = _font()
    rows = []
    for s in samples:
        if s.error or s.image is None or s.class_map is None:
            rows.append((s, None, 0.0, (0, 0)))
            continue
        image = _rgb(s.image)
        h, w = image.shape[:2]
        scale = tile_scale(h, w)
        class_map, unknown = s.class_map, s.unknown_mask
        if scale < 1:  # reduce first, then colour: large sources cost a tile's pixels, not a photo's
            image = np.asarray(_resize(image, scale, smooth=True))
            th, tw = image.shape[:2]
            ys = np.minimum(((np.arange(th) + 0.5) * h / th).astype(np.int64), h - 1)
            xs = np.minimum(((np.arange(tw) + 0.5) * w / tw).astype(np.int64), w - 1)
            class_map = class_map[ys[:, None], xs[None, :]]
            unknown = unknown[ys[:, None], xs[None, :]] if unknown is not None else None
            up = 1.0
        else:
            up = scale
        colored = colorize(class_map, classes, unknown)
        over = blend(image, colored, class_map, len(classes), unknown)
        tiles = [_resize(a, up, smooth=False) for a in (image, colored, over)]
        rows.append((s, tiles, scale, tiles[0].size))
    tile_w = max([r[3][0] for r in rows] + [TILE_TARGET])
    width = 2 * MARGIN + 3 * tile_w + 2 * GAP
    legend_entries = [(c.name, np.full((LEGEND_SWATCH, LEGEND_SWATCH, 3), color, np.uint8))
                      for c, color in zip(classes, class_colors(classes))]
    legend_entries.append(("ignored", _checker(LEGEND_SWATCH, LEGEND_SWATCH, IGNORE_COLORS)))
    if show_unknown:
        legend_entries.append(("colour in no class", _checker(LEGEND_SWATCH, LEGEND_SWATCH, UNKNOWN_COLORS)))
    per_row = max(1, (width - 2 * MARGIN) // LEGEND_COL_W)
    legend_h = math.ceil(len(legend_entries) / per_row) * LEGEND_ROW_H
    body_h = sum(CAPTION_H + (r[3][1] if r[1] is not None else 0) + GAP for r in rows)
    height = MARGIN + HEADER_H + CAPTION_H + body_h + GAP + CAPTION_H + legend_h + MARGIN
    sheet = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    draw.text((MARGIN, MARGIN), title, fill=TEXT, font=font)
    y = MARGIN + HEADER_H
    for j, name in enumerate(COLUMNS):
        draw.text((MARGIN + j * (tile_w + GAP), y), name, fill=TEXT, font=font)
    y += CAPTION_H
    result = Sheet(sheet)
    for s, tiles, scale, (tw, th) in rows:
        caption = s.key + (f"  -  {s.note}" if s.note else "")
        color = ERROR_TEXT if (s.error or s.note) else TEXT
        draw.text((MARGIN, y + 2), caption + (f"  -  {s.error}" if s.error else ""), fill=color, font=font)
        y += CAPTION_H
        entry: dict[str, Any] = {"key": s.key, "scale": scale}
        if tiles is not None:
            for j, (name, tile) in enumerate(zip(COLUMNS, tiles)):
                x = MARGIN + j * (tile_w + GAP)
                sheet.paste(tile, (x, y))
                entry[name] = (x, y, x + tile.size[0], y + tile.size[1])
            y += th
        result.boxes.append(entry)
        y += GAP
    y += GAP
    draw.text((MARGIN, y), "legend", fill=TEXT, font=font)
    y += CAPTION_H
    for i, (name, swatch) in enumerate(legend_entries):
        x = MARGIN + (i % per_row) * LEGEND_COL_W
        yy = y + (i // per_row) * LEGEND_ROW_H
        sheet.paste(Image.fromarray(swatch), (x, yy))
        draw.rectangle((x - 1, yy - 1, x + LEGEND_SWATCH, yy + LEGEND_SWATCH), outline=TEXT)
        draw.text((x + LEGEND_SWATCH + 6, yy), name, fill=TEXT, font=font)
        result.legend.append({"name": name, "box": (x, yy, x + LEGEND_SWATCH, yy + LEGEND_SWATCH)})
    return result


def render_classification(samples: Sequence[PreviewSample], classes: Sequence[ClassInfo], title: str) -> Sheet:
    font = _font()
    cells = []
    for s in samples:
        if s.image is None:
            cells.append((s, None, 0.0))
            continue
        image = _rgb(s.image)
        scale = tile_scale(*image.shape[:2])
        cells.append((s, _resize(image, scale, smooth=True), scale))
    tile_w = max([c[1].size[0] for c in cells if c[1] is not None] + [TILE_TARGET])
    tile_h = max([c[1].size[1] for c in cells if c[1] is not None] + [0])
    cols = max(1, min(GRID_COLUMNS, len(cells)))
    nrows = math.ceil(len(cells) / cols) if cells else 0
    cell_h = tile_h + 2 * CAPTION_H + GAP
    width = max(2 * MARGIN + cols * tile_w + (cols - 1) * GAP, 400)
    height = MARGIN + HEADER_H + nrows * cell_h + MARGIN
    sheet = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    draw.text((MARGIN, MARGIN), title, fill=TEXT, font=font)
    result = Sheet(sheet)
    for i, (s, tile, scale) in enumerate(cells):
        x = MARGIN + (i % cols) * (tile_w + GAP)
        y = MARGIN + HEADER_H + (i // cols) * cell_h
        entry: dict[str, Any] = {"key": s.key, "scale": scale, "label": s.label}
        if tile is not None:
            sheet.paste(tile, (x, y))
            entry["image"] = (x, y, x + tile.size[0], y + tile.size[1])
        elif s.error:  # a bad source file: its reason where the image would be
            for j, line in enumerate(_wrap(s.error, tile_w, font)[: max(1, tile_h // CAPTION_H)]):
                draw.text((x, y + j * CAPTION_H), line, fill=ERROR_TEXT, font=font)
        name = classes[s.label].name if s.label is not None and 0 <= s.label < len(classes) else f"label {s.label}"
        draw.text((x, y + tile_h + 2), name, fill=TEXT, font=font)
        draw.text((x, y + tile_h + CAPTION_H), _ellipsize(s.key, tile_w, font), fill=(90, 90, 90), font=font)
        result.boxes.append(entry)
    return result


def _wrap(text: str, width: int, font: Any) -> list[str]:
    """Words of `text` in lines no wider than `width` (a longer word gets a line of its own)."""
    lines: list[str] = []
    for word in text.split():
        if lines and font.getlength(lines[-1] + " " + word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def _ellipsize(text: str, width: int, font: Any) -> str:
    if font.getlength(text) <= width:
        return text
    while text and font.getlength("..." + text) > width:
        text = text[1:]
    return "..." + text


# -- sources of samples ---------------------------------------------------------------------------

def _choose(count: int, n: int, seed: int) -> list[int]:
    return sorted(random.Random(seed).sample(range(count), min(n, count)))


def _pick(by_key: dict[str, Any], pool: list[Any], options: PreviewOptions, missing: Callable[[str], str]) -> list[Any]:
    """The items --key names (each must exist: else KeyError with `missing(key)`), or
    `options.n` of `pool` chosen with `options.seed`."""
    if not options.keys:
        return [pool[i] for i in _choose(len(pool), options.n, options.seed)]
    absent = [k for k in options.keys if k not in by_key]
    if absent:
        raise KeyError(f"--key: {missing(absent[0])}. Received: {list(options.keys)}")
    return [by_key[k] for k in options.keys]


def dataset_samples(path: str | os.PathLike, options: PreviewOptions,
                    storage_options: dict | None = None) -> tuple[Any, str, list[PreviewSample]]:
    """(manifest, split, samples) picked from a converted dataset (random access; no full pass;
    a bucket dataset by ranged reads)."""
    import readers
    from readers.formats.spec import RecordSpec
    from readers.index import ref_keys
    from readers.formats.registry import get_adapter

    ds = readers.open(path, storage_options=storage_options)
    m = ds.manifest
    split = options.split or ("train" if "train" in m.splits else sorted(m.splits)[0] if m.splits else None)
    if split is None:
        raise ValueError(f"{ds.path} holds no split; nothing to preview.")
    shards = ds.shards(split)
    index: list[tuple[int, int]] = [(si, i) for si, s in enumerate(shards) for i in range(s.records)]
    keys_of = {}
    if options.keys:  # keys asked for: read the split's index files (never needed otherwise)
        for si, s in enumerate(shards):
            for i, key in enumerate(ref_keys(s)):
                keys_of[(si, i)] = key
    picked = _pick({k: pos for pos, k in keys_of.items()}, index, options,
                   lambda k: f"no sample {k!r} in split {split!r} of {ds.path}")
    for si in sorted({si for si, _ in picked} - {si for si, _ in keys_of}):  # the labels of random picks
        keys_of.update(((si, i), key) for i, key in enumerate(ref_keys(shards[si])))
    spec = RecordSpec.from_manifest(m)
    adapter = get_adapter(m.format)
    readers_by_shard: dict[int, Any] = {}
    out = []
    for si, i in picked:
        if si not in readers_by_shard:
            readers_by_shard[si] = adapter.random_access(shards[si], spec)
        image, target = readers_by_shard[si].read(i)
        key = keys_of.get((si, i), f"{shards[si].entry.file}#{i}")
        if options.augment is not None:
            image, target = _augmented(options, image, target, key, spec)
        if task_kind(m.task).dense:
            target = np.asarray(target)
            if target.ndim == 3:  # one-hot planes -> class map, all-zero rows ignored
                cmap = np.argmax(target, axis=-1).astype(np.int64)
                cmap[target.max(axis=-1) == 0] = m.num_classes
                target = cmap
            out.append(PreviewSample(key, to_display(image, options.display_bands), class_map=np.asarray(target)))
        else:
            out.append(PreviewSample(key, to_display(image, options.display_bands), label=int(target)))
    for r in readers_by_shard.values():
        r.close()
    return m, split, out


def source_samples(spec: Any, options: PreviewOptions, max_pixels: int, labels: Any = None,
                   ) -> tuple[tuple[ClassInfo, ...], list[PreviewSample]]:
    """Samples decoded from raw sources (mask semantics resolved as convert resolves them:
    colour, index or binary); unknown colours or values marked, bad files captioned."""
    from converter.discover.labels import resolve_labels
    from converter.discover.layouts import discover
    from converter.transform.colormap import AMBIGUOUS
    from converter.transform.decode import DecodeError, decode_image, decode_mask, read_source
    from converter.transform.sample import annotation_mask
    from converter.transform.semantics import make_semantics

    found = discover(spec)
    resolved, classes = resolve_labels(spec, labels, found)
    samples = [s for s in found.samples if options.split is None or s.split == options.split]
    example = found.samples[0].key if found.samples else "train/NAME.png"
    chosen = _pick({s.key: s for s in found.samples}, samples, options,
                   lambda k: f"no image/mask pair {k!r} in {spec.base}. Keys look like {example}")
    cmap = make_semantics(resolved, classes, options.color_tolerance)
    out = []
    for s in chosen:
        try:
            image = decode_image(read_source(s.image, s.key), max_pixels, exif_transpose=s.annotation is not None)
            mask = (annotation_mask(s.annotation, *image.shape[:2]) if s.annotation is not None else
                    decode_mask(read_source(s.mask, s.key), max_pixels,  # type: ignore[arg-type]
                                wide=resolved.semantics is not resolved.semantics.COLOUR))
        except DecodeError as e:
            out.append(PreviewSample(s.key, None, error=f"[{e.kind}] {e.reason}"))
            continue
        if (mask.height, mask.width) != image.shape[:2]:
            out.append(PreviewSample(s.key, None, error=f"[size_mismatch] mask is {mask.width}x{mask.height}, "
                                     f"image is {image.shape[1]}x{image.shape[0]}"))
            continue
        try:
            class_map, unknown = cmap.lookup(mask)
        except DecodeError as e:
            out.append(PreviewSample(s.key, None, error=f"[{e.kind}] {e.reason}"))
            continue
        bad = class_map >= AMBIGUOUS
        note = ""
        if bad.any():
            n_colors = len(unknown.counts) + len(unknown.ambiguous)
            note = f"{int(bad.sum())} px in {n_colors} colour(s) matching no class (checkered magenta)"
        out.append(PreviewSample(s.key, image, class_map=class_map.astype(np.int64), unknown_mask=bad, note=note))
    return classes, out


def class_source_samples(spec: Any, options: PreviewOptions, max_pixels: int, val_fraction: float | None = None,
                         ) -> tuple[tuple[ClassInfo, ...], list[PreviewSample]]:
    """Images decoded from class folders as convert decodes them (EXIF applied); bad files captioned."""
    from converter.discover.classfolders import discover_classification
    from converter.transform.decode import DecodeError, decode_image, read_source

    found, classes = discover_classification(spec, val_fraction)
    samples = [s for s in found.samples if options.split is None or s.split == options.split]
    example = found.samples[0].key if found.samples else "train/CLASS/NAME.jpg"
    chosen = _pick({s.key: s for s in found.samples}, samples, options,
                   lambda k: f"no image {k!r} in {spec.base}. Keys look like {example}")
    out = []
    for s in chosen:
        try:
            image = decode_image(read_source(s.image, s.key), max_pixels, exif_transpose=True)
        except DecodeError as e:
            out.append(PreviewSample(s.key, None, label=s.label, error=f"[{e.kind}] {e.reason}"))
            continue
        out.append(PreviewSample(s.key, image, label=s.label))
    return classes, out


def is_dataset(path: str | os.PathLike, storage_options: dict | None = None) -> bool:
    """Whether `path` (a folder or a bucket URL) holds a converted dataset (its manifest)."""
    from readers.manifest import MANIFEST_NAME
    from readers.storage.url import is_remote, local_path

    if is_remote(path):
        from readers.storage import open_store

        url = os.fspath(path)
        return url.endswith("/" + MANIFEST_NAME) or open_store(url, storage_options).exists(MANIFEST_NAME)
    p = local_path(path)
    return os.path.isfile(os.path.join(p, MANIFEST_NAME)) or (os.path.isfile(p) and p.endswith(MANIFEST_NAME))


def _save(sheet: Sheet, out_png: str | os.PathLike) -> None:
    out_png = os.fspath(out_png)
    folder = os.path.dirname(os.path.abspath(out_png))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"-o: folder {folder} does not exist. Received: -o {out_png}")
    if os.path.isdir(out_png):
        raise PreviewOutputError(f"-o {out_png} is a folder; give the PNG file to write, e.g. -o {out_png}/preview.png")
    try:
        sheet.image.save(out_png, format="PNG", compress_level=1)  # noisy photos: level 6 is 10x slower
    except OSError as e:
        raise PreviewOutputError(f"cannot write -o {out_png}: {e.strerror or e}. Choose a writable path.", 74) from e


class PreviewOutputError(ValueError):
    """The contact sheet cannot be written where -o says (a folder, read-only, full)."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _augmented(options: PreviewOptions, image: Any, target: Any, key: str, spec: Any) -> tuple[Any, Any]:
    """The sample as `tf_dataset(..., augment=options.augment, seed=options.seed)` gives it
    in `options.epoch`; the key in the manifest decides the draws, as in training."""
    from readers.augment import augment_sample

    return augment_sample(options.augment, image, target if spec.segmentation else int(target), key=key,
                          seed=options.seed, epoch=options.epoch, ignore_index=spec.ignore_index)


def preview_dataset(path: str | os.PathLike, out_png: str | os.PathLike, options: PreviewOptions | None = None,
                    storage_options: dict | None = None) -> Sheet:
    from readers.storage.url import is_remote, local_path

    options = options or PreviewOptions()
    m, split, samples = dataset_samples(path, options, storage_options)
    where = os.fspath(path) if is_remote(path) else os.path.abspath(local_path(path))
    title = f"{where}  split {split}  ({len(samples)} of {m.split(split).num_samples})"
    if task_kind(m.task).dense:
        sheet = render_segmentation(samples, m.classes, title)
    else:
        sheet = render_classification(samples, m.classes, title)
    _save(sheet, out_png)
    return sheet


def preview_sources(spec: Any, out_png: str | os.PathLike, options: PreviewOptions | None = None, *,
                    max_pixels: int | None = None, task: Any = None, val_fraction: float | None = None,
                    labels: Any = None) -> Sheet:
    """Contact sheet of raw sources. `task` None: classification with `val_fraction`, else detected
    as convert detects it; class folders give a grid of images with their class names."""
    from converter.discover.classfolders import detect_task
    from converter.options import DEFAULT_MAX_PIXELS, Task, check_val_fraction

    options = options or PreviewOptions()
    if task is None:
        task = Task.CLASSIFICATION if val_fraction is not None else detect_task(spec)
    val_fraction = check_val_fraction(val_fraction, task)
    if not task_kind(task).dense:
        classes, samples = class_source_samples(spec, options, max_pixels or DEFAULT_MAX_PIXELS, val_fraction)
        where = spec.root or spec.images
        title = f"{where}  (raw sources, class folders, {len(samples)} images)"
        sheet = render_classification(samples, classes, title)
        _save(sheet, out_png)
        return sheet
    classes, samples = source_samples(spec, options, max_pixels or DEFAULT_MAX_PIXELS, labels)
    where = spec.root or spec.images
    title = f"{where}  (raw sources, --color-tolerance {options.color_tolerance}, {len(samples)} pairs)"
    sheet = render_segmentation(samples, classes, title, show_unknown=True)
    _save(sheet, out_png)
    return sheet


__all__ = ["PreviewOptions", "PreviewSample", "Sheet", "blend", "class_source_samples", "colorize", "is_dataset",
           "preview_dataset",
           "preview_sources", "render_classification", "render_segmentation", "tile_scale"]
