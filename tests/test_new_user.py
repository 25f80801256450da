"""A new user on real-shaped data: `scan SRC --json`, its one command, every record bit-exact.

Datasets: Kaggle CamVid (RGB masks; P masks with the VOC palette against a reordered class_dict.csv),
custom sets in the VOC layout (2 and 6 classes, names files or none), labelme2voc output, TGS salt,
Oxford-IIIT Pet, Carvana (+ train_hq/, + its RLE CSV), ISIC 2017/2018, Kvasir-SEG, SegNet CamVid,
12-bit microscopy (PNG, TIFF), Massachusetts Roads, COCO-Stuff beside COCO JSON, LoveDA, Cellpose; and the
zip residue (__MACOSX, .DS_Store, Thumbs.db) that comes with them. xfail(strict) marks what is still
wrong, with the precise reason.

Each tree is shaped exactly like a public dataset as downloaded (`tests/_real_shapes.py`: names,
folders, modes, bit depths, the decoy files beside the data). The test does what a user does:
`imgshard scan SRC --json`, takes the printed `command`, runs it choosing only `--size` (plus
`--workers 1 -q`, which change no byte), then compares every stored record with a reference
computed here from the source files: image = Pillow `convert('RGB')` + BILINEAR (16-bit grey:
Pillow's `I;16` BILINEAR), mask = the class map the dataset means, decoded with Pillow/NumPy and
resized NEAREST.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageOps

import readers
from converter.cli import main as cli_main
from tests import _real_shapes as R

SIZE = (24, 32)  # (h, w): never a source size
IGNORE = 255
SPLIT_ALIASES = {"training": "train", "validation": "val", "valid": "val"}
VOC_NAMES = {"aeroplane", "bicycle", "bird", "boat", "bottle", "person", "tvmonitor"}


def scan_json(capsys, root: Path, *extra: str) -> dict:
    code = cli_main(["scan", str(root), "--json", "--workers", "1", *extra])
    report = json.loads(capsys.readouterr().out)
    report["exit"] = code
    return report


def run_command(command: str, out: Path) -> int:
    """The printed `imgshard convert ...` line as a user pastes it: OUT and --size filled in."""
    args = shlex.split(command)
    assert args[:2] == ["imgshard", "convert"] and args.count("OUT") == 1, command
    args = args[1:]
    args[args.index("OUT")] = str(out)
    args[args.index("--size") + 1] = f"{SIZE[0]}x{SIZE[1]}"
    return cli_main(args + ["--workers", "1", "-q"])


def _nearest(classes: np.ndarray) -> np.ndarray:
    im = Image.fromarray(classes.astype(np.int32), "I")
    return np.asarray(im.resize((SIZE[1], SIZE[0]), Image.Resampling.NEAREST)).astype(np.int64)


def reference_image(path: Path, shown: bool = False, channels: int = 3) -> np.ndarray:
    """The expected stored image; `channels` 1: an 8-bit grey dataset (grey stays one channel)."""
    if shown:
        im = ImageOps.exif_transpose(Image.open(path))
        return np.asarray(im.convert("RGB").resize((SIZE[1], SIZE[0]), Image.Resampling.BILINEAR))
    if path.suffix == ".tif":
        import tifffile

        arr = tifffile.imread(path)
        assert arr.dtype == np.uint16 and arr.ndim == 2, "fixture: 16-bit grey TIFF"
        return _resize16(arr)
    im = Image.open(path)
    if im.mode in ("I;16", "I;16B", "I;16L"):
        return _resize16(np.asarray(im).astype(np.uint16))
    if channels == 1:
        return np.asarray(im.convert("L").resize((SIZE[1], SIZE[0]), Image.Resampling.BILINEAR))[..., None]
    return np.asarray(im.convert("RGB").resize((SIZE[1], SIZE[0]), Image.Resampling.BILINEAR))


def _resize16(arr: np.ndarray) -> np.ndarray:
    """Pillow's I;16 BILINEAR over the whole source box (the documented 16-bit resize)."""
    one = Image.fromarray(arr)  # I;16
    out = one.resize((SIZE[1], SIZE[0]), Image.Resampling.BILINEAR, box=(0, 0, arr.shape[1], arr.shape[0]),
                     reducing_gap=None)
    return np.asarray(out).astype(np.uint16)[..., None]


