"""Layouts found by content (issue 26): folders, name tokens and splits from what pairs.

Every tree is generated here with the layout's real conventions and decoys; the pairing
is known by construction, and each record is checked bit-exactly against a Pillow
reference (image: RGB + BILINEAR; mask: its values, NEAREST; values are class ids).
`scan`'s command and the spec `scan --write-spec` writes are executed through the CLI.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import readers
from converter.cli import main as cli_main
from converter.discover import files
from converter.discover.content import ContentTie, infer_tokens, split_of
from converter.discover.evidence import PEEK_MASKS
from converter.discover.layouts import discover
from converter.discover.spec_file import SpecFileError, load_spec
from converter.inspect.scan import ScanOptions, scan
from converter.options import SourceSpec
from converter.testing import synth

SIZE = (20, 28)
CLASSES = 3


@dataclass
class Tree:
    root: Path
    pairs: dict[str, tuple[Path, Path]] = field(default_factory=dict)  # expected key -> (image, mask)


def _image(path: Path, rng, fmt: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    h, w = int(rng.integers(22, 34)), int(rng.integers(26, 40))
    Image.fromarray(synth.textured_image(h, w, rng)).save(path, format=fmt)
    return h, w


def _mask(path: Path, hw, rng, values=(0, 1, 2)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    m = synth.random_mask(hw[0], hw[1], len(values), rng)
    Image.fromarray(np.asarray(values, np.uint8)[m], "L").save(path)


def add_pair(tree: Tree, key: str, image: Path, mask: Path, seed: int, fmt: str | None = None) -> None:
    rng = np.random.default_rng(seed)
    hw = _image(image, rng, fmt)
    _mask(mask, hw, rng)
    tree.pairs[key] = (image, mask)


def random_stems(n: int, seed: int) -> list[str]:
    """Stems of digits and underscores, always with '3' and '13' (a wrong token pairs them)."""
    rng = np.random.default_rng(seed)
    out = ["3", "13", "31", "1_3"]
    while len(out) < n:
        s = "_".join(str(int(x)) for x in rng.integers(0, 40, int(rng.integers(1, 3))))
        if s not in out:
            out.append(s)
    rng.shuffle(out)
    return out


def reference(image: Path, mask: Path) -> tuple[np.ndarray, np.ndarray]:
    h, w = SIZE
    ref_image = np.asarray(Image.open(image).convert("RGB").resize((w, h), Image.Resampling.BILINEAR))
    ref_mask = np.asarray(Image.open(mask).resize((w, h), Image.Resampling.NEAREST)).astype(np.int64)
    return ref_image, ref_mask


def assert_records(tree: Tree, out: Path) -> None:
    data = readers.open(out)
    records = {r.key: r for split in data.splits for r in data.records(split)}
    assert set(records) == set(tree.pairs)
    for key, (image, mask) in tree.pairs.items():
        ref_image, ref_mask = reference(image, mask)
        np.testing.assert_array_equal(records[key].image, ref_image, err_msg=key)
        np.testing.assert_array_equal(records[key].mask.astype(np.int64), ref_mask, err_msg=key)


def run_command(command: str, out: Path) -> int:
    """Execute a printed `imgshard convert ...` line as a user would (OUT and --size filled in)."""
    args = shlex.split(command)[1:]
    assert args.count("OUT") == 1, command
    args[args.index("OUT")] = str(out)
    args[args.index("--size") + 1] = f"{SIZE[0]}x{SIZE[1]}"
    return cli_main(args + ["--workers", "1", "-q"])


def scan_json(capsys, *argv: str) -> dict:
    code = cli_main(["scan", *argv, "--json", "--workers", "1"])
    report = json.loads(capsys.readouterr().out)
    report["exit"] = code
    return report


def check_scan_and_spec(tree: Tree, tmp_path: Path, capsys) -> dict:
    """scan's command and the spec it writes both convert the tree exactly."""
    spec_path = tmp_path / "spec.json"
    report = scan_json(capsys, str(tree.root), "--write-spec", str(spec_path))
    v = report["verdict"]
    assert report["total_pairs"] == len(tree.pairs), report["verdict"]
    assert run_command(v["command"], tmp_path / "out_cmd") == 0
    assert_records(tree, tmp_path / "out_cmd")
    assert run_command(v["spec_command"], tmp_path / "out_spec") == 0
    assert_records(tree, tmp_path / "out_spec")
    return report


