"""Mask meaning from evidence (issue 24): no silently wrong class map.

Fixtures are built adversarially, not in the order the code reads them: palettes and
class tables in independent random orders, palettes with extra and missing entries,
VOC-layout datasets that are not Pascal VOC, two-level masks in every layout, 8- and
16-bit binary masks mixed. Every expected class map is computed here with Pillow
(``convert('RGB')`` + the table, or the values + the names file), never with imgshard.
`scan`'s suggested command is run through the CLI as a user would paste it.
"""

from __future__ import annotations

import shlex
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

import readers
from converter.cli import main as cli_main
from converter.convert import convert
from converter.discover.labelmaps import VOC_CLASSES, voc_palette_bytes
from converter.inspect.scan import ScanOptions, format_report, scan
from converter.options import LabelOptions, OutputOptions, RunOptions, SourceSpec
from converter.testing import synth
from tests import _layouts as L
from tests._pngcraft import SIGNATURE, chunk

SIZE = (20, 28)  # (h, w): never a source size
IGNORE = 255


def _scan(root, **labels):
    return scan(SourceSpec(root=str(root)), ScanOptions(workers=1, labels=LabelOptions(**labels) if labels else None))


def _run(command: str, out) -> int:
    args = shlex.split(command)[1:]
    args[args.index("OUT")] = str(out)
    args[args.index("--size") + 1] = f"{SIZE[0]}x{SIZE[1]}"
    return cli_main(args + ["--workers", "1", "-q"])


def _nearest(arr: np.ndarray) -> np.ndarray:
    """Pillow NEAREST to SIZE of an (H, W) int array (what the converter's NEAREST must equal)."""
    return np.asarray(Image.fromarray(arr.astype(np.int32), "I").resize((SIZE[1], SIZE[0]), Image.Resampling.NEAREST))


def _by_colour(mask_path, table: list[tuple[str, tuple[int, int, int]]]) -> np.ndarray:
    """Reference: each pixel's class = the table row whose colour is the pixel's displayed colour."""
    rgb = np.asarray(Image.open(mask_path).convert("RGB")).astype(np.int64)
    packed = rgb[..., 0] << 16 | rgb[..., 1] << 8 | rgb[..., 2]
    rows = {c[0] << 16 | c[1] << 8 | c[2]: i for i, (_, c) in enumerate(table)}
    assert set(np.unique(packed).tolist()) <= set(rows), "fixture: every displayed colour is a table row"
    return _nearest(np.vectorize(rows.__getitem__)(packed))


def _stored(out) -> dict[str, np.ndarray]:
    data = readers.open(out)
    return {r.key: r.mask.astype(np.int64) for split in data.splits for r in data.records(split)}


def _class_dict(path, table) -> None:
    synth.write_class_dict(path, table)


# -- palettes with a colour table -------------------------------------------------------------------

def _p_png(path, idx: np.ndarray, palette_colours) -> None:
    """An 8-bit P PNG written by hand, its PLTE exactly `palette_colours` (Pillow would shrink the
    bit depth of a short palette and wrap indices past its end)."""
    h, w = idx.shape
    rows = b"".join(b"\x00" + r.tobytes() for r in idx.astype(np.uint8))
    path.write_bytes(SIGNATURE + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 3, 0, 0, 0))
                     + chunk(b"PLTE", bytes(v for c in palette_colours for v in c))
                     + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def _camvid_palette(root, table, palette_colours: list[tuple[int, int, int]], index_maps: list[np.ndarray],
                    by_hand: bool = False):
    """CamVid layout: P masks drawing `index_maps` with `palette_colours`, and `table` as class_dict.csv."""
    _class_dict(root / "class_dict.csv", table)
    (root / "train").mkdir(parents=True)
    (root / "train_labels").mkdir(parents=True)
    for i, idx in enumerate(index_maps):
        rng = np.random.default_rng([99, i])
        Image.fromarray(synth.textured_image(*idx.shape, rng)).save(root / "train" / f"f{i:03d}.png")
        if by_hand:
            _p_png(root / "train_labels" / f"f{i:03d}.png", idx, palette_colours)
            continue
        m = Image.fromarray(idx.astype(np.uint8), "P")
        m.putpalette(bytes(v for c in palette_colours for v in c))
        m.save(root / "train_labels" / f"f{i:03d}.png")


