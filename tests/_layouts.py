"""Generated datasets in the layouts people have (issue 14), with the reference mapping of each.

Every generator writes a tiny but realistic dataset (textured images from
`converter.synth.textured_image`, street-scene masks from `synth.random_mask`) and
returns a `LayoutDataset`: its samples (split, key, image, mask) and `expected(v)`, the
class id (or `IGNORE`) the documented mapping gives to a mask value v. Tests compute
their reference from these with Pillow alone (NEAREST resize, then the mapping).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image, ImageDraw

from converter.testing import synth
from converter.discover.labelmaps import CITYSCAPES_LABELS, voc_palette_bytes

IGNORE = 255
SIZES = [(32, 48), (40, 36)]  # (h, w): the first is the most common


@dataclass
class Pair:
    split: str
    key: str
    image: Path
    mask: Path


@dataclass
class LayoutDataset:
    root: Path
    layout: str
    pairs: list[Pair] = field(default_factory=list)
    expected: Callable[[int], int] = lambda v: v
    num_classes: int = 0
    binary: bool = False
    threshold: int = 128
    notes: dict = field(default_factory=dict)

    def splits(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.pairs:
            out[p.split] = out.get(p.split, 0) + 1
        return out


def _rng(seed: int, i: int) -> np.random.Generator:
    return np.random.default_rng([seed, i])


def _image(path: Path, h: int, w: int, rng, fmt: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(synth.textured_image(h, w, rng)).save(path, format=fmt)


def _classes_map(h: int, w: int, k: int, rng) -> np.ndarray:
    """A class map using values 0..k-1 (every value in most masks)."""
    return synth.random_mask(h, w, k, rng)


def _border(values: np.ndarray, border_value: int) -> np.ndarray:
    """VOC's thin void border: pixels next to a different class get `border_value`."""
    out = values.copy()
    edge = np.zeros(values.shape, bool)
    edge[:, 1:] |= values[:, 1:] != values[:, :-1]
    edge[1:, :] |= values[1:, :] != values[:-1, :]
    out[edge] = border_value
    return out