# -- name tokens -------------------------------------------------------------------------------------


def test_tokens_never_cut_digit_runs():
    stems = tuple(random_stems(30, 1))
    tokens, n = infer_tokens(stems, tuple(stems))
    assert (tokens.image_suffix, tokens.mask_suffix, n) == ("", "", 30)
    tokens, n = infer_tokens(("3",), ("13",))
    assert n == 0  # '3' is not '13' without its '1'
    tokens, n = infer_tokens(tuple(stems), tuple(f"gt_{s}" for s in stems))
    assert (tokens.mask_prefix, tokens.image_prefix, n) == ("gt_", "", 30)


@pytest.mark.parametrize("rel,split", [("train_images", "train"), ("images_train", "train"),
                                       ("images_x_train", "train"), ("data/validation/img", "validation"),
                                       ("Testing-Set/masks", "testing"), ("images", None), ("trainer", None)])
def test_split_from_folder_names_at_any_depth(rel, split):
    assert split_of(rel) == split


def test_suffix_tokens_with_digit_stems(tmp_path, capsys):
    tree = Tree(tmp_path / "src")
    for i, stem in enumerate(random_stems(9, 2)):
        add_pair(tree, f"train/{stem}.png", tree.root / "photos" / f"{stem}.png",
                 tree.root / "seg" / f"{stem}_label.png", i)
    found = discover(SourceSpec(root=str(tree.root)))
    assert found.layout == "content" and len(found.samples) == 9 and not found.bad
    check_scan_and_spec(tree, tmp_path, capsys)


def test_prefix_tokens(tmp_path, capsys):
    tree = Tree(tmp_path / "sat")
    for i, stem in enumerate(random_stems(8, 3)):
        add_pair(tree, f"train/red_patch_{stem}.TIF", tree.root / "bands" / f"red_patch_{stem}.TIF",
                 tree.root / "truth" / f"gt_patch_{stem}.TIF", i, fmt="TIFF")
    check_scan_and_spec(tree, tmp_path, capsys)


def test_per_split_tokens_drive(tmp_path, capsys):
    """DRIVE: 21_training.tif / 01_test.tif, masks NN_manual1.gif per split: one suffix per folder pair."""
    tree = Tree(tmp_path / "DRIVE")
    for split, ids in (("training", range(21, 25)), ("test", range(1, 4))):
        for i in ids:
            add_pair(tree, f"{split}/{i:02d}_{split}.tif", tree.root / split / "images" / f"{i:02d}_{split}.tif",
                     tree.root / split / "1st_manual" / f"{i:02d}_manual1.gif", i, fmt="TIFF")
    report = check_scan_and_spec(tree, tmp_path, capsys)
    assert "--image-suffix" not in report["verdict"]["command"]  # no one suffix fits both splits
    spec = json.loads((tmp_path / "spec.json").read_text())
    assert spec["splits"]["training"][0]["image_suffix"] == "_training"
    assert spec["splits"]["test"][0]["image_suffix"] == "_test"


def test_splits_inside_folder_names(tmp_path, capsys):
    tree = Tree(tmp_path / "src")
    n = 0
    for split in ("train", "test"):
        for stem in random_stems(4, 4)[:3 if split == "test" else 4]:
            add_pair(tree, f"{split}/{stem}.png", tree.root / f"images_x_{split}" / f"{stem}.png",
                     tree.root / f"annotations_x_{split}" / f"{stem}.png", n)
            n += 1
    check_scan_and_spec(tree, tmp_path, capsys)
    tree2 = Tree(tmp_path / "src2")
    for split in ("train", "val"):
        for i, stem in enumerate(random_stems(3, 5)):
            add_pair(tree2, f"{split}/{stem}.png", tree2.root / f"{split}_images" / f"{stem}.png",
                     tree2.root / f"{split}_masks" / f"{stem}.png", 100 + i)
    found = discover(SourceSpec(root=str(tree2.root)))
    assert sorted(found.splits) == ["train", "val"] and {s.key for s in found.samples} == set(tree2.pairs)


# -- decoys --------------------------------------------------------------------------------------------


