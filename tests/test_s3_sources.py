"""Sources in buckets (issue 18): discovery from one listing, ETag/generation fingerprints,
workers reading objects, scan on URLs, --storage-option; against a real moto S3 server and
the GCS emulator on 127.0.0.1 (`tests/_objstore.py`).

The reference for every test is the same files converted or discovered from a local folder.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import readers
from _cron import convert_args, run_cli
from _layouts import make_ade, make_cityscapes, make_isic, make_labelme, make_unet, make_voc
from converter.convert import convert
from converter.discover import files as source_files
from converter.discover.classfolders import detect_task
from converter.discover.evidence import PEEK_MASKS
from converter.discover.sources import discover_sources
from converter.options import LabelOptions, MaskSemantics, OnChange, OutputOptions, RunOptions, SourceSpec, Task
from converter.testing import synth
from converter.transform.kinds import PROBE_FILES
from readers.index import shard_samples
from readers.manifest import Manifest
from readers.storage import open_store
from readers.storage.store import ObjectStore

SIZE = "32x48"


def upload(local: Path, url: str) -> list[str]:
    """Put every file below `local` under the prefix `url` (names relative, '/'-separated)."""
    store = open_store(url)
    names = []
    for path in sorted(local.rglob("*")):
        if path.is_file():
            name = path.relative_to(local).as_posix()
            store.put(name, path.read_bytes())
            names.append(name)
    return names


class Requests:
    """Counts the object-store calls of this process by kind (list, info, read) and object name."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, str]] = []
        for kind in ("list", "info", "read", "read_range"):
            original = getattr(ObjectStore, kind)

            def counted(store, name="", *args, _kind=kind, _original=original, **kwargs):
                self.calls.append((_kind, store.url_of(name)))
                return _original(store, name, *args, **kwargs)

            monkeypatch.setattr(ObjectStore, kind, counted)

    def of(self, kind: str) -> list[str]:
        return [url for k, url in self.calls if k == kind]

    def reset(self) -> None:
        self.calls.clear()


def _records(out) -> dict[str, tuple]:
    ds = readers.open(out)
    return {r.key: (split, r.image.tobytes(), None if r.mask is None else r.mask.tobytes(), r.label)
            for split in ds.splits for r in ds.records(split)}


def _sources(out) -> dict[str, tuple]:
    """key -> (image path, size, digest, mask path, size, digest, label) from the index files."""
    m = Manifest.load(os.path.join(out, "imgshard.json"))
    rows = {}
    for _, entry in m.iter_shards():
        for s in shard_samples(str(out), entry):
            mask = (s.mask.path, s.mask.size, s.mask.digest) if s.mask is not None else None
            rows[s.key] = (s.image.path, s.image.size, s.image.digest, mask, s.label)
    return rows


def server_options(server: str) -> dict:
    """Storage options naming the test server and its credentials. Multi-worker runs get them
    through `SourceSpec.storage_options`: their workers (loky's reusable interpreters, which
    may predate the server fixture's environment) are told the endpoint, not left to guess."""
    return {"endpoint_url": server, "key": "imgshard-test", "secret": "imgshard-test"}


def _options(**kw) -> OutputOptions:
    return OutputOptions(size=SIZE, **kw)


# -- discovery -------------------------------------------------------------------------------------

def _layout_datasets(tmp_path: Path) -> dict[str, tuple[Path, LabelOptions | None]]:
    """name -> (root, the label options its masks need beyond the layout's defaults)."""
    def needs(ds) -> LabelOptions:
        if ds.binary:
            return LabelOptions(semantics=MaskSemantics.BINARY)
        return LabelOptions(num_classes=ds.num_classes)

    layouts = {"ade": make_ade(tmp_path / "ade"), "mmseg": make_ade(tmp_path / "mmseg", naming="mmseg"),
               "unet": make_unet(tmp_path / "unet"), "isic": make_isic(tmp_path / "isic")}
    return {
        "camvid": (synth.make_camvid(tmp_path / "camvid", size=[(32, 48), (40, 36)], seed=0).root, None),
        "voc": (make_voc(tmp_path / "voc").root, None),
        "labelme": (make_labelme(tmp_path / "labelme").root, None),
        "cityscapes": (make_cityscapes(tmp_path / "cityscapes").root, None),
        **{name: (ds.root, needs(ds)) for name, ds in layouts.items()},
        "classes_split": (synth.make_classification(tmp_path / "cls", seed=6).root, None),
        "classes_flat": (synth.make_classification(tmp_path / "clsflat", per_class=3, flat=True, seed=7).root, None),
    }


