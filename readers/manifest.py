"""The manifest (`imgshard.json`): the contract between the converter and the readers.

This module has no dependency beyond the standard library so that both sides (and
any tool of the user's) can import it cheaply. The converter builds a `Manifest`,
publishes it last and atomically; the readers start from it and nothing else.

Layout of the JSON document (format version 3)::

    {
      "imgshard_manifest": 3,
      "tool_version": "0.1.0",
      "task": "segmentation",            # or "classification"
      "format": "tfrecord",              # or "npz"
      "compression": "none",             # tfrecord: none|gzip; npz: none|deflate
      "options": {...},                  # every option that changes the output bytes
      "image": {"height": 512, "width": 512, "channels": 3, "dtype": "uint8"},
      "mask": {"dtype": "uint8", "encoding": "class_map", "ignore_index": 255},  # null for classification
      "classes": [{"name": "Sky", "color": [128, 128, 128]}, ...],
      "splits": {
        "train": {
          "next_shard_index": 3,
          "shards": [
            {"file": "train-00000.tfrecord", "records": 75, "bytes": 58982400,
             "digest": "xxh3_128:...", "class_pixels": [..], "ignore_pixels": 0,
             "class_images": [..],      # optional: records in which each class occurs
             "source_bytes": 123456,    # bytes of the sources of its records
             "index": {"file": "train-00000.tfrecord.9f2c4e1a0b7d3366.idx.npy", "bytes": 4242,
                       "digest": "xxh3_128:..."}},
          ]
        }
      },
      "history": [{"time": "2026-11-21T06:00:00Z", "added": 150, "replaced": 0, "pruned": 0,
                   "tool_version": "0.1.0"}]
    }

Shard files are always named relative to the dataset folder; a manifest naming a path
outside it (absolute, or with ``..``) is refused.

Per-sample data (keys, source fingerprints, record positions) lives in one index file
per shard (`readers.index`), so the manifest grows with the number of shards, not
samples. Version 2 held it inline: each shard entry had
``"samples": [{"key": ..., "image": {"path", "size", "mtime_ns", "digest"}, "mask": ...}]``
and no ``index``. Versions 1 and 2 are read as before (their `ShardEntry.samples` are
filled, `ShardEntry.index` is None); the converter migrates such a dataset to version 3
in place (`converter.migrate`) on its first run. `Manifest.dumps` writes version 3 when
every shard has an index file and the version-2 layout when none has (only old tools
and tests build those).

Version 1 (imgshard 0.1.0) differs from version 2 only in the digests of shards and source files:
they held ``"sha256": HEX`` instead of ``"digest": "ALGORITHM:HEX"``. Version 1
manifests are read as version 2 with ``"sha256:HEX"`` digests, and written back as
version 2 (shards and sources written later get xxh3-128 digests).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Iterator, Mapping, Sequence

MANIFEST_NAME = "imgshard.json"
MANIFEST_VERSION = 3
LEGACY_VERSION = 2  # inline per-sample data
READABLE_VERSIONS = (1, 2, 3)
REPORTS_DIR = "reports"
HISTORY_LIMIT = 50

TASKS = ("segmentation", "classification")


class ManifestError(ValueError):
    """The manifest is missing, malformed, or hostile."""


def _check_relative(name: str, what: str, manifest_path: str) -> str:
    """Refuse names that would escape the dataset folder."""
    if not isinstance(name, str) or not name:
        raise ManifestError(f"{manifest_path}: {what} must be a non-empty string. Received: {name!r}")
    p = PurePosixPath(name)
    if p.is_absolute() or "\\" in name or ".." in p.parts or name.startswith("~") or ":" in p.parts[0]:
        raise ManifestError(
            f"{manifest_path}: {what} {name!r} points outside the dataset folder; "
            "shard names must be plain relative paths. Refusing to open a hostile manifest."
        )
    return name


# -- the schema, checked in one place ------------------------------------------------------------
#: Limits a manifest's values must keep. A damaged or hostile manifest that claims more
#: is refused by `validate` before anything is allocated or read.
MAX_IMAGE_SIDE = 1 << 16            # pixels per side (PNG allows more; no training image has it)
MAX_RECORD_BYTES = (1 << 31) - 1    # image (or one-hot mask) bytes of one record: a TFRecord/protobuf limit
MAX_CLASSES = 65535                 # uint16 class maps keep 65535 for the ignore index
MAX_COUNT = (1 << 63) - 1           # records, bytes, pixel counts: int64
MAX_MANIFEST_BYTES = 1 << 30        # the JSON document (versions 1-2: about 300 bytes per sample; 3: per shard)
MAX_INT_DIGITS = 20                 # an int64 in JSON (a 5000-digit integer is refused before int())
IMAGE_CHANNELS = tuple(range(1, 17))  # 1..16 channels (bands)
IMAGE_DTYPES = {"uint8": 1, "uint16": 2}  # stored image dtype -> bytes per sample


#: The fix every schema error ends with.
MANIFEST_FIX = ("The manifest is damaged: restore imgshard.json from a backup, or convert again with "
                "`imgshard convert SRC OUT --rebuild`.")


def _where(path: str, at: str) -> str:
    return f"{path}: {at}" if at else path


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _need_int(value: Any, at: str, path: str, lo: int = 0, hi: int = MAX_COUNT) -> None:
    if not _is_int(value) or not lo <= value <= hi:
        raise ManifestError(f"{_where(path, at)} must be an integer in [{lo}, {hi}]. Received: {value!r:.80}. "
                            + MANIFEST_FIX)


def _need(ok: bool, at: str, path: str, expected: str, value: Any) -> None:
    if not ok:
        raise ManifestError(f"{_where(path, at)} must be {expected}. Received: {value!r:.80}. " + MANIFEST_FIX)


def _need_dict(value: Any, at: str, path: str, required: Sequence[str] = ()) -> Mapping:
    _need(isinstance(value, dict), at, path, "an object", value)
    missing = [k for k in required if k not in value]
    if missing:
        raise ManifestError(f"{_where(path, at)} lacks {', '.join(map(repr, missing))}. Received keys: "
                            f"{sorted(value)[:20]}. " + MANIFEST_FIX)
    return value


def _need_ints(value: Any, at: str, path: str) -> None:
    _need(isinstance(value, list), at, path, "a list of integers", value)
    for i, v in enumerate(value):
        _need_int(v, f"{at}[{i}]", path)


def _validate_fingerprint(d: Any, at: str, path: str) -> None:
    _need_dict(d, at, path, ("path", "size", "mtime_ns"))
    _need(isinstance(d["path"], str), f"{at}.path", path, "a string", d["path"])
    _need_int(d["size"], f"{at}.size", path)
    _need_int(d["mtime_ns"], f"{at}.mtime_ns", path, -MAX_COUNT - 1)
    digest = d.get("digest", d.get("sha256"))  # version 1: "sha256"
    _need(isinstance(digest, str), f"{at}.digest", path, "a string", digest)


def _validate_index(d: Any, at: str, path: str) -> None:
    """A version-3 shard's index file reference: a plain relative name, its size, its digest."""
    _need_dict(d, at, path, ("file", "bytes", "digest"))
    _check_relative(d["file"], f"{at}.file", path)
    _need_int(d["bytes"], f"{at}.bytes", path)
    _need(isinstance(d["digest"], str) and ":" in d["digest"], f"{at}.digest", path, "'ALGORITHM:HEX'",
          d["digest"])