def test_npy_and_jpeg_overlay_decoys_are_never_masks(tmp_path, capsys):
    """labelme2voc: SegmentationClass/ holds .npy under other names, PNG masks in SegmentationClassPNG/,
    JPEG overlays with the images' names in SegmentationClassVisualization/."""
    tree = Tree(tmp_path / "voc_out")
    for i, stem in enumerate(random_stems(5, 6)):
        add_pair(tree, f"train/{stem}.jpg", tree.root / "JPEGImages" / f"{stem}.jpg",
                 tree.root / "SegmentationClassPNG" / f"{stem}.png", i, fmt="JPEG")
        np.save(tree.root / "SegmentationClass" / f"label_{stem}.npy" if (tree.root / "SegmentationClass").is_dir()
                else _mkdir(tree.root / "SegmentationClass") / f"label_{stem}.npy", np.ones((4, 4), np.int32))
        overlay = _mkdir(tree.root / "SegmentationClassVisualization") / f"{stem}.jpg"
        Image.fromarray(synth.textured_image(24, 30, np.random.default_rng(50 + i))).save(overlay)
    found = discover(SourceSpec(root=str(tree.root)))
    assert found.layout == "content" and {s.key for s in found.samples} == set(tree.pairs)
    assert all("SegmentationClassPNG" in s.mask for s in found.samples)
    check_scan_and_spec(tree, tmp_path, capsys)


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def test_per_class_subfolders_beside_combined_masks(tmp_path, capsys):
    tree = Tree(tmp_path / "suim")
    for i, stem in enumerate(random_stems(5, 7)):
        add_pair(tree, f"train/{stem}.jpg", tree.root / "images" / f"{stem}.jpg", tree.root / "masks" / f"{stem}.bmp",
                 i, fmt="JPEG")
        for cls in ("FV", "HD"):  # per-class binary masks with the same names: never the chosen masks
            _mask(tree.root / "masks" / cls / f"{stem}.bmp", (24, 30), np.random.default_rng(90 + i), (0, 255))
    found = discover(SourceSpec(root=str(tree.root)))
    assert not found.bad and {s.key for s in found.samples} == set(tree.pairs)
    check_scan_and_spec(tree, tmp_path, capsys)


def test_oxford_pet_pairs(tmp_path, capsys):
    """images/*.jpg (+ stray .mat) and annotations/trimaps/*.png (1, 2, 3) beside xmls/ and list.txt:
    the ADE20K names match, but pair nothing; content pairs everything."""
    root = tmp_path / "oxford-iiit-pet"
    tree = Tree(root)
    for i, stem in enumerate(["Abyssinian_1", "Abyssinian_13", "Abyssinian_3", "basset_hound_31", "pug_3"]):
        rng = np.random.default_rng(i)
        hw = _image(root / "images" / f"{stem}.jpg", rng, "JPEG")
        _mask(root / "annotations" / "trimaps" / f"{stem}.png", hw, rng, values=(1, 2, 3))
        _mkdir(root / "annotations" / "xmls")
        (root / "annotations" / "xmls" / f"{stem}.xml").write_text("<annotation/>")
        tree.pairs[f"train/{stem}.jpg"] = (root / "images" / f"{stem}.jpg", root / "annotations" / "trimaps" / f"{stem}.png")
    (root / "annotations" / "list.txt").write_text("#Image CLASS-ID SPECIES BREED ID\nAbyssinian_1 1 1 1\n")
    (root / "images" / "Abyssinian_100.mat").write_bytes(b"MATLAB 5.0")
    found = discover(SourceSpec(root=str(root)))
    assert found.layout == "content" and not found.bad
    assert {s.key: Path(s.mask) for s in found.samples} == {k: m for k, (_, m) in tree.pairs.items()}