def _discovered(spec: SourceSpec, base: str, labels: LabelOptions | None = None) -> dict:
    with source_files.source_scope():  # as the CLI: task detection and discovery share one listing
        task = detect_task(spec)
        found, classes, options = discover_sources(spec, OutputOptions(size=SIZE, task=task, labels=labels))
    rel = source_files.relative
    return {
        "task": task, "layout": found.layout, "why": found.why, "splits": found.splits, "classes": classes,
        "labels": options.labels, "suffixes": found.suffixes, "unpaired": found.unpaired_images,
        "samples": [(s.split, s.key, rel(s.image, base), s.mask and rel(s.mask, base), s.label,
                     s.image_stat[0], s.mask_stat and s.mask_stat[0]) for s in found.samples],
        "bad": sorted((rel(b.path, base), b.kind, b.key) for b in found.bad),
        "names_file": found.defaults.names_file and rel(found.defaults.names_file, base),
    }


def test_every_layout_is_discovered_from_a_bucket_as_from_a_folder_with_one_listing(tmp_path, s3_bucket,
                                                                                      monkeypatch):
    requests = Requests(monkeypatch)
    for name, (root, labels) in _layout_datasets(tmp_path).items():
        url = f"{s3_bucket}/{name}/raw"
        upload(root, url)
        local = _discovered(SourceSpec(root=str(root)), str(root), labels)
        requests.reset()
        remote = _discovered(SourceSpec(root=url), url, labels)
        assert remote == local, name
        assert local["samples"], name
        assert requests.of("list") == [url], name  # one listing of the prefix for detection and discovery
        assert requests.of("info") == [], name  # no request per object
        # reads, each object once: the class table / names file / split lists, and the masks whose
        # values tell what they mean (up to PEEK_MASKS spread over the samples: VOC ids, two levels)
        reads = requests.of("read")
        assert len(reads) == len(set(reads)), (name, reads)
        masks = [r for r in reads if r.endswith(".png")]
        assert len(masks) <= PEEK_MASKS and len(reads) - len(masks) <= 3, (name, reads)


def test_zero_byte_and_unpaired_objects_are_the_same_bad_inputs_as_local_files(tmp_path, s3_bucket):
    ds = synth.make_camvid(tmp_path / "src", splits={"train": 4}, size=[(32, 48)], seed=1)
    (ds.root / "train" / "empty.png").write_bytes(b"")
    (ds.root / "train_labels" / "empty_L.png").write_bytes(b"")
    (ds.root / "train" / "lonely.png").write_bytes((ds.root / "train" / sorted(os.listdir(ds.root / "train"))[0])
                                                   .read_bytes())
    url = f"{s3_bucket}/raw"
    upload(ds.root, url)
    local, remote = _discovered(SourceSpec(root=str(ds.root)), str(ds.root)), _discovered(SourceSpec(root=url), url)
    assert remote["bad"] == local["bad"]
    assert {k for _, k, _ in remote["bad"]} == {"empty_file", "missing_mask"}


def test_split_lists_and_class_table_elsewhere_in_the_bucket(tmp_path, s3_bucket):
    ds = synth.make_explicit(tmp_path / "e" / "images", tmp_path / "e" / "masks", tmp_path / "e" / "classes.csv", 5,
                             size=[(32, 48)], seed=5)
    upload(tmp_path / "e", f"{s3_bucket}/e")
    names = sorted(p.stem for p in (tmp_path / "e" / "images").iterdir())
    open_store(f"{s3_bucket}/lists").put("val.txt", ("\n".join(names[:2]) + "\n").encode())
    spec = SourceSpec(images=f"{s3_bucket}/e/images", masks=f"{s3_bucket}/e/masks",
                      classes=f"{s3_bucket}/e/classes.csv", split_lists=(("val", f"{s3_bucket}/lists/val.txt"),))
    found, classes, _ = discover_sources(spec, _options())
    assert [c.name for c in classes] == [n for n, _ in ds.classes]
    assert [s.key for s in found.samples] == [f"val/{n}.png" for n in names[:2]]
    assert all(s.image.startswith(f"{s3_bucket}/e/images/") for s in found.samples)