def _validate_shard(d: Any, at: str, path: str, version: int = 3) -> None:
    _need_dict(d, at, path, ("file", "records", "bytes") + (("index",) if version >= 3 else ()))
    _check_relative(d["file"], f"{at}.file", path)
    for name in ("records", "bytes", "ignore_pixels", "source_bytes"):
        if name in d:
            _need_int(d[name], f"{at}.{name}", path)
    if version >= 3:  # per-sample data lives in the index file, never inline
        _validate_index(d["index"], f"{at}.index", path)
        _need("samples" not in d, f"{at}.samples", path, "absent in a version-3 manifest (the index file holds them)",
              "a list")
    digest = d.get("digest", d.get("sha256"))  # version 1: "sha256"
    _need(isinstance(digest, str), f"{at}.digest", path, "a string", digest)
    for name in ("class_pixels", "class_images"):
        if name in d:
            _need_ints(d[name], f"{at}.{name}", path)
    samples = d.get("samples", [])
    _need(isinstance(samples, list), f"{at}.samples", path, "a list", samples)
    for i, sample in enumerate(samples):
        where = f"{at}.samples[{i}]"
        _need_dict(sample, where, path, ("key", "image"))
        _need(isinstance(sample["key"], str), f"{where}.key", path, "a string", sample["key"])
        _validate_fingerprint(sample["image"], f"{where}.image", path)
        if sample.get("mask") is not None:
            _validate_fingerprint(sample["mask"], f"{where}.mask", path)
        if sample.get("label") is not None:
            _need_int(sample["label"], f"{where}.label", path, 0, MAX_CLASSES - 1)