def stored(out: Path, ident=None) -> tuple[readers.Dataset, dict[str, tuple[str, object]]]:
    """Records by image stem (or `ident(key)`): (split, record)."""
    data = readers.open(str(out))
    by_stem: dict[str, tuple[str, object]] = {}
    for split in data.splits:
        for rec in data.records(split):
            stem = ident(rec.key) if ident else Path(rec.key).stem
            assert stem not in by_stem, f"two records for {stem}: {by_stem[stem][1].key}, {rec.key}"
            by_stem[stem] = (split, rec)
    return data, by_stem


def assert_exact(shaped: R.Shaped, out: Path, check_splits: bool = True, ident=None) -> readers.Dataset:
    """Every record of `out` (and of its sibling `out_spec`, when the spec run made one) bit-exact."""
    spec_out = out.with_name(out.name + "_spec")
    if spec_out.exists():
        _assert_exact(shaped, spec_out, check_splits, ident)
    return _assert_exact(shaped, out, check_splits, ident)


def _assert_exact(shaped: R.Shaped, out: Path, check_splits: bool, ident) -> readers.Dataset:
    data, records = stored(out, ident)
    assert set(records) == set(shaped.samples), (sorted(records), sorted(shaped.samples))
    for stem, sample in shaped.samples.items():
        split, rec = records[stem]
        if check_splits:
            assert SPLIT_ALIASES.get(split, split) == SPLIT_ALIASES.get(sample.split, sample.split), (stem, split)
        ref_img = reference_image(sample.image, sample.shown, int(data.manifest.image.get("channels", 3)))
        got_img = np.asarray(rec.image)
        assert got_img.dtype == ref_img.dtype, (stem, got_img.dtype, ref_img.dtype)
        np.testing.assert_array_equal(got_img.reshape(ref_img.shape), ref_img, err_msg=f"image {stem}")
        np.testing.assert_array_equal(np.asarray(rec.mask).astype(np.int64), _nearest(sample.meaning(sample.mask)),
                                      err_msg=f"mask {stem}")
    return data


def convert_as_told(shaped: R.Shaped, tmp_path: Path, capsys) -> tuple[dict, readers.Dataset]:
    """scan's command into tmp_path/out; the spec `scan --write-spec` wrote, through its `spec_command`,
    into tmp_path/out_spec (tests compare both)."""
    report = scan_json(capsys, shaped.root, "--write-spec", str(tmp_path / "spec.json"))
    command = report["verdict"]["command"]
    assert command, report["verdict"]
    code = run_command(command, tmp_path / "out")
    capsys.readouterr()
    assert code == 0, (command, code)
    spec_command = report["verdict"].get("spec_command")
    assert spec_command, report["verdict"]
    code = run_command(spec_command, tmp_path / "out_spec")
    capsys.readouterr()
    assert code == 0, (spec_command, code)
    return report, readers.open(str(tmp_path / "out"))


# -- 1. CamVid ---------------------------------------------------------------------------------------------


def test_camvid_kaggle_rgb_masks_with_shuffled_class_dict(tmp_path, capsys):
    shaped = R.make_camvid(tmp_path / "CamVid")
    report, data = convert_as_told(shaped, tmp_path, capsys)
    assert [n for n, _ in data.classes] == shaped.classes
    assert_exact(shaped, tmp_path / "out")


def test_camvid_palette_masks_voc_colours_class_dict_in_another_order(tmp_path, capsys):
    """#24's regression: index 0 is black = Void (last row), not the table's row 0."""
    shaped = R.make_camvid_palette(tmp_path / "CamVid")
    report, data = convert_as_told(shaped, tmp_path, capsys)
    assert [n for n, _ in data.classes] == shaped.classes
    assert_exact(shaped, tmp_path / "out")
    counts = data.class_pixel_counts("train")
    assert counts[shaped.classes.index("Void")] == counts.max()  # the big void band