# -- convert -------------------------------------------------------------------------------------

def test_convert_from_s3_equals_the_local_conversion_record_for_record(camvid_src, tmp_path, s3_bucket, s3_server):
    url = f"{s3_bucket}/datasets/camvid"
    upload(camvid_src.root, url)
    local = convert(SourceSpec(root=str(camvid_src.root)), str(tmp_path / "local"), _options(), RunOptions(workers=2))
    remote = convert(SourceSpec(root=url + "/", storage_options=server_options(s3_server)), str(tmp_path / "s3"),
                     _options(), RunOptions(workers=2))
    assert remote.published and remote.samples_written == local.samples_written == camvid_src.num_samples
    assert _records(tmp_path / "s3") == _records(tmp_path / "local")
    assert _sources(tmp_path / "s3") == _sources(tmp_path / "local")  # names relative to the root, as local
    lm, rm = (Manifest.load(str(tmp_path / d / "imgshard.json")) for d in ("local", "s3"))
    assert rm.classes == lm.classes and rm.splits.keys() == lm.splits.keys()
    # the sources moved to the bucket: the local dataset goes on without a rebuild, nothing re-converted
    moved = convert(SourceSpec(root=url), str(tmp_path / "local"), _options(), RunOptions(workers=1))
    assert not moved.plan.tasks and moved.plan.unchanged == camvid_src.num_samples
    assert _records(tmp_path / "local") == _records(tmp_path / "s3")


def test_classification_from_s3_equals_the_local_conversion(classification_src, tmp_path, s3_bucket, s3_server):
    url = f"{s3_bucket}/cls"
    upload(classification_src.root, url)
    opts = _options(task=Task.CLASSIFICATION)
    convert(SourceSpec(root=str(classification_src.root)), str(tmp_path / "local"), opts, RunOptions(workers=1))
    convert(SourceSpec(root=url, storage_options=server_options(s3_server)), str(tmp_path / "s3"), opts,
            RunOptions(workers=2))
    assert _records(tmp_path / "s3") == _records(tmp_path / "local")
    assert _sources(tmp_path / "s3") == _sources(tmp_path / "local")


def _source_reads(requests: Requests, url: str) -> list[str]:
    return sorted(u for u in requests.of("read") if u.startswith(url) and u.endswith(".png"))


def test_second_run_over_an_unchanged_bucket_downloads_no_source_object(tmp_path, s3_bucket, monkeypatch):
    ds = synth.make_camvid(tmp_path / "src", splits={"train": 5, "val": 2}, size=[(32, 48)], seed=2)
    url = f"{s3_bucket}/raw"
    upload(ds.root, url)
    requests = Requests(monkeypatch)
    spec = SourceSpec(root=url)
    opts = _options(labels=LabelOptions(semantics=MaskSemantics.COLOUR))  # no semantics peek at a mask
    first = convert(spec, str(tmp_path / "out"), opts, RunOptions(workers=1))
    assert len(_source_reads(requests, url)) == 2 * ds.num_samples  # one GET per image and per mask
    assert requests.of("info") == []
    # the image kind is probed from headers: one ranged GET per probed image, never the whole object
    assert 0 < len(requests.of("read_range")) <= min(PROBE_FILES, ds.num_samples)
    requests.reset()
    second = convert(spec, str(tmp_path / "out"), opts, RunOptions(workers=1))
    assert second.plan.unchanged == first.samples_written and not second.plan.tasks
    assert _source_reads(requests, url) == []
    assert requests.of("list") == [url] and requests.of("info") == []
    # without the explicit semantics, detection peeks at one mask per run, and nothing else
    requests.reset()
    convert(spec, str(tmp_path / "out"), _options(), RunOptions(workers=1))
    assert len(_source_reads(requests, url)) == 1