def _validate_image(image: Any, mask: Any, num_classes: int, path: str) -> None:
    _need_dict(image, "image", path, ("height", "width"))
    _need_int(image["height"], "image.height", path, 1, MAX_IMAGE_SIDE)
    _need_int(image["width"], "image.width", path, 1, MAX_IMAGE_SIDE)
    channels = image.get("channels", 3)
    _need(_is_int(channels) and channels in IMAGE_CHANNELS, "image.channels", path,
          "an integer 1..16", channels)
    dtype = image.get("dtype", "uint8")
    _need(dtype in IMAGE_DTYPES, "image.dtype", path, f"one of {sorted(IMAGE_DTYPES)}", dtype)
    bands = image.get("bands")
    _need(bands is None or (isinstance(bands, list) and all(isinstance(b, str) for b in bands)), "image.bands",
          path, "a list of band names", bands)
    pixels = image["height"] * image["width"]
    _need(pixels * channels * IMAGE_DTYPES[dtype] <= MAX_RECORD_BYTES, "image", path,
          f"at most {MAX_RECORD_BYTES} bytes per record", f"{image['height']}x{image['width']}x{channels}")
    if mask is None:
        return
    _need_dict(mask, "mask", path)
    if mask.get("ignore_index") is not None:
        _need_int(mask["ignore_index"], "mask.ignore_index", path, 0, MAX_CLASSES)
    if mask.get("encoding") == "onehot":
        _need(pixels * num_classes <= MAX_RECORD_BYTES, "mask", path,
              f"at most {MAX_RECORD_BYTES} bytes per one-hot record", f"{pixels} pixels x {num_classes} classes")


def _validate_classes(classes: Any, path: str) -> None:
    _need(isinstance(classes, list) and len(classes) <= MAX_CLASSES, "classes", path,
          f"a list of at most {MAX_CLASSES} classes", type(classes).__name__)
    for i, c in enumerate(classes):
        _need_dict(c, f"classes[{i}]", path, ("name",))
        _need(isinstance(c["name"], str), f"classes[{i}].name", path, "a string", c["name"])
        color = c.get("color")
        if color is not None:
            _need(isinstance(color, list) and len(color) == 3 and all(_is_int(v) and 0 <= v <= 255 for v in color),
                  f"classes[{i}].color", path, "[r, g, b] with integers in [0, 255]", color)