def test_camvid_voc_ordered_palette_with_reordered_class_dict_is_read_by_colour(tmp_path, caplog):
    """Regression 1: P masks with the VOC colour map (0 black, 1 dark red, 2 green, 3 olive) and
    a class_dict.csv naming those colours in another order: black is Void, not Animal."""
    root = tmp_path / "camvid"
    table = [("Animal", (0, 128, 0)), ("Building", (128, 0, 0)), ("Tree", (128, 128, 0)), ("Void", (0, 0, 0))]
    maps = []
    for i in range(5):
        idx = synth.random_mask(32, 48, 4, np.random.default_rng(i))
        idx[:12, :] = 0  # a large void area, as in the real corridor images
        maps.append(idx)
    palette = [tuple(v) for v in np.frombuffer(voc_palette_bytes(256), np.uint8).reshape(256, 3).tolist()]
    _camvid_palette(root, table, palette, maps)
    r = _scan(root)
    assert r.labels["semantics"] == "colour" and r.verdict["flags"] == []
    assert "palette order differs from class_dict.csv; reading by colour" in r.labels["reading_notes"]
    assert "palette order differs from class_dict.csv; reading by colour" in format_report(r)
    shares = {c["name"]: c["pixels"] for c in r.classes_table}
    assert shares["Void"] == sum(int((m == 0).sum()) for m in maps)
    assert shares["Animal"] == sum(int((m == 2).sum()) for m in maps)
    [check] = r.labels["readings"]
    colour_of = {0: 3, 1: 1, 2: 0, 3: 2}  # palette index -> table row, from the colours above
    expected_differ = sum(int((np.vectorize(colour_of.get)(m) != m).sum()) for m in maps)
    assert check["pixels"] == expected_differ > 0 and check["settled_by"] and check["palette_order"] == "differs"
    caplog.clear()
    assert _run(r.verdict["command"], tmp_path / "out") == 0  # convert says it too (a warning)
    assert "palette order differs from class_dict.csv; reading by colour" in caplog.text
    stored = _stored(tmp_path / "out")
    for i in range(5):
        np.testing.assert_array_equal(stored[f"train/f{i:03d}.png"], _by_colour(root / "train_labels" / f"f{i:03d}.png",
                                                                                  table))


@pytest.mark.parametrize("seed", range(10))
def test_any_permutation_of_table_rows_and_palette_entries_reads_each_pixel_by_its_colour(tmp_path, seed):
    """Property: whatever the order of the table's rows and of the palette's entries (with extra
    decoy entries, or a palette shorter than the indices used), each pixel's class is the table
    row whose colour equals the pixel's displayed colour."""
    rng = np.random.default_rng([24, seed])
    k = int(rng.integers(2, 8))
    colours = {(0, 0, 0)} if seed % 3 == 2 else set()  # black: what Pillow shows past a short palette
    while len(colours) < k:
        colours.add(tuple(int(x) for x in rng.integers(0, 256, 3)))
    table = [(f"class{j}", c) for j, c in enumerate(sorted(colours))]
    table = [table[j] for j in rng.permutation(k)]  # rows shuffled
    n_entries = k + int(rng.integers(0, 40))  # extra entries: decoy colours never drawn
    palette = [tuple(int(x) for x in rng.integers(0, 256, 3)) for _ in range(n_entries)]
    slots = rng.permutation(n_entries)[:k]  # table colours at random palette positions
    for (_, c), s in zip(table, slots):
        palette[s] = c
    used = list(slots)
    if seed % 3 == 2:  # missing entries: indices past the palette's end show black
        black = next(s for (_, c), s in zip(table, slots) if c == (0, 0, 0))
        used.remove(black)
        used.append(n_entries + 3)
    maps = [np.asarray(used)[synth.random_mask(24, 32, k, np.random.default_rng([seed, i]))] for i in range(3)]
    root = tmp_path / "perm"
    _camvid_palette(root, table, palette, maps, by_hand=True)
    r = _scan(root)
    assert r.labels["semantics"] == "colour" and not r.unknown_colors, r.verdict
    assert _run(r.verdict["command"], tmp_path / "out") == 0
    stored = _stored(tmp_path / "out")
    assert [n for n, _ in readers.open(tmp_path / "out").classes] == [n for n, _ in table]
    for i in range(3):
        np.testing.assert_array_equal(stored[f"train/f{i:03d}.png"],
                                      _by_colour(root / "train_labels" / f"f{i:03d}.png", table))