# -- 2. a custom dataset in the VOC layout ------------------------------------------------------------------


@pytest.mark.parametrize("names_file,classes,mode", [
    ("class_names.txt", 2, "P"), (None, 2, "P"), ("labels.txt", 2, "L"), (None, 6, "P"), ("labels.txt", 6, "L")],
    ids=["2-class_names.txt", "2-no-names", "2-labels.txt-L", "6-no-names", "6-labels.txt-L"])
def test_custom_voc_layout_never_gets_voc_classes(tmp_path, capsys, names_file, classes, mode):
    shaped = R.make_custom_voc(tmp_path / "water", names_file, classes=classes, mode=mode)
    report, data = convert_as_told(shaped, tmp_path, capsys)
    names = [n for n, _ in data.classes]
    assert len(names) == classes and not VOC_NAMES & set(names), names
    if names_file:
        assert names == shaped.classes
    assert_exact(shaped, tmp_path / "out")  # 255 border stays the ignore index


def test_labelme2voc_output_with_visualization_and_npy_folders(tmp_path, capsys):
    """The JPEG overlays in SegmentationClassVisualization/ are not a second band of JPEGImages/ (scan
    proposed `--bands JPEGImages,SegmentationClassVisualization`, a command that exits 1)."""
    shaped = R.make_labelme2voc(tmp_path / "data_dataset_voc")
    report, data = convert_as_told(shaped, tmp_path, capsys)
    assert [n for n, _ in data.classes] == shaped.classes
    assert_exact(shaped, tmp_path / "out")


# -- 3. TGS salt ----------------------------------------------------------------------------------------------


def test_tgs_salt_mixed_8bit_empty_and_16bit_masks(tmp_path, capsys):
    shaped = R.make_tgs(tmp_path / "tgs")
    report, data = convert_as_told(shaped, tmp_path, capsys)
    assert data.num_classes == 2
    assert "--ignore-index" not in report["verdict"]["command"]
    assert_exact(shaped, tmp_path / "out")
    assert data.class_pixel_counts("train")[1] > 0  # the salt is a class, never ignore


def test_tgs_salt_csv_alone_is_read_down_the_columns(tmp_path, capsys):
    """Without train/masks/, train.csv (Kaggle RLE, column-major) is the ground truth: same class maps."""
    shaped = R.make_tgs(tmp_path / "tgs")
    for sample in shaped.samples.values():
        sample.meaning = lambda p, arr=R._nonzero(sample.mask): arr  # noqa: B023 (bound per sample)
    masks = shaped.root / "train" / "masks"
    for f in masks.iterdir():
        f.unlink()
    masks.rmdir()
    report, data = convert_as_told(shaped, tmp_path, capsys)
    assert report["verdict"]["command"].startswith("imgshard convert") and data.num_classes == 2
    assert_exact(shaped, tmp_path / "out")


# -- 4. Oxford-IIIT Pet -----------------------------------------------------------------------------------------


def test_oxford_pet_trimaps_beside_xmls_lists_and_resource_forks(tmp_path, capsys):
    shaped = R.make_pet(tmp_path / "oxford-iiit-pet")
    report, data = convert_as_told(shaped, tmp_path, capsys)
    assert_exact(shaped, tmp_path / "out", check_splits=False)


def test_oxford_pet_official_split_lists_are_used(tmp_path, capsys):
    """annotations/trainval.txt + annotations/test.txt (`<name> class species breed` lines) are the splits:
    scan's command put the test images in 'train' (and `--split-list` turned pairing by content off)."""
    shaped = R.make_pet(tmp_path / "oxford-iiit-pet")
    report, data = convert_as_told(shaped, tmp_path, capsys)
    assert sorted(data.splits) == ["test", "trainval"]
    assert_exact(shaped, tmp_path / "out", check_splits=True)


# -- 5. Carvana -------------------------------------------------------------------------------------------------


def test_carvana_gif_masks_beside_a_row_major_rle_csv(tmp_path, capsys):
    shaped = R.make_carvana(tmp_path / "carvana")
    report, data = convert_as_told(shaped, tmp_path, capsys)
    assert data.num_classes == 2
    assert_exact(shaped, tmp_path / "out")