def _validate_sources(sources: Any, path: str) -> None:
    """The optional record of what a dataset was converted from: its scope and spec."""
    if sources is None:
        return
    _need_dict(sources, "sources", path)
    scope = sources.get("scope", [])
    _need(isinstance(scope, list), "sources.scope", path, "a list", scope)
    for i, entry in enumerate(scope):
        _need(isinstance(entry, dict) and isinstance(entry.get("split"), str)
              and all(isinstance(entry.get(k), (str, type(None))) for k in ("images", "masks")),
              f"sources.scope[{i}]", path, "an object with a split name and folder paths", entry)
    _need(isinstance(sources.get("spec"), (str, type(None))), "sources.spec", path, "a string or null",
          sources.get("spec"))


def validate(d: Any, path: str = MANIFEST_NAME) -> None:
    """Check a parsed manifest document against the schema; raise `ManifestError` naming
    the manifest, the field, what was expected and what was received.

    Types (integers are JSON integers, never strings, floats or booleans), ranges (counts
    >= 0 and within int64, image sides in [1, `MAX_IMAGE_SIDE`], channels 1..16 of uint8 or uint16, at most
    `MAX_RECORD_BYTES` per record, class colours in [0, 255]), relative shard names, and
    for version 3 each shard's index file (relative name, bytes, digest; no inline samples).
    Everything that reads a manifest goes through here (`Manifest.from_json`).
    """
    _need_dict(d, "", path, ("imgshard_manifest", "task", "format", "image", "classes", "splits"))
    version = d["imgshard_manifest"]
    if not _is_int(version) or version not in READABLE_VERSIONS:
        raise ManifestError(
            f"{path} has manifest version {version!r:.40}; this imgshard reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}. Upgrade imgshard, or re-convert with --rebuild."
        )
    _need(d["task"] in TASKS, "task", path, f"one of {TASKS}", d["task"])
    for name in ("format", "compression", "tool_version"):
        if name in d:
            _need(isinstance(d[name], str), name, path, "a string", d[name])
    for name in ("options",):
        if name in d:
            _need_dict(d[name], name, path)
    _need(isinstance(d.get("history", []), list), "history", path, "a list", d.get("history"))
    _validate_sources(d.get("sources"), path)
    _validate_classes(d["classes"], path)
    _need(d.get("mask") is None or isinstance(d["mask"], dict), "mask", path, "an object or null", d.get("mask"))
    _validate_image(d["image"], d.get("mask"), len(d["classes"]), path)
    _need_dict(d["splits"], "splits", path)
    for name, split in d["splits"].items():
        _check_relative(name, "split name", path)
        _need_dict(split, f"splits.{name}", path)
        if "next_shard_index" in split:
            _need_int(split["next_shard_index"], f"splits.{name}.next_shard_index", path)
        shards = split.get("shards", [])
        _need(isinstance(shards, list), f"splits.{name}.shards", path, "a list", shards)
        for i, shard in enumerate(shards):
            _validate_shard(shard, f"splits.{name}.shards[{i}]", path, version)
    _validate_names(d["splits"], path)


#: ``split-00003.tfrecord`` (a run id in a bucket: ``split-00003-r1a2b3c4d.tfrecord``): the split and the number.
_SHARD_NUMBER_RE = re.compile(r"^(.+)-(\d{5,})(?:-r[0-9a-f]{8})?\.[A-Za-z0-9.]+$")


def shard_number(split: str, file: Any) -> int:
    """The number a shard name of `split` carries (``train-00003.tfrecord`` -> 3); -1 for other names."""
    m = _SHARD_NUMBER_RE.match(file) if isinstance(file, str) else None
    return int(m.group(2)) if m and m.group(1) == split else -1


def _validate_names(splits: Mapping, path: str) -> None:
    """No shard or index file listed twice (in any split), and every split's `next_shard_index` above
    the number of each shard it lists: one damaged digit there would make the next run write its new
    shard under a published shard's name."""
    seen: dict[str, str] = {}
    for name, split in splits.items():
        top = -1
        for i, shard in enumerate(split.get("shards", [])):
            at = f"splits.{name}.shards[{i}]"
            index = shard.get("index")
            for field, file in (("file", shard["file"]), ("index.file", index.get("file") if isinstance(index, dict)
                                                          else None)):
                if isinstance(file, str):
                    _need(file not in seen, f"{at}.{field}", path, f"a name listed once (also at {seen.get(file)})",
                          file)
                    seen[file] = f"{at}.{field}"
            top = max(top, shard_number(name, shard["file"]))
        if "next_shard_index" in split:
            _need(split["next_shard_index"] > top, f"splits.{name}.next_shard_index", path,
                  f"above the number of every shard the split lists (its highest is {top})",
                  split["next_shard_index"])