def test_equal_choices_stop_with_the_flags(tmp_path):
    root = tmp_path / "two"
    for i, stem in enumerate(random_stems(3, 8)):
        rng = np.random.default_rng(i)
        hw = _image(root / "images" / f"{stem}.png", rng)
        _mask(root / "gt_a" / f"{stem}.png", hw, rng)
        _mask(root / "gt_b" / f"{stem}.png", hw, rng)
    with pytest.raises(ContentTie) as e:
        discover(SourceSpec(root=str(root)))
    assert f"--masks {root / 'gt_a'}" in str(e.value) and f"--masks {root / 'gt_b'}" in str(e.value)
    assert cli_main(["convert", str(root), str(tmp_path / "out"), "--size", "8x8", "-q"]) == 65
    line = next(x for x in str(e.value).splitlines() if "gt_b" in x)  # the flags that pick one, as printed
    flags = shlex.split(line.split("(")[0])
    assert _convert(*flags, str(tmp_path / "picked")) == 0
    data = readers.open(tmp_path / "picked")
    assert sorted(r.key for r in data.records("train")) == sorted(f"train/{s}.png" for s in random_stems(3, 8))
    for r in data.records("train"):
        ref = reference(root / "images" / r.key[len("train/"):], root / "gt_b" / r.key[len("train/"):])
        np.testing.assert_array_equal(r.mask.astype(np.int64), ref[1])


def test_no_command_when_nothing_converts(tmp_path, capsys):
    root = tmp_path / "empty"
    _mkdir(root / "images")
    _mkdir(root / "masks")
    report = scan_json(capsys, str(root))
    v = report["verdict"]
    assert v["status"] == "no_data" and v["command"] is None and report["exit"] == 65
    assert v["reason"] == "no image/mask pairs found" and v["evidence"]["pairs"] == 0


# -- several splits, the spec, prune scope -------------------------------------------------------------


def _three_splits(tmp_path: Path) -> Tree:
    tree = Tree(tmp_path / "src")
    n = 0
    for split, count in (("train", 4), ("val", 2), ("test", 2)):
        for stem in random_stems(count, 9 + n)[:count]:
            add_pair(tree, f"{split}/{stem}.png", tree.root / split / "img" / f"{stem}.png",
                     tree.root / split / "ann" / f"{stem}_m.png", n)
            n += 1
    return tree


def _pair_args(tree: Tree, splits) -> list[str]:
    out = []
    for s in splits:
        out += ["--images", str(tree.root / s / "img"), "--masks", str(tree.root / s / "ann"), "--split", s]
    return out


def _convert(*argv: str) -> int:
    return cli_main(["convert", *argv, "--size", f"{SIZE[0]}x{SIZE[1]}", "--workers", "1", "-q",
                     "--mask-semantics", "index", "--num-classes", str(CLASSES)])


def test_repeated_pairs_in_one_run_and_prune(tmp_path):
    tree = _three_splits(tmp_path)
    out = tmp_path / "out"
    assert _convert(*_pair_args(tree, ("train", "val", "test")), str(out)) == 0
    assert_records(tree, out)
    key = next(k for k in tree.pairs if k.startswith("val/"))
    image, mask = tree.pairs.pop(key)
    image.unlink()
    mask.unlink()
    assert _convert(*_pair_args(tree, ("train", "val", "test")), str(out), "--prune") == 0
    assert_records(tree, out)  # exactly the deleted source's record went


def test_prune_never_deletes_outside_the_run_scope(tmp_path, capsys):
    """Two explicit runs into one OUT, then --prune from one of them: refused, naming both scopes."""
    tree = _three_splits(tmp_path)
    out = tmp_path / "out"
    assert _convert(*_pair_args(tree, ("train",)), str(out)) == 0
    assert _convert(*_pair_args(tree, ("val",)), str(out)) == 0
    err = capsys.readouterr().err
    assert "deleted" not in err  # the other split's records are not "deleted"
    before = (out / "imgshard.json").read_bytes()
    assert _convert(*_pair_args(tree, ("val",)), str(out), "--prune") != 0
    err = capsys.readouterr().err
    assert "--prune" in err and str(tree.root / "train" / "img") in err and str(tree.root / "val" / "img") in err
    assert (out / "imgshard.json").read_bytes() == before
    tree.pairs = {k: v for k, v in tree.pairs.items() if not k.startswith("test/")}
    assert_records(tree, out)
    manifest = json.loads(before)
    assert {e["split"] for e in manifest["sources"]["scope"]} == {"train", "val"}


