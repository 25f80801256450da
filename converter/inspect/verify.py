"""`imgshard verify OUT`: prove that a converted dataset is whole.

Checks every shard the manifest lists, without TensorFlow:

* the file exists, has the manifest's size and digest (xxh3-128; sha256 in manifests
  of version 1);
* it holds the manifest's number of records, counted by the format's adapter
  (`FileAdapter.count_records`, from the one format registry): TFRecord files are
  walked header by header, so a file cut exactly at a record boundary (which
  TensorFlow reads as a shorter valid file) is caught; NPZ members' ``.npy`` headers
  give their shapes (never unpickled: an object dtype is an error);
* its index file (version 3: the per-sample data, `readers.index`) exists, has the
  manifest's size and digest, and holds what an index holds (fields and types, one row
  per record in record order, no key twice); damage is named with the index file;
* no sample key is listed twice in the dataset (nothing duplicated).

With ``deep=True`` every record is also decoded (CRCs checked): image shape and
dtype, mask or label shape and dtype, class indices below ``num_classes`` or equal to
the ignore index (one-hot planes 0/1 with at most one class per pixel), keys equal to
the index file's keys in order, and per-shard class pixel counts equal to the
manifest's.

Leftover temporary files and shard files the manifest does not list (a crashed or
running `convert`; the next run removes them) are warnings, not errors.

A bucket dataset (``s3://bucket/out``, ``gs://...``; `storage_options` as for
`readers.open`) is checked the same way: every object the manifest lists is downloaded,
one shard at a time, into a temporary folder and checked as a local file (its size and
digest against the manifest, its records, its index); unlisted shard objects are warnings.

Example::

    from converter.inspect.verify import verify
    report = verify("out/", deep=True)
    if not report.ok:
        for p in report.errors:
            print(p)
"""

from __future__ import annotations

import os
import time
import zipfile
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator

import numpy as np

from converter.fsutil import TMP_PREFIX
from converter.plan.fingerprint import algorithm_of, digest_bytes, digest_file
from readers.errors import describe
from readers.files import NotRegularFileError, OutsideDatasetError, check_inside, open_regular
from readers.formats import FileFormat, check_compression
from readers.formats.base import CountError
from readers.formats.spec import Record, RecordSpec, ShardRef
from readers.formats.registry import get_adapter
from readers.index import IndexFileError, decode_index, is_index_name, read_bounded
from readers.manifest import MANIFEST_NAME, Manifest, ManifestError, ShardEntry



@dataclass(frozen=True)
class Problem:
    """One finding: the file (relative to the dataset folder), the record if known, what is wrong."""

    file: str
    problem: str
    record: int | None = None
    split: str | None = None

    def __str__(self) -> str:
        where = self.file + (f", record {self.record}" if self.record is not None else "")
        return f"{where}: {self.problem}"


@dataclass
class VerifyReport:
    out_dir: str
    deep: bool
    shards: int = 0
    records: int = 0
    bytes: int = 0
    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def bad_files(self) -> list[str]:
        return sorted({p.file for p in self.errors})

    def to_json(self) -> dict:
        return {
            "out_dir": self.out_dir,
            "ok": self.ok,
            "deep": self.deep,
            "shards": self.shards,
            "records": self.records,
            "bytes": self.bytes,
            "bad_files": self.bad_files,
            "errors": [asdict(p) for p in self.errors],
            "warnings": [asdict(p) for p in self.warnings],
            "seconds": round(self.seconds, 3),
        }


def verify(out_dir: str | os.PathLike, *, deep: bool = False,
           on_shard: Callable[[str], None] | None = None, storage_options: dict | None = None) -> VerifyReport:
    """Check the dataset in `out_dir` (a folder, or an ``s3://``/``gs://`` URL with its
    `storage_options`) against its manifest (see the module docstring).

    Never raises for a damaged dataset: every problem found is in the returned
    report's `errors` (a missing or unreadable manifest is one error too). When a
    `convert` published a new manifest while this ran (it may delete shards of the
    previous one), the check runs once more on the new manifest.
    """
    from readers.storage.url import is_remote, local_path

    if is_remote(out_dir):
        return _verify_url(os.fspath(out_dir), deep, on_shard, storage_options)
    out_dir = local_path(out_dir)
    before = _manifest_identity(out_dir)
    report = _verify_once(out_dir, deep, on_shard)
    if not report.ok and before is not None and _manifest_identity(out_dir) != before:
        report = _verify_once(out_dir, deep, on_shard)
    return report