# -- VOC layout that is not Pascal VOC ----------------------------------------------------------------

def _voc_layout(root, k: int, *, names: list[str] | None = None, border: bool = True, ids=None, level=None):
    """JPEGImages/ + SegmentationClass/ (P, VOC palette) + ImageSets/Segmentation/{train,val}.txt, values
    0..k-1 (or 0/`level` for two classes) with a 255 void border when `border`."""
    ids = ids or [f"water_{i:04d}" for i in range(6)]
    for i, name in enumerate(ids):
        rng = np.random.default_rng([k, i])
        (root / "JPEGImages").mkdir(parents=True, exist_ok=True)
        Image.fromarray(synth.textured_image(32, 40, rng)).convert("RGB").save(root / "JPEGImages" / f"{name}.jpg")
        values = synth.random_mask(32, 40, k, rng)
        if level is not None:
            values = np.where(values > 0, level, 0).astype(np.uint8)
        if border:
            values = L._border(values, 255)
        L._save_p(root / "SegmentationClass" / f"{name}.png", values, voc_palette_bytes(256))
    sets = root / "ImageSets" / "Segmentation"
    sets.mkdir(parents=True)
    (sets / "train.txt").write_text("\n".join(ids[:4]) + "\n")
    (sets / "val.txt").write_text("\n".join(ids[4:]) + "\n")
    if names is not None:
        (root / "classes.txt").write_text("\n".join(names) + "\n")
    return ids


def _voc_reference(root, ids, expected) -> dict[str, np.ndarray]:
    out = {}
    for i, name in enumerate(ids):
        v = np.asarray(Image.open(root / "SegmentationClass" / f"{name}.png")).astype(np.int64)
        split = "train" if i < 4 else "val"
        out[f"{split}/{name}.jpg"] = np.vectorize(expected)(_nearest(v))
    return out


@pytest.mark.parametrize("k", [2, 3, 5, 7])
@pytest.mark.parametrize("with_names", [True, False])
def test_custom_voc_layout_dataset_gets_its_own_classes(tmp_path, k, with_names):
    """Regression 2: a k-class dataset in the VOC folder layout is not Pascal VOC: its classes come
    from its names file, or from the values present; never the 21 VOC classes."""
    root = tmp_path / "custom"
    names = [f"kind{j}" for j in range(k)] if with_names else None
    ids = _voc_layout(root, k, names=names, border=k > 2)
    r = _scan(root)
    assert r.labels["layout"] == "voc"
    assert "not Pascal VOC" in r.labels["classes_from"] or "classes.txt" in r.labels["classes_from"]
    assert _run(r.verdict["command"], tmp_path / "out") == 0
    data = readers.open(tmp_path / "out")
    got = [n for n, _ in data.classes]
    assert not set(got) & set(VOC_CLASSES[1:]) and data.num_classes == k
    if with_names:
        assert got == names
    if k == 2 and not with_names:  # 0/1 masks: binary
        assert got == ["background", "foreground"]
    stored = _stored(tmp_path / "out")
    ref = _voc_reference(root, ids, lambda v: v if v < k else IGNORE)
    assert stored.keys() == ref.keys()
    for key in ref:
        np.testing.assert_array_equal(stored[key], ref[key], err_msg=key)


def test_voc_ids_with_values_beyond_20_are_not_pascal_voc(tmp_path):
    root = tmp_path / "vocish"
    ids = _voc_layout(root, 30, ids=[f"2008_{i:06d}" for i in range(6)])
    r = _scan(root)
    assert "mask values beyond 0..20 and 255" in r.labels["classes_from"]
    words = shlex.split(r.verdict["command"])
    assert words[words.index("--num-classes") + 1] == str(max(
        int(np.asarray(Image.open(root / "SegmentationClass" / f"{n}.png"))[
            np.asarray(Image.open(root / "SegmentationClass" / f"{n}.png")) < 255].max()) for n in ids) + 1)