def test_spec_file_converts_several_splits_and_refuses_another(tmp_path, capsys):
    tree = _three_splits(tmp_path)
    spec = {"imgshard_source_spec": 1, "root": "src",
            "splits": {s: [{"images": f"{s}/img", "masks": f"{s}/ann", "image_suffix": "", "mask_suffix": "_m"}]
                       for s in ("train", "val", "test")},
            "labels": {"semantics": "index", "num_classes": CLASSES}}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    out = tmp_path / "out"
    assert cli_main(["convert", "--spec", str(path), str(out), "--size", f"{SIZE[0]}x{SIZE[1]}", "-q",
                     "--workers", "1"]) == 0
    assert_records(tree, out)
    assert json.loads((out / "imgshard.json").read_text())["sources"]["spec"] == load_spec(str(path)).text
    spec["splits"].pop("test")
    path.write_text(json.dumps(spec))
    argv = ["convert", "--spec", str(path), str(out), "--size", f"{SIZE[0]}x{SIZE[1]}", "-q", "--workers", "1"]
    assert cli_main(argv) != 0
    assert "different spec" in capsys.readouterr().err
    assert cli_main(argv + ["--rebuild"]) == 0


@pytest.mark.parametrize("doc,match", [
    ({"imgshard_source_spec": 2, "splits": {"train": [{"images": "a"}]}}, "version 1"),
    ({"imgshard_source_spec": 1, "splits": {"train": [{"images": "a", "maks": "b"}]}}, "maks"),
    ({"imgshard_source_spec": 1, "splits": {"train": []}}, "non-empty list"),
    ({"imgshard_source_spec": 1, "splits": {"../x": [{"images": "a"}]}}, "split name"),
    ({"imgshard_source_spec": 1, "splits": {"train": [{"images": "a", "recursive": "no"}]}}, "true or false"),
])
def test_hostile_spec_files_are_named(tmp_path, doc, match):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecFileError, match=match) as e:
        load_spec(str(path))
    assert str(path) in str(e.value)


def test_scan_of_a_spec_prints_a_spec_command(tmp_path, capsys):
    tree = _three_splits(tmp_path)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"imgshard_source_spec": 1, "root": str(tree.root), "splits": {
        s: [{"images": f"{s}/img", "masks": f"{s}/ann"}] for s in ("train", "val", "test")}}))
    report = scan(load_spec(str(path)).source, ScanOptions(workers=1))
    assert report.verdict["command"].startswith(f"imgshard convert --spec {path} OUT ")
    assert run_command(report.verdict["command"], tmp_path / "out") == 0
    assert_records(tree, tmp_path / "out")


# -- colour masks without a class table ------------------------------------------------------------------


def test_colour_masks_without_a_table_take_the_colours_present(tmp_path, capsys):
    """Classes = the colours present in ascending RGB order, named #rrggbb; written on request, then used."""
    root = tmp_path / "colour"
    palette = np.array([[220, 20, 60], [0, 0, 142], [128, 64, 128], [0, 0, 0], [250, 170, 30]], np.uint8)
    masks = {}
    for i, stem in enumerate(random_stems(5, 11)):
        rng = np.random.default_rng(i)
        hw = _image(root / "images" / f"{stem}.png", rng)
        picks = palette[: 3 + i % 3]  # not every file holds every colour
        values = picks[synth.random_mask(hw[0], hw[1], len(picks), rng)]
        _mkdir(root / "masks")
        Image.fromarray(values).save(root / "masks" / f"{stem}.png")
        masks[f"train/{stem}.png"] = (root / "images" / f"{stem}.png", values)
    present = np.unique(np.concatenate([v.reshape(-1, 3) for _, v in masks.values()]), axis=0)  # rows, sorted
    reads: list[str] = []
    original = files.LocalFiles.read
    with pytest.MonkeyPatch.context() as mp:  # count the real reads (one worker: in this process)
        mp.setattr(files.LocalFiles, "read", lambda self, path: reads.append(path) or original(self, path))
        report = scan_json(capsys, str(root))
    mask_reads = [p for p in reads if Path(p).parent == root / "masks"]
    # one pass over every mask makes the table and the report (not a census pass, then a second pass); the
    # semantics and readings checks peek at the first mask and up to PEEK_MASKS spread over the samples
    assert len(set(mask_reads)) == len(masks) and len(mask_reads) <= len(masks) + 1 + PEEK_MASKS, mask_reads
    assert report["verdict"]["command"] is None and report["exit"] == 65
    assert [c["name"] for c in report["classes"]] == ["#{:02x}{:02x}{:02x}".format(*c) for c in present]
    for c, colour in zip(report["classes"], present):  # pixels and files per class, counted by NumPy
        hits = [int((v.reshape(-1, 3) == colour).all(-1).sum()) for _, v in masks.values()]
        assert (c["pixels"], c["files"]) == (sum(hits), sum(h > 0 for h in hits)), c["name"]
    table = tmp_path / "classes.csv"
    report = scan_json(capsys, str(root), "--write-classes", str(table), "--write-spec", str(tmp_path / "s.json"))
    assert table.read_text().splitlines()[1:] == [f"#{r:02x}{g:02x}{b:02x},{r},{g},{b}" for r, g, b in present]
    for command, out in ((report["verdict"]["command"], tmp_path / "o1"), (report["verdict"]["spec_command"],
                                                                           tmp_path / "o2")):
        assert run_command(command, out) == 0
        data = readers.open(out)
        records = {r.key: r for r in data.records("train")}
        assert set(records) == set(masks)
        for key, (image, values) in masks.items():
            h, w = SIZE
            ids = np.argmax((values[:, :, None, :] == present[None, None]).all(-1), axis=-1).astype(np.uint8)
            ref = np.asarray(Image.fromarray(ids).resize((w, h), Image.Resampling.NEAREST))
            np.testing.assert_array_equal(records[key].mask, ref)
            np.testing.assert_array_equal(records[key].image, reference(image, image)[0])