def _refuse_number(text: str) -> Any:
    raise ValueError(f"the number {text[:40]} is not allowed in a manifest (NaN, infinity or out of range)")


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits ({text[:20]}...) is out of range")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        _refuse_number(text)
    return value


def read_manifest_json(path: str) -> Any:
    """Parse the manifest file at `path` (a regular file, at most `MAX_MANIFEST_BYTES`).

    Raises `ManifestError` naming the file for anything that is not a sane JSON
    document: not a regular file (a folder, a FIFO), too large, not UTF-8, not JSON,
    nested too deeply, NaN/infinite numbers, integers with more than `MAX_INT_DIGITS`
    digits. A missing file raises `FileNotFoundError`.
    """
    from readers.files import open_regular_file

    try:
        with open_regular_file(path) as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_MANIFEST_BYTES:
                raise ManifestError(f"{path} is {size} bytes, more than a manifest may hold "
                                    f"({MAX_MANIFEST_BYTES}); it is not an imgshard manifest.")
            raw = f.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise ManifestError(f"{path} cannot be read ({type(e).__name__}: {e}); the dataset cannot be opened.") from e
    return parse_manifest_bytes(raw, os.fspath(path))


def parse_manifest_bytes(raw: bytes, path: str) -> Any:
    """The JSON document in `raw` (a manifest's bytes, read from `path`: a file or a URL),
    with `read_manifest_json`'s checks on the text."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ManifestError(f"{path} is not valid UTF-8 ({e}); the dataset cannot be opened. "
                            + MANIFEST_FIX) from e
    try:
        return json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_refuse_number)
    except RecursionError as e:
        raise ManifestError(f"{path} is nested too deeply to be a manifest; the dataset cannot be opened. "
                            + MANIFEST_FIX) from e
    except ValueError as e:  # json.JSONDecodeError is a ValueError too
        raise ManifestError(f"{path} is not valid JSON ({e}); the dataset cannot be opened. " + MANIFEST_FIX) from e


@dataclass(frozen=True)
class ClassInfo:
    name: str
    color: tuple[int, int, int] | None  # None for classification classes

    def to_json(self) -> dict:
        return {"name": self.name, "color": list(self.color) if self.color is not None else None}

    @classmethod
    def from_json(cls, d: Mapping) -> "ClassInfo":
        color = d.get("color")
        return cls(str(d["name"]), tuple(int(c) for c in color) if color is not None else None)


@dataclass(frozen=True)
class SourceFingerprint:
    """Identity of one source file at conversion time (for incremental runs)."""

    path: str  # relative to the source root, '/'-separated (or absolute for explicit folders)
    size: int
    mtime_ns: int
    digest: str  # "ALGORITHM:HEX" of the content, e.g. "xxh3_128:..." ("sha256:..." from version 1)

    @property
    def algorithm(self) -> str:
        return self.digest.split(":", 1)[0]

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping) -> "SourceFingerprint":
        digest = str(d["digest"]) if "digest" in d else "sha256:" + str(d["sha256"])  # version 1
        return cls(str(d["path"]), int(d["size"]), int(d["mtime_ns"]), digest)


@dataclass(frozen=True)
class SampleEntry:
    key: str
    image: SourceFingerprint
    mask: SourceFingerprint | None = None
    label: int | None = None  # classification only

    def to_json(self) -> dict:
        d: dict[str, Any] = {"key": self.key, "image": self.image.to_json(),
                             "mask": self.mask.to_json() if self.mask else None}
        if self.label is not None:
            d["label"] = self.label
        return d

    @classmethod
    def from_json(cls, d: Mapping) -> "SampleEntry":
        return cls(
            key=str(d["key"]),
            image=SourceFingerprint.from_json(d["image"]),
            mask=SourceFingerprint.from_json(d["mask"]) if d.get("mask") else None,
            label=int(d["label"]) if d.get("label") is not None else None,
        )


@dataclass(frozen=True)
class IndexRef:
    """A shard's index file (version 3): its name, size and digest (see `readers.index`)."""

    file: str
    bytes: int
    digest: str  # "xxh3_128:HEX"

    def to_json(self) -> dict:
        return {"file": self.file, "bytes": self.bytes, "digest": self.digest}

    @classmethod
    def from_json(cls, d: Mapping, manifest_path: str = MANIFEST_NAME) -> "IndexRef":
        if not isinstance(d, Mapping):
            raise ManifestError(f"{manifest_path}: a shard's index must be an object. Received: {d!r}")
        ref = cls(_check_relative(d["file"], "index file", manifest_path), int(d["bytes"]), str(d["digest"]))
        if ref.bytes < 0 or ":" not in ref.digest:
            raise ManifestError(f"{manifest_path}: index {ref.file!r} needs bytes >= 0 and an 'ALGORITHM:HEX' "
                                f"digest. Received: bytes={ref.bytes}, digest={ref.digest!r}")
        return ref