def test_real_pascal_voc_keeps_the_voc_classes_and_says_why(tmp_path):
    ds = L.make_voc(tmp_path / "voc")
    r = _scan(ds.root)
    assert r.labels["classes_from"].startswith("Pascal VOC (VOC folders, VOC image ids")
    assert [c["name"] for c in r.classes_table] == list(VOC_CLASSES)
    assert "Classes from: Pascal VOC" in format_report(r)


# -- two-level masks ----------------------------------------------------------------------------------

def _salt(root, below: str = "") -> list[tuple[str, np.ndarray]]:
    """Regression 4, shaped like the salt set: [train/]images/ + [train/]masks/, some masks 8-bit
    all zero, the others 16-bit 0/65535."""
    out = []
    top = root / below if below else root
    for i in range(6):
        rng = np.random.default_rng([4, i])
        (top / "images").mkdir(parents=True, exist_ok=True)
        (top / "masks").mkdir(parents=True, exist_ok=True)
        Image.fromarray(synth.textured_image(32, 32, rng)).save(top / "images" / f"{i:04x}.png")
        if i % 3 == 0:
            values = np.zeros((32, 32), np.uint8)
            Image.fromarray(values, "L").save(top / "masks" / f"{i:04x}.png")
        else:
            values = np.where(synth.random_mask(32, 32, 2, rng) > 0, 65535, 0).astype(np.uint16)
            Image.fromarray(values).save(top / "masks" / f"{i:04x}.png")
        out.append((f"train/{i:04x}.png", values.astype(np.int64)))
    return out


@pytest.mark.parametrize("below", ["", "train"])
def test_binary_masks_mixed_8bit_zero_and_16bit_65535_keep_their_foreground(tmp_path, below):
    root = tmp_path / "salt"
    masks = _salt(root, below)
    assert Image.open(root / below / "masks" / "0001.png").mode.startswith("I")
    r = _scan(root)
    assert r.verdict["flags"] == ["--mask-semantics", "binary"], r.verdict
    assert "--ignore-index" not in r.verdict["command"]
    [check] = r.labels["readings"]
    assert check["check"] == "two levels" and check["pixels"] == sum(int((v > 0).sum()) for _, v in masks)
    assert check["settled_by"].startswith("masks of two levels are binary")
    assert _run(r.verdict["command"], tmp_path / "out") == 0
    stored = _stored(tmp_path / "out")
    for key, values in masks:
        np.testing.assert_array_equal(stored[key], _nearest((values > 0).astype(np.int64)), err_msg=key)
    assert sum(int(s.sum()) for s in stored.values()) > 0  # foreground survived


def test_a_class_turned_into_ignore_is_refused(tmp_path, capsys):
    root = tmp_path / "salt"
    _salt(root)
    code = cli_main(["convert", str(root), str(tmp_path / "out"), "--size", "20x28", "--workers", "1", "-q",
                     "--ignore-index", "65535", "--num-classes", "1"])
    err = capsys.readouterr().err
    assert code != 0 and "--mask-semantics binary" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "imgshard.json").exists()


def _two_level_layout(layout: str, root, level: int) -> list[tuple[str, object]]:
    """(key, mask path) of a 0/`level` dataset in `layout`."""
    def pair(img_dir, mask_dir, stem, key, i):
        rng = np.random.default_rng([level, i])
        img_dir.mkdir(parents=True, exist_ok=True)
        mask_dir.mkdir(parents=True, exist_ok=True)
        Image.fromarray(synth.textured_image(24, 36, rng)).save(img_dir / f"{stem}.png")
        values = np.where(synth.random_mask(24, 36, 2, rng) > 0, level, 0).astype(np.uint8)
        Image.fromarray(values, "L").save(mask_dir / f"{stem}.png")
        return key, mask_dir / f"{stem}.png"

    if layout == "camvid":
        return [pair(root / "train", root / "train_labels", f"c{i}", f"train/c{i}.png", i) for i in range(4)]
    if layout == "unet":
        return [pair(root / "images", root / "masks", f"u{i}", f"train/u{i}.png", i) for i in range(4)]
    if layout in ("ade", "mmseg"):
        img, ann, split = ("images", "annotations", "training") if layout == "ade" else ("img_dir", "ann_dir", "train")
        return [pair(root / img / split, root / ann / split, f"p{i}", f"{split}/p{i}.png", i) for i in range(4)]
    return [pair(root / "JPEGImages", root / "SegmentationClass", f"v{i}", f"train/v{i}.png", i) for i in range(4)]