# -- the spec scan writes, for the name layouts ----------------------------------------------------------


def _records(out: Path) -> dict:
    data = readers.open(out)
    return {r.key: r for split in data.splits for r in data.records(split)}


@pytest.mark.parametrize("make", ["make_voc", "make_labelme", "make_cityscapes", "make_ade", "make_unet", "make_isic",
                                  "make_index16"])
def test_written_spec_converts_as_the_command_does(tmp_path, capsys, make):
    """For every name layout: `convert --spec` (the spec scan wrote) gives the records scan's command gives,
    and the manifest records the spec."""
    from tests import _layouts as L

    ds = getattr(L, make)(tmp_path / "src")
    spec = tmp_path / "spec.json"
    report = scan_json(capsys, str(ds.root), "--write-spec", str(spec))
    v = report["verdict"]
    assert v["command"] and v["spec_command"]
    assert run_command(v["command"], tmp_path / "a") == 0
    assert run_command(v["spec_command"], tmp_path / "b") == 0
    a, b = _records(tmp_path / "a"), _records(tmp_path / "b")
    assert set(a) == set(b) == {p.key for p in ds.pairs}
    for key in a:
        np.testing.assert_array_equal(a[key].image, b[key].image, err_msg=key)
        np.testing.assert_array_equal(a[key].mask, b[key].mask, err_msg=key)
    assert readers.open(tmp_path / "a").classes == readers.open(tmp_path / "b").classes
    recorded = json.loads((tmp_path / "b" / "imgshard.json").read_text())["sources"]["spec"]
    assert recorded == load_spec(str(spec)).text


def test_replace_and_prune_never_touch_another_splits_records(tmp_path, capsys):
    """A train source changes and another is deleted; a val-only run with --on-change replace keeps the old
    train records exactly, and says nothing of train (issue 25, item 12)."""
    tree = _three_splits(tmp_path)
    out = tmp_path / "out"
    assert _convert(*_pair_args(tree, ("train",)), str(out)) == 0
    assert _convert(*_pair_args(tree, ("val",)), str(out)) == 0
    before = _records(out)
    train_keys = sorted(k for k in tree.pairs if k.startswith("train/"))
    changed_image = tree.pairs[train_keys[0]][0]
    Image.fromarray(synth.textured_image(26, 30, np.random.default_rng(77))).save(changed_image)
    tree.pairs[train_keys[1]][0].unlink()
    capsys.readouterr()
    assert cli_main(["convert", *_pair_args(tree, ("val",)), str(out), "--on-change", "replace", "--workers", "1",
                     "--size", f"{SIZE[0]}x{SIZE[1]}", "--mask-semantics", "index", "--num-classes", str(CLASSES)]) == 0
    err = capsys.readouterr().err
    assert "Nothing new" in err and "train/" not in err  # the summary says nothing of the other split
    after = _records(out)
    assert set(after) == set(before)
    for key in train_keys[:2]:
        np.testing.assert_array_equal(after[key].image, before[key].image)
        np.testing.assert_array_equal(after[key].mask, before[key].mask)