def _manifest_identity(out_dir: str | os.PathLike) -> tuple[int, int, int] | None:
    try:
        st = os.stat(os.path.join(os.fspath(out_dir), MANIFEST_NAME))
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _verify_once(out_dir: str | os.PathLike, deep: bool, on_shard: Callable[[str], None] | None) -> VerifyReport:
    t0 = time.perf_counter()
    root = os.path.abspath(os.fspath(out_dir))
    report = VerifyReport(root, deep)
    try:
        manifest = Manifest.load(root)
        fmt = FileFormat.parse(manifest.format)
        check_compression(fmt, manifest.compression)
        spec = RecordSpec.from_manifest(manifest, os.path.join(root, MANIFEST_NAME))
    except (FileNotFoundError, ManifestError, ValueError, KeyError, TypeError) as e:
        report.errors.append(Problem(MANIFEST_NAME, str(e)))
        report.seconds = time.perf_counter() - t0
        return report

    _check_all(root, manifest, fmt, spec, report, on_shard)
    _leftovers(root, manifest, report)
    report.seconds = time.perf_counter() - t0
    return report


def _check_all(root: str, manifest: Manifest, fmt: FileFormat, spec: RecordSpec, report: VerifyReport,
               on_shard: Callable[[str], None] | None,
               fetch: Callable[[str, ShardEntry], Callable[[], None]] | None = None) -> None:
    """Check every shard and index file the manifest lists (files under `root`), then that no
    key is listed twice. `fetch(split, entry)`: brings the shard's files into `root` first
    (a bucket dataset) and returns what to call once the shard is checked."""
    keys = _KeyCheck()
    for split, entry in manifest.iter_shards():
        report.shards += 1
        report.records += entry.records
        report.bytes += entry.bytes
        done = fetch(split, entry) if fetch is not None else None
        shard_keys = _check_index(root, split, entry, report)
        keys.add(entry, shard_keys)
        report.errors.extend(_check_shard(root, split, entry, fmt, spec, report.deep, shard_keys))
        if done is not None:
            done()
        if on_shard is not None:
            on_shard(entry.file)
    keys.report_duplicates(manifest, root, report)


def _verify_url(url: str, deep: bool, on_shard: Callable[[str], None] | None,
                storage_options: dict | None) -> VerifyReport:
    """`verify` of a bucket dataset: each listed object is downloaded (one at a time, into a
    temporary folder) and checked exactly as a local file is: size, digest, records, index."""
    import tempfile

    from readers.remote import list_objects, load_manifest
    from readers.storage import StorageError, open_store

    t0 = time.perf_counter()
    report = VerifyReport(url, deep)
    try:
        store = open_store(url, storage_options)
        report.out_dir = store.url
        manifest = load_manifest(store)
        fmt = FileFormat.parse(manifest.format)
        check_compression(fmt, manifest.compression)
        spec = RecordSpec.from_manifest(manifest, store.url_of(MANIFEST_NAME))
        objects = list_objects(store)
    except (FileNotFoundError, ManifestError, ValueError, KeyError, TypeError, StorageError) as e:
        report.errors.append(Problem(MANIFEST_NAME, str(e)))
        report.seconds = time.perf_counter() - t0
        return report
    with tempfile.TemporaryDirectory(prefix="imgshard-verify-") as tmp:
        def fetch(split: str, entry: ShardEntry) -> Callable[[], None]:
            names = [entry.file] + ([entry.index.file] if entry.index is not None else [])
            for name in names:  # a missing object stays missing: the checks name it
                _download(store, objects, name, tmp, report, split)
            # the shard goes once checked; index files stay (duplicate keys are named from them)
            return lambda: _remove(os.path.join(tmp, entry.file))

        _check_all(tmp, manifest, fmt, spec, report, on_shard, fetch)
    _object_leftovers(objects, manifest, report)
    report.seconds = time.perf_counter() - t0
    return report


