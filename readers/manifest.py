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
    def from_json(cls, d: Mapping, manifest_path: str = MANIFEST_NAME, version: int = MANIFEST_VERSION) -> "SplitEntry":
        return cls(
            shards=tuple(ShardEntry.from_json(s, manifest_path, version) for s in d.get("shards", ())),
            next_shard_index=int(d.get("next_shard_index", 0)),
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
        return {
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

    def dumps(self) -> str:
        """Canonical text: sorted keys, so identical content gives identical bytes."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, d: Mapping, manifest_path: str = MANIFEST_NAME) -> "Manifest":
        if not isinstance(d, Mapping) or "imgshard_manifest" not in d:
            raise ManifestError(f"{manifest_path} is not an imgshard manifest (no 'imgshard_manifest' key).")
        version = d["imgshard_manifest"]
        if version not in READABLE_VERSIONS:
            raise ManifestError(
                f"{manifest_path} has manifest version {version!r}; this imgshard reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))}. Upgrade imgshard, or re-convert with --rebuild."
            )
        try:
            task = d["task"]
            if task not in TASKS:
                raise ManifestError(f"{manifest_path}: task must be one of {TASKS}. Received: {task!r}")
            splits = {}
            for name, s in d["splits"].items():
                _check_relative(name, "split name", manifest_path)
                splits[name] = SplitEntry.from_json(s, manifest_path, version)
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
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"No imgshard dataset at {os.fspath(root)!r}: {MANIFEST_NAME} not found. "
                "Run `imgshard convert SRC OUT` first, or pass the folder that holds the manifest."
            )
        try:
            with open(path, "rb") as f:
                data = json.loads(f.read().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ManifestError(f"{path} is not valid JSON ({e}); the dataset cannot be opened.") from e
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
]