def test_carvana_rle_csv_alone_is_read_along_the_rows(tmp_path, capsys):
    """Carvana's train_masks.csv runs go along the rows: scan sees it from the shapes and its command says
    `--rle-order rows` (issue 27)."""
    shaped = R.make_carvana(tmp_path / "carvana")
    for sample in shaped.samples.values():
        sample.meaning = lambda p, arr=R._white(sample.mask): arr  # noqa: B023
    for f in (shaped.root / "train_masks").iterdir():
        f.unlink()
    (shaped.root / "train_masks").rmdir()
    report, data = convert_as_told(shaped, tmp_path, capsys)
    assert "--rle-order rows" in report["verdict"]["command"]
    assert_exact(shaped, tmp_path / "out")


def test_carvana_with_train_hq_is_never_two_bands(tmp_path, capsys):
    """Kaggle ships train.zip and train_hq.zip: the same photos twice. They are two versions, never
    two bands of one 6-channel image (scan proposed `--bands train,train_hq`): scan stops and names both."""
    shaped = R.make_carvana(tmp_path / "carvana")
    (shaped.root / "train_hq").mkdir()
    for stem, sample in shaped.samples.items():
        Image.open(sample.image).save(shaped.root / "train_hq" / f"{stem}.jpg", quality=100)
    code = cli_main(["scan", str(shaped.root), "--json", "--workers", "1"])
    said = capsys.readouterr()
    report = json.loads(said.out)  # JSON on stdout for a script, the error on stderr for a person
    assert code == 65 and report["verdict"]["command"] is None and report["verdict"]["status"] == "error"
    for text in (report["verdict"]["reason"], said.err):
        assert "pair equally well" in text and f"--images {shaped.root / 'train_hq'} --masks" in text, text
        assert "--bands" not in text
    chosen = ["convert", "--images", str(shaped.root / "train_hq"), "--masks", str(shaped.root / "train_masks"),
              "--split", "train", str(tmp_path / "out"), "--size", f"{SIZE[0]}x{SIZE[1]}",
              "--mask-semantics", "binary", "--workers", "1", "-q"]
    assert cli_main(chosen) == 0
    for sample in shaped.samples.values():
        sample.image = shaped.root / "train_hq" / sample.image.name
    assert_exact(shaped, tmp_path / "out")


# -- 6. ISIC 2018 task 1 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("exif", [False, True], ids=["plain", "exif-orientation"])
def test_isic2018_task1_training_and_validation(tmp_path, capsys, exif):
    """With `exif`: two photos tagged Orientation=6, one mask fitting the stored pixels, one drawn on the
    photo as shown: each record follows its own mask (--exif auto)."""
    shaped = R.make_isic(tmp_path / "isic2018")
    if exif:
        R.tag_orientation(shaped, "ISIC_0000001", mask_drawn_as_shown=False)
        R.tag_orientation(shaped, "ISIC_0000003", mask_drawn_as_shown=True)
    report, data = convert_as_told(shaped, tmp_path, capsys)
    assert data.num_classes == 2
    assert_exact(shaped, tmp_path / "out")


# -- 7. 12-bit microscopy -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("tiff", [False, True], ids=["png-I16", "tiff-zlib"])
def test_microscopy_12bit_grey_is_stored_as_uint16(tmp_path, capsys, tiff):
    shaped = R.make_microscopy(tmp_path / "cells", tiff=tiff)
    report, data = convert_as_told(shaped, tmp_path, capsys)
    assert data.num_classes == 2
    assert_exact(shaped, tmp_path / "out")


# -- more public shapes ----------------------------------------------------------------------------------------


def test_isic2017_superpixel_companions_are_not_images(tmp_path, capsys):
    """ISIC_NNNNNNN_superpixels.png beside each photo: scan reported '6 missing_mask' and its command carried
    `--max-bad 6` (a cron job then tolerating 6 real failures); they are files beside images, left out."""
    shaped = R.make_isic2017(tmp_path / "isic2017")
    report, data = convert_as_told(shaped, tmp_path, capsys)
    assert "--max-bad" not in report["verdict"]["command"], report["verdict"]["command"]
    assert_exact(shaped, tmp_path / "out")