@pytest.mark.parametrize("level", [1, 255])
@pytest.mark.parametrize("layout", ["camvid", "voc", "ade", "mmseg", "unet"])
def test_two_level_masks_convert_as_binary_in_every_layout(tmp_path, layout, level):
    root = tmp_path / layout
    pairs = _two_level_layout(layout, root, level)
    r = _scan(root)
    assert r.labels["layout"] == layout and r.labels["semantics"] == "binary", r.labels
    assert "--ignore-index" not in r.verdict["command"] and "--reduce-zero-label" not in r.verdict["command"]
    assert _run(r.verdict["command"], tmp_path / "out") == 0
    stored = _stored(tmp_path / "out")
    for key, path in pairs:
        values = np.asarray(Image.open(path)).astype(np.int64)
        np.testing.assert_array_equal(stored[key], _nearest((values > 0).astype(np.int64)), err_msg=key)


def test_void_value_covering_a_large_share_is_not_proposed_as_ignore(tmp_path):
    root = tmp_path / "big255"
    for i in range(3):
        rng = np.random.default_rng([7, i])
        (root / "images").mkdir(parents=True, exist_ok=True)
        (root / "masks").mkdir(parents=True, exist_ok=True)
        Image.fromarray(synth.textured_image(24, 36, rng)).save(root / "images" / f"m{i}.png")
        values = synth.random_mask(24, 36, 3, rng)
        values[:, :20] = 255  # more than half of every mask: a class, not a void label
        Image.fromarray(values, "L").save(root / "masks" / f"m{i}.png")
    r = _scan(root)
    assert "--ignore-index" not in r.verdict["flags"]


# -- scan --preview ---------------------------------------------------------------------------------

def test_scan_preview_draws_source_masks_under_the_chosen_reading(tmp_path, capsys):
    root = tmp_path / "camvid"
    table = [("Animal", (0, 128, 0)), ("Building", (128, 0, 0)), ("Tree", (128, 128, 0)), ("Void", (0, 0, 0))]
    maps = [np.where(synth.random_mask(32, 48, 4, np.random.default_rng(i)) == 3, 1, 0) for i in range(3)]
    palette = [tuple(v) for v in np.frombuffer(voc_palette_bytes(256), np.uint8).reshape(256, 3).tolist()]
    _camvid_palette(root, table, palette, maps)  # only indices 0 (black = Void) and 1 (dark red = Building)
    out = tmp_path / "look.png"
    assert cli_main(["scan", str(root), "--workers", "1", "--preview", str(out)]) == 0
    assert "palette order differs from class_dict.csv; reading by colour" in capsys.readouterr().out
    sheet = np.asarray(Image.open(out).convert("RGB")).reshape(-1, 3)
    colours = {tuple(c) for c in np.unique(sheet, axis=0).tolist()}
    assert (128, 0, 0) in colours  # Building drawn in its table colour
    # preview colours Void (black) as itself; under the index reading index 0 would be Animal green in the
    # mask column: the mask column's pixel count of Animal green is the legend swatch alone
    green = int(np.all(sheet == (0, 128, 0), axis=1).sum())
    assert green <= 16 * 16 + 64


