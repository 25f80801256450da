"""Annotation formats as source layouts: `detect`, `pairs`, `defaults`, as
`converter.discover.layouts` asks every layout (it adds `ANNOTATION_LAYOUTS` to its own)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from converter.discover.annotations.base import AnnotationFileError
from converter.discover.annotations.listing import AnnotationBlock, AnnotationSet, Reader
from converter.discover.annotations.registry import READERS
from converter.discover.files import absolute, exists
from converter.discover.layout import BadInput, LayoutDefaults
from converter.options import AnnotationOptions, MaskSemantics, SourceSpec, SplitSource


@dataclass
class AnnotationListing:
    """What `Layout.pairs` returns (`converter.discover.layouts.Listing`'s fields); `sources`: one
    `SplitSource` per split and annotation file (or folder), what a spec file pins."""

    splits: list[str]
    samples: list[AnnotationBlock]
    bad: list[BadInput] = field(default_factory=list)
    suffixes: tuple[str, str] | None = None
    unpaired_images: int = 0
    sources: list[SplitSource] = field(default_factory=list)


#: Formats with one annotation file per image (or per sample folder): a spec names their folder.
_PER_IMAGE = ("yolo", "labelme", "instances")


def spec_path(fmt: str, source: str) -> str:
    """The annotation path a spec names for a sample's source: the file, or the folder of per-image files."""
    return os.path.dirname(source.rstrip("/")) if fmt in _PER_IMAGE else source


def _sources(fmt: str, found: AnnotationSet) -> list[SplitSource]:
    groups: dict[tuple[str, str], list[str]] = {}
    for s in found.samples:
        groups.setdefault((s.split, spec_path(fmt, s.annotation.source)), []).append(os.path.dirname(s.image))
    return [SplitSource(split, os.path.commonpath(dirs), annotations=path, annotation_format=fmt)
            for (split, path), dirs in groups.items()]


def _under(path: str, folder: str) -> bool:
    path, folder = os.path.normpath(path), os.path.normpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def follow_spec(spec: SourceSpec) -> tuple[AnnotationLayout, str, AnnotationListing, LayoutDefaults]:
    """(layout, why, listing, defaults) of a spec's annotation sources: the format it names, read without
    detection, only the splits and annotation files (or folders) it pins (new files elsewhere are not looked at)."""
    formats = {s.annotation_format for s in spec.sources}
    if len(formats) != 1 or None in formats:
        raise ValueError(f"a source spec names either folder pairs or annotation sources of one format. Received: "
                         f"formats {sorted(str(f) for f in formats)}")
    layout = ANNOTATION_LAYOUTS[formats.pop()]  # type: ignore[index]
    found = layout.read(absolute(spec.root), spec.annotations)  # type: ignore[arg-type]
    for p in spec.sources:
        if not exists(p.annotations):  # type: ignore[arg-type]
            raise FileNotFoundError(f"source spec {spec.spec_file}: split {p.split!r}: annotations "
                                    f"{p.annotations} not found. Re-run `imgshard scan SRC --write-spec FILE`.")

    def pinned(split: str, source: str, image: str) -> bool:
        return any(p.split == split and _under(source, p.annotations or "") and _under(image, p.images)
                   for p in spec.sources)

    samples = [s for s in found.samples if pinned(s.split, s.annotation.source, s.image)]
    splits = list(dict.fromkeys(p.split for p in spec.sources))
    bad = [b for b in found.bad if b.key is None or b.key.split("/")[0] in splits]
    why = "spec: " + ", ".join(f"{p.split}: {p.annotations}" for p in spec.sources)
    listing = AnnotationListing(splits, [AnnotationBlock(samples)], bad, None, 0, list(spec.sources))
    _refuse_duplicate_keys(AnnotationSet(splits, samples, found.class_names, why))
    return layout, why, listing, layout.defaults(absolute(spec.root))  # type: ignore[arg-type]


class AnnotationLayout:
    """A `Layout` over one annotation `Reader`; the last set read is kept for `defaults` and scan."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self.name = reader.name
        self._last: tuple[str, AnnotationSet] | None = None

    def detect(self, root: str) -> str | None:
        return self.reader.detect(root)

    def read(self, root: str, options: AnnotationOptions | None = None) -> AnnotationSet:
        """The files read now (never a cached answer: they may have changed since)."""
        self._last = None
        found = self.reader.read(root, options or AnnotationOptions())
        self._last = (root, found)
        return found

    def last(self, root: str) -> AnnotationSet:
        """What the last `read` of `root` found (discovery's `defaults`, scan), else a read now."""
        return self._last[1] if self._last is not None and self._last[0] == root else self.read(root)

    def pairs(self, root: str, spec: SourceSpec) -> AnnotationListing:
        found = self.read(root, spec.annotations)
        _refuse_duplicate_keys(found)
        return AnnotationListing(list(found.splits), [AnnotationBlock(list(found.samples))], list(found.bad),
                                 None, found.unpaired_images, _sources(self.name, found))

    def defaults(self, root: str) -> LayoutDefaults:
        found = self.last(root)
        return LayoutDefaults(MaskSemantics.INDEX, (found.ignore,), False, None, found.class_names)


def _refuse_duplicate_keys(found: AnnotationSet) -> None:
    """Two samples with one key (an image listed twice) would overwrite each other: a named error."""
    seen: dict[str, str] = {}
    for s in found.samples:
        other = seen.setdefault(s.key, s.annotation.where)
        if other != s.annotation.where:
            raise AnnotationFileError(s.annotation.source, f"the image {s.key} is listed twice ({other} and "
                                      f"{s.annotation.where})", "list each image once")


ANNOTATION_LAYOUTS: dict[str, AnnotationLayout] = {name: AnnotationLayout(r) for name, r in READERS.items()}

__all__ = ["ANNOTATION_LAYOUTS", "AnnotationLayout", "AnnotationListing", "follow_spec", "spec_path"]