def test_changed_object_is_reconverted_and_identical_rewrite_is_not(tmp_path, s3_bucket, monkeypatch):
    ds = synth.make_camvid(tmp_path / "src", splits={"train": 4}, size=[(32, 48)], seed=3)
    url = f"{s3_bucket}/raw"
    upload(ds.root, url)
    spec, out = SourceSpec(root=url), str(tmp_path / "out")
    opts = _options(labels=LabelOptions(semantics=MaskSemantics.COLOUR))
    run = RunOptions(workers=1, on_change=OnChange.REPLACE)
    convert(spec, out, opts, run)
    store = open_store(url)
    names = sorted(n for n in (i.name for i in store.list("train")) if n.endswith(".png"))
    same, changed = names[0], names[1]
    etag = store.info(same).version
    store.put(same, store.read(same))  # identical bytes: S3 gives the same ETag
    assert store.info(same).version == etag
    new_pixels = synth.textured_image(32, 48, np.random.default_rng(99))
    path = tmp_path / "new.png"
    Image.fromarray(new_pixels).save(path)
    store.put(changed, path.read_bytes())
    requests = Requests(monkeypatch)
    result = convert(spec, out, opts, run)
    assert result.plan.replaced == 1 and result.plan.unchanged == 3
    assert set(_source_reads(requests, url)) == {f"{url}/{changed}", f"{url}/train_labels/" + _mask_of(changed)}
    record = next(r for r in readers.open(out).records("train") if r.key == changed)
    assert np.array_equal(record.image, np.asarray(Image.fromarray(new_pixels).resize((48, 32), Image.BILINEAR)))


def _mask_of(image_name: str) -> str:
    return os.path.basename(image_name)[:-4] + "_L.png"