def test_ignoring_a_level_of_two_level_masks_is_reported_and_refused(tmp_path):
    root = tmp_path / "salt"
    masks = _salt(root)
    r = _scan(root, ignore_values=(65535,))
    [check] = [c for c in r.labels["readings"] if c["check"] == "ignored level"]
    assert check["pixels"] == sum(int((v == 65535).sum()) for _, v in masks) > 0
    assert r.verdict["status"] == "needs_flags"
    assert any("--mask-semantics binary without --ignore-index 65535" in p for p in r.verdict["problems"])
    from converter.discover.labels import ReadingConflict
    for labels in (LabelOptions(ignore_values=(65535,), num_classes=2),
                   LabelOptions(semantics="binary", ignore_values=(65535,))):
        with pytest.raises(ReadingConflict, match="one of the two levels"):
            convert(SourceSpec(root=str(root)), str(tmp_path / "out"), OutputOptions(size=SIZE, labels=labels),
                    RunOptions(workers=1))


@pytest.mark.parametrize("layout", ["unet", "ade", "voc"])
def test_binary_masks_take_the_names_of_a_two_name_file_beside_them(tmp_path, layout):
    root = tmp_path / layout
    pairs = _two_level_layout(layout, root, 255)
    (root / "classes.txt").write_text("land\nwater\n")
    r = _scan(root)
    assert r.labels["semantics"] == "binary" and "classes.txt" in r.labels["classes_from"]
    assert [c["name"] for c in r.classes_table] == ["land", "water"]
    assert _run(r.verdict["command"], tmp_path / "out") == 0
    data = readers.open(tmp_path / "out")
    assert [n for n, _ in data.classes] == ["land", "water"]
    stored = _stored(tmp_path / "out")
    for key, path in pairs:
        values = np.asarray(Image.open(path)).astype(np.int64)
        np.testing.assert_array_equal(stored[key], _nearest((values > 0).astype(np.int64)), err_msg=key)


def _colour_layout(layout: str, root, write_mask) -> tuple[SourceSpec, list[tuple[str, object]]]:
    """A dataset in `layout` whose masks `write_mask(path, i)` writes; class_dict.csv at SRC (explicit: --classes)."""
    folders = {"camvid": ("train", "train_labels", "train"), "voc": ("JPEGImages", "SegmentationClass", "train"),
               "unet": ("images", "masks", "train"), "mmseg": ("img_dir/train", "ann_dir/train", "train"),
               "explicit": ("imgs", "gts", "train")}
    img, ann, split = folders[layout]
    pairs = []
    for i in range(3):
        (root / img).mkdir(parents=True, exist_ok=True)
        (root / ann).mkdir(parents=True, exist_ok=True)
        Image.fromarray(synth.textured_image(24, 32, np.random.default_rng([5, i]))).save(root / img / f"s{i}.png")
        write_mask(root / ann / f"s{i}.png", i)
        pairs.append((f"{split}/s{i}.png", root / ann / f"s{i}.png"))
    if layout == "explicit":
        return SourceSpec(images=str(root / img), masks=str(root / ann), classes=str(root / "class_dict.csv")), pairs
    return SourceSpec(root=str(root)), pairs


@pytest.mark.parametrize("kind", ["palette", "rgb"])
@pytest.mark.parametrize("layout", ["camvid", "voc", "unet", "mmseg", "explicit"])
def test_shuffled_palettes_and_tables_convert_to_the_tables_class_map_in_every_layout(tmp_path, layout, kind):
    rng = np.random.default_rng([len(layout), len(kind)])
    k = 5
    colours = sorted({tuple(int(x) for x in rng.integers(0, 256, 3)) for _ in range(k)})
    table = [(f"t{j}", c) for j, c in enumerate(colours)]
    table = [table[j] for j in rng.permutation(len(table))]
    palette = [tuple(int(x) for x in rng.integers(0, 256, 3)) for _ in range(20)]
    slots = rng.permutation(20)[:len(table)]
    for (_, c), s in zip(table, slots):
        palette[s] = c

    def write(path, i):
        idx = np.asarray(slots)[synth.random_mask(24, 32, len(table), np.random.default_rng([6, i]))]
        if kind == "palette":
            _p_png(path, idx, palette)
        else:
            Image.fromarray(np.asarray(palette, np.uint8)[idx], "RGB").save(path)

    root = tmp_path / layout
    spec, pairs = _colour_layout(layout, root, write)
    _class_dict(root / "class_dict.csv", table)
    r = scan(spec, ScanOptions(workers=1))
    assert r.labels["semantics"] == "colour" and r.verdict["status"] in ("ok", "warnings"), r.verdict
    assert _run(r.verdict["command"], tmp_path / "out") == 0
    stored = _stored(tmp_path / "out")
    for key, path in pairs:
        np.testing.assert_array_equal(stored[key], _by_colour(path, table), err_msg=key)