@dataclass(frozen=True)
class ShardEntry:
    file: str
    records: int
    bytes: int
    digest: str  # "ALGORITHM:HEX" of the file, e.g. "xxh3_128:..." ("sha256:..." from version 1)
    class_pixels: tuple[int, ...] = ()
    ignore_pixels: int = 0
    #: Per-sample entries: filled only from manifests of versions 1 and 2 (inline data).
    samples: tuple[SampleEntry, ...] = ()
    #: Per class, the number of records in which it occurs (optional: empty in manifests
    #: written before it existed). Median-frequency class weights need it.
    class_images: tuple[int, ...] = ()
    #: Version 3: the shard's index file (per-sample data); None in versions 1 and 2.
    index: IndexRef | None = None
    #: Bytes of the sources of the shard's records (version 3; summed from `samples` before).
    source_bytes: int = 0
    #: Images beyond 8-bit RGB: per channel the sum and sum of squares of the stored images,
    #: then their pixel count (`converter.publish.band_stats`); () when not kept.
    band_sums: tuple[float, ...] = ()

    @property
    def keys(self) -> list[str]:
        """Keys from the inline samples (versions 1, 2); `readers.index.shard_keys` reads any version."""
        return [s.key for s in self.samples]

    @property
    def total_source_bytes(self) -> int:
        if self.index is not None:
            return self.source_bytes
        return sum(s.image.size + (s.mask.size if s.mask else 0) for s in self.samples)

    def to_json(self) -> dict:
        d = {
            "file": self.file,
            "records": self.records,
            "bytes": self.bytes,
            "digest": self.digest,
            "class_pixels": list(self.class_pixels),
            "ignore_pixels": self.ignore_pixels,
            **({"class_images": list(self.class_images)} if self.class_images else {}),
            **({"band_sums": list(self.band_sums)} if self.band_sums else {}),
        }
        if self.index is not None:
            d["index"] = self.index.to_json()
            d["source_bytes"] = self.source_bytes
        else:
            d["samples"] = [s.to_json() for s in self.samples]
        return d

    @classmethod
    def from_json(cls, d: Mapping, manifest_path: str = MANIFEST_NAME, version: int = MANIFEST_VERSION) -> "ShardEntry":
        samples = tuple(SampleEntry.from_json(s) for s in d.get("samples", ()))
        index = None
        if version >= 3:
            if "index" not in d or samples:
                raise ManifestError(f"{manifest_path}: shard {d.get('file')!r} of a version-3 manifest must name "
                                    "its index file and list no samples inline.")
            index = IndexRef.from_json(d["index"], manifest_path)
        entry = cls(
            file=_check_relative(d["file"], "shard file", manifest_path),
            records=int(d["records"]),
            bytes=int(d["bytes"]),
            digest=str(d["digest"]) if "digest" in d else "sha256:" + str(d["sha256"]),  # version 1
            class_pixels=tuple(int(c) for c in d.get("class_pixels", ())),
            ignore_pixels=int(d.get("ignore_pixels", 0)),
            samples=samples,
            class_images=tuple(int(c) for c in d.get("class_images", ())),
            index=index,
            source_bytes=int(d.get("source_bytes", 0)),
            band_sums=tuple(float(v) for v in d.get("band_sums", ())),
        )
        if samples and len(samples) != entry.records:
            raise ManifestError(
                f"{manifest_path}: shard {entry.file} lists {len(samples)} samples but "
                f"records={entry.records}; the manifest is inconsistent."
            )
        return entry