# -- DRIVE as downloaded, tokens at both ends, TOML specs (issue 26 follow-up) ----------------------------


def _drive_as_downloaded(root: Path, sparse: bool = False) -> tuple[Tree, Tree]:
    """DRIVE exactly as unpacked: <split>/images/NN_<split>.tif (RGB), <split>/1st_manual/NN_manual1.gif
    (vessels, 0/255, different in every image) and <split>/mask/NN_<split>_mask.gif (the camera's field of
    view: the same disk for every image). Returns (vessel pairs, field-of-view pairs) keyed as converted.
    `sparse`: labels of a few pixels each (mostly background, so any two agree on 99% of the image) and a
    field of view whose edge moves by a pixel from image to image."""
    labels, fov = Tree(root), Tree(root)
    h, w = (160, 180) if sparse else (30, 34)  # a one-pixel edge is ~2% of a disk this size (DRIVE's: 0.7%)
    yy, xx = np.mgrid[:h, :w]
    for split, ids in (("training", (24, 21, 37, 22)), ("test", (3, 1, 13))):  # unsorted ids, '3' beside '13'
        for i in ids:
            rng = np.random.default_rng(100 + i)
            radius = min(h, w) / 2 - 1 - (i % 2 if sparse else 0)
            disk = np.where((yy - h / 2) ** 2 + (xx - w / 2) ** 2 <= radius ** 2, 255, 0).astype(np.uint8)
            image = root / split / "images" / f"{i:02d}_{split}.tif"
            vessels = root / split / "1st_manual" / f"{i:02d}_manual1.gif"
            field = root / split / "mask" / f"{i:02d}_{split}_mask.gif"
            for p in (image, vessels, field):
                p.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(synth.textured_image(h, w, rng)).save(image, format="TIFF")
            drawn = synth.random_mask(h, w, 2, rng) > 0
            if sparse:
                drawn = np.zeros((h, w), bool)
                drawn[rng.integers(h // 4, 3 * h // 4, 40), rng.integers(w // 4, 3 * w // 4, 40)] = True
            Image.fromarray(np.where(drawn, 255, 0).astype(np.uint8) & disk, "L").save(vessels)
            Image.fromarray(disk, "L").save(field)
            labels.pairs[f"{split}/{i:02d}_{split}.tif"] = (image, vessels)
            fov.pairs[f"{split}/{i:02d}_{split}.tif"] = (image, field)
    return labels, fov


def assert_binary_records(tree: Tree, out: Path) -> None:
    """Records equal Pillow's resize of each image and of each 0/255 mask (255 -> class 1)."""
    data = readers.open(out)
    records = {r.key: r for split in data.splits for r in data.records(split)}
    assert set(records) == set(tree.pairs)
    h, w = SIZE
    for key, (image, mask) in tree.pairs.items():
        ref_image = np.asarray(Image.open(image).convert("RGB").resize((w, h), Image.Resampling.BILINEAR))
        ref_mask = np.asarray(Image.open(mask).convert("L").resize((w, h), Image.Resampling.NEAREST)) == 255
        np.testing.assert_array_equal(records[key].image, ref_image, err_msg=key)
        np.testing.assert_array_equal(records[key].mask.astype(np.int64), ref_mask.astype(np.int64), err_msg=key)


@pytest.mark.parametrize("sparse", [False, True])
def test_drive_as_downloaded_pairs_the_vessel_labels_and_names_the_field_of_view(tmp_path, capsys, sparse):
    labels, fov = _drive_as_downloaded(tmp_path / "DRIVE", sparse)
    spec_path = tmp_path / "drive.json"
    report = scan_json(capsys, str(labels.root), "--write-spec", str(spec_path))
    v = report["verdict"]
    assert v["status"] == "needs_flags" and v["flags"] == ["--mask-semantics", "binary"], v  # vessels: 0/255
    assert report["total_pairs"] == len(labels.pairs), v
    assert run_command(v["command"], tmp_path / "cmd") == 0  # the one command scan prints, --size chosen
    assert_binary_records(labels, tmp_path / "cmd")
    assert run_command(v["spec_command"], tmp_path / "spec") == 0  # and the spec it writes
    assert_binary_records(labels, tmp_path / "spec")
    spec = json.loads(spec_path.read_text())
    assert {s: [p["masks"] for p in pairs] for s, pairs in spec["splits"].items()} == {
        "training": ["training/1st_manual"], "test": ["test/1st_manual"]}
    why = report["labels"]["why"]
    assert "set aside: training/mask/, test/mask/" in why or "set aside: test/mask/, training/mask/" in why
    flags = shlex.split(why.split("instead: ", 1)[1].rstrip(")"))  # the flags that choose the second candidate
    masks = sorted(flags[i + 1] for i, f in enumerate(flags) if f == "--masks")
    assert masks == sorted(str(labels.root / s / "mask") for s in ("training", "test"))
    assert cli_main(["convert", *flags, str(tmp_path / "fov"), "--size", f"{SIZE[0]}x{SIZE[1]}", "--workers", "1",
                     "-q", "--mask-semantics", "binary"]) == 0
    assert_binary_records(fov, tmp_path / "fov")


def test_tokens_at_both_ends_with_random_stems(tmp_path, capsys):
    tree = Tree(tmp_path / "src")
    for i, stem in enumerate(random_stems(10, 21)):
        add_pair(tree, f"train/img_{stem}_rgb.png", tree.root / "inputs" / f"img_{stem}_rgb.png",
                 tree.root / "labels" / f"lbl_{stem}_mask.png", 40 + i)
    check_scan_and_spec(tree, tmp_path, capsys)
    pair = json.loads((tmp_path / "spec.json").read_text())["splits"]["train"][0]
    assert (pair["image_prefix"], pair["image_suffix"], pair["mask_prefix"], pair["mask_suffix"]) == (
        "img_", "_rgb", "lbl_", "_mask")


def test_tokens_at_both_ends_despite_stray_names():
    stems = random_stems(12, 24)
    images = tuple(f"img_{s}_rgb" for s in stems) + ("Thumbs", "notes_1", "img_x")
    masks = tuple(f"lbl_{s}_mask" for s in stems) + ("readme",)
    tokens, n = infer_tokens(images, masks)
    assert (tokens.image_prefix, tokens.image_suffix, tokens.mask_prefix, tokens.mask_suffix, n) == (
        "img_", "_rgb", "lbl_", "_mask", 12)


def test_write_spec_toml_reads_back_as_the_json_spec_and_converts(tmp_path, capsys):
    import tomllib

    tree = Tree(tmp_path / "src")
    for i, stem in enumerate(random_stems(6, 22)):
        add_pair(tree, f"train/red_{stem}.png", tree.root / "bands" / f"red_{stem}.png",
                 tree.root / "truth" / f"gt_{stem}.png", 60 + i)
    scan_json(capsys, str(tree.root), "--write-spec", str(tmp_path / "s.json"))
    report = scan_json(capsys, str(tree.root), "--write-spec", str(tmp_path / "s.toml"))
    text = (tmp_path / "s.toml").read_text()
    assert not text.lstrip().startswith("{")  # TOML, not JSON under a .toml name
    assert tomllib.loads(text) == json.loads((tmp_path / "s.json").read_text())
    assert "s.toml" in report["verdict"]["spec_command"]
    assert run_command(report["verdict"]["spec_command"], tmp_path / "out") == 0
    assert_records(tree, tmp_path / "out")


def test_toml_writer_round_trips_awkward_names():
    import tomllib

    from converter.discover.spec_toml import dumps

    doc = {"imgshard_source_spec": 1, "root": 'C:\\data "raw"/ü\tx', "labels": {"ignore_values": [255, 0],
           "reduce_zero_label": False, "label_map": {"7": 1, "a.b c": 2}},
           "splits": {"train val": [{"images": "a/b", "bands": ["x", "y"], "recursive": True}, {"images": "c"}],
                      "test": []}, "skip": None}
    expected = {k: v for k, v in doc.items() if v is not None}
    assert tomllib.loads(dumps(doc)) == expected