def test_isic2017_records_are_exact_whatever_the_advice(tmp_path, capsys):
    shaped = R.make_isic2017(tmp_path / "isic2017")
    report, data = convert_as_told(shaped, tmp_path, capsys)
    assert data.num_classes == 2
    assert_exact(shaped, tmp_path / "out")


def test_kvasir_seg_jpeg_masks(tmp_path, capsys):
    """JPEG masks with ringing: the brightest channel at the mid level decides, as documented."""
    shaped = R.make_kvasir(tmp_path / "Kvasir-SEG")
    report, data = convert_as_told(shaped, tmp_path, capsys)
    assert data.num_classes == 2
    assert_exact(shaped, tmp_path / "out")


def test_segnet_camvid_annot_folders_pair_per_split(tmp_path, capsys):
    shaped = R.make_segnet_camvid(tmp_path / "CamVid")
    report, data = convert_as_told(shaped, tmp_path, capsys)
    assert data.num_classes == 12
    assert_exact(shaped, tmp_path / "out")


@pytest.mark.parametrize("make", [R.make_camvid, R.make_isic, R.make_tgs], ids=["camvid", "isic2018", "tgs"])
def test_zip_residue_never_changes_the_records(tmp_path, capsys, make):
    """__MACOSX/ with '._*' AppleDouble twins, .DS_Store, Thumbs.db: the same records, no bad input."""
    shaped = make(tmp_path / "src")
    R.add_zip_residue(shaped.root)
    report, data = convert_as_told(shaped, tmp_path, capsys)
    assert "--max-bad" not in report["verdict"]["command"]
    assert_exact(shaped, tmp_path / "out")


def test_cellpose_instance_id_masks_are_not_classes(tmp_path, capsys):
    shaped = R.make_cellpose(tmp_path / "cellpose")
    train = shaped.root / "train"
    code = cli_main(["scan", "--images", str(train), "--masks", str(train), "--image-suffix", "_img",
                     "--mask-suffix", "_masks", "--json", "--workers", "1"])
    report = json.loads(capsys.readouterr().out)
    command = report["verdict"]["command"]
    assert command and "--num-classes" not in command, command
    assert "--mask-semantics binary --binary-threshold 1" in command, command
    tops = sorted({int(np.asarray(Image.open(s.mask)).max()) for s in shaped.samples.values()})
    evidence = report["labels"]["instance_ids"]
    assert evidence is not None and sorted(set(evidence["top"])) == tops, (evidence, tops)
    assert any("per-instance ids are not kept" in n for n in report["labels"]["notes"])
    assert run_command(command, tmp_path / "out") == 0
    data = assert_exact(shaped, tmp_path / "out")
    assert data.num_classes == 2


def test_cellpose_instance_ids_read_as_classes_are_refused(tmp_path, capsys):
    """convert without scan's flags (the old advice, `--num-classes K`) refuses with a named error giving the
    flag; `--mask-semantics index` is the user's word that the values are classes, and converts."""
    shaped = R.make_cellpose(tmp_path / "cellpose")
    train = str(shaped.root / "train")
    k = max(int(np.asarray(Image.open(s.mask)).max()) for s in shaped.samples.values()) + 1
    args = ["convert", "--images", train, "--masks", train, "--image-suffix", "_img", "--mask-suffix", "_masks",
            str(tmp_path / "out"), "--size", "24x32", "--num-classes", str(k), "--workers", "1", "-q"]
    code = cli_main(args)
    err = capsys.readouterr().err
    assert code != 0 and "instance ids" in err and "--mask-semantics binary --binary-threshold 1" in err, err
    assert not (tmp_path / "out" / "imgshard.json").exists()
    assert cli_main(args + ["--mask-semantics", "index"]) == 0
    capsys.readouterr()
    data = readers.open(str(tmp_path / "out"))
    assert data.num_classes == k