def _download(store, objects: dict, name: str, folder: str, report: VerifyReport, split: str) -> None:
    from readers.storage import StorageError

    if name not in objects:
        return
    local = os.path.join(folder, name)
    os.makedirs(os.path.dirname(local), exist_ok=True)
    try:
        store.download(name, local)
    except (StorageError, FileNotFoundError) as e:
        report.errors.append(Problem(name, f"cannot download {store.url_of(name)} ({describe(e)})", None, split))


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _object_leftovers(objects: dict, manifest: Manifest, report: VerifyReport) -> None:
    """Shard and index objects the manifest does not list (left by a failed or running convert)."""
    from converter.publish.manifest import is_shard_name, listed_files

    listed = listed_files(manifest)
    for name in sorted(n for n in objects if "/" not in n):
        if (is_shard_name(name) or is_index_name(name)) and name not in listed:
            what = "shard" if is_shard_name(name) else "index"
            report.warnings.append(Problem(
                name, f"{what} object not listed in the manifest (left by a failed or running convert, or "
                "dropped by a rewrite; the next convert removes it)"))


def _check_index(root: str, split: str, entry: ShardEntry, report: VerifyReport) -> np.ndarray | None:
    """The shard's keys (UTF-8 bytes, record order) from its index file or the inline samples;
    None, with the damage named, when the index file is missing or damaged."""
    if entry.index is None:  # version 1 or 2: the manifest holds the samples
        return np.array([k.encode("utf-8") for k in entry.keys], dtype=object) if entry.samples else None
    name = entry.index.file
    path = os.path.join(root, name)
    if not os.path.lexists(path):
        report.errors.append(Problem(name, f"missing: the index file of {entry.file} does not exist", None, split))
        return None
    try:
        data = read_bounded(root, path, entry.index.bytes, entry.file)
    except IndexFileError as e:
        report.errors.append(Problem(name, f"cannot read it ({describe(e.__cause__ or e)})", None, split))
        return None
    problems = []
    if len(data) != entry.index.bytes:
        problems.append(f"size is {len(data)} bytes, the manifest says {entry.index.bytes}")
    try:
        digest = digest_bytes(data, algorithm_of(entry.index.digest))
    except ValueError as e:
        problems.append(f"cannot check its digest: {e}")
    else:
        if digest != entry.index.digest:
            problems.append(f"digest is {digest}, the manifest says {entry.index.digest} (the content changed)")
    try:
        table = decode_index(data, name, entry.records)
    except IndexFileError as e:
        problems.append(str(e).replace(f"{name}: ", "", 1))
        table = None
    report.errors.extend(Problem(name, f"index of {entry.file}: {p}", None, split) for p in problems)
    return table["key"] if table is not None and not problems else None


class _KeyCheck:
    """No key twice in the dataset: a 16-byte hash of every key (no per-sample objects),
    compared at the end."""

    def __init__(self) -> None:
        self.hashes: list[np.ndarray] = []
        self.entries: list[ShardEntry] = []

    def add(self, entry: ShardEntry, keys: np.ndarray | None) -> None:
        if keys is None:
            return
        from converter.plan.fptable import key_hashes

        self.hashes.append(key_hashes(list(keys)))
        self.entries.append(entry)

    def report_duplicates(self, manifest: Manifest, root: str, report: VerifyReport) -> None:
        if not self.hashes:
            return
        hashes = np.concatenate(self.hashes)
        shard = np.concatenate([np.full(len(h), i, np.int32) for i, h in enumerate(self.hashes)])
        record = np.concatenate([np.arange(len(h), dtype=np.int64) for h in self.hashes])
        order = np.argsort(hashes, kind="stable")
        dup = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
        split_of = {s.file: name for name, s in manifest.iter_shards()}
        for d in dup[:100]:
            first, again = self.entries[shard[order[d]]], self.entries[shard[order[d + 1]]]
            at = int(record[order[d + 1]])
            report.errors.append(Problem(again.file, f"key {_key_at(root, again, at)!r} is also listed in "
                                         f"{first.file} (a duplicated sample)", at, split_of.get(again.file)))


def _key_at(root: str, entry: ShardEntry, record: int) -> str:
    from readers.index import shard_keys

    return shard_keys(root, entry)[record]


def _leftovers(root: str, manifest: Manifest, report: VerifyReport) -> None:
    from converter.publish.manifest import is_shard_name, listed_files

    listed = listed_files(manifest)
    for name in sorted(os.listdir(root)):
        if name.startswith(TMP_PREFIX):
            report.warnings.append(Problem(
                name, "leftover temporary file of a crashed or running convert (the next convert removes it)"))
        elif (is_shard_name(name) or is_index_name(name)) and name not in listed:
            what = "shard" if is_shard_name(name) else "index"
            report.warnings.append(Problem(
                name, f"{what} file not listed in the manifest (left by a crashed or running convert, "
                "or dropped by a rewrite; the next convert removes it)"))