def test_label_map_reading_is_cross_checked_against_raw_ids(tmp_path):
    ds = L.make_cityscapes(tmp_path / "cityscapes")
    r = _scan(ds.root)
    [check] = [c for c in r.labels["readings"] if c["check"] == "label map"]
    expected = 0
    for p in ds.pairs:  # 8 masks or fewer: every one is sampled
        v = np.asarray(Image.open(p.mask)).astype(np.int64)
        expected += int((np.vectorize(ds.expected)(v) != v).sum())
    assert check["sampled"] == len(ds.pairs) and check["pixels"] == expected > 0
    assert check["settled_by"] == "the cityscapes layout's label map"
    assert r.labels["classes_from"].startswith("the Cityscapes label ids")


def test_images_and_annotations_without_ade20k_names_keep_zero_as_a_class(tmp_path):
    root = tmp_path / "anno"
    values = {}
    for i in range(3):
        rng = np.random.default_rng([8, i])
        (root / "images" / "train").mkdir(parents=True, exist_ok=True)
        (root / "annotations" / "train").mkdir(parents=True, exist_ok=True)
        Image.fromarray(synth.textured_image(24, 32, rng)).save(root / "images" / "train" / f"road_{i}.png")
        values[f"train/road_{i}.png"] = synth.random_mask(24, 32, 4, rng)
        Image.fromarray(values[f"train/road_{i}.png"], "L").save(root / "annotations" / "train" / f"road_{i}.png")
    r = _scan(root)
    assert r.labels["layout"] == "ade" and not r.labels["resolved"]["reduce_zero_label"]
    assert "not ADE20K" in r.labels["classes_from"]
    assert _run(r.verdict["command"], tmp_path / "out") == 0
    stored = _stored(tmp_path / "out")
    for key, v in values.items():
        np.testing.assert_array_equal(stored[key], _nearest(v.astype(np.int64)), err_msg=key)


def test_classes_flag_with_labelme_labels_txt_does_not_count_ignore_as_a_class(tmp_path):
    ds = L.make_labelme(tmp_path / "labelme")
    labels_txt = tmp_path / "labels.txt"
    labels_txt.write_text("__ignore__\n_background_\ncat\ndog\nperson\n")  # labelme's own input file
    spec = SourceSpec(root=str(ds.root), classes=str(labels_txt))
    convert(spec, str(tmp_path / "out"), OutputOptions(size=SIZE), RunOptions(workers=1))
    data = readers.open(tmp_path / "out")
    assert [n for n, _ in data.classes] == ["_background_", "cat", "dog", "person"]
    stored = _stored(tmp_path / "out")
    for p in ds.pairs:
        v = np.asarray(Image.open(p.mask)).astype(np.int64)
        np.testing.assert_array_equal(stored[p.key], np.vectorize(ds.expected)(_nearest(v)), err_msg=p.key)


def test_palette_colours_missing_from_the_table_with_indices_beyond_it_are_unknown_colours(tmp_path):
    """Indices beyond the table's rows cannot be class ids: the colour reading stands, and its
    colours the table does not name are reported (and ignored only on request) as unknown colours."""
    root = tmp_path / "pal"
    table = [("sky", (10, 20, 30)), ("road", (40, 50, 60))]
    palette = [(10, 20, 30), (1, 2, 3), (3, 2, 1), (40, 50, 60), (99, 99, 99)]
    maps = [np.asarray([0, 3, 4])[synth.random_mask(24, 32, 3, np.random.default_rng(i))] for i in range(3)]
    _camvid_palette(root, table, palette, maps, by_hand=True)
    r = _scan(root)
    [check] = r.labels["readings"]
    assert check["settled_by"].startswith("palette indices up to 4 are beyond the 2 rows")
    assert [u.color for u in r.unknown_colors] == [(99, 99, 99)]
    assert r.unknown_colors[0].pixels == sum(int((m == 4).sum()) for m in maps)
    assert r.verdict["flags"] == ["--unknown-color", "ignore"]
    assert not any("no rule settles" in p for p in r.verdict["problems"])