def _ade_like(root: Path, n: int = 6, classes: int = 150, seed: int = 31) -> int:
    """images/ + masks/ of a 150-class scene-parsing map (ADE20K-like): each image holds ~12 classes drawn
    from 1..150, several of them in more than one piece, 0 unlabelled. Returns K = max value + 1."""
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    top = 0
    for i in range(n):
        lab = np.zeros((64, 64), np.uint8)
        for c in rng.choice(np.arange(1, classes + 1), size=12, replace=False):
            for _ in range(int(rng.integers(1, 4))):  # stuff classes come in pieces (walls, floor around furniture)
                y, x = rng.integers(0, 56, size=2)
                lab[y:y + int(rng.integers(4, 24)), x:x + int(rng.integers(4, 24))] = c
        top = max(top, int(lab.max()))
        Image.fromarray(synth_photo(rng)).save(root / "images" / f"scene_{i:04d}.jpg")
        Image.fromarray(lab, "L").save(root / "masks" / f"scene_{i:04d}.png")
    return top + 1


def synth_photo(rng) -> np.ndarray:
    return rng.integers(0, 256, size=(64, 64, 3), dtype=np.uint8)


def test_many_class_map_is_not_taken_for_instance_ids(tmp_path, capsys):
    """A 150-class map: values shared across files, sparse per file, classes in several pieces: no instance-id
    evidence, scan proposes the classes (K = max value + 1) and convert accepts them."""
    k = _ade_like(tmp_path / "scenes")
    report = scan_json(capsys, tmp_path / "scenes")
    command = report["verdict"]["command"]
    assert report["labels"]["instance_ids"] is None
    assert f"--num-classes {k}" in command and "--binary-threshold" not in command, command
    assert run_command(command, tmp_path / "out") == 0
    capsys.readouterr()
    assert readers.open(str(tmp_path / "out")).num_classes == k


def test_massachusetts_roads_tiff_tree(tmp_path, capsys):
    """tiff/{split}/<id>.tiff + tiff/{split}_labels/<id>.tif (another extension), one level below SRC."""
    shaped = R.make_massachusetts_roads(tmp_path / "roads")
    for f in sorted((shaped.root / "png").rglob("*"), reverse=True):
        f.rmdir() if f.is_dir() else f.unlink()
    (shaped.root / "png").rmdir()
    report, data = convert_as_told(shaped, tmp_path, capsys)
    assert data.num_classes == 2
    assert_exact(shaped, tmp_path / "out")


def test_massachusetts_roads_two_trees_tie_offers_each_tree_whole_and_each_converts(tmp_path, capsys):
    """Massachusetts Roads as Kaggle ships it holds the same samples twice, as tiff/{split}(_labels)/ and
    png/{split}(_labels)/. scan stops (two copies) and offers each tree whole: every split's natural pair,
    never a cross-tree pair. Each offered line, run as scan says (its command and its spec), converts
    bit-exact against the files of that tree."""
    shaped = R.make_massachusetts_roads(tmp_path / "roads")
    code = cli_main(["scan", str(shaped.root), "--json", "--workers", "1"])
    said = capsys.readouterr()
    assert code == 65 and "pair equally well" in said.err, said.err
    for tree in ("tiff", "png"):
        for split in ("train", "val", "test"):
            assert f"--images {shaped.root / tree / split} --masks {shaped.root / tree / (split + '_labels')} " \
                   f"--split {split}" in said.err
    assert "--masks " + str(shaped.root / "tiff") not in said.err.split("png/ (")[1].split("\n")[0]
    assert f"--images {shaped.root / 'png' / 'train'} --masks {shaped.root / 'tiff' / 'train_labels'}" not in said.err
    assert f"--images {shaped.root / 'tiff' / 'train'} --masks {shaped.root / 'png' / 'train_labels'}" not in said.err
    offered = {line.strip().split("/ (")[0]: line.split("): imgshard scan ")[1]
               for line in said.err.splitlines() if "): imgshard scan " in line}
    assert sorted(offered) == ["png", "tiff"]
    for tree, flags in offered.items():
        as_tree = R.Shaped(shaped.root, num_classes=shaped.num_classes)
        for stem, sample in shaped.samples.items():
            ext = (".tiff", ".tif") if tree == "tiff" else (".png", ".png")
            as_tree.samples[stem] = R.Sample(shaped.root / tree / sample.split / (stem + ext[0]),
                                             shaped.root / tree / f"{sample.split}_labels" / (stem + ext[1]),
                                             sample.meaning, sample.split)
            assert as_tree.samples[stem].image.is_file() and as_tree.samples[stem].mask.is_file()
        spec = tmp_path / f"{tree}_spec.json"
        code = cli_main(["scan", *shlex.split(flags), "--json", "--workers", "1", "--write-spec", str(spec)])
        report = json.loads(capsys.readouterr().out)
        assert report["verdict"]["command"] and "--mask-semantics binary" in report["verdict"]["command"], code
        out = tmp_path / f"out_{tree}"
        assert run_command(report["verdict"]["command"], out) == 0
        assert run_command(report["verdict"]["spec_command"], out.with_name(out.name + "_spec")) == 0
        capsys.readouterr()
        data = assert_exact(as_tree, out)
        assert sorted(data.splits) == ["test", "train", "val"]