def _check_shard(root: str, split: str, entry: ShardEntry, fmt: FileFormat, spec: RecordSpec,
                 deep: bool, keys: np.ndarray | None = None) -> list[Problem]:
    path = os.path.join(root, entry.file)

    def problem(text: str, record: int | None = None) -> Problem:
        return Problem(entry.file, text, record, split)

    try:
        size = _regular_size(root, path)
    except FileNotFoundError:
        return [problem("missing: the manifest lists it but the file does not exist")]
    except (NotRegularFileError, OutsideDatasetError) as e:
        return [problem(str(e).replace(path, "it", 1))]
    except OSError as e:
        return [problem(f"cannot open it ({describe(e)})")]
    out: list[Problem] = []
    if size != entry.bytes:
        cut = " (truncated)" if size < entry.bytes else ""
        out.append(problem(f"size is {size} bytes, the manifest says {entry.bytes}{cut}"))
    try:
        digest = digest_file(path, algorithm_of(entry.digest))
    except OSError as e:
        return out + [problem(f"cannot read it ({describe(e)})")]
    except ValueError as e:  # a digest naming no algorithm this imgshard knows
        return out + [problem(f"cannot check its digest: {e}")]
    damaged = digest != entry.digest
    if damaged:
        out.append(problem(f"digest is {digest}, the manifest says {entry.digest} (the content changed)"))
    try:  # a damaged TFRecord is walked with CRCs on, to name the record
        count, record_problem = _count(path, fmt, spec, check_crc=damaged)
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as e:
        count, record_problem = None, Problem("", f"cannot count its records ({describe(e)})")
    if record_problem is not None:
        out.append(problem(record_problem.problem, record_problem.record))
    elif count is not None and count != entry.records:
        out.append(problem(f"holds {count} records, the manifest says {entry.records}"
                           + (" (cut at a record boundary)" if count < entry.records else "")))
    if deep and record_problem is None and count == entry.records:  # else the broken record is named already
        out.extend(problem(p.problem, p.record) for p in _deep(path, split, entry, fmt, spec, keys))
    return out


def _regular_size(root: str, path: str) -> int:
    """The size of shard `path`, a regular file inside `root` (symlinks resolved); raises
    `OSError` (`NotRegularFileError`, `OutsideDatasetError`, `FileNotFoundError`, ...)."""
    check_inside(root, path)
    fd = open_regular(path)
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def _count(path: str, fmt: FileFormat, spec: RecordSpec, *, check_crc: bool) -> tuple[int | None, Problem | None]:
    """(records in the file, or a Problem with the record index where reading broke)."""
    try:
        return get_adapter(fmt).count_records(path, spec, check_crc=check_crc), None
    except CountError as e:
        return None, Problem("", e.reason, e.record)


def _deep(path: str, split: str, entry: ShardEntry, fmt: FileFormat, spec: RecordSpec,
          index_keys: np.ndarray | None) -> Iterator[Problem]:
    """Decode every record; yield what is wrong (file names are filled in by the caller)."""
    adapter = get_adapter(fmt)
    keys = [k.decode("utf-8") for k in index_keys] if index_keys is not None else []
    ref = ShardRef(path, entry, 0)
    class_pixels = np.zeros(spec.num_classes, np.int64)
    ignore_pixels = 0
    index = 0
    records = adapter.iter_shard(ref, spec)
    while True:
        try:
            record = next(records)
        except StopIteration:
            break
        except (ValueError, OSError, EOFError, KeyError, IndexError) as e:  # ShardError names file and record
            record_index = getattr(e, "record", None)
            yield Problem("", _strip_fix(str(e), path), record_index if record_index is not None else index)
            return
        if index < len(keys) and record.key != keys[index]:
            yield Problem("", f"key {record.key!r} differs from the manifest's {keys[index]!r}", index)
        for text in _record_problems(record, spec):
            yield Problem("", text, index)
        counts, ignored = _class_counts(record, spec)
        class_pixels += counts
        ignore_pixels += ignored
        index += 1
    if index != entry.records:
        yield Problem("", f"decodes to {index} records, the manifest says {entry.records}")
        return
    stored = np.zeros(spec.num_classes, np.int64)
    stored[: len(entry.class_pixels)] = entry.class_pixels[: spec.num_classes]
    if entry.class_pixels and (not np.array_equal(stored, class_pixels) or ignore_pixels != entry.ignore_pixels):
        yield Problem("", "per-class pixel counts of the records differ from the manifest's class_pixels")