def test_a_rare_class_missing_from_the_sampled_masks_is_not_read_as_background(tmp_path):
    """Layouts look at 8 masks spread over the folder; the one mask holding class 2 (index 1 of 20)
    is not among them. Scan sees every mask: three classes, not binary."""
    root = tmp_path / "rare"
    ids = [f"img_{i:03d}" for i in range(20)]
    for i, name in enumerate(ids):
        rng = np.random.default_rng([11, i])
        (root / "JPEGImages").mkdir(parents=True, exist_ok=True)
        Image.fromarray(synth.textured_image(16, 20, rng)).convert("RGB").save(root / "JPEGImages" / f"{name}.jpg")
        values = synth.random_mask(16, 20, 3 if i == 1 else 2, rng)
        L._save_p(root / "SegmentationClass" / f"{name}.png", values, voc_palette_bytes(256))
    assert 2 in np.asarray(Image.open(root / "SegmentationClass" / "img_001.png"))
    r = _scan(root)
    assert r.labels["semantics"] == "index" and "--num-classes" in r.verdict["flags"]
    assert _run(r.verdict["command"], tmp_path / "out") == 0
    stored = _stored(tmp_path / "out")
    v = np.asarray(Image.open(root / "SegmentationClass" / "img_001.png")).astype(np.int64)
    np.testing.assert_array_equal(stored["train/img_001.jpg"], _nearest(v))
    assert (stored["train/img_001.jpg"] == 2).any()


def test_a_stray_labels_txt_beside_a_colour_table_dataset_is_not_read(tmp_path):
    root = tmp_path / "camvid"
    table = [("sky", (10, 20, 30)), ("road", (40, 50, 60))]
    _camvid_palette(root, table, [c for _, c in table], [synth.random_mask(16, 20, 2, np.random.default_rng(0))])
    (root / "labels.txt").write_bytes(b"\xff\xfe n\x00o\x00t\x00 \x00n\x00a\x00m\x00e\x00s\x00")  # UTF-16 notes
    r = _scan(root)
    assert r.labels["semantics"] == "colour" and r.verdict["status"] in ("ok", "warnings")


def test_unsettled_palette_reading_scan_says_so_and_convert_refuses_by_name(tmp_path, capsys):
    """Palette colours the table does not name, while every index used is a row of it: colour and
    index readings disagree and no rule settles it."""
    root = tmp_path / "pal"
    table = [("sky", (10, 20, 30)), ("road", (40, 50, 60)), ("car", (70, 80, 90))]
    palette = [(10, 20, 30), (41, 50, 60), (70, 80, 90)]  # index 1's colour is off by one
    maps = [synth.random_mask(16, 20, 3, np.random.default_rng(i)) for i in range(2)]
    _camvid_palette(root, table, palette, maps, by_hand=True)
    assert cli_main(["scan", str(root), "--workers", "1"]) == 65
    out = capsys.readouterr().out
    assert "NOT SETTLED" in out and "--mask-semantics index" in out
    code = cli_main(["convert", str(root), str(tmp_path / "out"), "--size", "16x20", "--workers", "1", "-q"])
    err = capsys.readouterr().err
    assert code != 0 and "--mask-semantics index" in err and "index 1 = (41, 50, 60)" in err
    assert "Traceback" not in err and not (tmp_path / "out" / "imgshard.json").exists()
    assert cli_main(["convert", str(root), str(tmp_path / "out"), "--size", "16x20", "--workers", "1", "-q",
                     "--mask-semantics", "index", "--classes", str(root / "class_dict.csv")]) == 0
    stored = _stored(tmp_path / "out")
    for i, m in enumerate(maps):
        np.testing.assert_array_equal(stored[f"train/f{i:03d}.png"], m.astype(np.int64))  # source size kept