def test_coco_stuff_maps_beside_coco_json_stop_with_both_readings(tmp_path, capsys):
    """COCO-Stuff unpacked as its README says, next to COCO's annotations/instances_*.json: the JSON (things
    only) was taken silently and the stuffthingmaps (the dataset) never mentioned. scan now stops naming
    both; `--layout content` converts the maps, train2017/val2017 as train/val, 255 ignored."""
    shaped = R.make_coco_stuff(tmp_path / "cocostuff")
    code = cli_main(["scan", str(shaped.root), "--json", "--workers", "1"])
    said = capsys.readouterr()
    assert code != 0 and json.loads(said.out)["verdict"]["command"] is None
    assert "--layout coco" in said.err and "--layout content" in said.err and "stuffthingmaps" in said.err
    code = cli_main(["scan", str(shaped.root), "--layout", "content", "--json", "--workers", "1"])
    report = json.loads(capsys.readouterr().out)
    command = report["verdict"]["command"]
    assert "--layout content" in command and "--num-classes 182" in command and "--ignore-index 255" in command
    assert run_command(command, tmp_path / "out") == 0
    assert_exact(shaped, tmp_path / "out")


def test_loveda_two_domains_per_split_with_the_same_numbers(tmp_path, capsys):
    """Train/Urban/images_png/3.png and Train/Rural/images_png/3.png are two samples, each with its own mask."""
    shaped = R.make_loveda(tmp_path / "LoveDA")
    report, data = convert_as_told(shaped, tmp_path, capsys)
    assert data.num_classes == 8
    assert_exact(shaped, tmp_path / "out", ident=lambda key: "/".join(key.split("/")[1:3] + [Path(key).stem]))


def test_split_lists_that_do_not_divide_the_images_are_not_used(tmp_path, capsys):
    """A second test.txt (a note at SRC) makes the lists ambiguous: no split from lists, all images in train,
    never a split that drops or duplicates images."""
    shaped = R.make_pet(tmp_path / "oxford-iiit-pet")
    (shaped.root / "test.txt").write_text("run the notebook first\n")
    report, data = convert_as_told(shaped, tmp_path, capsys)
    assert list(data.splits) == ["train"]
    assert_exact(shaped, tmp_path / "out", check_splits=False)


def test_a_photo_without_its_mask_is_still_named_beside_companions(tmp_path, capsys):
    """Companions are left out only when every image without a mask is one: a photo whose ground truth is
    missing stays a bad input (and so do the companions), never hidden."""
    shaped = R.make_isic2017(tmp_path / "isic2017")
    shaped.samples.pop("ISIC_0000013").mask.unlink()
    report = scan_json(capsys, shaped.root)
    assert "missing_mask" in json.dumps(report["verdict"]) and "ISIC_0000013" in json.dumps(report)