def _strip_fix(text: str, path: str) -> str:
    """A reader error's message without the file name and fix (the report gives both)."""
    from readers.errors import FIX_HINT

    text = text.replace(" " + FIX_HINT, "").replace(FIX_HINT, "")
    if text.startswith(f"shard {path}") and ": " in text:
        text = text.split(": ", 1)[1]
    return text.replace(f"Corrupt TFRecord file {path!r}: ", "")


def _record_problems(record: Record, spec: RecordSpec) -> list[str]:
    out = []
    image = record.image
    if image.shape != spec.image_shape or image.dtype != np.uint8:
        out.append(f"image is {image.shape} {image.dtype}, expected {spec.image_shape} uint8")
    if not spec.segmentation:
        if record.label is None or not 0 <= int(record.label) < spec.num_classes:
            out.append(f"label {record.label!r} is not a class index in [0, {spec.num_classes})")
        return out
    mask = record.mask
    if mask is None:
        return out + ["the record has no mask"]
    if mask.shape != spec.mask_shape or mask.dtype != spec.mask_np_dtype.newbyteorder("="):
        return out + [f"mask is {mask.shape} {mask.dtype}, expected {spec.mask_shape} {spec.mask_dtype}"]
    if spec.mask_encoding == "onehot":
        if mask.max(initial=0) > 1:
            out.append("one-hot mask holds values other than 0 and 1")
        elif mask.sum(axis=-1, dtype=np.int64).max(initial=0) > 1:
            out.append("one-hot mask sets more than one class on a pixel")
        return out
    values = np.unique(mask)
    bad = [int(v) for v in values if v >= spec.num_classes and v != spec.ignore_index]
    if bad:
        out.append(f"mask holds class indices {bad[:8]} outside [0, {spec.num_classes}) "
                   f"that are not the ignore index {spec.ignore_index}")
    return out


def _class_counts(record: Record, spec: RecordSpec) -> tuple[np.ndarray, int]:
    c = spec.num_classes
    counts = np.zeros(c, np.int64)
    if not spec.segmentation:
        if record.label is not None and 0 <= int(record.label) < c:
            counts[int(record.label)] = 1
        return counts, 0
    mask = record.mask
    if mask is None:
        return counts, 0
    if mask.ndim == 3:
        counts += mask.reshape(-1, mask.shape[-1]).sum(axis=0, dtype=np.int64)[:c]
        return counts, int(mask.shape[0] * mask.shape[1] - counts.sum())
    ignore = spec.ignore_index if spec.ignore_index is not None else 255
    full = np.bincount(mask.ravel(), minlength=max(c, ignore + 1))
    counts += full[:c]
    return counts, int(full[ignore])


def format_report(report: VerifyReport) -> str:
    """Human-readable lines: one per error and warning, then a verdict (one line when the
    manifest itself cannot be read: there is nothing else to report)."""
    if report.shards == 0 and len(report.errors) == 1 and report.errors[0].file == MANIFEST_NAME:
        return f"FAILED: {report.errors[0].problem}"
    lines = [f"error: {p}" for p in report.errors] + [f"warning: {p}" for p in report.warnings]
    what = "size, digest, record count" + (", every record decoded" if report.deep else "")
    if report.ok:
        lines.append(f"OK: {report.shards} shard(s), {report.records} record(s), {report.bytes / 1e6:.1f} MB "
                     f"verified ({what}) in {report.out_dir} in {report.seconds:.1f} s")
    else:
        lines.append(f"FAILED: {len(report.errors)} problem(s) in {len(report.bad_files)} file(s) of "
                     f"{report.out_dir} ({what} checked over {report.shards} shard(s)). Rewrite the dataset with "
                     "`imgshard convert SRC OUT --rebuild` (same options).")
    return "\n".join(lines)


__all__ = ["Problem", "VerifyReport", "format_report", "verify"]