def test_hostile_objects_get_the_same_named_errors_naming_their_urls(tmp_path, s3_bucket):
    ds = synth.make_camvid(tmp_path / "src", splits={"train": 4}, size=[(32, 48)], seed=4)
    images = sorted((ds.root / "train").iterdir())
    data = images[0].read_bytes()
    images[0].write_bytes(data[: len(data) // 2])  # truncated PNG
    images[1].write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(64))  # malformed
    url = f"{s3_bucket}/raw"
    upload(ds.root, url)
    run = RunOptions(workers=1, max_bad=10)
    local = convert(SourceSpec(root=str(ds.root)), str(tmp_path / "local"), _options(), run)
    remote = convert(SourceSpec(root=url), str(tmp_path / "s3"), _options(), run)
    rel_local = sorted((os.path.relpath(b.path, ds.root), b.kind, b.reason) for b in local.bad)
    rel_remote = sorted((b.path[len(url) + 1:], b.kind, b.reason.replace(url, str(ds.root))) for b in remote.bad)
    assert len(rel_local) == 2 and [r[:2] for r in rel_remote] == [r[:2] for r in rel_local]
    assert all(b.path.startswith(f"{url}/train/") for b in remote.bad)
    assert _records(tmp_path / "s3") == _records(tmp_path / "local")


# -- CLI: convert and scan on URLs, --storage-option ------------------------------------------------

def test_cli_convert_from_s3_with_storage_options_instead_of_the_environment(tmp_path, s3_bucket, s3_server,
                                                                              monkeypatch, capsys):
    ds = synth.make_camvid(tmp_path / "src", splits={"train": 3}, size=[(32, 48)], seed=5)
    url = f"{s3_bucket}/raw"
    upload(ds.root, url)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    source_files.use_storage_options(url, ())  # forget the options earlier tests registered
    out = tmp_path / "out"
    assert run_cli(convert_args(url, out, "--storage-option", f"endpoint_url={s3_server}")) == 0
    assert len(_records(out)) == 3
    capsys.readouterr()
    bad = "http://127.0.0.1:9"  # nothing listens there: one line naming the URL, no traceback
    assert run_cli(["scan", url, "-q", "--storage-option", f"endpoint_url={bad}",
                    "--storage-option", "config_kwargs.retries.max_attempts=1"]) == 1
    err = capsys.readouterr().err
    assert url in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_scan_on_s3_prints_layout_semantics_problems_and_the_convert_command(tmp_path, s3_bucket, s3_server,
                                                                              capsys):
    ds = synth.make_camvid(tmp_path / "src", splits={"train": 4, "val": 2}, size=[(32, 48)], seed=6,
                           unknown_colors=1)
    url = f"{s3_bucket}/raw"
    upload(ds.root, url)
    option = f"endpoint_url={s3_server}"
    # workers (loky's, reused from earlier tests) are told the server and credentials by the options
    flags = ["--storage-option", option, "--storage-option", "key=imgshard-test",
             "--storage-option", "secret=imgshard-test"]
    code = run_cli(["scan", url, "--workers", "2", *flags])
    # the command repeats the options, a secret redacted (credentials belong in the environment)
    text = capsys.readouterr().out
    assert code == 65  # the planted unknown colour: convert without flags would fail
    assert "camvid" in text and "colour" in text
    assert f"[unknown_color] {url}/val_labels/" in text  # the problem names the object's URL
    assert f"imgshard convert {url} OUT" in text and f"--storage-option {option}" in text
    assert "--storage-option key=imgshard-test" in text and "--storage-option 'secret=<redacted>'" in text
    assert "secret=imgshard-test" not in text
    local = run_cli(["scan", str(ds.root), "--json", "-q"])
    local_json = capsys.readouterr().out
    assert run_cli(["scan", url, "--json", "-q", "--workers", "2", *flags]) == local
    remote = _scan_summary(capsys.readouterr().out, url)
    assert remote == _scan_summary(local_json, str(ds.root))


def _scan_summary(text: str, root: str) -> dict:
    import json
    import re

    report = json.loads(text)
    return {"labels": report["labels"], "pairs": report["pairs"], "classes": report["classes"],
            "bad": sorted((b["path"].replace(root, "ROOT"), b["kind"]) for b in report["bad"]),
            "unknown": [(u["color"], u["pixels"], u["examples"]) for u in report["unknown_colors"]],
            "command": re.sub(r" --storage-option \S+", "", report["verdict"]["command"].replace(root, "ROOT"))}


def test_missing_prefix_is_named_as_a_missing_source_folder(s3_bucket, capsys):
    open_store(s3_bucket).put("other/a.png", b"x")
    assert run_cli(["scan", f"{s3_bucket}/raw", "-q"]) == 1
    err = capsys.readouterr().err
    assert f"Source folder not found: {s3_bucket}/raw" in err and "Traceback" not in err


def test_unknown_url_scheme_is_a_usage_error(capsys):
    assert run_cli(["scan", "ftp://host/raw"]) == 2
    err = capsys.readouterr().err
    assert "ftp" in err and "s3://" in err


def test_source_spec_freezes_storage_options_and_reads_file_urls_as_paths(tmp_path):
    spec = SourceSpec(root=f"file://{tmp_path}", storage_options={"client_kwargs": {"region_name": "eu-west-1"},
                                                                     "anon": True})
    assert spec.root == str(tmp_path) and spec.base == str(tmp_path)
    assert hash(spec) == hash(pickle.loads(pickle.dumps(spec)))
    assert spec.storage_options == (("anon", True), ("client_kwargs", ("__mapping__", (("region_name", "eu-west-1"),))))
    from readers.storage import storage_option_flags, thaw_storage_options

    assert thaw_storage_options(spec.storage_options) == {"anon": True, "client_kwargs": {"region_name": "eu-west-1"}}
    assert storage_option_flags(spec.storage_options) == ["--storage-option", "anon=true", "--storage-option",
                                                          "client_kwargs.region_name=eu-west-1"]
    assert SourceSpec(root="s3://bucket/raw/").base == "s3://bucket/raw"


# -- GCS: the same code path ------------------------------------------------------------------------

def test_gcs_scan_and_convert_from_gs_equal_local(camvid_src, tmp_path, gcs_bucket, capsys):
    # one worker: the emulator is reached through STORAGE_EMULATOR_HOST (gcsfs's endpoint_url option
    # first spends 60 s probing the emulator over gRPC), which a reused worker pool may not have
    url = f"{gcs_bucket}/raw"
    upload(camvid_src.root, url)
    convert(SourceSpec(root=str(camvid_src.root)), str(tmp_path / "local"), _options(), RunOptions(workers=1))
    convert(SourceSpec(root=url), str(tmp_path / "gs"), _options(), RunOptions(workers=1))
    assert _records(tmp_path / "gs") == _records(tmp_path / "local")
    assert _sources(tmp_path / "gs") == _sources(tmp_path / "local")
    again = convert(SourceSpec(root=url), str(tmp_path / "gs"), _options(), RunOptions(workers=1))
    assert not again.plan.tasks and again.plan.unchanged == camvid_src.num_samples  # generations unchanged
    capsys.readouterr()
    assert run_cli(["scan", url, "-q", "--workers", "1"]) == 0
    assert f"imgshard convert {url} OUT" in capsys.readouterr().out


def test_preview_of_raw_sources_in_a_bucket_draws_the_same_sheet_as_locally(tmp_path, s3_bucket):
    ds = synth.make_camvid(tmp_path / "src", splits={"train": 3}, size=[(32, 48)], seed=8)
    url = f"{s3_bucket}/raw"
    upload(ds.root, url)
    assert run_cli(["preview", str(ds.root), "-o", str(tmp_path / "local.png"), "-n", "3"]) == 0
    assert run_cli(["preview", url, "-o", str(tmp_path / "s3.png"), "-n", "3"]) == 0
    local, remote = (np.asarray(Image.open(tmp_path / f"{n}.png")) for n in ("local", "s3"))
    assert local.shape == remote.shape and local.std() > 0
    # the title names the source: compare the sample tiles below it
    assert np.array_equal(local[-local.shape[0] // 2:], remote[-remote.shape[0] // 2:])


def test_scan_of_class_folders_in_a_bucket_reads_the_split_layout(classification_src, tmp_path, s3_bucket, capsys):
    url = f"{s3_bucket}/cls"
    upload(classification_src.root, url)
    local = run_cli(["scan", str(classification_src.root), "--json", "-q", "--workers", "1"])
    local_report = capsys.readouterr().out.replace(str(classification_src.root), "ROOT")
    assert run_cli(["scan", url, "--json", "-q", "--workers", "1"]) == local
    remote_report = capsys.readouterr().out.replace(url, "ROOT")
    assert '"layout": "split"' in remote_report and remote_report == local_report


def test_label_map_file_in_a_bucket_resolves_like_a_local_one(tmp_path, s3_bucket):
    ds = make_ade(tmp_path / "mm", naming="mmseg")
    url = f"{s3_bucket}/mm"
    upload(ds.root, url)
    mapping = "".join(f"{v},{(v * 2) % ds.num_classes}\n" for v in range(ds.num_classes))
    (tmp_path / "map.csv").write_text(mapping)
    open_store(f"{s3_bucket}/maps").put("map.csv", mapping.encode())
    local_map = LabelOptions(label_map_file=str(tmp_path / "map.csv"))
    local = _discovered(SourceSpec(root=str(ds.root)), str(ds.root), local_map)
    remote = _discovered(SourceSpec(root=url), url, LabelOptions(label_map_file=f"{s3_bucket}/maps/map.csv"))
    assert remote["labels"].label_map == local["labels"].label_map == tuple(
        (v, (v * 2) % ds.num_classes) for v in range(ds.num_classes))
    assert remote["classes"] == local["classes"]


def _content_trees(tmp_path: Path, name: str):
    """(tree, label options): DRIVE as downloaded, or folders whose names say nothing of masks (their
    files' headers tell which side holds them)."""
    from test_content_layouts import Tree, _drive_as_downloaded, add_pair, random_stems

    if name == "drive":
        return _drive_as_downloaded(tmp_path / "DRIVE")[0], LabelOptions(semantics=MaskSemantics.BINARY)
    tree = Tree(tmp_path / "sat")
    for i, stem in enumerate(random_stems(6, 23)):
        add_pair(tree, f"train/red_{stem}.png", tree.root / "bands" / f"red_{stem}.png",
                 tree.root / "truth" / f"gt_{stem}.png", 80 + i)
    return tree, LabelOptions(num_classes=3)


@pytest.mark.parametrize("name", ["drive", "unnamed_folders"])
def test_pairing_by_content_from_a_bucket_as_from_a_folder(tmp_path, s3_bucket, monkeypatch, name):
    """Pairing by content in a bucket (DRIVE as downloaded: 1st_manual/ vessels beside mask/, one field of
    view repeated; folders named neither images nor masks): the same folders, tokens and samples as locally,
    from one listing, header reads and each object read once."""
    tree, labels = _content_trees(tmp_path, name)
    url = f"{s3_bucket}/{name}"
    upload(tree.root, url)
    local = _discovered(SourceSpec(root=str(tree.root)), str(tree.root), labels)
    requests = Requests(monkeypatch)
    remote = _discovered(SourceSpec(root=url), url, labels)
    assert remote.pop("why").replace(url, str(tree.root)) == local.pop("why")  # the set-aside flags name paths
    assert remote == local and local["layout"] == "content"
    assert sorted((s[0], s[2], s[3]) for s in local["samples"]) == sorted(
        (k.split("/")[0], str(i.relative_to(tree.root)), str(m.relative_to(tree.root)))
        for k, (i, m) in tree.pairs.items())
    reads = requests.of("read")
    assert requests.of("list") == [url] and len(reads) == len(set(reads)), reads  # each object read once