def test_cellpose_instance_ids_convert_with_the_binary_threshold_flags(tmp_path, capsys):
    """The workaround the xfail above names: `--mask-semantics binary --binary-threshold 1` (any id = cell)."""
    shaped = R.make_cellpose(tmp_path / "cellpose")
    train = shaped.root / "train"
    assert cli_main(["convert", "--images", str(train), "--masks", str(train), "--image-suffix", "_img",
                     "--mask-suffix", "_masks", str(tmp_path / "out"), "--size", f"{SIZE[0]}x{SIZE[1]}",
                     "--mask-semantics", "binary", "--binary-threshold", "1", "--workers", "1", "-q"]) == 0
    assert_exact(shaped, tmp_path / "out")


def test_face_part_map_with_one_blob_per_class_is_not_taken_for_instance_ids(tmp_path, capsys):
    """CelebAMask-HQ-like parsing maps: 18 parts (skin, eyes, brows, nose, lips, ears, hair, ...), each one small
    blob, some absent per face, so the top value varies: as consecutive and one-blob as instance ids, but too
    few ids; scan keeps them as classes and convert accepts `--num-classes K`."""
    rng = np.random.default_rng(8)
    root = tmp_path / "faces"
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    tops = set()
    for i in range(6):
        lab = Image.new("L", (64, 64), 0)
        draw = ImageDraw.Draw(lab)
        parts = [p for p in range(1, 19) if p < 16 or rng.random() < 0.5]  # hat, earrings, necklace: sometimes
        parts = parts if i else parts[:15]  # no accessory on the first face: the top value varies
        for p in parts:
            cx, cy = 6 + (p - 1) % 5 * 13, 6 + (p - 1) // 5 * 15
            draw.ellipse([cx - 4, cy - 3, cx + 4, cy + 3], fill=p)
        tops.add(max(parts))
        Image.fromarray(synth_photo(rng)).save(root / "images" / f"{i}.jpg")
        lab.save(root / "masks" / f"{i}.png")
    assert len(tops) > 1  # varying like instance counts
    top = max(tops)
    report = scan_json(capsys, root)
    command = report["verdict"]["command"]
    assert report["labels"]["instance_ids"] is None
    assert f"--num-classes {top + 1}" in command and "--binary-threshold" not in command, command
    assert run_command(command, tmp_path / "out") == 0
    capsys.readouterr()
    assert readers.open(str(tmp_path / "out")).num_classes == top + 1


def test_euler_numbers_count_blobs_minus_holes(tmp_path):
    """The per-id blob test (`euler_numbers`) against connected components counted by scipy: 4-connected
    pieces of each value minus its holes (8-connected pieces of the rest that touch no border)."""
    ndimage = pytest.importorskip("scipy.ndimage")
    from converter.discover.evidence import euler_numbers

    rng = np.random.default_rng(5)
    lab = np.zeros((40, 40), np.uint16)
    for v in range(1, 30):
        for _ in range(int(rng.integers(1, 3))):
            y, x = rng.integers(0, 36, size=2)
            lab[y:y + int(rng.integers(1, 9)), x:x + int(rng.integers(1, 9))] = v
    lab[10:15, 10:15] = 300
    lab[12, 12] = 301  # a hole in 300
    got = euler_numbers(lab)
    for v in np.unique(lab):
        pieces = ndimage.label(lab == v)[1]
        rest, n = ndimage.label(lab != v, structure=np.ones((3, 3)))
        border = set(np.unique(np.concatenate([rest[0], rest[-1], rest[:, 0], rest[:, -1]]))) - {0}
        holes = n - len(border)
        assert got[v] == pieces - holes, (v, got[v], pieces, holes)
    assert got[300] == 0 and got[301] == 1


def test_cellpose_src_alone_pairs_img_and_masks_in_one_folder(tmp_path, capsys):
    """`scan SRC` on Cellpose's train/NNN_img.png + train/NNN_masks.png (one folder): 'no known layout' before;
    now paired by content inside the folder (a mask word ends half the names), converted as binary."""
    shaped = R.make_cellpose(tmp_path / "cellpose")
    report, data = convert_as_told(shaped, tmp_path, capsys)
    assert "--binary-threshold 1" in report["verdict"]["command"]
    assert data.num_classes == 2
    assert_exact(shaped, tmp_path / "out")