@dataclass(frozen=True)
class SplitEntry:
    shards: tuple[ShardEntry, ...] = ()
    next_shard_index: int = 0

    @property
    def num_samples(self) -> int:
        return sum(s.records for s in self.shards)

    def class_pixels(self, num_classes: int) -> list[int]:
        total = [0] * num_classes
        for shard in self.shards:
            for i, c in enumerate(shard.class_pixels[:num_classes]):
                total[i] += c
        return total

    def class_images(self, num_classes: int) -> list[int] | None:
        """Records in which each class occurs, or None when a shard lacks the counts
        (written by an older imgshard)."""
        total = [0] * num_classes
        for shard in self.shards:
            if len(shard.class_images) < num_classes:
                return None
            for i, c in enumerate(shard.class_images[:num_classes]):
                total[i] += c
        return total

    def to_json(self) -> dict:
        return {"next_shard_index": self.next_shard_index, "shards": [s.to_json() for s in self.shards]}

    @classmethod
    def from_json(cls, d: Mapping, manifest_path: str = MANIFEST_NAME, version: int = MANIFEST_VERSION,
                  name: str = "") -> "SplitEntry":
        return cls(
            shards=tuple(ShardEntry.from_json(s, manifest_path, version) for s in d.get("shards", ())),
            # absent (older manifests): past every listed shard's number, so no name is ever reused
            next_shard_index=int(d.get("next_shard_index", 1 + max(
                [-1] + [shard_number(name, s.get("file")) for s in d.get("shards", ())]))),
        )