def _save_p(path: Path, values: np.ndarray, palette: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    im = Image.fromarray(values.astype(np.uint8), "P")
    im.putpalette(palette)
    im.save(path)


def make_voc(root: Path, seed: int = 0) -> LayoutDataset:
    """VOCdevkit/VOC2012: JPEG images, P masks with the VOC palette and a 255 border,
    ImageSets/Segmentation/{train,val,trainval}.txt, and images without masks."""
    base = root / "VOCdevkit" / "VOC2012"
    ds = LayoutDataset(root, "voc", expected=lambda v: v if v < 21 else IGNORE, num_classes=21)
    names = [f"2007_{i:06d}" for i in range(7)]
    lists = {"train": names[:4], "val": names[4:6]}
    for i, name in enumerate(names):
        h, w = SIZES[i % 3 == 2]
        rng = _rng(seed, i)
        _image(base / "JPEGImages" / f"{name}.jpg", h, w, rng)
        if i == 6:
            continue  # an image without a mask, in no list (VOC's JPEGImages holds detection images too)
        values = _classes_map(h, w, 21, rng) * 1
        values = np.where(values > 0, (values * 3) % 21, 0).astype(np.uint8)
        _save_p(base / "SegmentationClass" / f"{name}.png", _border(values, 255), voc_palette_bytes(256))
    sets = base / "ImageSets" / "Segmentation"
    sets.mkdir(parents=True)
    for split, members in lists.items():
        (sets / f"{split}.txt").write_text("\n".join(members) + "\n")
    (sets / "trainval.txt").write_text("\n".join(names[:6]) + "\n")
    for split, members in lists.items():
        for n in members:
            ds.pairs.append(Pair(split, f"{split}/{n}.jpg", base / "JPEGImages" / f"{n}.jpg",
                                 base / "SegmentationClass" / f"{n}.png"))
    ds.notes["unlisted_mask"] = None
    return ds


def make_labelme(root: Path, seed: int = 1) -> LayoutDataset:
    """labelme2voc output: JPEGImages/, SegmentationClass/*.png (+ decoy .npy),
    SegmentationClassVisualization/*.jpg, class_names.txt; -1 (ignore) saved as 255."""
    names = ["_background_", "cat", "dog", "person"]
    ds = LayoutDataset(root, "voc", expected=lambda v: v if v < 4 else IGNORE, num_classes=4)
    (root).mkdir(parents=True)
    (root / "class_names.txt").write_text("\n".join(names) + "\n")
    for i in range(4):
        h, w = SIZES[i % 2]
        rng = _rng(seed, i)
        stem = f"img_{i:03d}"
        _image(root / "JPEGImages" / f"{stem}.jpg", h, w, rng)
        values = _classes_map(h, w, 4, rng)
        values[: 2, :] = 255  # an "__ignore__" region
        _save_p(root / "SegmentationClass" / f"{stem}.png", values, voc_palette_bytes(256))
        np.save(root / "SegmentationClass" / f"{stem}.npy", values.astype(np.int32))
        _image(root / "SegmentationClassVisualization" / f"{stem}.jpg", h, w, rng)
        ds.pairs.append(Pair("train", f"train/{stem}.jpg", root / "JPEGImages" / f"{stem}.jpg",
                             root / "SegmentationClass" / f"{stem}.png"))
    return ds


_CS_TRAIN = {lid: (tid if tid is not None else IGNORE) for lid, _, tid in CITYSCAPES_LABELS}


def make_cityscapes(root: Path, seed: int = 2) -> LayoutDataset:
    """leftImg8bit/<split>/<city>/*_leftImg8bit.png + gtFine/<split>/<city>/*_gtFine_labelIds.png
    (label ids 0..33), with the _color, _instanceIds and _polygons.json files beside them."""
    ds = LayoutDataset(root, "cityscapes", expected=lambda v: _CS_TRAIN.get(v, IGNORE), num_classes=19)
    i = 0
    for split, cities in (("train", ("aachen", "bremen")), ("val", ("frankfurt",))):
        for city in cities:
            for n in range(2):
                h, w = SIZES[i % 3 == 2]
                rng = _rng(seed, i)
                stem = f"{city}_{n:06d}_000019"
                img = root / "leftImg8bit" / split / city / f"{stem}_leftImg8bit.png"
                _image(img, h, w, rng)
                ids = np.array(sorted(_CS_TRAIN), np.uint8)
                values = ids[(_classes_map(h, w, 12, rng).astype(np.int64) * 5 + i) % 34]
                gt = root / "gtFine" / split / city
                gt.mkdir(parents=True, exist_ok=True)
                Image.fromarray(values, "L").save(gt / f"{stem}_gtFine_labelIds.png")
                Image.fromarray(values * 7, "L").save(gt / f"{stem}_gtFine_instanceIds.png")
                _image(gt / f"{stem}_gtFine_color.png", h, w, rng)
                (gt / f"{stem}_gtFine_polygons.json").write_text("{}")
                ds.pairs.append(Pair(split, f"{split}/{city}/{stem}_leftImg8bit.png", img,
                                     gt / f"{stem}_gtFine_labelIds.png"))
                i += 1
    return ds


def make_ade(root: Path, naming: str = "ade", seed: int = 3, classes: int = 6,
             reduce: bool | None = None) -> LayoutDataset:
    """ADE20K (images/{training,validation} + annotations/...) or mmseg (img_dir/{train,val} +
    ann_dir/...): JPEG images, L masks with values 0..classes (0 = "other"). `reduce` (default:
    ADE naming): the expected mapping is --reduce-zero-label's (0 -> ignore, v -> v-1)."""
    img_dir, ann_dir, splits = (("images", "annotations", ("training", "validation")) if naming == "ade"
                                else ("img_dir", "ann_dir", ("train", "val")))
    reduce = naming == "ade" if reduce is None else reduce
    if reduce:
        ds = LayoutDataset(root, naming, num_classes=classes,
                           expected=lambda v: IGNORE if v == 0 else (v - 1 if v - 1 < classes else IGNORE))
    else:
        ds = LayoutDataset(root, naming, num_classes=classes + 1, expected=lambda v: v)
    for j, split in enumerate(splits):
        for n in range(3 - j):
            i = j * 10 + n
            h, w = SIZES[n == 2]
            rng = _rng(seed, i)
            stem = f"ADE_{split}_{i:08d}"
            _image(root / img_dir / split / f"{stem}.jpg", h, w, rng)
            values = _classes_map(h, w, classes + 1, rng)
            (root / ann_dir / split).mkdir(parents=True, exist_ok=True)
            Image.fromarray(values, "L").save(root / ann_dir / split / f"{stem}.png")
            ds.pairs.append(Pair(split, f"{split}/{stem}.jpg", root / img_dir / split / f"{stem}.jpg",
                                 root / ann_dir / split / f"{stem}.png"))
    return ds


def make_unet(root: Path, seed: int = 4, levels: tuple[int, int] = (0, 255)) -> LayoutDataset:
    """Keras U-Net tutorial layout: {train,test}/image/*.png + {train,test}/label/*.png, binary masks."""
    ds = LayoutDataset(root, "unet", num_classes=2, binary=True, expected=lambda v: int(v >= 128) if levels[1] > 1
                       else int(v >= 1))
    i = 0
    for split, n in (("train", 4), ("test", 2)):
        for k in range(n):
            h, w = SIZES[k == 3]
            rng = _rng(seed, i)
            _image(root / split / "image" / f"{k}.png", h, w, rng)
            values = np.where(_classes_map(h, w, 2, rng) > 0, levels[1], levels[0]).astype(np.uint8)
            (root / split / "label").mkdir(parents=True, exist_ok=True)
            Image.fromarray(values, "L").save(root / split / "label" / f"{k}.png")
            ds.pairs.append(Pair(split, f"{split}/{k}.png", root / split / "image" / f"{k}.png",
                                 root / split / "label" / f"{k}.png"))
            i += 1
    return ds


def make_isic(root: Path, seed: int = 5, jpeg_masks: bool = False) -> LayoutDataset:
    """ISIC-style: <Input>/ISIC_n.jpg + <GroundTruth>/ISIC_n_segmentation.png (or .jpg: JPEG
    masks, binarized at the mid level), binary 0/255."""
    imgs, gts = root / "ISIC2018_Task1-2_Training_Input", root / "ISIC2018_Task1_Training_GroundTruth"
    ds = LayoutDataset(root, "unet", num_classes=2, binary=True, expected=lambda v: int(v >= 128))
    ext = ".jpg" if jpeg_masks else ".png"
    for i in range(5):
        h, w = SIZES[i == 4]
        rng = _rng(seed, i)
        stem = f"ISIC_{i:07d}"
        _image(imgs / f"{stem}.jpg", h, w, rng)
        gts.mkdir(parents=True, exist_ok=True)
        values = np.where(_classes_map(h, w, 2, rng) > 0, 255, 0).astype(np.uint8)
        Image.fromarray(values, "L").save(gts / f"{stem}_segmentation{ext}", **({"quality": 75} if jpeg_masks else {}))
        ds.pairs.append(Pair("train", f"train/{stem}.jpg", imgs / f"{stem}.jpg", gts / f"{stem}_segmentation{ext}"))
    return ds


def make_drive(root: Path, seed: int = 6) -> LayoutDataset:
    """DRIVE-style: training/images/<id>_training.tif + training/1st_manual/<id>_manual1.gif
    (vessels, binary) + training/mask/<id>_training_mask.gif (the field of view: a decoy)."""
    ds = LayoutDataset(root, "explicit", num_classes=2, binary=True)
    t = root / "training"
    for i in range(21, 25):
        h, w = SIZES[i == 24]
        rng = _rng(seed, i)
        _image(t / "images" / f"{i}_training.tif", h, w, rng, fmt="TIFF")
        values = np.where(_classes_map(h, w, 2, rng) > 0, 255, 0).astype(np.uint8)
        for folder, name in (("1st_manual", f"{i}_manual1.gif"), ("mask", f"{i}_training_mask.gif")):
            (t / folder).mkdir(parents=True, exist_ok=True)
            Image.fromarray(values if folder == "1st_manual" else 255 - values, "L").save(t / folder / name)
        ds.pairs.append(Pair("train", f"train/{i}_training.tif", t / "images" / f"{i}_training.tif",
                             t / "1st_manual" / f"{i}_manual1.gif"))
    return ds


def make_index16(root: Path, seed: int = 7, classes: int = 300) -> LayoutDataset:
    """images/ + masks/ with 16-bit PNG index masks (values 0..classes-1, above 255)."""
    ds = LayoutDataset(root, "unet", num_classes=classes, expected=lambda v: v)
    for i in range(4):
        h, w = SIZES[i == 3]
        rng = _rng(seed, i)
        _image(root / "images" / f"s{i}.png", h, w, rng)
        values = (_classes_map(h, w, 12, rng).astype(np.int64) * 26 + i).astype(np.uint16)
        values[0, 0] = classes - 1
        (root / "masks").mkdir(parents=True, exist_ok=True)
        Image.fromarray(values).save(root / "masks" / f"s{i}.png")
        ds.pairs.append(Pair("train", f"train/s{i}.png", root / "images" / f"s{i}.png", root / "masks" / f"s{i}.png"))
    return ds


def mask_values(path: Path) -> np.ndarray:
    """A mask's pixel values as Pillow reads them (P: palette indices, L, I;16)."""
    im = Image.open(path)
    if im.mode in ("RGB", "RGBA"):
        return np.asarray(im.convert("RGB")).max(axis=2)
    if im.mode == "1":
        im = im.convert("L")
    return np.asarray(im).astype(np.int64)


def reference(pair: Pair, ds: LayoutDataset, size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Pillow reference: image RGB + BILINEAR; mask values NEAREST, then the documented mapping."""
    h, w = size
    image = np.asarray(Image.open(pair.image).convert("RGB").resize((w, h), Image.Resampling.BILINEAR))
    values = mask_values(pair.mask)
    rows = Image.fromarray(values.astype(np.int32), "I").resize((w, h), Image.Resampling.NEAREST)
    v = np.asarray(rows).astype(np.int64)
    if ds.binary:
        top = int(values.max())
        expected = (v >= (1 if top <= 1 else ds.threshold)).astype(np.int64)
    else:
        table = {int(x): ds.expected(int(x)) for x in np.unique(v)}
        expected = np.vectorize(table.__getitem__, otypes=[np.int64])(v)
    return image, expected


def jpeg_bytes(values: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(values, "L").save(buf, format="JPEG", quality=75)
    return buf.getvalue()


def draw_outline(values: np.ndarray, value: int) -> np.ndarray:
    im = Image.fromarray(values)
    ImageDraw.Draw(im).rectangle([0, 0, values.shape[1] - 1, values.shape[0] - 1], outline=value)
    return np.asarray(im)
