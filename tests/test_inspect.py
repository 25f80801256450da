"""`imgshard inspect`: numbers from the manifest equal what the records and files hold."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import readers
from converter.cli import main as cli_main
from converter.inspect.describe import bar, describe, format_description
from tests._look import add_unused_class, convert_tiny, write_classification


@pytest.mark.parametrize("fmt,compression", [("tfrecord", None), ("npz", None)])
def test_inspect_percentages_equal_counts_from_records(camvid_src, tmp_path, fmt, compression):
    add_unused_class(camvid_src.class_dict_path)
    convert_tiny(camvid_src.root, tmp_path / "out", format=fmt, compression=compression)
    d = describe(tmp_path / "out")
    ds = readers.open(tmp_path / "out")
    for split in ds.splits:
        counts = np.zeros(256, np.int64)
        n = 0
        for rec in ds.records(split):
            counts += np.bincount(rec.mask.ravel(), minlength=256)
            n += rec.mask.size
        assert d["splits"][split]["total_pixels"] == n
        for c in d["classes"]:
            assert c["pixels"][split] == counts[c["index"]]
            assert c["share"][split] == pytest.approx(100 * counts[c["index"]] / n, abs=1e-4)
        assert d["splits"][split]["ignore_share"] == pytest.approx(100 * counts[255] / n, abs=1e-4)
        shares = sum(c["share"][split] for c in d["classes"]) + d["splits"][split]["ignore_share"]
        assert shares == pytest.approx(100.0, abs=1e-3)
    assert d["classes"][5]["share"] == {"test": 0.0, "train": 0.0, "val": 0.0}


def test_inspect_sizes_shards_and_sources(camvid_src, tmp_path):
    m = convert_tiny(camvid_src.root, tmp_path / "out")
    d = describe(tmp_path / "out")
    assert d["format"] == "tfrecord" and d["compression"] == "none" and d["task"] == "segmentation"
    assert d["record_shapes"] == {"image": {"shape": [32, 48, 3], "dtype": "uint8"},
                                  "mask": {"shape": [32, 48], "dtype": "uint8"}}
    for split, entry in m.splits.items():
        s = d["splits"][split]
        assert s["samples"] == entry.num_samples and s["shards"] == len(entry.shards)
        assert s["bytes_on_disk"] == sum(os.path.getsize(tmp_path / "out" / x.file) for x in entry.shards)
        pairs = camvid_src.pairs[split]
        assert s["source_bytes"] == sum(os.path.getsize(i) + os.path.getsize(k) for i, k in pairs)
        assert s["problems"] == []
    assert d["options"]["size"] == [32, 48]
    assert len(d["history"]) == 1 and d["history"][0]["added"] == 10


def test_inspect_reports_a_truncated_shard(camvid_src, tmp_path):
    m = convert_tiny(camvid_src.root, tmp_path / "out")
    shard = m.splits["train"].shards[0].file
    with open(tmp_path / "out" / shard, "r+b") as f:
        f.truncate(100)
    d = describe(tmp_path / "out")
    assert d["splits"]["train"]["problems"] == [f"{shard}: 100 bytes on disk, manifest says {m.splits['train'].shards[0].bytes}"]
    assert "run imgshard verify" in format_description(d)


def test_inspect_text_has_a_bar_per_class_and_split(camvid_src, tmp_path):
    convert_tiny(camvid_src.root, tmp_path / "out")
    text = format_description(describe(tmp_path / "out"), color=True)
    assert "\x1b[48;2;128;128;128m" in text  # Sky swatch
    sky = next(line for line in text.splitlines() if " Sky " in line)
    assert sky.count("%") == 3 and "█" in sky


def test_bar_fills_in_eighths():
    assert bar(1.0, 4) == "████"
    assert bar(0.0, 4) == "    "
    assert bar(0.5 + 1 / 32, 4) == "██▏ "


def test_inspect_cli_json_parses(camvid_src, tmp_path, capsys):
    convert_tiny(camvid_src.root, tmp_path / "out")
    assert cli_main(["inspect", str(tmp_path / "out"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sorted(doc["splits"]) == ["test", "train", "val"]
    assert cli_main(["inspect", str(tmp_path / "out"), "--no-color"]) == 0
    assert "Classes: share of pixels" in capsys.readouterr().out


def test_inspect_missing_dataset_names_the_folder(tmp_path, capsys):
    assert cli_main(["inspect", str(tmp_path / "nothing")]) == 1
    assert "imgshard.json not found" in capsys.readouterr().err


def test_inspect_classification_manifest(classification_src, tmp_path):
    write_classification(classification_src, tmp_path / "cls")
    d = describe(tmp_path / "cls")
    assert d["task"] == "classification" and d["share_unit"] == "records" and d["mask"] is None
    ds = readers.open(tmp_path / "cls")
    labels = np.bincount([r.label for r in ds.records("train")], minlength=ds.num_classes)
    for c in d["classes"]:
        assert c["color"] is None
        assert c["share"]["train"] == pytest.approx(100 * labels[c["index"]] / labels.sum(), abs=1e-4)
    text = format_description(d)
    assert "label int64" in text and "share of records" in text


def test_inspect_piped_into_a_closed_reader_exits_quietly(camvid_src, tmp_path):
    import subprocess
    import sys

    from converter.convert import convert
    from converter.options import OutputOptions, RunOptions, SourceSpec

    out = tmp_path / "out"
    convert(SourceSpec(root=str(camvid_src.root)), str(out), OutputOptions(size=(24, 24)), RunOptions(workers=1))
    proc = subprocess.Popen([sys.executable, "-m", "converter.cli", "inspect", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()  # like `| head -1`: read one line, then hang up
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert first.startswith(b"Dataset:")
    assert proc.returncode == 0
    assert b"Traceback" not in err and b"BrokenPipe" not in err