@dataclass(frozen=True)
class Manifest:
    tool_version: str
    task: str
    format: str
    compression: str
    options: Mapping[str, Any]
    image: Mapping[str, Any]
    mask: Mapping[str, Any] | None
    classes: tuple[ClassInfo, ...]
    splits: Mapping[str, SplitEntry]
    history: tuple[Mapping[str, Any], ...] = ()
    version: int = MANIFEST_VERSION
    #: What the dataset was converted from: {"scope": [{"split", "images", "masks"}...], "spec": text or
    #: null} (`converter.plan.scope`); None in manifests written before it existed.
    sources: Mapping[str, Any] | None = None

    # -- derived views -------------------------------------------------------------
    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (int(self.image["height"]), int(self.image["width"]), int(self.image.get("channels", 3)))

    def shards(self, split: str) -> tuple[ShardEntry, ...]:
        return self.split(split).shards

    def split(self, split: str) -> SplitEntry:
        try:
            return self.splits[split]
        except KeyError:
            raise KeyError(
                f"Unknown split {split!r}. Expected one of {sorted(self.splits)}. Received: {split!r}"
            ) from None

    def iter_shards(self) -> Iterator[tuple[str, ShardEntry]]:
        for name in sorted(self.splits):
            for shard in self.splits[name].shards:
                yield name, shard

    # -- (de)serialisation ---------------------------------------------------------
    @property
    def indexed(self) -> bool:
        """Whether every shard has an index file (the dataset is in the version-3 layout)."""
        return all(s.index is not None for _, s in self.iter_shards())

    def to_json(self) -> dict:
        """Version 3 when every shard has its index file; the version-2 layout (inline
        samples) when none has; a mix is refused (it would lose per-sample data)."""
        shards = [s for _, s in self.iter_shards()]
        indexed = sum(s.index is not None for s in shards)
        if 0 < indexed < len(shards):
            raise ValueError(f"{indexed} of {len(shards)} shards have an index file: a manifest cannot mix "
                             "version-3 shards with inline samples. Migrate every shard first (converter.migrate).")
        out = {
            "imgshard_manifest": MANIFEST_VERSION if indexed == len(shards) else LEGACY_VERSION,
            "tool_version": self.tool_version,
            "task": self.task,
            "format": self.format,
            "compression": self.compression,
            "options": dict(self.options),
            "image": dict(self.image),
            "mask": dict(self.mask) if self.mask is not None else None,
            "classes": [c.to_json() for c in self.classes],
            "splits": {k: self.splits[k].to_json() for k in sorted(self.splits)},
            "history": [dict(h) for h in self.history],
        }
        if self.sources is not None:
            out["sources"] = dict(self.sources)
        return out

    def dumps(self) -> str:
        """Canonical text: sorted keys, so identical content gives identical bytes."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, d: Mapping, manifest_path: str = MANIFEST_NAME) -> "Manifest":
        if not isinstance(d, Mapping) or "imgshard_manifest" not in d:
            raise ManifestError(f"{manifest_path} is not an imgshard manifest (no 'imgshard_manifest' key).")
        validate(d, manifest_path)
        version = d["imgshard_manifest"]
        try:
            task = d["task"]
            splits = {}
            for name, s in d["splits"].items():
                _check_relative(name, "split name", manifest_path)
                splits[name] = SplitEntry.from_json(s, manifest_path, version, name)
            return cls(
                version=version,
                tool_version=str(d.get("tool_version", "?")),
                task=task,
                format=str(d["format"]),
                compression=str(d.get("compression", "none")),
                options=dict(d.get("options", {})),
                image=dict(d["image"]),
                mask=dict(d["mask"]) if d.get("mask") is not None else None,
                classes=tuple(ClassInfo.from_json(c) for c in d["classes"]),
                splits=splits,
                history=tuple(d.get("history", ())),
                sources=dict(d["sources"]) if d.get("sources") is not None else None,
            )
        except ManifestError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise ManifestError(f"{manifest_path} is malformed: {type(e).__name__}: {e}") from e

    @classmethod
    def load(cls, root: str | os.PathLike) -> "Manifest":
        """Load `root/imgshard.json` (or the manifest file itself when given)."""
        path = os.fspath(root)
        if os.path.isdir(path):
            path = os.path.join(path, MANIFEST_NAME)
        if not os.path.lexists(path):
            raise FileNotFoundError(
                f"No imgshard dataset at {os.fspath(root)!r}: {MANIFEST_NAME} not found. "
                "Run `imgshard convert SRC OUT` first, or pass the folder that holds the manifest."
            )
        data = read_manifest_json(path)
        return cls.from_json(data, path)

    def replace(self, **changes: Any) -> "Manifest":
        return dataclasses.replace(self, **changes)


def empty_splits(names: Sequence[str]) -> dict[str, SplitEntry]:
    return {n: SplitEntry() for n in names}


__all__ = [
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "READABLE_VERSIONS",
    "REPORTS_DIR",
    "HISTORY_LIMIT",
    "ClassInfo",
    "IndexRef",
    "Manifest",
    "ManifestError",
    "SampleEntry",
    "ShardEntry",
    "SourceFingerprint",
    "SplitEntry",
    "empty_splits",
    "parse_manifest_bytes",
    "read_manifest_json",
    "validate",
]
